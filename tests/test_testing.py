"""jsr.testing: its assertions must fail where the arrays differ; its dense
values; and the properties of the suite's own test data (tests/draw.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from draw import random_csr, random_rowsparse

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt


def _rsp(values, dtype=jnp.float32):
    return jsr.RowSparse(jnp.asarray([values], dtype), [1], shape=(3, len(values)))


def test_assert_allclose_passes_equal_and_fails_different_values():
    a = _rsp([1.0, 2.0])
    jsrt.assert_allclose(a * 2, [[0, 0], [2, 4], [0, 0]], stype="row_sparse", dtype=jnp.float32)
    with pytest.raises(AssertionError):
        jsrt.assert_allclose(a * 2, [[0, 0], [2, 4.001], [0, 0]])


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_assert_allclose_compares_imaginary_parts(dtype):
    with jax.enable_x64(dtype == "complex128"):
        _compare_complex(_rsp([1 + 1j, 2 + 0j], dtype))


def _compare_complex(a):
    jsrt.assert_allclose(a * 2, np.array([[0, 0], [2 + 2j, 4], [0, 0]]))
    with pytest.raises(AssertionError):
        jsrt.assert_allclose(a * 2, np.array([[0, 0], [2 + 99j, 4 - 7j], [0, 0]]))


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float32", "bfloat16"])
def test_tolerance_accepts_one_ops_rounding(dtype):
    """A result rounded once in ``dtype`` passes against the exact value."""
    exact = np.array([[1 / 3 + 2j / 7, 5 / 9 - 1j / 11]])
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        exact = exact.real
    with jax.enable_x64(dtype == "complex128"):
        rounded = jnp.asarray(exact, dtype)
        rtol, atol = jsrt.tolerance(dtype)
        assert rtol > 0 and atol > 0
        jsrt.assert_allclose(rounded, exact)


def test_integer_tolerance_is_exact():
    assert jsrt.tolerance("int32") == (0.0, 0.0)
    with pytest.raises(AssertionError):
        jsrt.assert_allclose(jnp.array([1, 2]), np.array([1, 3]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"stype": "csr"}, "expected storage type 'csr', got 'row_sparse'"),
        ({"dtype": jnp.float16}, "expected dtype float16, got float32"),
    ],
)
def test_assert_allclose_checks_stype_and_dtype(kwargs, match):
    with pytest.raises(AssertionError, match=match):
        jsrt.assert_allclose(_rsp([1.0]), [[0], [1], [0]], **kwargs)


def test_assert_allclose_checks_shape_and_validity():
    with pytest.raises(AssertionError, match="shape mismatch"):
        jsrt.assert_allclose(_rsp([1.0]), [[0], [1]])
    broken = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([1, 1]), (3, 1))
    with pytest.raises(AssertionError, match="sorted ascending without duplicates"):
        jsrt.assert_allclose(broken, [[0], [2], [0]])


def test_random_dense_checks_its_arguments():
    with pytest.raises(TypeError, match=r"`shape` must be a tuple of ints"):
        jsrt.random_dense(np.random.default_rng(0), (2.5, 3))
    with pytest.raises(TypeError, match=r"`rng` must be a numpy.random.Generator.*PRNGKeyArray"):
        jsrt.random_dense(jax.random.key(0), (3, 2))
    assert jsrt.random_dense(np.random.default_rng(0), (3, 2)).shape == (3, 2)


def _exact_non_zero(values):
    """Non-zero multiples of 1/4 in [-8, 8]: exact in every dtype, so a
    dense oracle computes them without rounding."""
    v = np.asarray(values).astype(np.float64)
    return bool(np.all((v != 0) & (v * 4 == np.round(v * 4)) & (np.abs(v) <= 8)))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int8, np.uint8, np.bool_])
def test_test_data_is_canonical_with_exact_non_zero_values(dtype):
    """The suite's test data (tests/draw.py): canonical arrays with the
    requested rows and slots, stored values exact and non-zero, padding last
    with zero data, a CSR thinned to fit a small ``nse``, and the same draws
    from the same Generator."""
    rng = np.random.default_rng(0)
    x = random_rowsparse(rng, (7, 2), n_rows=3, capacity=5, dtype=dtype)
    jsrt.assert_valid(x)
    assert x.dtype == dtype and x.capacity == 5 and int(x.nnz_rows) == 3
    assert _exact_non_zero(x.data[:3]) and not np.asarray(x.data[3:]).any()
    c = random_csr(rng, (5, 6), density=0.5, nse=40, dtype=dtype)
    jsrt.assert_valid(c)
    nnz = int(c.nnz)
    assert c.dtype == dtype and c.nse == 40 and 0 < nnz < 30 and _exact_non_zero(c.data[:nnz])
    thin = random_csr(rng, (5, 6), density=1.0, nse=4, dtype=dtype)
    jsrt.assert_valid(thin)
    assert thin.nse == int(thin.nnz) == 4
    again = random_rowsparse(np.random.default_rng(0), (7, 2), n_rows=3, capacity=5, dtype=dtype)
    np.testing.assert_array_equal(np.asarray(again.indices), np.asarray(x.indices))
    np.testing.assert_array_equal(np.asarray(again.data), np.asarray(x.data))


def test_assert_valid_names_the_padding_slot_with_non_zero_data():
    """assert_valid checks padding data with the constructors' own check, so
    its message names the slot as theirs do."""
    rsp = jsr.RowSparse._make(jnp.array([[1.0], [2.0]]), jnp.array([1, 4]), (4, 1))
    with pytest.raises(AssertionError, match=r"padding slots \(id N = 4\) .*; slot 1 holds"):
        jsrt.assert_valid(rsp)
    csr = jsr.CSR._make(jnp.array([1.0, 5.0]), jnp.array([0, 2]), jnp.array([0, 1]), (1, 2))
    with pytest.raises(AssertionError, match=r"must hold zero `data`, but slot 1 holds 5.0"):
        jsrt.assert_valid(csr)
