"""Reductions: sum(axis=None|0|1|...), square_sum and norm against numpy, eagerly
and under jit, over edge shapes and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from draw import random_csr, random_rowsparse

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt

RSP_CASES = [
    ((0, 3), 0, 1),
    ((1, 2), 1, 1),
    ((6, 2), 3, 5),
    ((6, 2), 0, 0),
    ((5, 2, 3), 2, 3),
    ((7,), 3, 4),
    ((4, 0), 2, 3),  # D = 0
]
CSR_CASES = [((0, 3), 0), ((4, 5), 0), ((4, 5), 3), ((3, 0), 1)]


def make(kind, case, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    if kind == "row_sparse":
        shape, n_rows, cap = case
        return random_rowsparse(rng, shape, n_rows=n_rows, capacity=cap, dtype=dtype)
    shape, pad = case
    base = random_csr(np.random.default_rng(1), shape, density=0.5, dtype=dtype)
    return random_csr(np.random.default_rng(1), shape, density=0.5, nse=base.nse + pad, dtype=dtype)


def _dense_of(x):
    """The numpy array of a RowSparse / CSR, scattered in numpy from its
    stored entries (padding dropped)."""
    data, idx = np.asarray(x.data), np.asarray(x.indices)
    out = np.zeros(x.shape, data.dtype)
    if isinstance(x, jsr.RowSparse):
        real = idx < x.shape[0]
        out[idx[real]] = data[real]
        return out
    indptr = np.asarray(x.indptr)
    rows = np.repeat(np.arange(x.shape[0]), np.diff(indptr))
    out[rows, idx[: indptr[-1]]] = data[: indptr[-1]]
    return out


CASES = [("row_sparse", c) for c in RSP_CASES] + [("csr", c) for c in CSR_CASES]


@pytest.mark.parametrize("kind,case", CASES, ids=str)
def test_sum_all_axes(kind, case, jit_mode):
    x = make(kind, case)
    axes = [None] + list(range(x.ndim)) + [-1]
    f = jit_mode(lambda x: [jsr.sum(x, axis=a, keepdims=k) for a in axes for k in (False, True)])
    outs = f(x)
    dense = _dense_of(x).astype(np.float64)
    expected = [dense.sum(axis=a, keepdims=k) for a in axes for k in (False, True)]
    for out, exp in zip(outs, expected, strict=True):
        assert jsr.stype(out) == "default" and out.dtype == x.dtype
        jsrt.assert_allclose(out, exp)


DTYPE_CASES = [("row_sparse", ((6, 2), 3, 5)), ("csr", ((4, 5), 3))]


@pytest.mark.parametrize("kind,case", DTYPE_CASES, ids=str)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.int32])
def test_sum_and_square_sum_dtypes(kind, case, dtype, jit_mode):
    """Half-precision sums keep their dtype; integer sums widen as numpy's do
    (to the default int); values against numpy, every axis."""
    x = make(kind, case, dtype)
    dense = _dense_of(x)
    axes = [None] + list(range(x.ndim))
    combos = [(a, k) for a in axes for k in (False, True)]

    def reductions(x):
        sums = [jsr.sum(x, axis=a) for a in axes]
        squares = [jsr.square_sum(x, axis=a, keepdims=k) for a, k in combos]
        return sums, squares

    sums, squares = jit_mode(reductions)(x)
    want_dtype = jax.dtypes.canonicalize_dtype(np.sum(dense[:0]).dtype)
    wide = dense.astype(np.float64)
    for out, a in zip(sums, axes, strict=True):
        assert out.dtype == want_dtype
        jsrt.assert_allclose(out, wide.sum(axis=a), stype="default")
    for out, (a, k) in zip(squares, combos, strict=True):
        assert out.dtype == want_dtype
        jsrt.assert_allclose(out, (wide**2).sum(axis=a, keepdims=k))


def test_sum_bad_axis():
    x = make("row_sparse", ((6, 2), 3, 5))
    with pytest.raises(ValueError, match="`axis` 2 is out of range for a 2-D array"):
        jsr.sum(x, axis=2)
    with pytest.raises(TypeError, match=r"`axis` must be None or an int, got \(0, 1\)"):
        jsr.sum(x, axis=(0, 1))
    np.testing.assert_array_equal(np.asarray(jsr.sum(jnp.ones((2, 3)), axis=1)), [3, 3])


@pytest.mark.parametrize("kind,case", CASES, ids=str)
def test_square_sum(kind, case, jit_mode):
    x = make(kind, case)
    dense = _dense_of(x).astype(np.float64)
    axes = [a for a in (None, 0, 1, -1) if a is None or -x.ndim <= a < x.ndim]
    combos = [(a, k) for a in axes for k in (True, False)]
    outs = jit_mode(lambda x: [jsr.square_sum(x, axis=a, keepdims=k) for a, k in combos])(x)
    for out, (axis, keepdims) in zip(outs, combos, strict=True):
        sparse_out = kind == "row_sparse" and axis is not None and axis % x.ndim >= 1 and keepdims
        jsrt.assert_allclose(
            out,
            (dense**2).sum(axis=axis, keepdims=keepdims),
            stype="row_sparse" if sparse_out else "default",
        )
        if sparse_out:
            np.testing.assert_array_equal(np.asarray(out.indices), np.asarray(x.indices))


@pytest.mark.parametrize("fmt", ["row_sparse", "csr"])
def test_numpys_sum_calls_the_method(fmt):
    """``np.sum(x)`` calls ``x.sum(axis=..., dtype=..., out=...)``: it gives
    the sum (in ``dtype`` when given) and refuses an ``out`` array."""
    x = jsr.RowSparse([[1.0, 2.0], [3.0, 4.5]], [0, 2], shape=(3, 2))
    x = x if fmt == "row_sparse" else x.tostype("csr")
    dense = np.asarray(x.todense())
    np.testing.assert_array_equal(np.sum(x), dense.sum())
    np.testing.assert_array_equal(np.sum(x, axis=0), dense.sum(axis=0))
    half = x.sum(dtype=jnp.float16)
    assert half.dtype == jnp.float16 and float(half) == 10.5
    with pytest.raises(TypeError, match="`out` is not supported"):
        np.sum(x, out=np.zeros(()))


def test_square_sum_dense_input():
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(jsr.square_sum(x)), [[5.0], [50.0]])


@pytest.mark.parametrize("kind,case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_norm(kind, case, dtype, jit_mode):
    x = make(kind, case, dtype)
    out = jit_mode(jsr.norm)(x)
    assert out.shape == () and out.dtype == dtype
    jsrt.assert_allclose(out, np.linalg.norm(_dense_of(x).astype(np.float64).ravel()))


def test_norm_ignores_padding_and_dense_input():
    x = jsr.RowSparse._make(jnp.array([[3.0, 4.0], [0.0, 0.0]]), jnp.array([1, 5]), (5, 2))
    assert float(jsr.norm(x)) == 5.0
    assert float(jsr.norm(jnp.array([3.0, 4.0]))) == 5.0


@pytest.mark.parametrize(
    "values,dtype",
    [([[1j, 2.0]], np.complex64), ([[50000, 0]], np.int32), ([[3, -4]], np.int8)],
)
def test_norm_of_complex_and_integer_data_follows_jnp_linalg_norm(values, dtype):
    """sum(square(x)) gave a complex 'norm' for complex data and overflowed ints."""
    x = jsr.row_sparse_array((np.array(values, dtype), [1]), shape=(3, 2))
    want = jnp.linalg.norm(jnp.asarray(x.asnumpy()).reshape(-1))
    got = jsr.norm(x)
    assert got.dtype == want.dtype and not jnp.iscomplexobj(got)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    np.testing.assert_allclose(float(jsr.norm(x.asnumpy())), float(want), rtol=1e-6)


@pytest.mark.parametrize("axis", [np.int64(0), np.int32(-1), np.intp(1)])
def test_numpy_integer_axes_are_accepted(axis):
    """As in jnp.sum; `axis=np.int64(0)` raised a TypeError."""
    dense = np.array([[0.0, 0.0], [1.0, 2.0], [0.0, 3.0]], np.float32)
    x = jsr.cast_storage(jnp.asarray(dense), "row_sparse")
    np.testing.assert_array_equal(np.asarray(jsr.sum(x, axis=axis)), dense.sum(axis=int(axis)))
    with pytest.raises(TypeError, match=r"`axis` must be None or an int, got True"):
        jsr.sum(x, axis=True)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("axis", [0, 1])
def test_csr_sums_of_halves_accumulate_in_float32(dtype, axis, jit_mode):
    """A CSR's column and row sums added in bfloat16 stopped at 256 for 1000
    ones (and float16's 60000 + 60000 - 60000 was inf); jnp.sum accumulates
    halves in float32, as the total already did."""
    cases = [np.ones((1000, 3))]
    if dtype == jnp.float16:
        big = np.zeros((3, 3))
        big[:, 0] = [60000, 60000, -60000]
        cases.append(big)
    for dense in cases:
        x = jnp.asarray(dense if axis == 0 else dense.T, dtype)  # summed along 1000 / 3
        got = jit_mode(lambda c: jsr.sum(c, axis=axis))(jsr.csr_matrix(x))
        want = jnp.sum(x, axis=axis)
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
        assert np.all(np.isfinite(np.asarray(got, np.float32)))


@pytest.mark.parametrize("kind,case", CASES, ids=str)
def test_sum_method_matches_numpy(kind, case, jit_mode):
    """``x.sum(axis, keepdims)`` on RowSparse and CSR, as numpy's and
    scipy.sparse's arrays have it (``jnp.sum`` refuses sparse arrays)."""
    x = make(kind, case)
    axes = [None] + list(range(x.ndim)) + [-1]
    f = jit_mode(lambda x: [x.sum(axis=a, keepdims=k) for a in axes for k in (False, True)])
    dense = _dense_of(x)
    got = iter(f(x))
    for a in axes:
        for k in (False, True):
            out = next(got)
            assert isinstance(out, jax.Array)
            np.testing.assert_allclose(
                np.asarray(out), dense.sum(axis=a, keepdims=k), rtol=1e-6, atol=1e-6
            )


def test_sum_method_bad_axis_names_it():
    x = make("row_sparse", ((6, 2), 3, 5))
    with pytest.raises(ValueError, match="`axis` 2 is out of range for a 2-D array"):
        x.sum(axis=2)
