"""jsr.dot: every storage combination against numpy, eager and jitted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxsparse_rows as jsr

# Every test runs with the native CPU kernels (where built) and with pure XLA.
pytestmark = pytest.mark.usefixtures("kernels")


def _random_csr(rng, m, k, density=0.3, pad=0, dtype=np.float32):
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < density)
    dense = dense.astype(dtype)
    x = jsr.CSR.fromdense(jnp.asarray(dense))
    if pad:
        nnz = x.nse
        x = jsr.CSR._make(
            jnp.concatenate([x.data, jnp.zeros((pad,), x.dtype)]),
            jnp.concatenate([x.indices, jnp.full((pad,), k, x.indices.dtype)]),
            x.indptr,
            x.shape,
        )
        assert x.nse == nnz + pad
    return x, dense


def _random_rsp(rng, n, d, rows, pad=0, dtype=np.float32):
    idx = np.sort(rng.choice(n, size=rows, replace=False)).astype(np.int32)
    data = rng.standard_normal((rows, d)).astype(dtype)
    x = jsr.row_sparse_array((data, idx), shape=(n, d))
    if pad:
        x = x.with_capacity(rows + pad)
    dense = np.zeros((n, d), dtype)
    dense[idx] = data
    return x, dense


def _close(a, b, dtype=np.float32):
    tol = {np.float32: 1e-5, np.float16: 2e-2}.get(dtype, 1e-5)
    np.testing.assert_allclose(
        np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol
    )


# Rounding bound per element, relative to (|a| @ |b|): a few units in the last
# place times the (short) inner dimension; integers must be exact.
_REL_BOUND = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2, "int32": 0.0}


def _values(rng, shape, dtype):
    """Random operand values in ``dtype``: small ints, or normal floats."""
    if jnp.issubdtype(dtype, jnp.integer):
        return rng.integers(-3, 4, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _check_product(out, a, b, dtype):
    """``out`` equals the float64 product of the (already rounded) numpy operands
    ``a @ b`` within the rounding bound of ``dtype``; same shape and dtype."""
    out = out.todense() if jsr.is_sparse(out) else out
    assert out.dtype == dtype, (out.dtype, dtype)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    exact = a64 @ b64
    got = np.asarray(out, np.float64)
    assert got.shape == exact.shape, (got.shape, exact.shape)
    limit = _REL_BOUND[jnp.dtype(dtype).name] * (np.abs(a64) @ np.abs(b64))
    err = np.abs(got - exact)
    assert np.all(err <= limit), f"max excess {np.max(err - limit)} (got {got}, want {exact})"


def _csr_from_dense(dense, nse=None):
    """A CSR holding the non-zeros of the numpy ``dense``, built in numpy, padded
    (column id K, zero value) to ``nse`` slots."""
    m, k = dense.shape
    rows, cols = np.nonzero(dense)
    nse = len(rows) if nse is None else nse
    data = np.zeros(nse, dense.dtype)
    data[: len(rows)] = dense[rows, cols]
    ind = np.full(nse, k, np.int32)
    ind[: len(rows)] = cols
    indptr = np.zeros(m + 1, np.int32)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    x = jsr.CSR(jnp.asarray(data), jnp.asarray(ind), jnp.asarray(indptr), (m, k))
    assert x.nse == nse
    return x


def _sparse_dense(rng, m, k, density, dtype):
    """A numpy ``[m, k]`` matrix of ``dtype`` with about ``density`` non-zeros."""
    return _values(rng, (m, k), dtype) * (rng.random((m, k)) < density).astype(dtype)


def _rsp_from_dense_rows(rng, n, trailing, rows, pad, dtype):
    """A RowSparse storing ``rows`` random rows of an ``[n, *trailing]`` array,
    built in numpy, plus ``pad`` padding slots; and its numpy form."""
    idx = np.sort(rng.choice(n, size=rows, replace=False)).astype(np.int32)
    data = np.zeros((rows + pad,) + trailing, dtype)
    data[:rows] = _values(rng, (rows,) + trailing, dtype)
    ind = np.full(rows + pad, n, np.int32)
    ind[:rows] = idx
    x = jsr.RowSparse(jnp.asarray(data), jnp.asarray(ind), (n,) + trailing)
    dense = np.zeros((n,) + trailing, dtype)
    dense[idx] = data[:rows]
    return x, dense


def test_seed_transpose_dot(jit_mode):
    """Seed 000/001: dot(csr, ones, transpose_a=True) is row_sparse [[7,7],[9,9],[8,8],0,0]."""
    lhs = jsr.csr_matrix(([7, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    out = jit_mode(lambda a, b: jsr.dot(a, b, transpose_a=True))(lhs, jnp.ones((3, 2)))
    assert out.stype == "row_sparse" and out.shape == (5, 2)
    np.testing.assert_array_equal(
        out.asnumpy(), np.array([[7, 7], [9, 9], [8, 8], [0, 0], [0, 0]], np.float32)
    )
    # Rows are the column ids structurally present in the csr.
    np.testing.assert_array_equal(np.asarray(out.indices), [0, 1, 2])


CSR_DENSE_SHAPES = [
    (5, 7, 3, 0),
    (5, 7, 3, 4),
    (1, 1, 1, 0),
    (0, 4, 2, 0),
    (4, 0, 2, 0),
    (6, 9, 1, 2),
]


@pytest.mark.parametrize(
    "m,k,p,pad,dtype",
    [(*c, d) for d in (np.float32, np.float16) for c in CSR_DENSE_SHAPES]
    + [(5, 7, 3, 4, np.int32)],
)
def test_csr_dense(jit_mode, rng, dtype, m, k, p, pad):
    dense = _sparse_dense(rng, m, k, 0.3, dtype)
    x = _csr_from_dense(dense, nse=int(np.count_nonzero(dense)) + pad)
    y = _values(rng, (k, p), dtype)
    out = jit_mode(jsr.dot)(x, jnp.asarray(y))
    assert jsr.stype(out) == "default" and out.shape == (m, p)
    _check_product(out, dense, y, dtype)


def test_csr_dense_vector_and_transpose_b(jit_mode, rng):
    x, dense = _random_csr(rng, 4, 6)
    v = rng.standard_normal(6).astype(np.float32)
    _close(jit_mode(jsr.dot)(x, jnp.asarray(v)), dense @ v)
    yt = rng.standard_normal((3, 6)).astype(np.float32)
    out = jit_mode(lambda a, b: jsr.dot(a, b, transpose_b=True))(x, jnp.asarray(yt))
    _close(out, dense @ yt.T)


@pytest.mark.parametrize(
    "m,k,p,pad,density",
    [
        (5, 7, 3, 0, 0.3),
        (5, 7, 3, 3, 0.3),
        (0, 4, 2, 0, 0.3),  # M = 0
        (3, 8, 1, 0, 0.3),
        (4, 0, 2, 2, 0.3),  # K = 0, padded
        (5, 7, 3, 2, 0.0),  # nnz = 0, padded
    ],
)
def test_csr_transpose_dense(jit_mode, rng, m, k, p, pad, density):
    x, dense = _random_csr(rng, m, k, density=density, pad=pad)
    y = rng.standard_normal((m, p)).astype(np.float32)
    out = jit_mode(lambda a, b: jsr.dot(a, b, transpose_a=True))(x, jnp.asarray(y))
    assert out.stype == "row_sparse" and out.shape == (k, p)
    assert out.capacity == min(x.nse, k)
    _close(out.todense(), dense.T @ y)
    present = np.unique(np.asarray(x.indices)[: int(x.nnz)])
    np.testing.assert_array_equal(np.asarray(out.indices)[: len(present)], present)
    jsr.check(out)


@pytest.mark.parametrize("pad", [0, 2])
def test_csr_rowsparse(jit_mode, rng, pad):
    x, dense = _random_csr(rng, 6, 10, density=0.4)
    r, rdense = _random_rsp(rng, 10, 3, rows=4, pad=pad)
    out = jit_mode(jsr.dot)(x, r)
    assert jsr.stype(out) == "default"
    _close(out, dense @ rdense)
    y = rng.standard_normal((6, 3)).astype(np.float32)
    r2, r2dense = _random_rsp(rng, 6, 3, rows=2, pad=pad)
    out_t = jit_mode(lambda a, b: jsr.dot(a, b, transpose_a=True))(x, r2)
    assert out_t.stype == "row_sparse"
    _close(out_t.todense(), dense.T @ r2dense)
    del y


def test_csr_rowsparse_empty_capacity(jit_mode, rng):
    x, dense = _random_csr(rng, 3, 5)
    r = jsr.zeros("row_sparse", (5, 2))
    out = jit_mode(jsr.dot)(x, r)
    np.testing.assert_array_equal(np.asarray(out), np.zeros((3, 2), np.float32))


# The products below run no native kernel (``test_paths_without_kernels``
# checks that), so they run once, with ``kernels=xla``, not twice.
XLA_ONLY = pytest.mark.parametrize("kernels", ["xla"], indirect=True)


def test_paths_without_kernels(kernels):
    """dot(rsp, dense), its transpose and dense @ sparse lower to no kernel
    call, with the kernels on."""
    from jaxsparse_rows import _native

    r = jsr.zeros("row_sparse", (4, 3)).with_capacity(2)
    c = _csr_from_dense(np.eye(4, 3, dtype=np.float32), nse=5)
    calls = [
        (lambda a, b: jsr.dot(a, b), (r, jnp.ones((3, 2)))),
        (lambda a, b: jsr.dot(a, b, transpose_a=True), (r, jnp.ones((4, 2)))),
        (lambda a, b: jsr.dot(a, b), (jnp.ones((2, 4)), r)),
        (lambda a, b: jsr.dot(a, b), (jnp.ones((2, 4)), c)),
    ]
    for f, args in calls:
        hlo = jax.jit(f).lower(*args).as_text()
        assert not any(t in hlo for t in _native.TARGETS), hlo
    if kernels == "native":  # the positive control: the float32 csr products do
        hlo = jax.jit(jsr.dot).lower(c, jnp.ones((3, 2))).as_text()
        assert _native.CSR_DENSE.target in hlo
        t_dot = jax.jit(lambda a, b: jsr.dot(a, b, transpose_a=True))
        assert _native.CSR_T_DENSE.target in t_dot.lower(c, jnp.ones((4, 2))).as_text()


# (N, D, stored rows, padding slots, P); P None: a 1-D rhs.
RSP_DENSE_CASES = [
    (8, 5, 3, 0, 4),
    (8, 5, 3, 2, 4),  # padded capacity
    (6, 5, 0, 0, 4),  # capacity 0
    (6, 5, 0, 2, 4),  # nothing stored, padding only
    (0, 5, 0, 0, 4),  # N = 0
    (0, 5, 0, 2, 4),  # N = 0, padded
    (6, 0, 2, 1, 3),  # D = 0
    (6, 5, 3, 1, 0),  # P = 0
    (6, 5, 3, 1, None),  # vector rhs
]
HALF = [np.float16, jnp.bfloat16]
HALF_AND_INT = HALF + [np.int32]


@pytest.mark.parametrize(
    "case,dtype",
    [(c, np.float32) for c in RSP_DENSE_CASES] + [(RSP_DENSE_CASES[1], d) for d in HALF_AND_INT],
    ids=str,
)
@XLA_ONLY
def test_rowsparse_dense(jit_mode, rng, kernels, case, dtype):
    """dot(rsp, dense) keeps the rows (padding too); its transpose is dense."""
    n, d, rows, pad, p = case
    r, rdense = _rsp_from_dense_rows(rng, n, (d,), rows, pad, dtype)
    y = _values(rng, (d,) if p is None else (d, p), dtype)
    out = jit_mode(jsr.dot)(r, jnp.asarray(y))
    assert out.stype == "row_sparse" and out.shape == (n,) + y.shape[1:]
    np.testing.assert_array_equal(np.asarray(out.indices), np.asarray(r.indices))
    jsr.check(out)  # padding slots hold zero rows
    _check_product(out, rdense, y, dtype)
    y2 = _values(rng, (n,) if p is None else (n, p), dtype)
    out_t = jit_mode(lambda a, b: jsr.dot(a, b, transpose_a=True))(r, jnp.asarray(y2))
    assert jsr.stype(out_t) == "default"
    _check_product(out_t, rdense.T, y2, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_csr_products_in_half_precision(jit_mode, rng, dtype):
    """Every csr product (and dense @ sparse) in float16 and bfloat16, on a
    padded csr, against the float64 product of the same rounded operands."""
    m, k, p = 5, 7, 3
    dense = _sparse_dense(rng, m, k, 0.4, dtype)
    x = _csr_from_dense(dense, nse=int(np.count_nonzero(dense)) + 3)
    y, yv, yt = _values(rng, (k, p), dtype), _values(rng, (k,), dtype), _values(rng, (m, p), dtype)
    r, rdense = _rsp_from_dense_rows(rng, k, (p,), 4, 2, dtype)
    rt, rtdense = _rsp_from_dense_rows(rng, m, (p,), 2, 1, dtype)
    a = _values(rng, (2, m), dtype)

    def products(x, y, yv, yt, r, rt, a):
        return (
            jsr.dot(x, y),
            jsr.dot(x, yv),
            jsr.dot(x, yt, transpose_a=True),
            jsr.dot(x, r),
            jsr.dot(x, rt, transpose_a=True),
            jsr.dot(a, x),
            jsr.dot(a, rt),
        )

    outs = jit_mode(products)(x, y, yv, yt, r, rt, a)
    expected = [
        (dense, y, "default"),
        (dense, yv, "default"),
        (dense.T, yt, "row_sparse"),
        (dense, rdense, "default"),
        (dense.T, rtdense, "row_sparse"),
        (a, dense, "default"),
        (a, rtdense, "default"),
    ]
    for out, (lhs, rhs, stype) in zip(outs, expected, strict=True):
        assert jsr.stype(out) == stype
        _check_product(out, lhs, rhs, dtype)


def test_dense_sparse(jit_mode, rng):
    x, dense = _random_csr(rng, 5, 6, pad=2)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    _close(jit_mode(jsr.dot)(jnp.asarray(a), x), a @ dense)
    r, rdense = _random_rsp(rng, 5, 4, rows=2, pad=1)
    _close(jit_mode(jsr.dot)(jnp.asarray(a), r), a @ rdense)
    _close(jnp.asarray(a) @ r, a @ rdense)  # __rmatmul__
    _close(x @ jnp.ones((6, 2)), dense @ np.ones((6, 2)))  # __matmul__


# (P, N, K, kind, stored, padding): dense [P, N] @ sparse [N, K].
DENSE_SPARSE_CASES = [
    (3, 5, 6, "csr", 0.5, 2),
    (3, 5, 6, "csr", 0.0, 3),  # nnz = 0, padded
    (3, 5, 6, "csr", 0.0, 0),  # capacity 0
    (0, 5, 6, "csr", 0.5, 1),  # P = 0
    (3, 5, 0, "csr", 1.0, 1),  # K = 0: (N, 0) csr
    (3, 0, 4, "csr", 1.0, 0),  # N = 0: (0, K) csr
    (3, 0, 4, "csr", 1.0, 2),  # N = 0, padded
    (3, 6, 4, "row_sparse", 3, 2),
    (3, 6, 4, "row_sparse", 0, 0),  # capacity 0
    (0, 6, 4, "row_sparse", 2, 1),  # P = 0
    (3, 6, 0, "row_sparse", 2, 1),  # D = 0
    (3, 0, 4, "row_sparse", 0, 0),  # N = 0
    (3, 0, 4, "row_sparse", 0, 2),  # N = 0, padded
]


@pytest.mark.parametrize("case", DENSE_SPARSE_CASES, ids=str)
@XLA_ONLY
def test_dense_sparse_edge_shapes(jit_mode, rng, kernels, case):
    p, n, k, kind, stored, pad = case
    if kind == "csr":
        sdense = _sparse_dense(rng, n, k, stored, np.float32)
        s = _csr_from_dense(sdense, nse=int(np.count_nonzero(sdense)) + pad)
    else:
        s, sdense = _rsp_from_dense_rows(rng, n, (k,), stored, pad, np.float32)
    a = _values(rng, (p, n), np.float32)
    out = jit_mode(jsr.dot)(jnp.asarray(a), s)
    assert jsr.stype(out) == "default"
    _check_product(out, a, sdense, np.float32)


def test_dense_dense(jit_mode, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal((3, 2)).astype(np.float32)
    out = jit_mode(lambda u, v: jsr.dot(u, v, transpose_a=True))(jnp.asarray(a), jnp.asarray(b))
    _close(out, a.T @ b)


@pytest.mark.parametrize(
    "make",
    [
        lambda rng: (_random_csr(rng, 3, 4), _random_csr(rng, 4, 2)),
        lambda rng: (_random_rsp(rng, 3, 4, 2), _random_rsp(rng, 4, 2, 2)),
        lambda rng: (_random_rsp(rng, 3, 4, 2), _random_csr(rng, 4, 2)),
    ],
)
def test_unsupported_combinations_fall_back_with_warning(rng, make):
    (a, da), (b, db) = make(rng)
    with pytest.warns(jsr.StorageFallbackWarning, match="dot"):
        out = jsr.dot(a, b)
    assert jsr.stype(out) == "default"
    _close(out, da @ db)


def test_sparse_rhs_transpose_b_falls_back(rng):
    x, dense = _random_csr(rng, 3, 4)
    r, rdense = _random_rsp(rng, 2, 4, rows=1)
    with pytest.warns(jsr.StorageFallbackWarning):
        out = jsr.dot(x, r, transpose_b=True)
    _close(out, dense @ rdense.T)


@pytest.mark.parametrize(
    "lhs,rhs,kw,match",
    [
        (jsr.zeros("csr", (3, 5)), jnp.ones((4, 2)), {}, r"inner dimensions differ.*5 != 4"),
        (
            jsr.zeros("csr", (3, 5)),
            jnp.ones((5, 2)),
            {"transpose_a": True},
            r"lhs \(transposed\) has shape \(5, 3\).*3 != 5",
        ),
        (jsr.zeros("row_sparse", (3, 5)), jnp.ones((2, 5)), {}, "inner dimensions differ"),
        (jnp.ones((2, 2, 2)), jnp.ones((2, 2)), {}, "`lhs` must be 1-D or 2-D"),
        (jsr.zeros("csr", (3, 5)), jnp.ones((5, 2, 2)), {}, "`rhs` must be 1-D or 2-D"),
    ],
)
def test_shape_errors(lhs, rhs, kw, match):
    with pytest.raises(ValueError, match=match):
        jsr.dot(lhs, rhs, **kw)


# Shape buckets (M, K, P) of the property test, each with a fixed entry capacity
# (M * K + 2 slots, so the padding varies with the density), so the jitted
# products compile once per bucket and the examples vary sparsity and values.
PRODUCT_BUCKETS = [(0, 4, 2), (4, 0, 2), (5, 7, 0), (1, 1, 1), (5, 7, 3), (6, 8, 1)]
_products = jax.jit(lambda a, b, c: (jsr.dot(a, b), jsr.dot(a, c, transpose_a=True)))


@given(
    shape=st.sampled_from(PRODUCT_BUCKETS),
    density=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_csr_products_property(shape, density, seed):
    m, k, p = shape
    rng = np.random.default_rng(seed)
    dense = _sparse_dense(rng, m, k, density, np.float32)
    x = _csr_from_dense(dense, nse=m * k + 2)
    y = rng.standard_normal((k, p)).astype(np.float32)
    yt = rng.standard_normal((m, p)).astype(np.float32)
    fwd, bwd = _products(x, jnp.asarray(y), jnp.asarray(yt))
    _check_product(fwd, dense, y, np.float32)
    assert bwd.capacity == min(x.nse, k)
    np.testing.assert_array_equal(bwd.indices, _present_columns(dense, bwd.capacity, k))
    _check_product(bwd, dense.T, yt, np.float32)


def _present_columns(dense, capacity, k):
    """The sorted column ids holding a non-zero, padded with K to ``capacity``."""
    present = np.flatnonzero(dense.any(axis=0))
    return np.concatenate([present, np.full(capacity - len(present), k)])


def test_dense_gradients_through_dot(rng):
    """d/d(rhs) of sum(dot(csr, rhs)) matches the dense gradient."""
    x, dense = _random_csr(rng, 4, 6, pad=2)
    y = jnp.asarray(rng.standard_normal((6, 3)).astype(np.float32))
    g = jax.grad(lambda b: jnp.sum(jsr.dot(x, b) ** 2))(y)
    g_ref = jax.grad(lambda b: jnp.sum((jnp.asarray(dense) @ b) ** 2))(y)
    _close(g, g_ref)
    jax.test_util.check_grads(
        lambda b: jsr.dot(x, b), (y,), order=1, modes=["rev"], atol=1e-2, rtol=1e-2
    )


def test_vmap_over_dense_operand(rng):
    x, dense = _random_csr(rng, 4, 6, pad=1)
    ys = jnp.asarray(rng.standard_normal((3, 6, 2)).astype(np.float32))
    out = jax.vmap(lambda y: jsr.dot(x, y))(ys)
    for b in range(3):
        _close(out[b], dense @ np.asarray(ys[b]))
    yts = jnp.asarray(rng.standard_normal((3, 4, 2)).astype(np.float32))
    out_t = jax.vmap(lambda y: jsr.dot(x, y, transpose_a=True).todense())(yts)
    for b in range(3):
        _close(out_t[b], dense.T @ np.asarray(yts[b]))


def test_products_of_a_csr_sharded_over_an_explicit_axis():
    """A CSR whose entries (``data``, ``indices``) are sharded over an explicit
    mesh axis: the products gather its arrays whole first (not a broadcast's
    sharding error), and all three products equal the
    unsharded ones (one-device mesh), and the gradient with respect to the
    values comes back sharded like them, eagerly and under jit."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    x = jsr.csr_matrix(([1.0, 2, 3, 4], [0, 5, 1, 5], [0, 2, 3, 4]), shape=(3, 8))
    d, e, w = jnp.arange(6.0).reshape(3, 2), jnp.ones((8, 2)), jnp.ones((2, 3))
    xd = np.asarray(x.todense())
    mesh = jax.make_mesh((1,), ("b",), axis_types=(AxisType.Explicit,))

    def loss(vals, csr, rhs):
        y = jsr.CSR(vals, csr.indices, csr.indptr, csr.shape)
        return jnp.sum(jsr.dot(y, rhs, transpose_a=True).todense() ** 2)

    want_grad = jax.grad(loss)(x.data, x, d)
    with jax.set_mesh(mesh):
        on = NamedSharding(mesh, P("b"))
        xs = jsr.CSR(jax.device_put(x.data, on), jax.device_put(x.indices, on), x.indptr, x.shape)
        for wrap in (lambda f: f, jax.jit):
            t = wrap(lambda a, b: jsr.dot(a, b, transpose_a=True))(xs, d)
            np.testing.assert_allclose(np.asarray(t.todense()), xd.T @ np.asarray(d))
            np.testing.assert_allclose(np.asarray(wrap(jsr.dot)(xs, e)), xd @ np.asarray(e))
            np.testing.assert_allclose(np.asarray(wrap(jsr.dot)(w, xs)), np.asarray(w) @ xd)
            g = wrap(jax.grad(loss))(xs.data, xs, d)
            assert jax.typeof(g).sharding.spec[0] == "b", jax.typeof(g)
            np.testing.assert_allclose(np.asarray(g), np.asarray(want_grad), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_csr_products_of_halves_accumulate_in_float32(dtype, jit_mode):
    """The CSR products added bfloat16 contributions in bfloat16: 1000 ones
    summed to 256 in dot(csr, dense), in the transposed product and in
    dot(dense, csr). jnp.dot accumulates halves in float32."""
    x = jnp.ones((1000, 2), dtype)
    ones = jnp.ones((1000, 2), dtype)
    cases = {
        "csr @ dense": (lambda c, d: jsr.dot(c, d), jsr.csr_matrix(x.T), ones, x.T @ ones),
        "csr.T @ dense": (
            lambda c, d: jsr.dot(c, d, transpose_a=True).todense(),
            jsr.csr_matrix(x),
            ones,
            x.T @ ones,
        ),
        "dense @ csr": (lambda d, c: jsr.dot(d, c), ones.T, jsr.csr_matrix(x), ones.T @ x),
    }
    for name, (f, a, b, want) in cases.items():
        got = jit_mode(f)(a, b)
        assert got.dtype == dtype, name
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.full((2, 2), 1000.0), name)
        np.testing.assert_array_equal(np.asarray(want, np.float32), np.full((2, 2), 1000.0))
