"""Elementwise ops: the storage-type inference table row by row, zero-preserving
unary functions, broadcasting, dtype preservation and padding, eagerly and under
jit, against a dense numpy oracle."""

from __future__ import annotations

import functools
import operator
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from draw import random_csr, random_rowsparse
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt
from tests import strategies as sst

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]
N, D = 6, 2


@functools.cache
def inputs(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    r1 = random_rowsparse(rng, (N, D), n_rows=3, capacity=4, dtype=dtype)
    r2 = random_rowsparse(rng, (N, D), n_rows=3, capacity=5, dtype=dtype)
    c1 = random_csr(rng, (N, D), density=0.4, nse=8, dtype=dtype)
    c2 = random_csr(rng, (N, D), density=0.4, dtype=dtype)
    dense = jnp.asarray(jsrt.random_dense(rng, (N, D), dtype))
    return r1, r2, c1, c2, dense


def dense_of(x):
    return np.asarray(x).astype(np.float64)


# One row per line of the table in `_elementwise.py` / docs/storage.md:
# (expression, function of (r1, r2, c1, c2, dense), numpy oracle, result stype).
TABLE = [
    ("rsp * scalar", lambda r, s, c, t, d: r * 3, lambda r, s, c, t, d: r * 3, "row_sparse"),
    ("scalar * rsp", lambda r, s, c, t, d: 3 * r, lambda r, s, c, t, d: 3 * r, "row_sparse"),
    ("rsp / scalar", lambda r, s, c, t, d: r / 4, lambda r, s, c, t, d: r / 4, "row_sparse"),
    ("-rsp", lambda r, s, c, t, d: -r, lambda r, s, c, t, d: -r, "row_sparse"),
    ("abs(rsp)", lambda r, s, c, t, d: jsr.abs(r), lambda r, s, c, t, d: abs(r), "row_sparse"),
    ("rsp + rsp", lambda r, s, c, t, d: r + s, lambda r, s, c, t, d: r + s, "row_sparse"),
    ("rsp - rsp", lambda r, s, c, t, d: r - s, lambda r, s, c, t, d: r - s, "row_sparse"),
    ("rsp * rsp", lambda r, s, c, t, d: r * s, lambda r, s, c, t, d: r * s, "row_sparse"),
    ("rsp * dense", lambda r, s, c, t, d: r * d, lambda r, s, c, t, d: r * d, "row_sparse"),
    ("dense * rsp", lambda r, s, c, t, d: d * r, lambda r, s, c, t, d: d * r, "row_sparse"),
    ("rsp + dense", lambda r, s, c, t, d: r + d, lambda r, s, c, t, d: r + d, "default"),
    ("dense + rsp", lambda r, s, c, t, d: d + r, lambda r, s, c, t, d: d + r, "default"),
    ("dense - rsp", lambda r, s, c, t, d: d - r, lambda r, s, c, t, d: d - r, "default"),
    ("rsp ** 2", lambda r, s, c, t, d: r**2, lambda r, s, c, t, d: r**2, "row_sparse"),
    ("csr * scalar", lambda r, s, c, t, d: c * 3, lambda r, s, c, t, d: c * 3, "csr"),
    ("csr / scalar", lambda r, s, c, t, d: c / 4, lambda r, s, c, t, d: c / 4, "csr"),
    ("-csr", lambda r, s, c, t, d: -c, lambda r, s, c, t, d: -c, "csr"),
    (
        "sqrt(|csr|)",
        lambda r, s, c, t, d: jsr.sqrt(abs(c)),
        lambda r, s, c, t, d: np.sqrt(abs(c)),
        "csr",
    ),
    ("csr + csr", lambda r, s, c, t, d: c + t, lambda r, s, c, t, d: c + t, "csr"),
    ("csr - csr", lambda r, s, c, t, d: c - t, lambda r, s, c, t, d: c - t, "csr"),
    ("csr * dense", lambda r, s, c, t, d: c * d, lambda r, s, c, t, d: c * d, "csr"),
    ("dense * csr", lambda r, s, c, t, d: d * c, lambda r, s, c, t, d: d * c, "csr"),
    ("csr + dense", lambda r, s, c, t, d: c + d, lambda r, s, c, t, d: c + d, "default"),
    ("dense + csr", lambda r, s, c, t, d: d + c, lambda r, s, c, t, d: d + c, "default"),
]

# "anything else": dense result and a StorageFallbackWarning naming the op.
FALLBACK = [
    ("rsp + scalar", lambda r, s, c, t, d: r + 1, lambda r, s, c, t, d: r + 1, "add"),
    ("rsp - scalar", lambda r, s, c, t, d: r - 1, lambda r, s, c, t, d: r - 1, "subtract"),
    ("rsp / dense", lambda r, s, c, t, d: r / d, lambda r, s, c, t, d: r / d, "divide"),
    ("scalar / rsp", lambda r, s, c, t, d: 1 / r, lambda r, s, c, t, d: 1 / r, "divide"),
    ("rsp * csr", lambda r, s, c, t, d: r * c, lambda r, s, c, t, d: r * c, "multiply"),
    ("rsp + csr", lambda r, s, c, t, d: r + c, lambda r, s, c, t, d: r + c, "add"),
    ("csr * csr", lambda r, s, c, t, d: c * t, lambda r, s, c, t, d: c * t, "multiply"),
    ("rsp ** -1", lambda r, s, c, t, d: r**-1.0, lambda r, s, c, t, d: r**-1.0, "power"),
    (
        "log(rsp)",
        lambda r, s, c, t, d: jsr.apply_dense(jnp.log, r),
        lambda r, s, c, t, d: np.log(r),
        "log",
    ),
]


# dtype x mode combinations (each dtype is run at least once under jit and eagerly
# across the set, keeping the suite fast)
MODES = [
    (jnp.float32, "eager"),
    (jnp.float32, "jit"),
    (jnp.float16, "eager"),
    (jnp.bfloat16, "jit"),
]


@pytest.mark.parametrize("name,fn,ref,out_stype", TABLE, ids=[t[0] for t in TABLE])
@pytest.mark.parametrize("dtype,mode", MODES, ids=lambda v: getattr(v, "__name__", v))
def test_inference_table(name, fn, ref, out_stype, dtype, mode):
    args = inputs(dtype)
    out = (jax.jit(fn) if mode == "jit" else fn)(*args)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = ref(*(dense_of(a) for a in args))
    jsrt.assert_allclose(out, expected, stype=out_stype, dtype=dtype)


@pytest.mark.parametrize("name,fn,ref,op", FALLBACK, ids=[t[0] for t in FALLBACK])
def test_fallback_is_dense_and_warns(name, fn, ref, op, jit_mode):
    args = inputs()
    with pytest.warns(jsr.StorageFallbackWarning, match=op) as rec:
        out = jit_mode(fn)(*args)
    assert "densified" in str(rec[0].message)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = ref(*(dense_of(a) for a in args))
    assert jsr.stype(out) == "default"
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, equal_nan=True)


def test_dense_only_inputs_stay_plain_jax():
    x, y = jnp.ones(3), jnp.full(3, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for op, ref in [
            (jsr.add, np.add),
            (jsr.subtract, np.subtract),
            (jsr.multiply, np.multiply),
            (jsr.divide, np.divide),
        ]:
            np.testing.assert_array_equal(np.asarray(op(x, y)), ref(np.ones(3), 2.0))
        assert jsr.apply_dense(jnp.exp, x).shape == (3,)  # no sparse input: no warning


def _np_dense(x):
    """The dense value of a canonical RowSparse / CSR, built in numpy (float64)
    from its children, so that oracles do not go through the library's todense."""
    data = np.asarray(x.data).astype(np.float64)
    idx = np.asarray(x.indices)
    out = np.zeros(x.shape, np.float64)
    if x.stype == "row_sparse":
        real = idx < x.shape[0]
        out[idx[real]] = data[real]
    else:
        indptr = np.asarray(x.indptr)
        rows = np.repeat(np.arange(x.shape[0]), np.diff(indptr))
        out[rows, idx[: indptr[-1]]] = data[: indptr[-1]]
    return out


# Values that tell the rounding functions apart (rint rounds half to even, trunc /
# floor / ceil differ on negatives); the stored values start with these, then
# unscaled random values in [-2.6, 2.6].
ROUNDING_CASES = np.array([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1.7, -1.7, 0.2, -2.3])
UNARY_REFS = {n: getattr(np, n, None) for n in jsr.ZERO_PRESERVING_UNARY}
UNARY_REFS["relu"] = lambda v: np.maximum(v, 0)
# numpy maps keeping 0 at 0 that move the values into each function's domain
# (|v| <= 0.91 for arcsin / arctanh / log1p, and tan kept away from its poles).
UNARY_DOMAINS = {"raw": lambda v: v, "abs": np.abs, "scaled": lambda v: v * 0.35}
UNARY_DOMAIN_OF = {n: "raw" for n in jsr.ZERO_PRESERVING_UNARY}
UNARY_DOMAIN_OF.update(sqrt="abs", arcsin="scaled", arctanh="scaled", log1p="scaled", tan="scaled")


def _unary_input(base, domain, dtype, seed=0):
    """``base``'s sparsity pattern with ROUNDING_CASES then random values stored
    (mapped into ``domain``), padding kept zero."""
    idx = np.asarray(base.indices)
    if base.stype == "row_sparse":
        stored = idx < base.shape[0]
    else:
        stored = np.arange(base.nse) < np.asarray(base.indptr)[-1]
    data = np.zeros(base.data.shape, np.float64)
    n = data[stored].size
    vals = np.random.default_rng(seed).uniform(-2.6, 2.6, n)
    vals[: min(n, ROUNDING_CASES.size)] = ROUNDING_CASES[:n]
    data[stored] = vals.reshape(data[stored].shape)
    data = UNARY_DOMAINS[domain](data).astype(jnp.dtype(dtype))
    if base.stype == "row_sparse":
        return jsr.RowSparse(data, idx, base.shape)
    return jsr.CSR(data, idx, np.asarray(base.indptr), base.shape)


def _check_unary(name, x, out, dtype):
    ref = UNARY_REFS[name](_np_dense(x).astype(np.float32))  # oracle in float32
    try:
        jsrt.assert_allclose(out, ref, stype=x.stype, dtype=dtype)
        np.testing.assert_array_equal(np.asarray(out.indices), np.asarray(x.indices))
    except AssertionError as e:
        raise AssertionError(f"{name} of {x!r} {jnp.dtype(dtype).name}: {e}") from None


# Edge shapes, sharing few data shapes (each is one eager compilation per function).
# RowSparse (shape, stored rows, capacity): N = 0 and capacity 0, capacity 0, N = 0
# padded, 2-D padded, D = 0, 3-D rows padded (12 stored values: all ROUNDING_CASES).
UNARY_RSP_CASES = [
    ((0, 3), 0, 0),
    ((5, 3), 0, 0),
    ((0, 2, 3), 0, 3),
    ((6, 3), 1, 2),
    ((4, 0), 1, 2),
    ((6, 2, 3), 2, 3),
]
# CSR (shape, density, nse): M = 0, K = 0, nnz = 0, padded (11 stored), full
UNARY_CSR_CASES = [
    ((0, 4), 0.5, 12),
    ((4, 0), 0.5, 12),
    ((3, 4), 0.0, 12),
    ((5, 5), 0.55, 12),
    ((3, 4), 1.0, 12),
]


@functools.cache
def _unary_cases(dtype):
    rng = np.random.default_rng(13)
    bases = [random_rowsparse(rng, s, n_rows=n, capacity=k) for s, n, k in UNARY_RSP_CASES]
    bases += [random_csr(rng, s, density=p, nse=k) for s, p, k in UNARY_CSR_CASES]
    padded_csr = bases[-2]
    assert ROUNDING_CASES.size <= int(padded_csr.nnz) < padded_csr.nse
    return {
        d: [_unary_input(b, d, dtype, seed=i) for i, b in enumerate(bases)] for d in UNARY_DOMAINS
    }


def _all_unary(xs):
    return {n: [getattr(jsr, n)(x) for x in xs[UNARY_DOMAIN_OF[n]]] for n in UNARY_REFS}


@pytest.mark.parametrize("dtype,mode", MODES, ids=lambda v: getattr(v, "__name__", v))
def test_zero_preserving_unary(dtype, mode):
    """Every zero-preserving function on every edge shape (one jit for all of them)."""
    xs = _unary_cases(dtype)
    outs = (jax.jit(_all_unary) if mode == "jit" else _all_unary)(xs)
    for name, results in outs.items():
        for x, out in zip(xs[UNARY_DOMAIN_OF[name]], results, strict=True):
            _check_unary(name, x, out, dtype)
        # on a dense array it is the plain function (the padded CSR's data: all
        # ROUNDING_CASES and a zero, in a shape compiled above)
        dense = np.asarray(xs[UNARY_DOMAIN_OF[name]][-2].data, np.float32)
        np.testing.assert_allclose(
            np.asarray(getattr(jsr, name)(jnp.asarray(dense))),
            UNARY_REFS[name](dense),
            rtol=1e-5,
            atol=1e-6,
        )


# -- dtype preservation, padding ----------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_preserved_and_mixed_promotes(dtype):
    r1, r2, c1, c2, d = inputs(dtype)
    ops = lambda r1, r2, c1, c2, d: [
        r1 + r2,
        r1 * r2,
        r1 * d,
        r1 + d,
        c1 + c2,
        c1 * d,
        r1 * 2.5,
        c1 / 2,
        -r1,
        jsr.square(c1),
    ]
    for out in jax.eval_shape(ops, r1, r2, c1, c2, d):
        assert out.dtype == dtype
    wide = inputs(jnp.float32)[1]
    outs = jax.eval_shape(lambda a, b: (a + b, a * b, b * a), r1, wide)
    assert all(o.dtype == jnp.promote_types(dtype, jnp.float32) for o in outs)


@pytest.mark.parametrize("scalar", [np.inf, np.nan, 0.0])
def test_padding_stays_zero_after_nonfinite_scalar(scalar, jit_mode):
    r1, _, c1, _, _ = inputs()
    with np.errstate(divide="ignore", invalid="ignore"):
        for x in (r1, c1):
            for f in (lambda x, s: x * s, lambda x, s: x / s):
                out = jit_mode(f)(x, jnp.float32(scalar))  # traced scalar under jit
                pad = np.asarray(out.indices) == x.shape[1 if x.stype == "csr" else 0]
                assert pad.any() and np.all(np.asarray(out.data)[pad] == 0)
                expected = f(np.asarray(x.data, np.float64), scalar)
                np.testing.assert_array_equal(np.asarray(out.data)[~pad], expected[~pad])


# -- broadcasting --------------------------------------------------------------------
@pytest.mark.parametrize("bshape", [(), (D,), (1, D), (N, 1), (N, D)])
def test_rsp_times_dense_broadcasts(bshape, jit_mode):
    r1 = inputs()[0]
    b = jnp.asarray(jsrt.random_dense(np.random.default_rng(3), bshape))
    out = jit_mode(lambda r, b: (r * b, b * r))(r1, b)
    jsrt.assert_allclose(out[0], dense_of(r1) * np.asarray(b), stype="row_sparse")
    jsrt.assert_allclose(out[1], dense_of(r1) * np.asarray(b), stype="row_sparse")
    if bshape:  # rsp + 0-d array is the `rsp + scalar` fallback, tested above
        total = jit_mode(lambda r, b: r + b)(r1, b)
        jsrt.assert_allclose(total, dense_of(r1) + np.asarray(b), stype="default")


@pytest.mark.parametrize("bshape", [(N + 1, D), (3,), (2, N, D), (N,)])
def test_rsp_dense_bad_broadcast(bshape):
    r1 = inputs()[0]
    b = jnp.ones(bshape)
    with pytest.raises(ValueError, match="does not broadcast|sparse results cannot grow"):
        r1 * b
    with pytest.raises(ValueError, match="broadcast"):
        r1 + b


def test_sparse_sparse_shape_mismatch():
    a = jsr.zeros("row_sparse", (3, 2))
    b = jsr.zeros("row_sparse", (4, 2))
    with pytest.raises(ValueError, match=r"same shape, got \(3, 2\) and \(4, 2\)"):
        a + b
    with pytest.raises(ValueError, match="same shape"):
        a * b
    with pytest.raises(ValueError, match="same shape"):
        jsr.zeros("csr", (3, 2)) + jsr.zeros("csr", (2, 3))
    with pytest.raises(ValueError, match="does not broadcast to the csr shape"):
        jsr.zeros("csr", (3, 2)) * jnp.ones((3, 3))


@pytest.mark.parametrize(
    "op, name",
    [
        (lambda a, b: a + b, "add"),
        (lambda a, b: b + a, "add"),
        (lambda a, b: a - b, "subtract"),
        (lambda a, b: a / b, "divide"),
        (lambda a, b: b / a, "divide"),
    ],
)
@pytest.mark.parametrize("stype_", ["row_sparse", "csr"])
def test_mismatched_dense_operand_errors_name_the_op_and_shapes(op, name, stype_, jit_mode):
    """These raised numpy's "shape mismatch: objects cannot be broadcast" or
    JAX's "div got incompatible shapes", naming neither the op nor the operands."""
    a = jsr.zeros(stype_, (6, 2))
    b = jnp.ones((5, 2))
    with pytest.raises(ValueError, match=rf"^{name}: operands of shapes \(\d, 2\) and "):
        jit_mode(op)(a, b)


@pytest.mark.parametrize(
    "op, name",
    [
        (lambda a, b: a * b, "multiply"),
        (lambda a, b: a + b, "add"),
        (lambda a, b: a - b, "subtract"),
        (lambda a, b: a / b, "divide"),
    ],
)
def test_sparse_operands_of_two_storage_types_broadcast_densely(op, name):
    """Their result is dense (the fallback), so they broadcast as dense arrays
    do; shapes that do not broadcast raise an error that names the op, not
    JAX's "mul got incompatible shapes" from inside the fallback."""
    rsp = jsr.row_sparse_array(([[1.0, 2.0, 3.0, 4.0]], [0]), shape=(1, 4))
    csr = jsr.csr_matrix(np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
        got = op(rsp, csr)
    want = op(np.asarray(rsp.todense()), np.asarray(csr.todense()))
    assert jsr.stype(got) == "default" and got.shape == (3, 4)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    mismatched = jsr.zeros("row_sparse", (6, 2)), jsr.zeros("csr", (3, 5))
    with pytest.raises(ValueError, match=rf"^{name}: operands of shapes \(6, 2\) and \(3, 5\)"):
        op(*mismatched)


# -- properties ------------------------------------------------------------------------
# Drawn per example: eager or jit (eager compiles each primitive for each new shape,
# so the modes share the examples), the dtype, a dense operand's seed, a divisor
# (exact in every dtype; a Python float, and a JAX scalar that is traced under jit)
# and an exponent (a Python scalar > 0 keeps the storage type; fractional on |x|).
_MODES = st.sampled_from(["jit", "eager"])
_DIVISORS = st.sampled_from([4.0, -0.5, 3.0])
_EXPONENTS = st.sampled_from([2, 0.5, 3, 1.5, 1])
_SEEDS = st.integers(0, 2**32 - 1)


def _binary_ops(a, b, d, t, *, s, p):
    base = a if float(p).is_integer() else abs(a)
    out = {"a + b": a + b, "a - b": a - b}
    if a.stype == "row_sparse":
        out["a * b"] = a * b
    out |= {"a * d": a * d, "d * a": d * a}
    out |= {"a / s": a / s, "jsr.divide(a, t)": jsr.divide(a, t)}
    return out | {"a ** p": base**p, "jsr.power(a, p)": jsr.power(base, p)}


def _binary_expected(da, db, dd, s, p):
    base = da if float(p).is_integer() else np.abs(da)
    return {
        "a + b": da + db,
        "a - b": da - db,
        "a * b": da * db,
        "a * d": da * dd,
        "d * a": dd * da,
        "a / s": da / s,
        "jsr.divide(a, t)": da / s,
        "a ** p": base**p,
        "jsr.power(a, p)": base**p,
    }


def _check_binary_ops(a, b, seed, s, p, mode):
    dtype = a.dtype
    d = jnp.asarray(jsrt.random_dense(np.random.default_rng(seed), a.shape, dtype))
    t = jnp.asarray(s, dtype)
    # one compilation per example under jit instead of one per primitive
    ops = functools.partial(_binary_ops, s=s, p=p)
    out = (jax.jit(ops) if mode == "jit" else ops)(a, b, d, t)
    expected = _binary_expected(_np_dense(a), _np_dense(b), np.asarray(d, np.float64), s, p)
    for name, got in out.items():
        try:
            jsrt.assert_allclose(got, expected[name], stype=a.stype, dtype=dtype)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
    return out


@settings(max_examples=sst.examples(8))
@given(
    pair=st.sampled_from(DTYPES).flatmap(lambda dt: sst.rowsparse_pair(dtype=dt)),
    seed=_SEEDS,
    s=_DIVISORS,
    p=_EXPONENTS,
    mode=_MODES,
)
def test_rsp_binary_ops_match_numpy(pair, seed, s, p, mode):
    a, b = pair
    out = _check_binary_ops(a, b, seed, s, p, mode)
    rows_a = set(np.asarray(a.indices)[np.asarray(a.indices) < a.shape[0]].tolist())
    rows_b = set(np.asarray(b.indices)[np.asarray(b.indices) < b.shape[0]].tolist())
    for name in ("a + b", "a - b"):
        assert int(out[name].nnz_rows) == len(rows_a | rows_b)
        assert out[name].capacity == a.capacity + b.capacity
    assert int(out["a * b"].nnz_rows) == len(rows_a & rows_b)
    assert out["a * b"].capacity == min(a.capacity, b.capacity)
    for name in ("a * d", "a / s", "jsr.divide(a, t)", "a ** p"):  # same rows
        np.testing.assert_array_equal(np.asarray(out[name].indices), np.asarray(a.indices))


@settings(max_examples=sst.examples(8))
@given(
    pair=st.sampled_from(DTYPES).flatmap(lambda dt: sst.csr_pair(dtype=dt)),
    seed=_SEEDS,
    s=_DIVISORS,
    p=_EXPONENTS,
    mode=_MODES,
)
def test_csr_binary_ops_match_numpy(pair, seed, s, p, mode):
    a, b = pair
    out = _check_binary_ops(a, b, seed, s, p, mode)
    assert out["a + b"].nse == out["a - b"].nse == a.nse + b.nse
    for name in ("a * d", "a / s", "jsr.divide(a, t)", "a ** p"):  # same entries
        np.testing.assert_array_equal(np.asarray(out[name].indices), np.asarray(a.indices))
        np.testing.assert_array_equal(np.asarray(out[name].indptr), np.asarray(a.indptr))


def test_union_under_jit_with_padding_and_k0():
    f = jax.jit(lambda a, b: (a + b, a * b))
    rng = np.random.default_rng(11)
    for ka, kb in [(0, 0), (0, 3), (2, 4)]:
        a = random_rowsparse(rng, (5, 3), n_rows=ka, capacity=ka + 1)
        b = random_rowsparse(rng, (5, 3), n_rows=kb, capacity=kb)
        s, p = f(a, b)
        jsrt.assert_allclose(s, dense_of(a) + dense_of(b), stype="row_sparse")
        jsrt.assert_allclose(p, dense_of(a) * dense_of(b), stype="row_sparse")


# -- optax -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_optax_apply_updates_scatter_adds(dtype, jit_mode):
    rng = np.random.default_rng(5)
    params = {"emb": jnp.asarray(jsrt.random_dense(rng, (N, D), dtype)), "b": jnp.ones(3, dtype)}
    upd = random_rowsparse(rng, (N, D), n_rows=2, capacity=4, dtype=dtype)
    updates = {"emb": upd, "b": jnp.full(3, 0.5, dtype)}
    new = jit_mode(optax.apply_updates)(params, updates)
    assert jsr.stype(new["emb"]) == "default" and new["emb"].dtype == dtype
    jsrt.assert_allclose(new["emb"], dense_of(params["emb"]) + dense_of(upd), dtype=dtype)
    np.testing.assert_array_equal(np.asarray(new["b"], np.float32), np.full(3, 1.5))
    # float32 updates into bfloat16 params keep the params' dtype
    new16 = optax.apply_updates(params, {"emb": upd.astype(jnp.float32), "b": updates["b"]})
    assert new16["emb"].dtype == dtype


def _rsp_of(dense):
    return jsr.cast_storage(jnp.asarray(dense), "row_sparse")


def _csr_of(dense):
    return jsr.cast_storage(jnp.asarray(dense), "csr")


@pytest.mark.parametrize(
    "a_dtype,b_dtype",
    [
        ("float32", "uint8"),
        ("int8", "uint8"),
        ("uint8", "uint8"),
        ("float32", "bool"),
        ("int32", "uint16"),
    ],
)
@pytest.mark.parametrize("kinds", ["rsp-rsp", "rsp-dense", "csr-csr", "csr-dense", "dense-rsp"])
def test_subtract_promotes_before_negating(jit_mode, a_dtype, b_dtype, kinds):
    """-b in b's own unsigned dtype wrapped (float32 1 - uint8 2 gave 255)."""
    a_np = np.array([[1, 0, 3], [0, 0, 0], [2, 2, 0]]).astype(a_dtype)
    b_np = np.array([[2, 0, 0], [0, 0, 0], [1, 3, 0]]).astype(b_dtype)
    ka, kb = kinds.split("-")
    make = {"rsp": _rsp_of, "csr": _csr_of, "dense": jnp.asarray}
    a, b = make[ka](a_np), make[kb](b_np)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
        got = jit_mode(jsr.subtract)(a, b)
    want = np.asarray(jnp.subtract(jnp.asarray(a_np), jnp.asarray(b_np)))
    assert jsr.todense(got).dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(jsr.todense(got)), want)


def test_subtract_of_bools_and_of_lists():
    rb = _rsp_of(np.array([[True, False]]))
    with pytest.raises(TypeError, match="bool operands is not defined"):
        rb - rb
    r = jsr.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2))
    np.testing.assert_array_equal(np.asarray(r - [1.0, 2.0]), [[-1, -2], [0, 0], [-1, -2]])
    with pytest.raises(ValueError, match="subtract: operands must have the same shape"):
        r - jsr.zeros("row_sparse", (4, 2))


BOOL_A = np.array([[True, False, True], [False, False, False], [False, True, True]])
BOOL_B = np.array([[True, True, False], [False, False, False], [True, False, True]])


@pytest.mark.parametrize(
    "op",
    [
        "rsp+rsp", "rsp+dense", "dense+rsp", "csr+csr", "csr+dense", "rsp*rsp", "csr->rsp",
        "rsp->csr", "csr.todense", "dot(csr,dense)", "dot(csr.T,dense)", "dot(csr,rsp)",
    ],
)  # fmt: skip
def test_bool_data_follows_jax_numpy(jit_mode, op):
    """numpy sums of bools are logical or; XLA's scatter-add rejected bool."""
    a, b = jnp.asarray(BOOL_A), jnp.asarray(BOOL_B)
    ops = {
        "rsp+rsp": (lambda ra, rb, ca, cb: ra + rb, a + b),
        "rsp+dense": (lambda ra, rb, ca, cb: ra + b, a + b),
        "dense+rsp": (lambda ra, rb, ca, cb: b + ra, a + b),
        "csr+csr": (lambda ra, rb, ca, cb: ca + cb, a + b),
        "csr+dense": (lambda ra, rb, ca, cb: ca + b, a + b),
        "rsp*rsp": (lambda ra, rb, ca, cb: ra * rb, a * b),
        "csr->rsp": (lambda ra, rb, ca, cb: jsr.cast_storage(ca, "row_sparse"), a),
        "rsp->csr": (lambda ra, rb, ca, cb: jsr.cast_storage(ra, "csr"), a),
        "csr.todense": (lambda ra, rb, ca, cb: ca.todense(), a),
        "dot(csr,dense)": (lambda ra, rb, ca, cb: jsr.dot(ca, b), jnp.dot(a, b)),
        "dot(csr.T,dense)": (lambda ra, rb, ca, cb: jsr.dot(ca, b, transpose_a=True), a.T @ b),
        "dot(csr,rsp)": (lambda ra, rb, ca, cb: jsr.dot(ca, rb), jnp.dot(a, b)),
    }
    fn, want = ops[op]
    got = jit_mode(fn)(_rsp_of(a), _rsp_of(b), _csr_of(a), _csr_of(b))
    dense = jsr.todense(got)
    assert dense.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(dense), np.asarray(want))


def _sparse_like(kind, dense):
    """``dense`` stored as ``kind`` (its non-zero rows / entries), built in numpy."""
    dense = np.asarray(dense, np.float32)
    if kind == "row_sparse":
        rows = np.flatnonzero(np.any(dense != 0, axis=tuple(range(1, dense.ndim))))
        return jsr.RowSparse(dense[rows], rows, dense.shape)
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))])
    return jsr.CSR(dense[rows, cols], cols, indptr, dense.shape)


@pytest.mark.parametrize("kind", ["row_sparse", "csr"])
def test_equality_is_elementwise_and_dense(kind, jit_mode):
    rng = np.random.default_rng(21)
    if kind == "row_sparse":
        x = random_rowsparse(rng, (6, 3), n_rows=3, capacity=4)
    else:
        x = random_csr(rng, (5, 4), density=0.4, nse=10)
    dx = _np_dense(x)
    dy = dx.copy()  # equal to x but for a changed stored value, a new entry, a dropped one
    stored = np.argwhere(dx != 0)
    dy[tuple(stored[0])] += 1
    dy[tuple(np.argwhere(dx == 0)[0])] = 2.0
    dy[tuple(stored[-1])] = 0.0
    others = [
        (_sparse_like(kind, dy), dy),
        (jnp.asarray(dy, jnp.float32), dy),
        (x.copy(), dx),
        (0.0, 0.0),
        (jnp.asarray(dx[:1], jnp.float32), dx[:1]),  # broadcast row
    ]
    dense_y = jnp.asarray(dy, jnp.float32)
    compare = lambda x, os: ([(x == o, x != o) for o in os], dense_y == x)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
        got, swapped = jit_mode(compare)(x, [o for o, _ in others])
    for (eq, ne), (_, want) in zip(got, others, strict=True):
        assert jsr.stype(eq) == "default" and eq.dtype == jnp.bool_
        np.testing.assert_array_equal(np.asarray(eq), dx == want)
        np.testing.assert_array_equal(np.asarray(ne), dx != want)
    np.testing.assert_array_equal(np.asarray(swapped), dy == dx)
    assert not np.all(dx == dy) and np.any(dx == dy)  # the comparisons above are mixed
    assert (x == None) is False  # noqa: E711  (identity, as Python's default)
    assert x in [x]


@pytest.mark.parametrize(
    "op",
    [
        lambda x: x < 1, lambda x: x <= 1, lambda x: x > 1, lambda x: x >= np.array([[1.0, 2.0]]),
        lambda x: 2**x, lambda x: x // 2, lambda x: 7 // x, lambda x: x % 2, lambda x: 5 % x,
        lambda x: +x,
    ],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["row_sparse", "csr"])
def test_operators_with_dense_results_follow_jax_numpy(jit_mode, op, kind):
    dense = jnp.array([[0.0, 0.0], [1.5, 2.0], [0.0, 3.0]])
    x = jsr.cast_storage(dense, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
        got = jit_mode(op)(x)
    np.testing.assert_array_equal(np.asarray(jsr.todense(got)), np.asarray(op(dense)))


@pytest.mark.parametrize(
    "p,stype",
    [
        (2, "row_sparse"), (np.float32(0.5), "row_sparse"), (np.array(3), "row_sparse"),
        (jnp.float32(2), "default"), (0, "default"), (np.float32(-1), "default"),
    ],
)  # fmt: skip
def test_power_keeps_row_sparse_for_positive_python_and_numpy_scalars(jit_mode, p, stype):
    """The result's type must not depend on jit: a JAX scalar is traced under
    jit (its sign unknown), so it gives a dense result eagerly too."""
    r = jsr.row_sparse_array(([[1.0, 4.0]], [1]), shape=(3, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
        out = jit_mode(lambda r: r**p)(r)
    assert jsr.stype(out) == stype
    want = jnp.asarray(r.todense()) ** jnp.asarray(p)  # 0 ** -1 is inf
    np.testing.assert_allclose(np.asarray(jsr.todense(out)), np.asarray(want))
    if isinstance(p, jax.Array):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", jsr.StorageFallbackWarning)
            traced = jax.jit(lambda r, p: r**p)(r, p)
        assert jsr.stype(traced) == stype


def test_masked_scalar_paths_keep_the_weak_type_of_the_values():
    """int8 * inf is a weak float32, as in jax.numpy; adding float16 then gives float16."""
    ri = jsr.row_sparse_array((np.array([[1, 2]], np.int8), [1]), shape=(3, 2))
    rh = jsr.row_sparse_array((np.array([[1, 2]], np.float16), [1]), shape=(3, 2))
    want = jnp.asarray(ri.asnumpy()) * np.inf + jnp.asarray(rh.asnumpy())
    got = (ri * np.inf) + rh
    assert got.dtype == want.dtype == jnp.float16
    # Unstored rows stay zero (the documented sparse rule); the dense product has 0 * inf.
    np.testing.assert_array_equal(np.asarray(got.todense()), [[0, 0], [np.inf, np.inf], [0, 0]])


def test_equality_with_non_arrays_is_identity():
    r = jsr.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2))
    assert (r == jax.ShapeDtypeStruct((3, 2), jnp.float32)) is False
    assert (r == "r") is False and (r != "r") is True


@pytest.mark.parametrize("other", [None, "a", object()], ids=["None", "str", "object"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "truediv", "matmul"])
@pytest.mark.parametrize("fmt", ["row_sparse", "csr"])
def test_a_non_array_operand_gets_pythons_operator_error(fmt, op, other):
    """``x * None`` raises Python's ``unsupported operand type(s)`` naming both
    types, either way round, instead of an error from inside jax.numpy."""
    x = jsr.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2))
    x = x if fmt == "row_sparse" else x.tostype("csr")
    fn = getattr(operator, op)
    # (`"a" + x` and `"a" * x` get str's own message first)
    python = r"unsupported operand type|can only concatenate str|can't multiply sequence"
    for a, b in ((x, other), (other, x)):
        with pytest.raises(TypeError, match=python):
            fn(a, b)


@pytest.mark.parametrize("fmt", ["row_sparse", "csr"])
def test_numpy_ufuncs_are_the_operators_or_refuse(fmt):
    """A numpy operand on the left reaches the sparse one as a numpy ufunc
    (``np.multiply(ndarray, x)``): computed as the Python operator is, so the
    storage type is kept and the values are the dense ones. Other ufuncs
    (``np.exp``) refuse naming the library's ops instead of densifying
    silently; ``np.asarray`` and ``np.sum`` still convert and sum."""
    x = jsr.row_sparse_array(([[1.0, 2.0], [3.0, 4.0]], [0, 2]), shape=(3, 2))
    x = x if fmt == "row_sparse" else x.tostype("csr")
    w = np.arange(1.0, 7.0, dtype=np.float32).reshape(3, 2)
    dense = np.asarray(x.todense())
    for got, want in (
        (w * x, w * dense),
        (np.multiply(w, x), w * dense),
        (np.multiply(x, w), dense * w),
    ):
        assert jsr.is_sparse(got) and got.stype == fmt
        np.testing.assert_allclose(np.asarray(got.todense()), want)
    np.testing.assert_allclose(np.asarray(w + x), w + dense)
    np.testing.assert_allclose(np.asarray(w @ x.todense().T), w @ dense.T)
    with pytest.warns(jsr.StorageFallbackWarning):
        np.testing.assert_array_equal(np.asarray(w < x), w < dense)
    with pytest.raises(TypeError, match=r"numpy ufuncs such as `exp` do not take.*jsr\.sqrt"):
        np.exp(x)
    np.testing.assert_array_equal(np.asarray(x), dense)
    assert float(np.sum(x)) == dense.sum()
