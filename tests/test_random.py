"""jsr.random: exact entry counts, valid structure, determinism from the key,
dtypes and argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from hypothesis import given
from hypothesis import strategies as st

import jaxsparse_rows as jsr


@given(st.integers(0, 40), st.integers(0, 40), st.floats(0, 1), st.integers(0, 2**31 - 1))
def test_csr_structure_and_count(m, k, density, seed):
    x = jsr.random.csr(jax.random.key(seed), (m, k), density)
    nnz = int(round(density * m * k))
    assert x.shape == (m, k) and x.nse == nnz and np.asarray(x.indptr)[-1] == nnz
    jsr.CSR(x.data, x.indices, x.indptr, x.shape)  # strict validation: sorted, unique, in range
    data = np.asarray(x.data)
    assert np.all((data >= 0) & (data < 1))


@given(st.integers(0, 50), st.integers(1, 3), st.floats(0, 1), st.integers(0, 2**31 - 1))
def test_row_sparse_structure_and_count(n, d, density, seed):
    a = jsr.random.row_sparse(jax.random.key(seed), (n, d, 2), density, capacity=None)
    k = int(round(density * n))
    assert a.shape == (n, d, 2) and a.capacity == k and np.all(np.asarray(a.indices) < n)
    jsr.RowSparse(a.data, a.indices, a.shape)  # strict validation


def test_deterministic_and_key_dependent():
    k0, k1 = jax.random.key(0), jax.random.key(1)
    a, b = jsr.random.csr(k0, (50, 60), 0.1), jsr.random.csr(k0, (50, 60), 0.1)
    c = jsr.random.csr(k1, (50, 60), 0.1)
    for f in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(a.indices, c.indices)
    # raw uint32 keys work too
    r1 = jsr.random.row_sparse(jax.random.PRNGKey(3), (100, 4), 0.2)
    r2 = jsr.random.row_sparse(jax.random.PRNGKey(3), (100, 4), 0.2)
    np.testing.assert_array_equal(r1.indices, r2.indices)
    np.testing.assert_array_equal(r1.data, r2.data)


def _chi_square_cdf(counts, total):
    """CDF of the chi-square statistic of ``counts`` in equal buckets, when
    ``k = sum(counts)`` of ``total`` equally likely positions were drawn
    without replacement: the statistic, scaled by ``(total - 1) / (total - k)``
    for the smaller spread of such draws, is about chi-square with
    ``len(counts) - 1`` degrees of freedom. Near 0: too even; near 1: too uneven."""
    counts = np.asarray(counts, np.float64)
    k = counts.sum()
    expected = k / len(counts)
    stat = ((counts - expected) ** 2 / expected).sum() * (total - 1) / (total - k)
    return scipy.stats.chi2.cdf(stat, len(counts) - 1)


def test_positions_are_spread_uniformly():
    """Chi-square tests (fixed keys, two-sided, generous bounds) of how the
    entries fall into rows, columns and blocks of the flat positions."""
    m, k = 200, 50
    x = jsr.random.csr(jax.random.key(7), (m, k), 0.2)
    indptr, cols = np.asarray(x.indptr), np.asarray(x.indices)
    rows = np.repeat(np.arange(m), np.diff(indptr))
    flat = rows * k + cols
    for counts in (
        np.diff(indptr),  # entries per row
        np.bincount(cols, minlength=k),  # per column
        np.bincount(flat // 250, minlength=m * k // 250),  # per block of 250 positions
        np.bincount(2 * (rows % 2) + cols % 2, minlength=4),  # row / column parity
    ):
        assert 1e-6 < _chi_square_cdf(counts, m * k) < 1 - 1e-6, counts
    n = 4000
    a = jsr.random.row_sparse(jax.random.key(8), (n, 2), 0.25)
    counts = np.bincount(np.asarray(a.indices) // 100, minlength=n // 100)  # rows per block
    assert 1e-6 < _chi_square_cdf(counts, n) < 1 - 1e-6, counts


def test_under_jit():
    """The functions draw on the host from a concrete key (the module docs: call
    them outside jit): a key traced by jit is refused with a TypeError that says
    so. Arrays drawn outside pass into jitted code and come back unchanged."""
    key = jax.random.key(5)
    for fn in (jsr.random.csr, jsr.random.row_sparse):
        with pytest.raises(TypeError, match="concrete jax.random key.*run outside jit"):
            jax.jit(lambda k, fn=fn: fn(k, (4, 5), 0.5))(key)
        # A concrete key closed over inside jit draws the same array, as a
        # constant (it raised JAX's TracerArrayConversionError).
        inside = jax.jit(lambda fn=fn: fn(key, (4, 5), 0.5).todense())()
        np.testing.assert_array_equal(inside, fn(key, (4, 5), 0.5).todense())
    c, r = jsr.random.csr(key, (6, 5), 0.4), jsr.random.row_sparse(key, (6, 5), 0.5, capacity=4)
    c2, r2 = jax.jit(lambda c, r: (c, r))(c, r)
    for a, b, fields in ((c, c2, ("data", "indices", "indptr")), (r, r2, ("data", "indices"))):
        assert type(a) is type(b) and a.shape == b.shape
        for f in fields:
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    # a jitted product of the drawn csr against numpy
    dense = np.zeros((6, 5), np.float32)
    rows = np.repeat(np.arange(6), np.diff(np.asarray(c.indptr)))
    dense[rows, np.asarray(c.indices)] = np.asarray(c.data)
    assert np.count_nonzero(dense) == 12  # round(0.4 * 30) entries
    y = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    np.testing.assert_allclose(jax.jit(jsr.dot)(c, jnp.asarray(y)), dense @ y, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_dtypes_range_and_capacity(dtype):
    x = jsr.random.csr(jax.random.key(0), (10, 10), 0.5, dtype=dtype, minval=-2, maxval=-1)
    assert x.dtype == dtype
    assert np.all((np.asarray(x.data, np.float32) >= -2) & (np.asarray(x.data, np.float32) < -1))
    a = jsr.random.row_sparse(jax.random.key(0), (10, 3), 0.3, dtype=dtype, capacity=6)
    assert a.dtype == dtype and a.capacity == 6 and int(a.nnz_rows) == 3
    np.testing.assert_array_equal(np.asarray(a.indices)[3:], 10)
    assert not np.asarray(a.data, np.float32)[3:].any()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("minval,maxval", [(0.0, 1.0), (0.1, 0.3), (-2.0, -1.0)])
def test_values_stay_in_the_half_open_interval_after_rounding(dtype, minval, maxval):
    """Draws near maxval must not round up to it in a narrow dtype (nor below minval)."""
    key = jax.random.key(1)
    x = jsr.random.csr(key, (400, 500), 0.5, dtype=dtype, minval=minval, maxval=maxval)
    a = jsr.random.row_sparse(key, (400, 500), 0.5, dtype=dtype, minval=minval, maxval=maxval)
    for values in (np.asarray(x.data, np.float64), np.asarray(a.data, np.float64)[:200]):
        assert values.min() >= minval and values.max() < maxval


def test_float64_under_x64():
    with jax.enable_x64(True):
        x = jsr.random.csr(jax.random.key(0), (5, 5), 0.4, dtype=jnp.float64)
        assert x.dtype == jnp.float64 and x.indices.dtype == jnp.int64


@pytest.mark.parametrize(
    "fn, name", [(jsr.random.csr, "csr"), (jsr.random.row_sparse, "row_sparse")]
)
def test_float64_without_x64_warns_as_jax_does(fn, name):
    """float64 without x64 came back as float32 with no warning, where
    jax.random.uniform and jnp.zeros warn that it is truncated."""
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on: float64 is available")
    with pytest.warns(UserWarning, match=rf"float64 requested in jsr.random.{name} .*float32"):
        x = fn(jax.random.key(0), (40, 50), 0.5, dtype=jnp.float64, minval=0.1, maxval=0.3)
    assert x.dtype == jnp.float32
    values = np.asarray(x.data, np.float64)  # (every stored value is drawn)
    assert values.min() >= 0.1 and values.max() < 0.3


def test_errors():
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="density"):
        jsr.random.csr(key, (3, 3), 1.5)
    with pytest.raises(TypeError, match="density"):
        jsr.random.csr(key, (3, 3), "dense")
    with pytest.raises(ValueError, match="2-D"):
        jsr.random.csr(key, (3, 3, 3), 0.1)
    with pytest.raises(TypeError, match="floating"):
        jsr.random.csr(key, (3, 3), 0.1, dtype=jnp.int32)
    with pytest.raises(TypeError, match="key"):
        jsr.random.csr(0, (3, 3), 0.1)
    with pytest.raises(ValueError, match="capacity"):
        jsr.random.row_sparse(key, (10, 2), 0.5, capacity=2)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda k: jsr.random.row_sparse(k, (5.7, 2), 0.5), TypeError, r"`shape` must be a tuple"),
        (lambda k: jsr.random.row_sparse(k, (-1, 2), 0.5), ValueError, r"`shape` must be a tuple"),
        (lambda k: jsr.random.row_sparse(k, (), 0.5), ValueError, r"`shape` must have at least"),
        (
            lambda k: jsr.random.row_sparse(k, (5, 2), 0.4, capacity=2.9),
            TypeError,
            r"`capacity` must be an int >= 0, got float 2.9",
        ),
        (lambda k: jsr.random.csr(k, (4.9, 4), 0.5), TypeError, r"`shape` must be a tuple"),
        (lambda k: jsr.random.csr(k, (4, 4), -1), ValueError, r"`density` must lie in \[0, 1\]"),
        (lambda k: jsr.random.csr(k, (4, 4), 0.5, nse=-1), ValueError, r"`nse` must be an int"),
        (lambda k: jsr.random.csr(k, (4, 4), 0.5, nse=8.0), TypeError, r"`nse` .* got float 8.0"),
        (lambda k: jsr.random.csr(k, (4, 4), 0.5, nse=True), TypeError, r"`nse` .* got bool True"),
        (
            lambda k: jsr.random.csr(k, (4, 4), 0.5, nse=7),
            ValueError,
            r"`nse` = 7 is smaller than the 8 entries",
        ),
    ],
)
def test_shape_and_capacity_errors_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call(jax.random.key(0))


def test_csr_nse_pads_after_the_stored_entries():
    """``nse`` slots past the ``round(density * M * K)`` entries are padding:
    column id ``K``, zero data; the stored entries are those drawn without it."""
    key = jax.random.key(3)
    x = jsr.random.csr(key, (6, 5), 0.4, dtype=jnp.bfloat16, nse=17)
    plain = jsr.random.csr(key, (6, 5), 0.4, dtype=jnp.bfloat16)
    assert x.nse == 17 and int(x.nnz) == plain.nse == 12 and x.dtype == jnp.bfloat16
    jsr.CSR(x.data, x.indices, x.indptr, x.shape)  # strict validation
    np.testing.assert_array_equal(np.asarray(x.indices)[12:], 5)
    assert not np.asarray(x.data, np.float32)[12:].any()
    np.testing.assert_array_equal(x.indptr, plain.indptr)
    np.testing.assert_array_equal(np.asarray(x.data)[:12], np.asarray(plain.data))
    assert jsr.random.csr(key, (6, 5), 0.4, nse=12).nse == 12
    assert jsr.random.csr(key, (0, 5), 0.4, nse=3).nse == 3


@pytest.mark.parametrize("fn", [jsr.random.csr, jsr.random.row_sparse])
@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        # float16 holds at most 65504: every value came out as 65504
        (
            {"dtype": jnp.float16, "minval": 1e5, "maxval": 2e5},
            ValueError,
            r"`minval` = 100000.0 is not representable in float16",
        ),
        ({"dtype": jnp.float16, "maxval": 7e4}, ValueError, r"`maxval` = 70000.0 is not repr"),
        ({"minval": 1.0, "maxval": 0.0}, ValueError, r"`minval` must be less than `maxval`"),
        ({"minval": 1.0, "maxval": 1.0}, ValueError, r"`minval` must be less than `maxval`"),
        ({"minval": float("nan")}, ValueError, r"`minval` must be finite, got nan"),
        ({"maxval": float("inf")}, ValueError, r"`maxval` must be finite, got inf"),
        ({"minval": "0"}, TypeError, r"`minval` must be a finite real number, got str"),
        (
            {"dtype": jnp.float16, "minval": 1.0001, "maxval": 1.0002},
            ValueError,
            r"no float16 value lies in \[minval, maxval\)",
        ),
    ],
)
def test_value_range_errors_name_the_bound(fn, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        fn(jax.random.key(0), (3, 3), 0.5, **kwargs)


@pytest.mark.parametrize("fn", [jsr.random.csr, jsr.random.row_sparse])
def test_a_key_must_be_typed_or_raw_uint32(fn):
    """A float array was truncated to uint32 and accepted as a key."""
    match = r"`key` must be a jax.random key.*got an array of dtype float32"
    with pytest.raises(TypeError, match=match):
        fn(jnp.array([0.5, 1.7]), (3, 3), 0.5)
    with pytest.raises(TypeError, match=r"`key`.*dtype int32"):
        fn(jnp.array([0, 1], jnp.int32), (3, 3), 0.5)
    raw = fn(jax.random.PRNGKey(0), (3, 3), 0.5, minval=-1, maxval=np.float32(2))
    assert raw.shape == (3, 3)


def test_density_must_be_a_real_number():
    with pytest.raises(TypeError, match=r"`density` must be a number in \[0, 1\], got str '0.5'"):
        jsr.random.csr(jax.random.key(0), (3, 3), "0.5")
