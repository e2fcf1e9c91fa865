"""Padding slots stay zero when a dense operand holds inf or nan, and sparse
reductions accumulate like jnp.sum (regressions found in review)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_rows as jsr

STORED = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)


def _padded():
    return jsr.RowSparse(STORED, [0, 1], shape=(3, 2)).with_capacity(4)


def _oracle(stored_result):
    """Row-sparse semantics: unstored rows stay zero (a dense product would give
    0 * inf = nan there; the sparse result does not compute them at all)."""
    out = np.zeros((3,) + stored_result.shape[1:], np.float32)
    out[:2] = stored_result
    return out


def test_rsp_times_broadcast_dense_with_inf_keeps_padding_zero(jit_mode):
    a = _padded()
    d = jnp.array([jnp.inf, 1.0])
    out = jit_mode(lambda x, y: x * y)(a, d)
    jsr.check(out)
    np.testing.assert_array_equal(np.asarray(out.data[2:]), 0)
    np.testing.assert_array_equal(np.asarray(out.todense()), _oracle(STORED * np.asarray(d)))
    assert float(jit_mode(jsr.sum)(out)) == np.inf


def test_rsp_dot_dense_with_inf_keeps_padding_zero(jit_mode):
    a = _padded()
    rhs = jnp.array([[jnp.inf, 1.0], [1.0, 1.0]])
    out = jit_mode(jsr.dot)(a, rhs)
    jsr.check(out)
    np.testing.assert_array_equal(np.asarray(out.data[2:]), 0)
    np.testing.assert_array_equal(np.asarray(out.todense()), _oracle(STORED @ np.asarray(rhs)))


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.float16])
def test_csr_sum_accumulates_like_jnp_sum(jit_mode, axis, dtype):
    dense = np.ones((200, 3), dtype)
    dense[5, 1] = 0
    x = jsr.csr_matrix(jnp.asarray(dense))
    out = jit_mode(lambda v: jsr.sum(v, axis=axis))(x)
    expected = jnp.sum(jnp.asarray(dense), axis=axis)
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(expected, np.float64))
