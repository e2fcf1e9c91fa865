"""jsr.random: exact entry counts, valid structure, determinism from the key,
dtypes and argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def test_positions_are_spread_uniformly():
    x = jsr.random.csr(jax.random.key(7), (200, 50), 0.2)
    counts = np.diff(np.asarray(x.indptr))
    # 10 entries per row on average; every column used about 40 times
    assert abs(counts.mean() - 10) < 1e-9 and counts.std() < 5
    col_counts = np.bincount(np.asarray(x.indices), minlength=50)
    assert col_counts.min() > 15 and col_counts.max() < 70


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
