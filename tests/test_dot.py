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


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "m,k,p,pad",
    [(5, 7, 3, 0), (5, 7, 3, 4), (1, 1, 1, 0), (0, 4, 2, 0), (4, 0, 2, 0), (6, 9, 1, 2)],
)
def test_csr_dense(jit_mode, rng, dtype, m, k, p, pad):
    x, dense = _random_csr(rng, m, k, pad=pad, dtype=dtype)
    y = rng.standard_normal((k, p)).astype(dtype)
    out = jit_mode(jsr.dot)(x, jnp.asarray(y))
    assert jsr.stype(out) == "default" and out.shape == (m, p) and out.dtype == dtype
    _close(out, dense.astype(np.float64) @ y, dtype)


def test_csr_dense_vector_and_transpose_b(jit_mode, rng):
    x, dense = _random_csr(rng, 4, 6)
    v = rng.standard_normal(6).astype(np.float32)
    _close(jit_mode(jsr.dot)(x, jnp.asarray(v)), dense @ v)
    yt = rng.standard_normal((3, 6)).astype(np.float32)
    out = jit_mode(lambda a, b: jsr.dot(a, b, transpose_b=True))(x, jnp.asarray(yt))
    _close(out, dense @ yt.T)


@pytest.mark.parametrize("m,k,p,pad", [(5, 7, 3, 0), (5, 7, 3, 3), (0, 4, 2, 0), (3, 8, 1, 0)])
def test_csr_transpose_dense(jit_mode, rng, m, k, p, pad):
    x, dense = _random_csr(rng, m, k, pad=pad)
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


@pytest.mark.parametrize("pad", [0, 2])
def test_rowsparse_dense(jit_mode, rng, pad):
    r, rdense = _random_rsp(rng, 8, 5, rows=3, pad=pad)
    y = rng.standard_normal((5, 4)).astype(np.float32)
    out = jit_mode(jsr.dot)(r, jnp.asarray(y))
    assert out.stype == "row_sparse" and out.shape == (8, 4)
    np.testing.assert_array_equal(np.asarray(out.indices), np.asarray(r.indices))
    _close(out.todense(), rdense @ y)
    y2 = rng.standard_normal((8, 2)).astype(np.float32)
    out_t = jit_mode(lambda a, b: jsr.dot(a, b, transpose_a=True))(r, jnp.asarray(y2))
    assert jsr.stype(out_t) == "default"
    _close(out_t, rdense.T @ y2)


def test_dense_sparse(jit_mode, rng):
    x, dense = _random_csr(rng, 5, 6, pad=2)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    _close(jit_mode(jsr.dot)(jnp.asarray(a), x), a @ dense)
    r, rdense = _random_rsp(rng, 5, 4, rows=2, pad=1)
    _close(jit_mode(jsr.dot)(jnp.asarray(a), r), a @ rdense)
    _close(jnp.asarray(a) @ r, a @ rdense)  # __rmatmul__
    _close(x @ jnp.ones((6, 2)), dense @ np.ones((6, 2)))  # __matmul__


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


@given(
    m=st.integers(0, 6),
    k=st.integers(1, 8),
    p=st.integers(1, 3),
    density=st.floats(0, 1),
    pad=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_csr_products_property(m, k, p, density, pad, seed):
    rng = np.random.default_rng(seed)
    x, dense = _random_csr(rng, m, k, density=density, pad=pad)
    y = rng.standard_normal((k, p)).astype(np.float32)
    yt = rng.standard_normal((m, p)).astype(np.float32)
    fwd, bwd = jax.jit(lambda a, b, c: (jsr.dot(a, b), jsr.dot(a, c, transpose_a=True)))(
        x, jnp.asarray(y), jnp.asarray(yt)
    )
    _close(fwd, dense @ y)
    _close(bwd.todense(), dense.T @ yt)


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
