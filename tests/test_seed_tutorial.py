"""The examples of the MXNet RowSparseNDArray tutorial (seeds 000 / 001),
reproduced with the values the tutorial prints."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_rows as jsr


def test_row_sparse_format_2d_and_3d():
    dense = np.array([[1, 2, 3], [0, 0, 0], [4, 0, 5], [0, 0, 0], [0, 0, 0]], np.float32)
    a = jsr.RowSparse.fromdense(dense)
    assert a.data.tolist() == [[1, 2, 3], [4, 0, 5]] and a.indices.tolist() == [0, 2]
    dense3 = np.array(
        [[[1, 0], [0, 2], [3, 4]], [[5, 0], [6, 0], [0, 0]], [[0, 0], [0, 0], [0, 0]]], np.float32
    )
    b = jsr.RowSparse.fromdense(dense3)
    assert b.data.tolist() == dense3[:2].tolist() and b.indices.tolist() == [0, 1]
    assert b.stype == "row_sparse"


def test_array_creation_dtype_and_inspection():
    shape = (6, 2)
    a = jsr.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=shape)
    b = jsr.row_sparse_array((np.array([[1, 2], [3, 4]]), np.array([1, 4])), shape=shape)
    assert repr(a) == "RowSparse(float32[6, 2], rows=2)" and a.shape == b.shape == (6, 2)
    c = jsr.row_sparse_array(a)
    d = jsr.row_sparse_array(a, dtype=np.float16)
    assert (c.dtype, d.dtype) == (np.float32, np.float16)
    expected = np.array([[0, 0], [1, 2], [0, 0], [0, 0], [3, 4], [0, 0]], np.float32)
    out = a.asnumpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(b.asnumpy(), expected)
    assert a.stype == "row_sparse"
    assert a.data.tolist() == [[1.0, 2.0], [3.0, 4.0]] and a.indices.tolist() == [1, 4]


def test_storage_type_conversion_and_copies():
    ones = jnp.ones((2, 2))
    rsp = jsr.cast_storage(ones, "row_sparse")  # dense arrays: the free function form
    dense = rsp.tostype("default")
    assert rsp.stype == "row_sparse" and jsr.stype(dense) == "default"
    np.testing.assert_array_equal(np.asarray(dense), [[1, 1], [1, 1]])
    rsp2 = jsr.cast_storage(ones, "row_sparse")
    np.testing.assert_array_equal(np.asarray(jsr.cast_storage(rsp2, "default")), np.ones((2, 2)))
    a = jsr.cast_storage(jnp.ones((2, 2)), "row_sparse")
    b = a.copy()
    assert b is not a
    np.testing.assert_array_equal(b.asnumpy(), [[1.0, 1.0], [1.0, 1.0]])
    # `c[:] = a` / `a.copyto(d)` into row_sparse zeros: JAX arrays are immutable,
    # so the copy is a new array of the destination's storage type.
    c = jsr.zeros("row_sparse", (2, 2))
    c = jsr.cast_storage(a, c.stype)
    assert c.stype == "row_sparse" and c.dtype == np.float32
    np.testing.assert_array_equal(c.asnumpy(), [[1.0, 1.0], [1.0, 1.0]])
    # `e[:] = g` / `g.copyto(f)` from a dense source keep the destination's type:
    # {'e.stype': 'row_sparse', 'f.stype': 'row_sparse', 'g.stype': 'default'}
    e = jsr.zeros("row_sparse", (2, 2))
    g = jnp.ones(e.shape)
    e = jsr.cast_storage(g, e.stype)
    assert (e.stype, jsr.stype(g)) == ("row_sparse", "default")
    np.testing.assert_array_equal(e.asnumpy(), np.ones((2, 2)))


def test_retain_row_slices():
    rsp = jsr.row_sparse_array(([[1, 2], [3, 4], [5, 6]], [0, 2, 3]), shape=(5, 2))
    np.testing.assert_array_equal(rsp.asnumpy(), [[1, 2], [0, 0], [3, 4], [5, 6], [0, 0]])
    kept = jsr.retain(rsp, jnp.array([0, 1]))
    assert kept.stype == "row_sparse" and kept.shape == (5, 2)
    np.testing.assert_array_equal(kept.asnumpy(), [[1, 2], [0, 0], [0, 0], [0, 0], [0, 0]])


def transpose_dot():
    lhs = jsr.csr_matrix(([7, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    return jsr.dot(lhs, jnp.ones((3, 2)), transpose_a=True)


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_dot_csr_transposed_dense_is_row_sparse(mode):
    out = transpose_dot() if mode == "eager" else jax.jit(transpose_dot)()
    assert out.stype == "row_sparse" and out.shape == (5, 2)
    np.testing.assert_array_equal(out.asnumpy(), [[7, 7], [9, 9], [8, 8], [0, 0], [0, 0]])


def test_storage_type_inference():
    a = transpose_dot().copy()
    b = a * 2  # zero times 2 is still zero
    c = a + jnp.ones((5, 2))
    assert (b.stype, jsr.stype(c)) == ("row_sparse", "default")
    np.testing.assert_array_equal(b.asnumpy(), 2 * np.asarray(a))
    np.testing.assert_array_equal(np.asarray(c), np.asarray(a) + 1)


def test_dense_fallback_with_warning():
    a = transpose_dot().copy()
    with pytest.warns(jsr.StorageFallbackWarning, match="log"):
        d = jsr.apply_dense(jnp.log, a)
    assert (a.stype, jsr.stype(d)) == ("row_sparse", "default")
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(np.asarray(d), np.log(np.asarray(a)))
    # `e = mx.nd.log(a, out=e)` with a row_sparse `e`: the dense result cast to
    # the output's storage type; {'a.stype': 'row_sparse', 'd.stype': 'default',
    # 'e.stype': 'row_sparse'}
    e = jsr.zeros("row_sparse", a.shape)
    with pytest.warns(jsr.StorageFallbackWarning, match="log"):
        e = jsr.cast_storage(jsr.apply_dense(jnp.log, a), e.stype)
    assert (a.stype, jsr.stype(d), e.stype) == ("row_sparse", "default", "row_sparse")
    np.testing.assert_array_equal(e.asnumpy(), np.asarray(d))


def test_motivation_dot_and_its_row_sparse_gradient():
    """Seeds 000 / 001, "Motivation": Y = dot(X, W) = [[3, 4, 5]] for X = [[1, 0]],
    and grad_W = dot(X, ones_like(Y), transpose_a=True) = [[1, 1, 1], [0, 0, 0]]:
    only the row X touches is non-zero, so grad_W is row-sparse."""
    x = jsr.csr_matrix(np.array([[1.0, 0.0]], np.float32))
    w = jnp.array([[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
    y = jsr.dot(x, w)
    np.testing.assert_array_equal(np.asarray(y), [[3.0, 4.0, 5.0]])
    grad_w = jsr.dot(x, jnp.ones_like(y), transpose_a=True)
    assert grad_w.stype == "row_sparse" and grad_w.indices.tolist() == [0]
    np.testing.assert_array_equal(grad_w.asnumpy(), [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    # the same gradient from autodiff: d sum(Y) / dW
    auto = jax.grad(lambda w: jnp.sum(jsr.dot(x, w)))(w)
    np.testing.assert_array_equal(np.asarray(auto), grad_w.asnumpy())
