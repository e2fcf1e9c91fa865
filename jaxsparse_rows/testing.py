"""Test helpers for code that uses jaxsparse_rows: dense-oracle assertions
and exact dense test values (random sparse arrays come from
:mod:`jsr.random <jaxsparse_rows.random>`).

Everything here is plain numpy + jax (no pytest or hypothesis), so it can be
used from any test framework::

    import jax
    import jaxsparse_rows as jsr
    from jaxsparse_rows import testing as jsrt

    x = jsr.random.row_sparse(jax.random.key(0), (10, 3), 0.4, capacity=6)
    jsrt.assert_allclose(x * 2, 2 * x.asnumpy(), stype="row_sparse")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._csr import CSR, validate_csr
from ._dtypes import index_dtype
from ._rowsparse import RowSparse, as_shape, validate_padding_data, validate_row_indices
from ._storage import stype as _stype

__all__ = [
    "assert_allclose",
    "assert_valid",
    "random_dense",
    "tolerance",
]

_TOLERANCES = {
    "bfloat16": (2e-2, 2e-2),
    "float16": (2e-3, 2e-3),
    "float32": (1e-5, 1e-6),
    "float64": (1e-12, 1e-12),
    "complex64": (1e-5, 1e-6),
    "complex128": (1e-12, 1e-12),
}


def tolerance(dtype: Any) -> tuple[float, float]:
    """``(rtol, atol)`` suitable for comparing results of one op in ``dtype``
    (complex dtypes get their component float's; integer and bool dtypes are
    compared exactly).

    Example:
      >>> from jaxsparse_rows import testing as jsrt
      >>> jsrt.tolerance("float16")
      (0.002, 0.002)
    """
    name = jnp.dtype(dtype).name
    return _TOLERANCES.get(name, (0.0, 0.0))


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "`rng` must be a numpy.random.Generator (e.g. `np.random.default_rng(0)`), got "
            f"{type(rng).__name__}. (`jsr.random` draws from a jax.random key instead.)"
        )
    return rng


def random_dense(
    rng: np.random.Generator, shape: Sequence[int], dtype: Any = np.float32
) -> np.ndarray:
    """A dense numpy array of small non-zero values, exact in every dtype.

    The values are multiples of 1/4 in ``[-2, 2]`` for floating dtypes,
    integers in ``[-8, 8]`` for signed integer dtypes (``[1, 8]`` for unsigned
    ones), and ``True`` for bool.

    Args:
      rng: a ``numpy.random.Generator``.
      shape: the shape, ints ``>= 0``.
      dtype: the dtype.

    Example:
      >>> import numpy as np
      >>> from jaxsparse_rows import testing as jsrt
      >>> x = jsrt.random_dense(np.random.default_rng(0), (2, 3))
      >>> x.shape, x.dtype, bool(np.all(x != 0))
      ((2, 3), dtype('float32'), True)
      >>> y = jsrt.random_dense(np.random.default_rng(0), (100,), np.int8)
      >>> bool(np.all((np.abs(y) >= 1) & (np.abs(y) <= 8)))
      True
    """
    rng = _check_rng(rng)
    shape = as_shape(shape, index_dims=0)
    dtype = jnp.dtype(dtype)
    mag = rng.integers(1, 9, size=shape)
    if jnp.issubdtype(dtype, jnp.unsignedinteger) or dtype == np.bool_:
        return mag.astype(dtype)
    sign = rng.choice(np.array([-1, 1]), size=shape)
    vals = sign * mag
    if jnp.issubdtype(dtype, jnp.floating):
        return (vals / 4.0).astype(dtype)
    return vals.astype(dtype)


def _dense(x: Any) -> np.ndarray:
    return np.asarray(x)  # sparse arrays densify through ``__array__``


def assert_allclose(
    actual: Any,
    expected: Any,
    *,
    stype: str | None = None,
    dtype: Any = None,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Asserts that ``actual`` (sparse or dense) equals the dense ``expected``.

    Both sides are densified and compared in float64 with the tolerance of
    ``actual``'s dtype (see :func:`tolerance`) unless ``rtol`` / ``atol`` are
    given. Shapes must match exactly. If ``stype`` is given, ``actual`` must
    have that storage type; if ``dtype`` is given, ``actual`` must have that
    dtype. A sparse ``actual`` is also checked with :func:`assert_valid`.

    Example:
      >>> import numpy as np, jaxsparse_rows as jsr
      >>> from jaxsparse_rows import testing as jsrt
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> jsrt.assert_allclose(a * 2, [[0, 0], [2, 4], [0, 0]], stype="row_sparse")
    """
    if stype is not None and _stype(actual) != stype:
        raise AssertionError(f"expected storage type {stype!r}, got {_stype(actual)!r}.")
    act_dtype = actual.dtype if hasattr(actual, "dtype") else np.asarray(actual).dtype
    if dtype is not None and jnp.dtype(act_dtype) != jnp.dtype(dtype):
        raise AssertionError(f"expected dtype {jnp.dtype(dtype)}, got {jnp.dtype(act_dtype)}.")
    if isinstance(actual, RowSparse | CSR):
        assert_valid(actual)
    a = _dense(actual)
    e = np.asarray(_dense(expected))
    if a.shape != e.shape:
        raise AssertionError(f"shape mismatch: actual {a.shape}, expected {e.shape}.")
    default_rtol, default_atol = tolerance(act_dtype)
    np.testing.assert_allclose(
        _widened(a),
        _widened(e),
        rtol=default_rtol if rtol is None else rtol,
        atol=default_atol if atol is None else atol,
    )


def _widened(x: np.ndarray) -> np.ndarray:
    """Floats (bfloat16 too) as float64 and complex values as complex128, for
    comparison; other dtypes unchanged."""
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        return x.astype(np.float64)
    return x


def assert_valid(x: Any) -> None:
    """Asserts the structural invariants of a concrete RowSparse or CSR array.

    RowSparse: ``data`` is ``[k, *shape[1:]]``, ``indices`` is ``[k]`` of the
    default index dtype, real ids sorted, unique and in ``[0, N)``, padding
    slots (id ``N``) last with zero data. CSR: the same for ``indptr`` /
    column ids / padding. The checks run in numpy (for traced arrays use
    :func:`jsr.check <jaxsparse_rows.check>` with checkify).

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> from jaxsparse_rows import testing as jsrt
      >>> jsrt.assert_valid(jsr.RowSparse.fromdense(jnp.eye(3)))
    """
    if not isinstance(x, RowSparse | CSR):
        raise AssertionError(f"expected a RowSparse or CSR, got {type(x).__name__}.")
    if not isinstance(x.data, jax.Array) or not isinstance(x.indices, jax.Array):
        raise AssertionError(
            f"children must be jax arrays, got {type(x.data).__name__} / "
            f"{type(x.indices).__name__}."
        )
    if x.indices.dtype != index_dtype():
        raise AssertionError(f"indices dtype must be {index_dtype()}, got {x.indices.dtype}.")
    if x.indices.ndim != 1 or x.data.shape[0] != x.indices.shape[0]:
        raise AssertionError(
            f"data {x.data.shape} and indices {x.indices.shape} disagree on the capacity."
        )
    if isinstance(x, RowSparse):
        if tuple(x.data.shape[1:]) != tuple(x.shape[1:]):
            raise AssertionError(f"data {x.data.shape} does not match shape {x.shape}.")
    else:
        if x.indptr.dtype != index_dtype() or x.indptr.shape != (x.shape[0] + 1,):
            raise AssertionError(
                f"indptr must be [{x.shape[0] + 1}] {index_dtype()}, got "
                f"{x.indptr.shape} {x.indptr.dtype}."
            )
        if x.data.ndim != 1:
            raise AssertionError(f"CSR data must be 1-D, got {x.data.shape}.")
    data = np.asarray(x.data)
    try:
        if isinstance(x, RowSparse):
            n_real = validate_row_indices(np.asarray(x.indices), x.shape[0])
            validate_padding_data(data, n_real, x.shape[0])
        else:
            validate_csr(data, np.asarray(x.indices), np.asarray(x.indptr), x.shape)
    except ValueError as e:
        raise AssertionError(str(e)) from None
