"""Interop with scipy.sparse and jax.experimental.sparse.BCOO."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from draw import random_csr, random_rowsparse
from jax.experimental import sparse as jsparse

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt


@pytest.mark.parametrize("fmt", ["csr", "coo", "csc", "lil"])
@pytest.mark.parametrize("shape", [(0, 3), (4, 5), (3, 0)])
def test_from_scipy_any_format(fmt, shape):
    m = sp.random(*shape, density=0.4, format=fmt, random_state=0)
    ref = m.tocsr()  # scipy's own csr: sorted, no duplicates, no padding
    assert ref.has_canonical_format
    for x in (jsr.from_scipy(m), jsr.csr_matrix(m)):
        jsrt.assert_allclose(x, m.toarray(), stype="csr", dtype=jnp.float32)
        assert x.nse == ref.nnz
        np.testing.assert_array_equal(x.indptr, ref.indptr)
        np.testing.assert_array_equal(x.indices, ref.indices)
        np.testing.assert_array_equal(x.data, ref.data.astype(np.float32))


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
    c = random_csr(rng, (5, 4), density=0.4, nse=12, dtype=dtype)
    m = c.to_scipy()
    assert isinstance(m, sp.csr_matrix) and m.nnz == int(c.nnz)  # padding excluded
    np.testing.assert_array_equal(m.toarray(), np.asarray(c).astype(np.float32))
    r = random_rowsparse(rng, (6, 3), n_rows=2, capacity=4, dtype=dtype)
    mr = jsr.to_scipy(r)
    np.testing.assert_array_equal(mr.toarray(), np.asarray(r).astype(np.float32))
    back = jsr.from_scipy(m)
    np.testing.assert_array_equal(np.asarray(back), m.toarray())


def test_to_scipy_bad_input():
    with pytest.raises(ValueError, match="only 2-D row_sparse arrays convert to scipy"):
        jsr.to_scipy(jsr.zeros("row_sparse", (2, 2, 2)))
    with pytest.raises(TypeError, match="`x` must be a RowSparse or CSR, got ArrayImpl"):
        jsr.to_scipy(jnp.ones((2, 2)))


DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32]


def _rsp(rng, shape, n_rows, cap, dtype):
    """A RowSparse with ``n_rows`` stored rows and ``cap`` slots, built in numpy;
    its numpy dense form, stored ids and stored rows."""
    n = shape[0]
    ids = np.sort(rng.choice(n, n_rows, replace=False)).astype(np.int32)
    rows = jsrt.random_dense(rng, (n_rows,) + shape[1:], dtype)
    idx = np.concatenate([ids, np.full(cap - n_rows, n, np.int32)])
    data = np.concatenate([rows, np.zeros((cap - n_rows,) + shape[1:], rows.dtype)])
    dense = np.zeros(shape, rows.dtype)
    dense[ids] = rows
    return jsr.RowSparse(jnp.asarray(data), jnp.asarray(idx), shape), dense, ids, rows


@pytest.mark.parametrize(
    "shape,n_rows,cap,dtype",
    [
        ((6, 2), 2, 4, jnp.float32),
        ((5, 2, 3), 3, 3, jnp.float32),  # n-d rows
        ((0, 2), 0, 1, jnp.float32),  # N = 0, padded
        ((4,), 2, 2, jnp.float32),  # 1-D
        ((4, 0), 2, 3, jnp.float32),  # D = 0
        ((5, 3), 0, 0, jnp.float32),  # capacity 0
    ]
    + [((6, 2), 2, 4, d) for d in DTYPES[1:]],
    ids=str,
)
def test_bcoo_roundtrip_rowsparse(shape, n_rows, cap, dtype, jit_mode):
    r, dense, ids, rows = _rsp(np.random.default_rng(1), shape, n_rows, cap, dtype)
    b = jit_mode(jsr.to_bcoo)(r)
    assert isinstance(b, jsparse.BCOO) and b.n_sparse == 1 and b.n_dense == len(shape) - 1
    assert b.dtype == dtype and b.nse == cap
    np.testing.assert_array_equal(np.asarray(b.indices)[:n_rows, 0], ids)
    np.testing.assert_array_equal(np.asarray(b.data)[:n_rows], rows)
    np.testing.assert_array_equal(np.asarray(b.todense()), dense)
    back = jit_mode(jsr.from_bcoo)(b)
    jsrt.assert_allclose(back, dense, stype="row_sparse", dtype=dtype)
    if jit_mode(jsr.stype) is jsr.stype:  # eagerly: exactly the stored rows
        np.testing.assert_array_equal(back.indices, ids)
    else:  # under jit the capacity stays nse
        assert back.capacity == cap


@pytest.mark.parametrize(
    "shape,density,pad,dtype",
    [
        ((5, 4), 0.4, 3, jnp.float32),
        ((0, 3), 0.4, 2, jnp.float32),  # (0, K), padded
        ((3, 0), 0.4, 2, jnp.float32),  # (M, 0), padded
        ((4, 5), 0.0, 2, jnp.float32),  # nnz = 0, padded
        ((4, 5), 0.0, 0, jnp.float32),  # capacity 0
    ]
    + [((5, 4), 0.4, 3, d) for d in DTYPES[1:]],
    ids=str,
)
def test_bcoo_roundtrip_csr(shape, density, pad, dtype, jit_mode):
    rng = np.random.default_rng(2)
    dense = np.where(
        rng.random(shape) < density, jsrt.random_dense(rng, shape, dtype), np.zeros((), dtype)
    )
    r, c = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=shape[0]))])
    data = np.concatenate([dense[r, c], np.zeros(pad, dense.dtype)])
    cols = np.concatenate([c, np.full(pad, shape[1])])
    x = jsr.CSR(
        jnp.asarray(data), jnp.asarray(cols, jnp.int32), jnp.asarray(indptr, jnp.int32), shape
    )
    b = jit_mode(jsr.to_bcoo)(x)
    assert b.n_sparse == 2 and b.dtype == dtype and b.nse == len(r) + pad
    np.testing.assert_array_equal(np.asarray(b.indices)[: len(r)], np.stack([r, c], axis=1))
    np.testing.assert_array_equal(np.asarray(b.todense()), dense)  # padding dropped
    back = jsr.from_bcoo(b, stype="csr")  # other layouts than n_sparse=1 need concrete input
    jsrt.assert_allclose(back, dense, stype="csr", dtype=dtype)
    np.testing.assert_array_equal(back.indptr, indptr)
    np.testing.assert_array_equal(back.indices, c)
    back = jsr.from_bcoo(b)
    jsrt.assert_allclose(back, dense, stype="row_sparse", dtype=dtype)
    np.testing.assert_array_equal(back.indices, np.unique(r))


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_bcoo_sums_duplicates_against_numpy(dtype, jit_mode):
    """Unsorted, repeated ids and BCOO padding (id N): rows summed in numpy."""
    rng = np.random.default_rng(3)
    n, nse = 7, 12
    ids = rng.integers(0, n + 1, nse)  # id n: padding
    data = jsrt.random_dense(rng, (nse, 2), dtype)
    data[ids == n] = 0
    expected = np.zeros((n, 2), np.float64)
    np.add.at(expected, ids[ids < n], data[ids < n].astype(np.float64))
    b = jsparse.BCOO((jnp.asarray(data), jnp.asarray(ids[:, None], jnp.int32)), shape=(n, 2))
    x = jit_mode(jsr.from_bcoo)(b)
    jsrt.assert_allclose(x, expected, stype="row_sparse", dtype=dtype)
    present = np.unique(ids[ids < n])
    np.testing.assert_array_equal(np.asarray(x.indices)[: len(present)], present)


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
    # BCOO inputs from explicit (data, indices): BCOO.fromdense is slow eagerly.
    batched = jsparse.BCOO((jnp.ones((2, 1, 2)), jnp.zeros((2, 1, 1), jnp.int32)), shape=(2, 2, 2))
    assert batched.n_batch == 1
    with pytest.raises(ValueError, match="batched BCOO"):
        jsr.from_bcoo(batched)
    eye = jsparse.BCOO((jnp.ones(2), jnp.array([[0, 0], [1, 1]], jnp.int32)), shape=(2, 2))
    with pytest.raises(ValueError, match="`stype` must be 'row_sparse' or 'csr'"):
        jsr.from_bcoo(eye, stype="default")
    with pytest.raises(ValueError, match="under jit supports only"):
        jax.jit(lambda b: jsr.from_bcoo(b, stype="csr"))(eye)


@pytest.mark.parametrize("stype", ["row_sparse", "csr"])
def test_from_bcoo_refuses_negative_indices_in_every_layout(stype):
    """The one-sparse-dimension path refused -1; the dense path let
    BCOO.todense wrap it to the last row."""
    two = jsparse.BCOO((jnp.array([1.0, 2.0]), jnp.array([[-1, 0], [1, 1]])), shape=(3, 2))
    with pytest.raises(ValueError, match=r"`m` has a negative index \(-1, 0\)"):
        jsr.from_bcoo(two, stype=stype)
    one = jsparse.BCOO((jnp.array([[1.0], [2.0]]), jnp.array([[-1], [1]])), shape=(3, 1))
    with pytest.raises(ValueError, match=r"negative index \(-1,\)|Negative ids are not allowed"):
        jsr.from_bcoo(one, stype=stype)
    # Indices >= shape are BCOO padding, dropped as BCOO.todense drops them.
    padded = jsparse.BCOO((jnp.array([1.0, 2.0]), jnp.array([[3, 0], [1, 1]])), shape=(3, 2))
    np.testing.assert_array_equal(jsr.from_bcoo(padded, stype=stype).asnumpy(), padded.todense())


def test_to_bcoo_takes_small_id_dtypes_and_drops_malformed_ids():
    """int8 row ids of a 300-row RowSparse (whose padding id 300 int8 cannot
    hold) convert; a negative id (malformed, unchecked under jit) becomes
    BCOO padding instead of wrapping to the last row."""
    r = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([3, 120], jnp.int8), (300, 1))
    np.testing.assert_array_equal(np.flatnonzero(jsr.to_bcoo(r).todense()), [3, 120])
    bad = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([3, -5], jnp.int8), (300, 1))
    np.testing.assert_array_equal(np.flatnonzero(jax.jit(jsr.to_bcoo)(bad).todense()), [3])
