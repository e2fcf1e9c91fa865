"""RowSparse: constructors, attributes, conversions and bad input, against a dense
numpy oracle, eagerly and under jit, over edge shapes and dtypes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from draw import random_rowsparse
from hypothesis import given, settings
from jax.experimental import checkify
from jax.experimental import sparse as jsparse

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt
from jaxsparse_rows._dtypes import index_dtype
from tests import strategies as sst

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16]

# (shape, n_rows, capacity): N = 0, 1, many; k = 0; padding; 1-D, 2-D, 3-D+ rows.
SHAPES = [
    ((0, 3), 0, 0),
    ((0, 3), 0, 2),
    ((1, 2), 1, 1),
    ((1, 2), 0, 0),
    ((6, 2), 2, 2),
    ((6, 2), 2, 5),
    ((7,), 3, 4),
    ((5, 2, 3), 2, 3),
    ((4, 1, 2, 2), 4, 4),
    ((5, 0), 2, 2),
]


def nonzero_rows(dense: np.ndarray) -> np.ndarray:
    return np.nonzero(np.any(dense != 0, axis=tuple(range(1, dense.ndim))))[0]


def oracle(x: jsr.RowSparse) -> np.ndarray:
    """Dense numpy array built from the children with numpy only."""
    data = np.asarray(x.data)
    idx = np.asarray(x.indices)
    out = np.zeros(x.shape, data.dtype)
    real = idx < x.shape[0]
    out[idx[real]] = data[real]
    return out


@pytest.mark.parametrize("shape,n_rows,cap", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_todense_attributes(shape, n_rows, cap, dtype, jit_mode):
    x = random_rowsparse(np.random.default_rng(1), shape, n_rows=n_rows, capacity=cap, dtype=dtype)
    dense, nnz = jit_mode(lambda x: (x.todense(), x.nnz_rows))(x)
    assert dense.dtype == dtype and dense.shape == shape
    np.testing.assert_array_equal(np.asarray(dense), oracle(x))
    assert int(nnz) == n_rows
    assert x.shape == shape and x.dtype == dtype and x.ndim == len(shape)
    assert x.stype == "row_sparse" and x.capacity == cap and len(x) == shape[0]
    assert x.indices.dtype == index_dtype()
    np.testing.assert_array_equal(np.asarray(x.row_mask), np.arange(cap) < n_rows)
    extra = "" if cap == n_rows else f", capacity={cap}"
    head = f"{jnp.dtype(dtype).name}[{', '.join(map(str, shape))}]"
    assert repr(x) == f"RowSparse({head}, rows={n_rows}{extra})"


def test_float64_under_x64(jit_mode):
    with jax.enable_x64(True):
        x = jsr.row_sparse_array(([[1.5, 2.0]], [2]), shape=(3, 2), dtype=np.float64)
        assert x.dtype == np.float64 and x.indices.dtype == np.int64
        out = jit_mode(lambda x: (x * 2).todense())(x)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(np.asarray(out), [[0, 0], [0, 0], [3, 4]])
        # float64 numpy input keeps its dtype under x64
        y = jsr.row_sparse_array((np.ones((1, 2)), [0]), shape=(3, 2))
        assert y.dtype == np.float64
    x32 = jsr.row_sparse_array((np.ones((1, 2)), [0]), shape=(3, 2))
    assert x32.dtype == np.float32 and x32.indices.dtype == np.int32


@pytest.mark.parametrize("dtype", [float, int, "float64"])
def test_python_dtype_is_canonicalised_without_warning(dtype):
    # `dtype=float` means float32 when x64 is off; filterwarnings=error turns
    # a "float64 not available" truncation warning into a failure.
    want = jax.dtypes.canonicalize_dtype(dtype)
    r = jsr.row_sparse_array(([[1, 2]], [1]), shape=(3, 2), dtype=dtype)
    c = jsr.csr_matrix(([1, 2], [0, 1], [0, 1, 2]), shape=(2, 2), dtype=dtype)
    assert r.dtype == want and c.dtype == want
    np.testing.assert_array_equal(np.asarray(c.todense()), [[1, 0], [0, 2]])


# -- strict constructor ---------------------------------------------------------
def test_strict_constructor_accepts_padding():
    x = jsr.RowSparse([[1.0], [0.0]], [1, 3], shape=(3, 1))
    assert repr(x) == "RowSparse(float32[3, 1], rows=1, capacity=2)"
    np.testing.assert_array_equal(x.asnumpy(), [[0], [1], [0]])


def test_strict_constructor_under_jit_takes_traced_values():
    # under jit only shapes/dtypes are checked; values are the caller's promise
    f = jax.jit(lambda d, i: jsr.RowSparse(d, i, (4, 2)).todense())
    out = f(jnp.ones((2, 2)), jnp.array([0, 3]))
    np.testing.assert_array_equal(np.asarray(out), [[1, 1], [0, 0], [0, 0], [1, 1]])


BAD_STRICT = [
    (([[1.0], [2.0]], [3, 1], (4, 1)), ValueError, "sorted ascending.*unsorted ids 3, 1"),
    (([[1.0], [2.0]], [1, 1], (4, 1)), ValueError, "duplicate ids 1, 1"),
    (([[1.0]], [5], (4, 1)), ValueError, r"`indices` must be < N = 4.*got 5"),
    (([[1.0]], [-1], (4, 1)), ValueError, r"`indices` must be >= 0, got -1"),
    (([[1.0], [2.0]], [1], (4, 1)), ValueError, "same length.*2 rows of data and 1 indices"),
    (([1.0, 2.0], [0, 1], (4, 1)), ValueError, r"`data` must have ndim == len\(shape\) = 2"),
    (([[1.0, 2.0]], [0], (4, 3)), ValueError, r"trailing dims must equal shape\[1:\] = \(3,\)"),
    (([[1.0]], [[0]], (4, 1)), ValueError, "`indices` must be 1-D"),
    (([[1.0]], [0.0], (4, 1)), TypeError, "`indices` must have an integer dtype, got float"),
    (([[0.0], [1.0]], [4, 1], (4, 1)), ValueError, "padding slots .* must come after"),
    (
        ([[1.0], [1.0]], [1, 4], (4, 1)),
        ValueError,
        r"padding slots \(id N = 4\) must hold zero `data`; slot 1 holds non-zero values",
    ),
    (([[1.0]], [0], ()), ValueError, "at least one dimension"),
    (([[1.0]], [0], (-1, 1)), ValueError, "`shape` must be a tuple of non-negative ints"),
    (([[1.0]], [0], "ab"), TypeError, "`shape` must be a tuple of ints"),
]


@pytest.mark.parametrize("args,exc,match", BAD_STRICT)
def test_strict_constructor_rejects(args, exc, match):
    with pytest.raises(exc, match=match):
        jsr.RowSparse(*args)


# -- row_sparse_array -------------------------------------------------------------
def test_row_sparse_array_defaults():
    a = jsr.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=(6, 2))
    assert a.dtype == jnp.float32  # Python lists default to float32 (MXNet)
    b = jsr.row_sparse_array((np.array([[1, 2], [3, 4]]), np.array([1, 4])), shape=(6, 2))
    assert jnp.issubdtype(b.dtype, jnp.integer)  # numpy input keeps its kind
    c = jsr.row_sparse_array((np.ones((2, 2)), [1, 4]), shape=(6, 2))
    assert c.dtype == jnp.float32  # float64 numpy -> float32 without x64
    d = jsr.row_sparse_array(([[1, 2], [3, 4]], [1, 4]), shape=(6, 2), dtype="float16")
    assert d.dtype == jnp.float16
    for x in (a, b, c, d):
        jsrt.assert_valid(x)
    np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    # a single row may be given without its leading axis
    e = jsr.row_sparse_array(([1.0, 2.0], [3]), shape=(4, 2))
    np.testing.assert_array_equal(e.asnumpy()[3], [1, 2])


def test_row_sparse_array_from_dense_and_sparse():
    a = jsr.row_sparse_array([[0, 0], [1, 2]])
    assert a.dtype == jnp.float32 and a.indices.tolist() == [1]
    b = jsr.row_sparse_array(np.array([[0.0, 0.0], [1.0, 2.0]], np.float16))
    assert b.dtype == jnp.float16
    assert jsr.row_sparse_array(a) is a
    assert jsr.row_sparse_array(a, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    c = jsr.row_sparse_array(jsr.csr_matrix([[0.0, 3.0], [0.0, 0.0]]))
    assert c.stype == "row_sparse"
    np.testing.assert_array_equal(c.asnumpy(), [[0, 3], [0, 0]])
    with pytest.raises(ValueError, match="`shape` .* does not match"):
        jsr.row_sparse_array(a, shape=(3, 2))
    with pytest.raises(ValueError, match="`shape` .* does not match"):
        jsr.row_sparse_array([[0, 1]], shape=(3, 2))


@given(sst.coo_triplets())
def test_row_sparse_array_canonicalises(triplet):
    data, ids, shape = triplet
    x = jsr.row_sparse_array((data, ids), shape=shape)
    jsrt.assert_valid(x)
    expected = np.zeros(shape, np.float32)
    np.add.at(expected, ids, data)
    np.testing.assert_allclose(x.asnumpy(), expected, rtol=1e-6)
    assert x.capacity == len(np.unique(ids))


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_sparse_array_canonicalises_traced_data(dtype):
    # the ids are concrete (closed over), the data traced: still canonicalised
    ids = np.array([4, 1, 4, 0])

    @jax.jit
    def f(data):
        return jsr.row_sparse_array((data, ids), shape=(5, 2))

    data = jnp.arange(8, dtype=dtype).reshape(4, 2)
    x = f(data)
    assert x.dtype == dtype and x.indices.tolist() == [0, 1, 4]
    expected = np.zeros((5, 2), np.float32)
    np.add.at(expected, ids, np.arange(8.0).reshape(4, 2))
    np.testing.assert_array_equal(x.asnumpy().astype(np.float32), expected)


BAD_RSA = [
    ((([[1.0]], [7]),), {"shape": (4, 1)}, ValueError, r"lie in \[0, N\) = \[0, 4\), got 7"),
    ((([[1.0]], [-2]),), {"shape": (4, 1)}, ValueError, "got -2. Negative ids"),
    ((([[1.0]], [4]),), {"shape": (4, 1)}, ValueError, r"lie in \[0, N\)"),
    ((([[1.0]], [1]),), {}, ValueError, "`shape` is required"),
    ((([[1.0]], [1], [2]),), {"shape": (4, 1)}, ValueError, "pair, got a tuple of 3"),
    ((([[1.0], [2.0]], [1]),), {"shape": (4, 1)}, ValueError, "one id per row of `data`"),
    ((([[1.0, 2.0]], [1]),), {"shape": (4, 1)}, ValueError, r"shape \[k, \*shape\[1:\]\]"),
    ((([[1.0]], [1.5]),), {"shape": (4, 1)}, TypeError, "integer dtype"),
]


@pytest.mark.parametrize("args,kwargs,exc,match", BAD_RSA)
def test_row_sparse_array_rejects(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        jsr.row_sparse_array(*args, **kwargs)


# -- fromdense ------------------------------------------------------------------
DENSE_CASES = [
    np.zeros((0, 3)),
    np.zeros((4, 2)),
    np.array([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]),
    np.array([0.0, 5.0, 0.0, -1.0]),
    np.arange(24.0).reshape(4, 3, 2) * (np.arange(4) % 2 == 0)[:, None, None],
]


@pytest.mark.parametrize("dense", DENSE_CASES, ids=lambda d: str(d.shape))
@pytest.mark.parametrize("dtype", DTYPES)
def test_fromdense_exact(dense, dtype):
    x = jsr.RowSparse.fromdense(jnp.asarray(dense, dtype))
    jsrt.assert_valid(x)
    nz_rows = nonzero_rows(dense)
    assert x.indices.tolist() == nz_rows.tolist() and x.dtype == dtype
    np.testing.assert_array_equal(x.asnumpy().astype(np.float64), dense)


@pytest.mark.parametrize("dense", DENSE_CASES, ids=lambda d: str(d.shape))
def test_fromdense_max_rows(dense, jit_mode):
    n_nz = len(nonzero_rows(dense))
    f = jit_mode(lambda d: jsr.RowSparse.fromdense(d, max_rows=n_nz + 2))
    x = f(jnp.asarray(dense, jnp.float32))
    jsrt.assert_valid(x)
    assert x.capacity == n_nz + 2 and int(x.nnz_rows) == n_nz
    np.testing.assert_array_equal(x.asnumpy(), dense)


def test_fromdense_overflow_is_reported():
    dense = jnp.array([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="3 non-zero rows, more than `max_rows` = 2"):
        jsr.RowSparse.fromdense(dense, max_rows=2)
    f = checkify.checkify(
        jax.jit(lambda d: jsr.RowSparse.fromdense(d, max_rows=2)), errors=checkify.user_checks
    )
    err, x = f(dense)
    with pytest.raises(checkify.JaxRuntimeError, match="more non-zero rows than `max_rows` = 2"):
        err.throw()
    err, _ = f(jnp.array([[1.0], [0.0], [3.0]]))
    err.throw()  # within capacity: no error


def test_fromdense_under_jit_needs_max_rows():
    with pytest.raises(ValueError, match="needs a static `max_rows`"):
        jax.jit(jsr.RowSparse.fromdense)(jnp.ones((2, 2)))
    with pytest.raises(TypeError, match="`max_rows` must be a concrete Python int"):
        jax.jit(lambda d, k: jsr.RowSparse.fromdense(d, max_rows=k))(jnp.ones((2, 2)), 2)
    with pytest.raises(ValueError, match="`max_rows` must be an int >= 0"):
        jsr.RowSparse.fromdense(jnp.ones((2, 2)), max_rows=-1)
    with pytest.raises(ValueError, match="at least one dimension"):
        jsr.RowSparse.fromdense(jnp.float32(1.0))


@settings(max_examples=sst.examples(15))
@given(sst.rowsparse())
def test_fromdense_roundtrip_property(x):
    y = jsr.RowSparse.fromdense(x.todense())
    jsrt.assert_valid(y)
    np.testing.assert_array_equal(y.asnumpy(), x.asnumpy())
    # stored rows hold non-zero values, so exactly those rows come back
    assert y.indices.tolist() == nonzero_rows(oracle(x)).tolist()


# -- conversions and copies -------------------------------------------------------
@pytest.mark.parametrize("shape,n_rows,cap", SHAPES[:6])
def test_numpy_conversion(shape, n_rows, cap):
    x = random_rowsparse(np.random.default_rng(2), shape, n_rows=n_rows, capacity=cap)
    a = np.asarray(x)
    np.testing.assert_array_equal(a, oracle(x))
    assert a.flags.writeable
    b = x.asnumpy()
    b[...] = 7  # a fresh, writable copy: the array is unchanged
    np.testing.assert_array_equal(x.asnumpy(), oracle(x))
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.array(x, copy=True).dtype == np.float32
    with pytest.raises(ValueError, match="cannot be viewed as a dense numpy array"):
        np.asarray(x, copy=False)


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES + [jnp.int32])
def test_astype(src, dst, jit_mode):
    x = random_rowsparse(np.random.default_rng(3), (5, 2), n_rows=2, capacity=3, dtype=src)
    y = jit_mode(lambda x: x.astype(dst))(x)
    assert y.dtype == dst and y.shape == x.shape
    jsrt.assert_valid(y)
    np.testing.assert_array_equal(y.asnumpy(), oracle(x).astype(dst))


def test_copy_is_deep():
    x = jsr.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2))
    y = x.copy()
    assert y is not x and y.data is not x.data and y.indices is not x.indices
    assert type(y) is jsr.RowSparse and y.shape == x.shape
    np.testing.assert_array_equal(y.asnumpy(), x.asnumpy())
    x.data.delete()  # the copy owns its own buffers
    np.testing.assert_array_equal(y.asnumpy(), [[0, 0], [1, 2], [0, 0]])


@pytest.mark.parametrize("cap", [0, 2, 3, 6])
def test_with_capacity(cap, jit_mode):
    x = random_rowsparse(np.random.default_rng(4), (6, 2), n_rows=2, capacity=3)
    y = jit_mode(lambda x: x.with_capacity(cap))(x) if cap >= 2 else None
    if y is not None:
        assert y.capacity == cap
        jsrt.assert_valid(y)
        np.testing.assert_array_equal(y.asnumpy(), x.asnumpy())
    else:
        with pytest.raises(ValueError, match=r"with_capacity\(0\) would drop rows"):
            x.with_capacity(cap)


def test_zeros_row_sparse():
    z = jsr.zeros("row_sparse", (4, 2, 3), dtype=jnp.bfloat16)
    jsrt.assert_valid(z)
    assert z.capacity == 0 and z.dtype == jnp.bfloat16
    np.testing.assert_array_equal(z.asnumpy().astype(np.float32), np.zeros((4, 2, 3)))
    assert repr(jsr.zeros("row_sparse", (100, 8))) == "RowSparse(float32[100, 8], rows=0)"
    with pytest.raises(ValueError, match="at least one dimension for row_sparse"):
        jsr.zeros("row_sparse", ())


def test_row_count_beyond_the_index_dtype_is_refused():
    """With 32-bit indices a RowSparse cannot have 2**31 or more rows (the
    padding id N would not fit); 64-bit indices allow it."""
    with pytest.raises(ValueError, match=r"`shape\[0\]` is 2147483648.*jax_enable_x64"):
        jsr.row_sparse_array(([[1.0]], [5]), shape=(2**31, 1))
    with pytest.raises(ValueError, match="jax_enable_x64"):
        jsr.zeros("row_sparse", (2**31, 1))
    with jax.enable_x64(True):
        assert jsr.row_sparse_array(([[1.0]], [5]), shape=(2**31, 1)).shape == (2**31, 1)


@pytest.mark.parametrize("key", [0, slice(0, 2), (0, 1), jnp.array([1])])
def test_indexing_is_refused_with_the_ops_to_use(key):
    x = jsr.RowSparse([[1.0, 2.0]], [1], shape=(3, 2))
    with pytest.raises(TypeError, match=r"cannot be indexed.*jsr\.take.*jsr\.retain.*todense"):
        x[key]
    with pytest.raises(TypeError, match="not iterable"):
        list(x)


TRUTH_CASES = [
    (stype, shape, rows)
    for stype in ("row_sparse", "csr")
    for shape in [(0, 3), (2, 0), (1, 1), (1,), (3, 2), (1, 1, 1), (4,)]
    for rows in (0, 1)
    if rows <= shape[0] and (stype == "row_sparse" or len(shape) == 2)
]


@pytest.mark.parametrize("stype, shape, rows", TRUTH_CASES)
def test_truth_value_follows_numpy(stype, shape, rows):
    """``bool(x)`` is the dense array's: defined for one element only (not
    Python's fallback on ``__len__``, which would call any RowSparse with
    rows true)."""
    dense = np.zeros(shape, np.float32)
    dense[:rows] = 1.5
    x = jsr.cast_storage(jnp.asarray(dense), stype)
    try:
        want = bool(dense)
    except ValueError:
        with pytest.raises(ValueError, match=r"truth value of .*ambiguous.*x\.size > 0"):
            bool(x)
    else:
        assert bool(x) is want
        with pytest.raises(jax.errors.TracerBoolConversionError):
            jax.jit(lambda x: 1 if x else 0)(x)


def test_truth_value_of_a_stored_zero_is_false():
    assert not jsr.RowSparse([[0.0]], [0], shape=(1, 1))
    assert not jsr.csr_matrix(([0.0], [0], [0, 1]), shape=(1, 1))
    assert jsr.csr_matrix(([-2.0], [0], [0, 1]), shape=(1, 1))


def test_host_indices_are_validated_inside_jit_too():
    """numpy / list indices are known inside jit, so they are checked there too
    (unchecked duplicates would make todense and sum disagree)."""
    data = np.array([[1.0], [2.0]], np.float32)
    with pytest.raises(ValueError, match="must be < N = 3"):
        jax.jit(lambda: jsr.RowSparse(data[:1], np.array([5]), (3, 1)).todense())()
    with pytest.raises(ValueError, match="sorted ascending without duplicates"):
        jax.jit(lambda: jsr.RowSparse(data, [1, 1], (3, 1)).todense())()
    ok = jax.jit(lambda d: jsr.RowSparse(d, np.array([0, 2]), (3, 1)).todense())(jnp.asarray(data))
    np.testing.assert_array_equal(np.asarray(ok)[:, 0], [1.0, 0.0, 2.0])


def test_take_from_a_scalar_names_x():
    with pytest.raises(ValueError, match="`x` must be at least 1-D"):
        jsr.take(jnp.float32(1), jnp.array([0]))


@pytest.mark.parametrize("shape", [(5, 2), (5,), (4, 0, 3)])
def test_row_sparse_array_from_empty_lists(shape):
    x = jsr.row_sparse_array(([], []), shape=shape)
    assert x.shape == shape and x.capacity == 0 and x.dtype == jnp.float32
    np.testing.assert_array_equal(x.asnumpy(), np.zeros(shape))


@pytest.mark.parametrize("dtype", [None, jnp.float16, jnp.int32])
def test_shape_only_constructors_build_empty_arrays(dtype):
    """MXNet's ``row_sparse_array((D0, D1..))`` and MXNet / scipy's
    ``csr_matrix((M, N))`` build empty arrays; they were refused with a
    message about (data, indices)."""
    r = jsr.row_sparse_array((4, 2, 3), dtype=dtype)
    c = jsr.csr_matrix((2, 5), dtype=dtype)
    want = jnp.dtype(jnp.float32 if dtype is None else dtype)
    assert (r.shape, r.capacity, r.dtype) == ((4, 2, 3), 0, want)
    assert (c.shape, c.nse, c.dtype) == ((2, 5), 0, want)
    np.testing.assert_array_equal(np.asarray(r.todense()), np.zeros((4, 2, 3)))
    np.testing.assert_array_equal(np.asarray(c.todense()), np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"`shape` \(3, 2\) does not match"):
        jsr.row_sparse_array((4, 2), shape=(3, 2))
    with pytest.raises(ValueError, match=r"`shape` \(3, 2\) does not match"):
        jsr.csr_matrix((4, 2), shape=(3, 2))


REPEATS = 600  # past 256, where a bfloat16 running sum of ones stops


@pytest.mark.parametrize(
    "build",
    [
        lambda v: jsr.row_sparse_array((v, [1] * REPEATS), shape=(3,)),
        lambda v: jsr.csr_matrix((v, [1] * REPEATS, [0, 0, REPEATS]), shape=(2, 3)),
        lambda v: jsr.from_bcoo(
            jsparse.BCOO((v[:, None], jnp.ones((REPEATS, 1), jnp.int32)), shape=(3, 1))
        ),
    ],
    ids=["row_sparse_array", "csr_matrix", "from_bcoo"],
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.bool_])
def test_constructors_sum_repeated_ids_as_the_other_sums_do(build, dtype, jit_mode):
    """Repeats of one id merge like ``jnp.sum``: half precision accumulates in
    float32 and rounds once (600 ones give 600, not 256), bools combine by
    logical or; host values and traced ones give the same."""
    values = jnp.asarray(np.arange(REPEATS) % 2 == 0, dtype)
    got = np.asarray(jit_mode(lambda v: build(v).todense())(values), np.float32)
    want = jnp.sum(values.astype(jnp.float32)).astype(dtype)  # one rounding
    assert got.sum() == np.float32(want) and np.count_nonzero(got) == 1
