"""Padding slots stay zero when a dense operand or a scalar is inf or nan (or
becomes one in the data's dtype), and sparse reductions accumulate like
jnp.sum."""

from __future__ import annotations

import operator
import warnings

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


def _padded_of(fmt, dtype):
    if fmt == "row_sparse":
        return _padded().astype(dtype)
    # one stored entry and one padding slot
    data = jnp.array([1.5, 0.0], dtype)
    return jsr.CSR(data, jnp.array([0, 2]), jnp.array([0, 1, 1, 1]), (3, 2))


@pytest.mark.parametrize(
    "dtype,op,scalar",
    [
        (jnp.float16, "multiply", 65536.0),  # inf in float16 (a loss scale)
        (jnp.float16, "divide", 1e-8),  # 0 in float16
        (jnp.bfloat16, "multiply", 1e39),
        (jnp.bfloat16, "divide", 1e-45),
        (jnp.float16, "power", 1e-8),  # 0 in float16: x ** 0 is 1 everywhere, so dense
    ],
)
@pytest.mark.parametrize("fmt", ["row_sparse", "csr"])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # jax's own
def test_a_scalar_that_overflows_in_the_data_dtype_keeps_padding_zero(
    fmt, dtype, op, scalar, jit_mode
):
    """The scalar is tested as the op computes with it, in the data's dtype:
    a finite Python float that is inf or 0 there masks the padding slots
    like an explicit inf or 0 would, so sums and norms see no 0 * inf."""
    a = _padded_of(fmt, dtype)
    fn = {"multiply": operator.mul, "divide": operator.truediv, "power": operator.pow}[op]
    dense = np.asarray(a.todense(), np.float32)
    stored = dense != 0
    want = np.asarray(fn(jnp.asarray(dense, dtype), scalar), np.float32)
    if op != "power":
        want = np.where(stored, want, 0)
    with pytest.warns(jsr.StorageFallbackWarning) if op == "power" else _no_warning():
        out, total = jit_mode(lambda x: (lambda y: (y, jsr.sum(y)))(fn(x, scalar)))(a)
    got = out.todense() if jsr.is_sparse(out) else out
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
    np.testing.assert_array_equal(np.float32(total), np.sum(want, dtype=np.float32))
    if jsr.is_sparse(out):
        jsr.check(out)


class _no_warning(warnings.catch_warnings):
    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("error", jsr.StorageFallbackWarning)


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
