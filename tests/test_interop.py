"""Interop with scipy.sparse and jax.experimental.sparse.BCOO."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from jax.experimental import sparse as jsparse

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "lil"])
@pytest.mark.parametrize("shape", [(0, 3), (4, 5), (3, 0)])
def test_from_scipy_any_format(fmt, shape):
    m = sp.random(*shape, density=0.4, format=fmt, random_state=0)
    x = jsr.from_scipy(m)
    jsrt.assert_allclose(x, m.toarray(), stype="csr", dtype=jnp.float32)
    assert jsr.csr_matrix(m).nse == x.nse


def test_from_scipy_sums_duplicates_and_sorts():
    m = sp.csr_matrix(
        (np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3, 3])), shape=(2, 3)
    )
    x = jsr.from_scipy(m)
    assert x.indices.tolist() == [0, 2] and x.data.tolist() == [2.0, 4.0]
    with pytest.raises(TypeError, match="`m` must be a scipy.sparse matrix, got ndarray"):
        jsr.from_scipy(np.ones((2, 2)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_to_scipy_roundtrip(dtype):
    rng = np.random.default_rng(0)
    c = jsrt.random_csr(rng, (5, 4), density=0.4, nse=12, dtype=dtype)
    m = c.to_scipy()
    assert isinstance(m, sp.csr_matrix) and m.nnz == int(c.nnz)  # padding excluded
    np.testing.assert_array_equal(m.toarray(), np.asarray(c).astype(np.float32))
    r = jsrt.random_rowsparse(rng, (6, 3), n_rows=2, capacity=4, dtype=dtype)
    mr = jsr.to_scipy(r)
    np.testing.assert_array_equal(mr.toarray(), np.asarray(r).astype(np.float32))
    back = jsr.from_scipy(m)
    np.testing.assert_array_equal(np.asarray(back), m.toarray())


def test_to_scipy_bad_input():
    with pytest.raises(ValueError, match="only 2-D row_sparse arrays convert to scipy"):
        jsr.to_scipy(jsr.zeros("row_sparse", (2, 2, 2)))
    with pytest.raises(TypeError, match="`x` must be a RowSparse or CSR, got ArrayImpl"):
        jsr.to_scipy(jnp.ones((2, 2)))


@pytest.mark.parametrize(
    "shape,n_rows,cap", [((6, 2), 2, 4), ((5, 2, 3), 3, 3), ((0, 2), 0, 1), ((4,), 2, 2)]
)
def test_bcoo_roundtrip_rowsparse(shape, n_rows, cap, jit_mode):
    r = jsrt.random_rowsparse(np.random.default_rng(1), shape, n_rows=n_rows, capacity=cap)
    b = jit_mode(jsr.to_bcoo)(r)
    assert isinstance(b, jsparse.BCOO) and b.n_sparse == 1 and b.n_dense == len(shape) - 1
    np.testing.assert_array_equal(np.asarray(b.todense()), np.asarray(r))
    back = jit_mode(jsr.from_bcoo)(b)
    jsrt.assert_allclose(back, np.asarray(r), stype="row_sparse")


def test_bcoo_roundtrip_csr(jit_mode):
    c = jsrt.random_csr(np.random.default_rng(2), (5, 4), density=0.4, nse=10)
    b = jit_mode(jsr.to_bcoo)(c)
    assert b.n_sparse == 2
    np.testing.assert_array_equal(np.asarray(b.todense()), np.asarray(c))
    jsrt.assert_allclose(jsr.from_bcoo(b, stype="csr"), np.asarray(c), stype="csr")
    jsrt.assert_allclose(jsr.from_bcoo(b), np.asarray(c), stype="row_sparse")


def test_from_bcoo_unsorted_duplicates_and_padding():
    b = jsparse.BCOO(
        (
            jnp.array([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0], [0.0, 0.0]]),
            jnp.array([[2], [0], [2], [3]]),
        ),
        shape=(3, 2),
    )  # id 3 = padding
    expected = [[2, 2], [0, 0], [6, 6]]
    x = jsr.from_bcoo(b)
    assert x.indices.tolist() == [0, 2]
    jsrt.assert_allclose(x, expected, stype="row_sparse")
    xj = jax.jit(jsr.from_bcoo)(b)
    assert xj.capacity == 4  # keeps the static nse under jit
    jsrt.assert_allclose(xj, expected, stype="row_sparse")


def test_from_bcoo_bad_input():
    with pytest.raises(TypeError, match="`m` must be a jax.experimental.sparse.BCOO"):
        jsr.from_bcoo(jnp.ones((2, 2)))
    b = jsparse.BCOO.fromdense(jnp.ones((2, 2, 2)), n_batch=1)
    with pytest.raises(ValueError, match="batched BCOO"):
        jsr.from_bcoo(b)
    with pytest.raises(ValueError, match="`stype` must be 'row_sparse' or 'csr'"):
        jsr.from_bcoo(jsparse.BCOO.fromdense(jnp.ones((2, 2))), stype="default")
    with pytest.raises(ValueError, match="under jit supports only"):
        jax.jit(lambda b: jsr.from_bcoo(b, stype="csr"))(jsparse.BCOO.fromdense(jnp.eye(2)))
