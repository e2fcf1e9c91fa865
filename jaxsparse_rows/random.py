"""Random sparse arrays for tests and examples (MXNet's ``rand_ndarray(shape,
'csr' | 'row_sparse', density)``), deterministic from a ``jax.random`` key.

The key's bits seed a host-side numpy generator (no compilation, so they are
cheap to call with many shapes); call them outside ``jax.jit`` (inside, only
with a key closed over from outside, which makes the result a constant). The
number of stored entries is static: ``round(density * size)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._csr import CSR
from ._rowsparse import RowSparse, _as_shape
from ._util import check_static_int, index_dtype, is_concrete

__all__ = ["csr", "row_sparse"]


def _check_density(density: Any) -> float:
    try:
        value = float(density)
    except (TypeError, ValueError):
        raise TypeError(f"`density` must be a number in [0, 1], got {density!r}.") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`density` must lie in [0, 1], got {density!r}.")
    return value


def _host_rng(key: Any) -> np.random.Generator:
    """A numpy Generator seeded by the key's bits: deterministic, no compilation."""
    if not isinstance(key, jax.Array) or not is_concrete(key):
        raise TypeError(
            f"`key` must be a concrete jax.random key (e.g. `jax.random.key(0)`), got "
            f"{type(key).__name__}. These functions run outside jit."
        )
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        with jax.ensure_compile_time_eval():  # a concrete key closed over inside jit
            key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key).astype(np.uint32).ravel().tolist())


def _check_float(dtype: Any) -> np.dtype:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a floating dtype, got {dtype}.")
    return dtype


def _positions(rng: np.random.Generator, total: int, k: int) -> np.ndarray:
    """``k`` distinct ints in ``[0, total)``, uniform, sorted."""
    return np.sort(rng.choice(total, size=k, replace=False, shuffle=False).astype(np.int64))


def _uniform(rng: np.random.Generator, shape, dtype, minval: float, maxval: float) -> np.ndarray:
    """Uniform values in ``[minval, maxval)`` as ``dtype``: drawn in float64, then
    kept inside the interval after rounding (a bfloat16 draw of 0.999 is 1.0)."""
    values = rng.uniform(minval, maxval, shape).astype(dtype)
    top, bottom = np.asarray(maxval, dtype), np.asarray(minval, dtype)
    if float(top) >= maxval:
        top = np.nextafter(top, np.asarray(-np.inf, dtype))
    if float(bottom) < minval:
        bottom = np.nextafter(bottom, np.asarray(np.inf, dtype))
    return np.clip(values, bottom, top).astype(dtype, copy=False)


def _values(rng: np.random.Generator, shape, dtype, minval: float, maxval: float) -> jax.Array:
    return jnp.asarray(_uniform(rng, shape, dtype, minval, maxval))


def csr(
    key: jax.Array,
    shape: Sequence[int],
    density: float,
    dtype: Any = jnp.float32,
    minval: float = 0.0,
    maxval: float = 1.0,
) -> CSR:
    """A random CSR matrix with ``round(density * M * K)`` stored entries.

    Positions are uniform without replacement; values are uniform in
    ``[minval, maxval)``. The result has no padding.

    Args:
      key: a ``jax.random`` key; the same key gives the same matrix.
      shape: ``(M, K)``.
      density: fraction of the entries that are stored, in ``[0, 1]``.
      dtype: a floating dtype.
      minval: lower end of the range of the values.
      maxval: upper end of the range of the values.

    Example:
      >>> import jax, jaxsparse_rows as jsr
      >>> x = jsr.random.csr(jax.random.key(0), (1000, 100), 0.01)
      >>> x, int(x.nnz)
      (CSR(float32[1000, 100], nnz=1000), 1000)
    """
    rng = _host_rng(key)
    shape = _as_shape(shape, index_dims=2)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D (M, K) for a CSR, got {shape}.")
    density = _check_density(density)
    dtype = _check_float(dtype)
    m, n = shape
    nnz = int(round(density * m * n))
    flat = _positions(rng, m * n, nnz)
    rows, cols = flat // max(n, 1), flat % max(n, 1)
    idt = index_dtype()
    indptr = np.zeros(m + 1, idt)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    data = _values(rng, (nnz,), dtype, minval, maxval)
    return CSR._make(data, jnp.asarray(cols.astype(idt)), jnp.asarray(indptr), shape)


def row_sparse(
    key: jax.Array,
    shape: Sequence[int],
    density: float,
    dtype: Any = jnp.float32,
    minval: float = 0.0,
    maxval: float = 1.0,
    capacity: int | None = None,
) -> RowSparse:
    """A random RowSparse array storing ``round(density * N)`` of its ``N`` rows.

    The stored rows are uniform without replacement (sorted); their values
    are uniform in ``[minval, maxval)``.

    Args:
      key: a ``jax.random`` key; the same key gives the same array.
      shape: ``(N, D1, ..., Dn)``.
      density: fraction of the rows that are stored, in ``[0, 1]``.
      dtype: a floating dtype.
      minval: lower end of the range of the values.
      maxval: upper end of the range of the values.
      capacity: row slots of the result (default: exactly the stored rows);
        extra slots are padding (index ``N``, zero data).

    Example:
      >>> import jax, jaxsparse_rows as jsr
      >>> a = jsr.random.row_sparse(jax.random.key(0), (10, 3), 0.3, capacity=4)
      >>> a, a.data.shape
      (RowSparse(float32[10, 3], rows=3, capacity=4), (4, 3))
    """
    rng = _host_rng(key)
    shape = _as_shape(shape)
    if len(shape) < 1:
        raise ValueError("`shape` must have at least one dimension (the rows), got ().")
    density = _check_density(density)
    dtype = _check_float(dtype)
    n = shape[0]
    k = int(round(density * n))
    cap = k if capacity is None else check_static_int(capacity, "capacity")
    if cap < k:
        raise ValueError(
            f"`capacity` = {cap} is smaller than the {k} rows that density {density} of "
            f"{n} rows stores; pass a capacity >= {k} or None."
        )
    rows = _positions(rng, n, k)
    idt = index_dtype()
    indices = np.full(cap, n, idt)
    indices[:k] = rows
    data = np.zeros((cap,) + shape[1:], dtype)
    data[:k] = _uniform(rng, (k,) + shape[1:], dtype, minval, maxval)
    return RowSparse._make(jnp.asarray(data), jnp.asarray(indices), shape)
