"""CSR: constructors, canonicalisation, fromdense (eager and under jit), row
slicing, conversions and bad input, against a dense numpy oracle."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from draw import random_csr
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt
from jaxsparse_rows._dtypes import index_dtype
from tests import strategies as sst

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]

# (shape, density, extra padding slots)
SHAPES = [
    ((0, 3), 0.5, 0),
    ((3, 0), 0.5, 2),
    ((1, 1), 1.0, 0),
    ((4, 5), 0.0, 0),
    ((4, 5), 0.4, 0),
    ((4, 5), 0.4, 3),
    ((6, 2), 1.0, 1),
]


def oracle(x: jsr.CSR) -> np.ndarray:
    """Dense matrix from the children with numpy only (scipy-free)."""
    data, cols, ptr = (np.asarray(a) for a in (x.data, x.indices, x.indptr))
    out = np.zeros(x.shape, data.dtype)
    for r in range(x.shape[0]):
        for s in range(ptr[r], ptr[r + 1]):
            out[r, cols[s]] += data[s]
    return out


def make(shape, density, pad, dtype=np.float32, seed=0):
    base = random_csr(np.random.default_rng(seed), shape, density=density, dtype=dtype)
    if not pad:
        return base
    return random_csr(
        np.random.default_rng(seed), shape, density=density, nse=base.nse + pad, dtype=dtype
    )


@pytest.mark.parametrize("shape,density,pad", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_todense_attributes(shape, density, pad, dtype, jit_mode):
    x = make(shape, density, pad, dtype)
    dense, nnz = jit_mode(lambda x: (x.todense(), x.nnz))(x)
    assert dense.dtype == dtype and dense.shape == shape
    np.testing.assert_array_equal(np.asarray(dense), oracle(x))
    n_stored = int(np.count_nonzero(oracle(x)))
    assert int(nnz) == n_stored and x.nse == n_stored + pad
    assert x.stype == "csr" and x.ndim == 2 and x.dtype == dtype and len(x) == shape[0]
    assert x.indptr.dtype == x.indices.dtype == index_dtype()
    rows = np.repeat(np.arange(shape[0]), np.diff(np.asarray(x.indptr)))
    np.testing.assert_array_equal(
        np.asarray(x.row_ids()), np.concatenate([rows, np.full(pad, shape[0])])
    )
    head = f"{jnp.dtype(dtype).name}[{shape[0]}, {shape[1]}]"
    extra = f", nse={x.nse}" if pad else ""
    assert repr(x) == f"CSR({head}, nnz={n_stored}{extra})"


def test_float64_under_x64():
    with jax.enable_x64(True):
        x = jsr.csr_matrix(([1.5, 2.0], [1, 0], [0, 1, 2]), shape=(2, 2), dtype=np.float64)
        assert x.dtype == np.float64 and x.indptr.dtype == np.int64
        out = jax.jit(lambda x: (x * 2).todense())(x)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(out), [[0, 3], [4, 0]])


# -- constructors -----------------------------------------------------------------
def test_csr_matrix_seed_example():
    x = jsr.csr_matrix(([7, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    assert x.dtype == jnp.float32  # Python lists default to float32
    np.testing.assert_array_equal(x.asnumpy(), [[7, 0, 8, 0, 0], [0, 0, 0, 0, 0], [0, 9, 0, 0, 0]])


def test_csr_matrix_other_inputs():
    dense = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]])
    a = jsr.csr_matrix(dense)
    assert a.dtype == jnp.float32 and a.indices.tolist() == [1, 0, 2]
    b = jsr.csr_matrix([[0, 1], [0, 0]])
    assert b.dtype == jnp.float32 and b.indptr.tolist() == [0, 1, 1]
    assert jsr.csr_matrix(a) is a
    assert jsr.csr_matrix(a, dtype=jnp.float16).dtype == jnp.float16
    c = jsr.csr_matrix(([1, 2], [0, 1], [0, 1, 2]), shape=(2, 2), dtype=jnp.bfloat16)
    assert c.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="`shape` .* does not match"):
        jsr.csr_matrix(a, shape=(3, 3))
    with pytest.raises(ValueError, match="`shape` .* does not match"):
        jsr.csr_matrix(dense, shape=(3, 3))


@st.composite
def unsorted_csr(draw):
    m = draw(st.integers(0, 5))
    k = draw(st.integers(1, 5))
    counts = draw(st.lists(st.integers(0, 4), min_size=m, max_size=m))
    nnz = sum(counts)
    cols = draw(st.lists(st.integers(0, k - 1), min_size=nnz, max_size=nnz))
    vals = draw(st.lists(st.integers(-4, 4), min_size=nnz, max_size=nnz))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return np.asarray(vals, np.float32), np.asarray(cols, np.int64), indptr, (m, k)


@settings(max_examples=sst.examples(20))
@given(unsorted_csr())
def test_csr_matrix_canonicalises(case):
    vals, cols, indptr, shape = case
    x = jsr.csr_matrix((vals, cols, indptr), shape=shape)
    jsrt.assert_valid(x)
    expected = np.zeros(shape, np.float32)
    rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
    np.add.at(expected, (rows, cols), vals)
    np.testing.assert_array_equal(oracle(x), expected)
    assert x.nse == len(set(zip(rows.tolist(), cols.tolist(), strict=True)))


def test_csr_matrix_drops_given_padding_and_sums_duplicates_in_half():
    x = jsr.csr_matrix((np.array([1, 2, 3, 0], np.float16), [2, 0, 2, 4], [0, 3, 3]), shape=(2, 4))
    assert x.dtype == jnp.float16 and x.nse == 2
    assert x.data.tolist() == [2.0, 4.0] and x.indices.tolist() == [0, 2]


def test_strict_constructor_accepts_padding():
    x = jsr.CSR([1.0, 0.0], [1, 3], [0, 1, 1], shape=(2, 3))
    assert repr(x) == "CSR(float32[2, 3], nnz=1, nse=2)"
    np.testing.assert_array_equal(x.asnumpy(), [[0, 1, 0], [0, 0, 0]])


BAD_STRICT = [
    (([1.0], [0], [0, 1], (1, 2, 3)), ValueError, r"CSR `shape` must be 2-D \(M, K\)"),
    (([[1.0]], [0], [0, 1], (1, 2)), ValueError, "must be 1-D, got shapes"),
    (([1.0, 2.0], [0], [0, 1], (1, 2)), ValueError, "same length, got 2 and 1"),
    (([1.0], [0], [0, 1, 1], (1, 2)), ValueError, r"`indptr` must have M \+ 1 = 2 entries"),
    (([1.0], [0], [1, 1], (1, 2)), ValueError, r"`indptr\[0\]` must be 0, got 1"),
    (([1.0, 1.0], [0, 1], [0, 2, 1], (2, 2)), ValueError, r"non-decreasing.*indptr\[1\] = 2"),
    (([1.0], [0], [0, 2], (1, 2)), ValueError, r"`indptr\[-1\]` = 2 exceeds"),
    (([1.0], [5], [0, 1], (1, 2)), ValueError, r"column ids\) must lie in \[0, 2\), got 5"),
    (([1.0], [-1], [0, 1], (1, 2)), ValueError, r"must lie in \[0, 2\), got -1"),
    (([1.0, 1.0], [1, 0], [0, 2], (1, 2)), ValueError, "sorted ascending.*row 0 has 1 then 0"),
    (([1.0, 1.0], [1, 1], [0, 2], (1, 2)), ValueError, "without duplicates.*1 then 1"),
    (([1.0, 0.0], [0, 1], [0, 1], (1, 2)), ValueError, "must carry column id 2"),
    (
        ([1.0, 5.0], [0, 2], [0, 1], (1, 2)),
        ValueError,
        "must hold zero `data`, but slot 1 holds 5.0",
    ),
    (([1.0], [0.0], [0, 1], (1, 2)), TypeError, "`indices` must have an integer dtype"),
    (([1.0], [0], [0.0, 1.0], (1, 2)), TypeError, "`indptr` must have an integer dtype"),
]


@pytest.mark.parametrize("args,exc,match", BAD_STRICT)
def test_strict_constructor_rejects(args, exc, match):
    with pytest.raises(exc, match=match):
        jsr.CSR(*args)


BAD_MATRIX = [
    ((([1.0], [0]),), {"shape": (1, 2)}, ValueError, "triple, got a tuple of 2"),
    ((([1.0], [0], [0, 1]),), {}, ValueError, "`shape` is required"),
    ((([1.0], [3], [0, 1]),), {"shape": (1, 2)}, ValueError, r"lie in \[0, 2\), got 3"),
    ((([1.0], [0], [0, 1]),), {"shape": (1, 2, 1)}, ValueError, "must be 2-D"),
    ((([1.0, 1.0], [0, 1], [0, 2, 1]),), {"shape": (2, 2)}, ValueError, "non-decreasing"),
    ((np.ones((2, 2, 2)),), {}, ValueError, r"needs a 2-D `x`, got shape \(2, 2, 2\)"),
    # An entry past indptr[-1] that is not padding (column id K) was dropped.
    (
        (([1.0, 2.0, 3.0], [0, 1, 0], [0, 1, 2]),),
        {"shape": (2, 2)},
        ValueError,
        r"hold 3 entries but indptr\[-1\] = 2.*data\[:2\].*column id 2",
    ),
]


@pytest.mark.parametrize("args,kwargs,exc,match", BAD_MATRIX)
def test_csr_matrix_rejects(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jsr.csr_matrix(*args, **kwargs)


# -- fromdense ------------------------------------------------------------------
DENSE = [
    np.zeros((0, 3)),
    np.zeros((3, 0)),
    np.zeros((2, 3)),
    np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 0.0], [4.0, 0.0, 0.0]]),
]


@pytest.mark.parametrize("dense", DENSE, ids=lambda d: str(d.shape))
@pytest.mark.parametrize("dtype", DTYPES)
def test_fromdense_exact(dense, dtype):
    x = jsr.CSR.fromdense(jnp.asarray(dense, dtype))
    jsrt.assert_valid(x)
    assert x.nse == np.count_nonzero(dense) and x.dtype == dtype
    np.testing.assert_array_equal(oracle(x).astype(np.float64), dense)


@pytest.mark.parametrize("dense", DENSE, ids=lambda d: str(d.shape))
def test_fromdense_with_nse(dense, jit_mode):
    nse = int(np.count_nonzero(dense)) + 2
    x = jit_mode(lambda d: jsr.CSR.fromdense(d, nse=nse))(jnp.asarray(dense, jnp.float32))
    jsrt.assert_valid(x)
    assert x.nse == nse and int(x.nnz) == nse - 2
    np.testing.assert_array_equal(oracle(x), dense)


def test_fromdense_overflow_under_jit_counts_only_kept_entries():
    dense = jnp.array([[1.0, 2.0], [0.0, 3.0], [4.0, 0.0]])
    with pytest.raises(ValueError, match="4 non-zeros, more than `nse` = 2"):
        jsr.CSR.fromdense(dense, nse=2)
    f = jax.jit(lambda d: jsr.CSR.fromdense(d, nse=2))
    x = f(dense)
    # the first two entries (row-major) are kept and indptr agrees with them
    assert x.indptr.tolist() == [0, 2, 2, 2]
    jsrt.assert_valid(x)
    np.testing.assert_array_equal(x.asnumpy(), [[1, 2], [0, 0], [0, 0]])
    err, _ = checkify.checkify(f, errors=checkify.user_checks)(dense)
    with pytest.raises(checkify.JaxRuntimeError, match="more non-zeros than `nse` = 2"):
        err.throw()


def test_fromdense_under_jit_needs_nse():
    with pytest.raises(ValueError, match="needs a static `nse`"):
        jax.jit(jsr.CSR.fromdense)(jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="needs a 2-D `x`"):
        jsr.CSR.fromdense(jnp.ones(3))


@settings(max_examples=sst.examples(15))
@given(sst.csr())
def test_fromdense_roundtrip_property(x):
    y = jsr.CSR.fromdense(x.todense())
    jsrt.assert_valid(y)
    np.testing.assert_array_equal(oracle(y), oracle(x))


# -- slicing ----------------------------------------------------------------------
SLICES = [
    slice(0, 2),
    slice(1, 3),
    slice(2, 2),
    slice(None),
    slice(-2, None),
    slice(3, 1),
    slice(0, 100),
    1,
    -1,
]


@pytest.mark.parametrize("key", SLICES, ids=str)
@pytest.mark.parametrize("pad", [0, 2])
def test_row_slicing(key, pad, jit_mode):
    x = make((4, 5), 0.5, pad, seed=3)
    y = jit_mode(lambda x: x[key])(x)
    expected = oracle(x)[key]
    expected = expected[None] if expected.ndim == 1 else expected
    assert isinstance(y, jsr.CSR) and y.shape == expected.shape and y.nse == x.nse
    jsrt.assert_valid(y)
    np.testing.assert_array_equal(oracle(y), expected)


def test_row_slicing_empty_and_errors():
    z = jsr.zeros("csr", (3, 4))
    assert z[1:3].shape == (2, 4) and z[1:3].nse == 0
    x = jsr.csr_matrix(([7.0, 8.0, 9.0], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    with pytest.raises(ValueError, match="step 1, got 2"):
        _ = x[::2]
    with pytest.raises(IndexError, match="row index 3 is out of range for 3 rows"):
        _ = x[3]
    with pytest.raises(TypeError, match=r"row slices `x\[a:b\]` and ints"):
        _ = x[0, 1]


# -- conversions and copies ------------------------------------------------------
def test_numpy_copy_astype_pickle():
    x = make((4, 5), 0.4, 2, seed=5)
    a = np.asarray(x)
    assert a.flags.writeable
    np.testing.assert_array_equal(a, oracle(x))
    with pytest.raises(ValueError, match="cannot be viewed as a dense numpy array"):
        np.asarray(x, copy=False)
    y = x.copy()
    assert y is not x and y.data is not x.data and y.indptr is not x.indptr
    np.testing.assert_array_equal(oracle(y), oracle(x))
    for dtype in DTYPES + [jnp.int32]:
        z = x.astype(dtype)
        assert z.dtype == dtype and z.nse == x.nse
        np.testing.assert_array_equal(np.asarray(z), oracle(x).astype(dtype))
    p = pickle.loads(pickle.dumps(x))
    assert isinstance(p.data, jax.Array) and isinstance(p.indptr, jax.Array)
    np.testing.assert_array_equal(p.asnumpy(), x.asnumpy())


def test_zeros_csr_and_transpose_hint():
    z = jsr.zeros("csr", (3, 4), dtype="float16")
    jsrt.assert_valid(z)
    assert repr(z) == "CSR(float16[3, 4], nnz=0)"
    np.testing.assert_array_equal(z.asnumpy(), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="must be 2-D for csr"):
        jsr.zeros("csr", (3,))
    with pytest.raises(TypeError, match="transpose_a=True"):
        _ = z.T


@pytest.mark.parametrize(
    "make",
    [
        lambda shape: jsr.csr_matrix(([1.0], [5], [0, 1]), shape=shape),
        lambda shape: jsr.CSR([1.0], [5], [0, 1], shape),
        lambda shape: jsr.zeros("csr", shape),
    ],
)
def test_column_count_beyond_the_index_dtype_is_refused(make):
    """With 32-bit indices a CSR cannot have 2**31 or more columns: the padding
    id (K) would not fit. The error says so and how to enable 64-bit indices."""
    with pytest.raises(ValueError, match=r"`shape\[1\]` is 2147483658.*jax_enable_x64"):
        make((1, 2**31 + 10))
    with jax.enable_x64(True):
        x = make((1, 2**31 + 10))
        assert x.shape == (1, 2**31 + 10)


def test_host_structure_with_traced_data_is_checked_and_canonicalised_in_jit():
    """Only the values are traced: the structure is validated and canonicalised
    (sorted, duplicates summed) on the host, as for concrete input."""
    d = jnp.array([1.0, 2.0, 3.0])
    build = lambda d: jsr.csr_matrix((d, np.array([2, 0, 2]), np.array([0, 2, 3])), shape=(2, 3))  # noqa: E731
    c = jax.jit(build)(d)
    np.testing.assert_array_equal(np.asarray(c.indices), [0, 2, 2])
    np.testing.assert_array_equal(np.asarray(c.data), [2.0, 1.0, 3.0])
    dup = jax.jit(
        lambda d: jsr.csr_matrix((d, np.array([1, 1, 0]), np.array([0, 2, 3])), shape=(2, 3))
    )(d)
    np.testing.assert_array_equal(np.asarray(dup.todense()), [[0, 3, 0], [3, 0, 0]])
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got 5"):
        jax.jit(
            lambda d: jsr.csr_matrix((d, np.array([2, 5, 1]), np.array([0, 2, 3])), shape=(2, 3))
        )(d)
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\), got -1"):
        jax.jit(lambda d: jsr.CSR(d, np.array([-1]), np.array([0, 1]), (1, 3)).todense())(d[:1])


def test_canonicalising_a_very_wide_matrix_keeps_every_entry():
    """csr_matrix merged duplicates through the key row * K + col, which
    overflows int64 for M * K >= 2**63: the (4, 0) entry moved to (0, 4)."""
    with jax.enable_x64(True):
        for k in (2**62 + 1, 2**62):
            x = jsr.csr_matrix(([1.0, 2.0, 5.0], [4, 0, 0], [0, 1, 1, 1, 1, 3]), shape=(5, k))
            np.testing.assert_array_equal(np.asarray(x.indptr), [0, 1, 1, 1, 1, 2])
            np.testing.assert_array_equal(np.asarray(x.indices), [4, 0])
            np.testing.assert_array_equal(np.asarray(x.data), [1.0, 7.0])


def test_csr_matrix_from_scipy_checks_shape():
    sp = pytest.importorskip("scipy.sparse")
    m = sp.random(3, 4, density=0.5, format="csr", random_state=0)
    with pytest.raises(ValueError, match=r"`shape` \(3, 3\) does not match the matrix's \(3, 4\)"):
        jsr.csr_matrix(m, shape=(3, 3))
    want = m.toarray().astype(np.float32)  # float64 becomes float32 with x64 off
    np.testing.assert_array_equal(jsr.csr_matrix(m, shape=(3, 4)).asnumpy(), want)


@pytest.mark.parametrize("data", [["a"], [None], ["1"], np.array(["x"])])
def test_non_numeric_data_is_named(data):
    with pytest.raises(TypeError, match=r"`data` must hold numbers or bools, got .*dtype"):
        jsr.CSR(data, [0], [0, 1], (1, 2))
    with pytest.raises(TypeError, match=r"`data` must hold numbers or bools"):
        jsr.RowSparse(data, [0], (2,))
    # The list constructors convert to float32 by default: numpy would turn
    # None into NaN and "1" into 1.0 on the way.
    with pytest.raises(TypeError, match=r"`data` must hold numbers or bools, got .*dtype"):
        jsr.row_sparse_array((data, [0]), (2,))
    with pytest.raises(TypeError, match=r"`data` must hold numbers or bools, got .*dtype"):
        jsr.csr_matrix((data, [0], [0, 1]), shape=(1, 2))


def test_data_that_does_not_convert_is_named():
    with pytest.raises(ValueError, match=r"`data` could not be converted to an array: .*"):
        jsr.row_sparse_array(([[1.0], [2.0, 3.0]], [0, 1]), (2, 1))
    with pytest.raises(ValueError, match=r"`data` could not be converted to an array: .*"):
        jsr.RowSparse([[1.0], [2.0, 3.0]], [0, 1], (2, 1))
    with pytest.raises(ValueError, match=r"`data` could not be converted to an array of int8"):
        jsr.row_sparse_array(([300], [0]), (2,), dtype="int8")
    got = jsr.row_sparse_array(([[1, 2.5]], [1]), (2, 2), dtype="float32")
    np.testing.assert_array_equal(got.asnumpy(), [[0.0, 0.0], [1.0, 2.5]])


@pytest.mark.parametrize(
    "build",
    [
        lambda v: jsr.RowSparse([[v], [2]], [0, 2], (4, 1)),
        lambda v: jsr.row_sparse_array(np.array([[v], [0]])),
        lambda v: jsr.csr_matrix(np.array([[v, 0]])),
        lambda v: jsr.CSR(np.array([v, 1]), [0, 1], [0, 2], (1, 2)),
    ],
    ids=["RowSparse", "row_sparse_array", "csr_matrix", "CSR"],
)
def test_integer_data_that_int32_would_wrap_is_refused(build):
    """With x64 off int64 data becomes int32: 2**40 became 0, and the dense
    constructors then dropped the whole row or entry as a zero."""
    with pytest.raises(ValueError, match=r"`data` must fit in int32 \(enable jax_enable_x64"):
        build(2**40)
    with pytest.raises(ValueError, match=r"`data` must fit in uint32"):
        jsr.RowSparse(np.array([[2**40]], np.uint64), [0], (2, 1))
    with pytest.raises(ValueError, match=r"`data` must fit in int8, got 300"):
        jsr.row_sparse_array((np.array([[300]]), [0]), (2, 1), dtype="int8")
    assert build(2**31 - 1).dtype == jnp.int32  # the largest int32 still fits
    with jax.enable_x64(True):
        np.testing.assert_array_equal(np.asarray(build(2**40).data).max(), 2**40)


def test_big_endian_data_is_taken_in_native_order():
    data = np.array([[1.0], [2.0]], ">f4")
    np.testing.assert_array_equal(
        jsr.RowSparse(data, [0, 2], (4, 1)).asnumpy(), [[1.0], [0.0], [2.0], [0.0]]
    )
    np.testing.assert_array_equal(
        jsr.CSR(data[:, 0], [1, 0], [0, 1, 2], (2, 2)).asnumpy(), [[0, 1], [2, 0]]
    )


@pytest.mark.parametrize("other", [None, "abc", object()])
def test_dot_names_a_non_array_operand(other):
    c = jsr.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(TypeError, match=r"`rhs` must be an array \(dense, RowSparse or CSR\)"):
        jsr.dot(c, other)
    with pytest.raises(TypeError, match=r"`lhs` must be an array"):
        jsr.dot(other, c)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_with_no_columns_times_sparse_is_zeros(jit_mode, dtype):
    """dense [P, 0] @ sparse [0, K]: XLA cannot gather from zero columns, so
    this raised an internal error when the sparse operand had slots."""
    lhs = jnp.zeros((2, 0), dtype)
    csr = jsr.CSR._make(jnp.ones((3,), dtype), jnp.array([1, 0, 2]), jnp.array([0]), (0, 4))
    rsp = jsr.RowSparse(jnp.zeros((2, 4), dtype), jnp.array([0, 0]), (0, 4))
    for rhs in (csr, rsp):
        out = jit_mode(jsr.dot)(lhs, rhs)
        want = np.zeros((2, 0), np.float32) @ np.zeros((0, 4), np.float32)
        assert out.dtype == dtype and out.shape == want.shape
        np.testing.assert_array_equal(np.asarray(out, np.float32), want)


@pytest.mark.parametrize("pad", [0, 2])
def test_grad_with_respect_to_a_csr_keeps_its_structure(jit_mode, rng, pad):
    """jsr.grad of a CSR argument: the derivative for each stored entry, as a
    CSR with the same indices (JAX's grad refused its int32 leaves)."""
    dense = rng.normal(size=(4, 5)).astype(np.float32) * (rng.random((4, 5)) < 0.5)
    x = jsr.CSR.fromdense(jnp.asarray(dense), nse=int(np.count_nonzero(dense)) + pad)
    w = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)

    def loss(c, w):
        return jnp.sum(jnp.tanh(jsr.dot(c, w)))

    g, gw = jit_mode(jsr.grad(loss, argnums=(0, 1)))(x, w)
    dense_g, dense_gw = jax.grad(lambda d, w: jnp.sum(jnp.tanh(d @ w)), argnums=(0, 1))(
        jnp.asarray(dense), w
    )
    assert isinstance(g, jsr.CSR) and g.shape == x.shape and g.nse == x.nse
    np.testing.assert_array_equal(np.asarray(g.indices), np.asarray(x.indices))
    np.testing.assert_array_equal(np.asarray(g.indptr), np.asarray(x.indptr))
    nnz = int(x.indptr[-1])
    np.testing.assert_array_equal(np.asarray(g.data)[nnz:], 0)  # padding slots
    rows = np.repeat(np.arange(4), np.diff(np.asarray(x.indptr)))
    cols = np.asarray(x.indices)[:nnz]
    np.testing.assert_allclose(
        np.asarray(g.data)[:nnz], np.asarray(dense_g)[rows, cols], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(np.asarray(gw), np.asarray(dense_gw), rtol=1e-5, atol=1e-6)


# Every op of a CSR beside the products (tested in test_dot.py), with its numpy
# oracle on the dense matrix ``d`` (w: a dense [M, K] operand).
SHARDED_OPS = {
    "todense": (lambda a, w: a.todense(), lambda d, w: d),
    "sum": (lambda a, w: jsr.sum(a), lambda d, w: d.sum()),
    "sum axis 0": (lambda a, w: jsr.sum(a, axis=0), lambda d, w: d.sum(0)),
    "sum axis 1": (lambda a, w: jsr.sum(a, axis=1, keepdims=True), lambda d, w: d.sum(1)[:, None]),
    "square_sum": (lambda a, w: jsr.square_sum(a), lambda d, w: (d**2).sum(1)[:, None]),
    "row slice": (lambda a, w: a[1:3].todense(), lambda d, w: d[1:3]),
    "times 2": (lambda a, w: (a * 2.0).todense(), lambda d, w: 2 * d),
    "sqrt": (lambda a, w: jsr.sqrt(jsr.abs(a)).todense(), lambda d, w: np.sqrt(np.abs(d))),
    "astype": (lambda a, w: a.astype(jnp.float16).todense(), lambda d, w: d.astype(np.float16)),
    "times dense": (lambda a, w: jsr.multiply(a, w).todense(), lambda d, w: d * w),
    "plus dense": (lambda a, w: jsr.add(a, w), lambda d, w: d + w),
    "plus itself": (lambda a, w: jsr.add(a, a).todense(), lambda d, w: 2 * d),
    "to row_sparse": (
        lambda a, w: jsr.cast_storage(a, "row_sparse").todense(),
        lambda d, w: d,
    ),
    "to bcoo": (lambda a, w: jsr.to_bcoo(a).todense(), lambda d, w: d),
}


@pytest.mark.parametrize("jit_mode", ["eager", "jit"])
@pytest.mark.parametrize("op", sorted(SHARDED_OPS))
def test_ops_of_a_csr_sharded_over_an_explicit_axis(op, jit_mode):
    """A CSR whose entries are sharded over an explicit mesh axis (what
    ``jax.device_put`` of a whole batch with a data-parallel sharding gives,
    ``indptr`` included): every op that places the entries by row and column
    gathers its arrays whole first; the results equal the oracle on a
    one-device mesh, with padding slots."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    x = random_csr(np.random.default_rng(3), (4, 6), density=0.4, nse=12)
    d = oracle(x)
    w = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)
    fn, want = SHARDED_OPS[op]
    mesh = jax.make_mesh((1,), ("b",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, NamedSharding(mesh, P("b")))  # all three arrays
        assert jax.typeof(xs.indptr).sharding.spec[0] == "b"
        wrap = jax.jit if jit_mode == "jit" else (lambda f: f)
        got = wrap(fn)(xs, jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(got, np.float64), want(d, w), rtol=2e-3, atol=1e-6)


def test_values_only_ops_of_a_sharded_csr_keep_its_sharding():
    """Scaling, unary maps, casts and the total sum touch the values alone and
    stay sharded (nothing is gathered); ``todense``'s gradient with respect
    to the values comes back sharded like them."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    x = random_csr(np.random.default_rng(5), (3, 5), density=0.5, nse=8)
    mesh = jax.make_mesh((1,), ("b",), axis_types=(AxisType.Explicit,))

    def loss(vals, csr):
        return jnp.sum(jsr.CSR(vals, csr.indices, csr.indptr, csr.shape).todense() ** 2)

    with jax.set_mesh(mesh):
        on = NamedSharding(mesh, P("b"))
        xs = jsr.CSR(jax.device_put(x.data, on), jax.device_put(x.indices, on), x.indptr, x.shape)
        for wrap in (lambda f: f, jax.jit):
            for y in (wrap(lambda a: a * 2.0)(xs), wrap(jsr.negative)(xs)):
                assert jax.typeof(y.data).sharding.spec[0] == "b", jax.typeof(y.data)
            g = wrap(jax.grad(loss))(xs.data, xs)
            assert jax.typeof(g).sharding.spec[0] == "b", jax.typeof(g)
            np.testing.assert_allclose(np.asarray(g), 2 * np.asarray(x.data), rtol=1e-6)


def test_int64_ids_past_2_32_are_dropped_not_wrapped():
    """XLA:CPU keeps the low 32 bits of a 64-bit index, so a malformed column
    id 2**32 + 1 (unchecked under jit) could land in column 1. ``todense``,
    ``sum(axis=0)``, ``dense @ csr`` and ``csr @ dense`` drop it, as they drop
    a RowSparse row id past the end in ``todense``, ``dense @ rsp``,
    ``sum(axis=1)``, ``+ dense``, ``* dense`` and ``to_bcoo``, and a negative
    one (not the last row or column)."""
    with jax.enable_x64(True):
        big = jnp.array([2**32 + 1], jnp.int64)
        csr = lambda c: jsr.CSR._make(jnp.ones(1), c, jnp.array([0, 1], jnp.int64), (1, 4))  # noqa: E731
        rsp = lambda r: jsr.RowSparse._make(jnp.ones((1, 2)), r, (4, 2))  # noqa: E731
        f = jax.jit(
            lambda c, r: (
                csr(c).todense(),
                jsr.sum(csr(c), axis=0),
                jsr.dot(jnp.ones((2, 1)), csr(c)),
                rsp(r).todense(),
                jsr.dot(jnp.ones((3, 4)), rsp(r)),
                jsr.sum(rsp(r), axis=1),
                jsr.add(csr(c), jnp.zeros((1, 4))),
                jsr.multiply(csr(c), jnp.ones((1, 4))).todense(),
                jsr.to_bcoo(csr(c)).todense(),
                jsr.to_bcoo(rsp(r)).todense(),
            )
        )
        # too large (past 2**32) and negative (large or -1): all dropped
        for bad in (big, jnp.array([-1], jnp.int64), jnp.array([-(2**40)], jnp.int64)):
            for out in f(bad, bad):
                np.testing.assert_array_equal(np.asarray(out), np.zeros(out.shape))
        # the same entries at a real id land where they should
        real = [np.asarray(o) for o in f(jnp.array([1], jnp.int64), jnp.array([1], jnp.int64))]
        assert real[0][0, 1] == 1 and real[1][1] == 1 and real[2][0, 1] == 1
        assert real[3][1].tolist() == [1, 1] and real[4][0].tolist() == [1, 1]
