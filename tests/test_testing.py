"""jsr.testing's own assertions: they must fail where the arrays differ."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


@pytest.mark.parametrize(
    "call,exc,match",
    [
        # (5.7, 2) built 5 rows and capacity 2.9 gave 2
        (lambda r: jsrt.random_rowsparse(r, (5.7, 2)), TypeError, r"`shape` must be a tuple of"),
        (lambda r: jsrt.random_rowsparse(r, (-1, 2)), ValueError, r"`shape` must be a tuple of"),
        (
            lambda r: jsrt.random_rowsparse(r, ()),
            ValueError,
            r"`shape` must have at least 1 dimension",
        ),
        (
            lambda r: jsrt.random_rowsparse(r, (5, 2), n_rows=2, capacity=2.9),
            TypeError,
            r"`capacity` must be an int >= 0, got float 2.9",
        ),
        (
            lambda r: jsrt.random_rowsparse(r, (5, 2), n_rows=1.5),
            TypeError,
            r"`n_rows` must be an int >= 0, got float 1.5",
        ),
        (lambda r: jsrt.random_csr(r, (4.9, 4)), TypeError, r"`shape` must be a tuple of ints"),
        (
            lambda r: jsrt.random_csr(r, (2, 2, 2)),
            ValueError,
            r"`shape` must be 2-D, got \(2, 2, 2\)",
        ),
        (lambda r: jsrt.random_csr(r, (4, 4), density=-1), ValueError, r"`density` must lie"),
        (lambda r: jsrt.random_csr(r, (4, 4), density=1.5), ValueError, r"`density` must lie"),
        (lambda r: jsrt.random_csr(r, (4, 4), nse=-1), ValueError, r"`nse` must be an int >= 0"),
        (lambda r: jsrt.random_csr(r, (4, 4), nse=2.5), TypeError, r"`nse` must be an int >= 0"),
        (lambda r: jsrt.random_csr(r, (4, 4), nse=True), TypeError, r"`nse` .* got bool True"),
        (lambda r: jsrt.random_dense(r, (2.5, 3)), TypeError, r"`shape` must be a tuple of ints"),
    ],
)
def test_random_helpers_check_their_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call(np.random.default_rng(0))


@pytest.mark.parametrize("helper", [jsrt.random_rowsparse, jsrt.random_csr, jsrt.random_dense])
def test_random_helpers_need_a_numpy_generator(helper):
    with pytest.raises(TypeError, match=r"`rng` must be a numpy.random.Generator.*PRNGKeyArray"):
        helper(jax.random.key(0), (3, 2))
    assert helper(np.random.default_rng(0), (3, 2)).shape == (3, 2)


def test_assert_valid_names_the_padding_slot_with_non_zero_data():
    """assert_valid checks padding data with the constructors' own check, so
    its message names the slot as theirs do."""
    rsp = jsr.RowSparse._make(jnp.array([[1.0], [2.0]]), jnp.array([1, 4]), (4, 1))
    with pytest.raises(AssertionError, match=r"padding slots \(id N = 4\) .*; slot 1 holds"):
        jsrt.assert_valid(rsp)
    csr = jsr.CSR._make(jnp.array([1.0, 5.0]), jnp.array([0, 2]), jnp.array([0, 1]), (1, 2))
    with pytest.raises(AssertionError, match=r"must hold zero `data`, but slot 1 holds 5.0"):
        jsrt.assert_valid(csr)
