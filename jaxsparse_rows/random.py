"""Random sparse arrays for tests and examples (MXNet's ``rand_ndarray(shape,
'csr' | 'row_sparse', density)``), deterministic from a ``jax.random`` key.

The key's bits seed a host-side numpy generator (no compilation, so they are
cheap to call with many shapes); call them outside ``jax.jit`` (inside, only
with a key closed over from outside, which makes the result a constant). The
number of stored entries is static: ``round(density * size)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._args import check_static_int, is_concrete
from ._csr import CSR
from ._dtypes import index_dtype
from ._rowsparse import RowSparse, as_shape

__all__ = ["csr", "row_sparse"]


def _real_scalar(value: Any, name: str, expected: str) -> float:
    """``value`` as a float: a real (int or float) scalar, not a bool or a string."""
    try:
        arr = np.asarray(value)
    except Exception:  # e.g. a traced value
        arr = None
    if (
        arr is None
        or arr.ndim != 0
        or arr.dtype == np.bool_
        or not any(jnp.issubdtype(arr.dtype, k) for k in (jnp.integer, jnp.floating))
    ):
        raise TypeError(f"`{name}` must be {expected}, got {type(value).__name__} {value!r}.")
    return float(arr)


def _check_density(density: Any) -> float:
    value = _real_scalar(density, "density", "a number in [0, 1]")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`density` must lie in [0, 1], got {density!r}.")
    return value


def _rounded_bounds(dtype: np.dtype, minval: float, maxval: float) -> tuple[Any, Any]:
    """The smallest and largest ``dtype`` values inside ``[minval, maxval)``."""
    top, bottom = np.asarray(maxval, dtype), np.asarray(minval, dtype)
    if float(top) >= maxval:
        top = np.nextafter(top, np.asarray(-np.inf, dtype))
    if float(bottom) < minval:
        bottom = np.nextafter(bottom, np.asarray(np.inf, dtype))
    return bottom, top


def _check_range(minval: Any, maxval: Any, dtype: np.dtype) -> tuple[float, float]:
    """``[minval, maxval)``: finite real bounds, ``minval < maxval``, both within
    ``dtype``'s finite range, and at least one ``dtype`` value between them."""
    bounds = {}
    limit = float(jnp.finfo(dtype).max)
    for name, value in (("minval", minval), ("maxval", maxval)):
        v = _real_scalar(value, name, "a finite real number")
        if not np.isfinite(v):
            raise ValueError(f"`{name}` must be finite, got {value!r}.")
        if abs(v) > limit:
            raise ValueError(
                f"`{name}` = {value!r} is not representable in {dtype.name} (its finite values "
                f"lie in [{-limit:g}, {limit:g}]): the values would round to +-inf or be "
                "clipped to the largest finite value. Pass a bound in that range or a wider "
                "`dtype`."
            )
        bounds[name] = v
    lo, hi = bounds["minval"], bounds["maxval"]
    if not lo < hi:
        raise ValueError(
            f"`minval` must be less than `maxval` (values lie in [minval, maxval)), got "
            f"minval={minval!r}, maxval={maxval!r}."
        )
    if not np.isfinite(hi - lo):
        raise ValueError(
            f"`maxval` - `minval` must be finite in float64 (the values are drawn in it), got "
            f"minval={minval!r}, maxval={maxval!r}."
        )
    bottom, top = _rounded_bounds(dtype, lo, hi)
    if bottom > top:
        raise ValueError(
            f"no {dtype.name} value lies in [minval, maxval) = [{minval!r}, {maxval!r}): the "
            "interval is narrower than the spacing of the dtype there. Widen it or pass a "
            "wider `dtype`."
        )
    return lo, hi


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
    elif key.dtype != jnp.uint32:
        raise TypeError(
            "`key` must be a jax.random key: a typed key (`jax.random.key(0)`) or a raw "
            f"uint32 key array (`jax.random.PRNGKey(0)`), got an array of dtype {key.dtype} "
            f"and shape {key.shape}."
        )
    return np.random.default_rng(np.asarray(key).astype(np.uint32).ravel().tolist())


def _check_float(dtype: Any, fn: str) -> np.dtype:
    """A floating ``dtype`` as JAX will hold it: float64 without x64 becomes
    float32 with JAX's warning (the values are then drawn for float32, so they
    stay below ``maxval`` after rounding)."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a floating dtype, got {dtype}.")
    held = jnp.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if held != dtype:
        warnings.warn(
            f"Explicitly requested dtype {dtype} requested in jsr.random.{fn} is not "
            f"available, and will be truncated to dtype {held}. To enable more dtypes, set "
            "the jax_enable_x64 configuration option or the JAX_ENABLE_X64 shell "
            "environment variable.",
            UserWarning,
            stacklevel=3,
        )
    return held


def _positions(rng: np.random.Generator, total: int, k: int) -> np.ndarray:
    """``k`` distinct ints in ``[0, total)``, uniform, sorted."""
    return np.sort(rng.choice(total, size=k, replace=False, shuffle=False).astype(np.int64))


def _uniform(rng: np.random.Generator, shape, dtype, minval: float, maxval: float) -> np.ndarray:
    """Uniform values in ``[minval, maxval)`` as ``dtype``: drawn in float64, then
    kept inside the interval after rounding (a bfloat16 draw of 0.999 is 1.0)."""
    values = rng.uniform(minval, maxval, shape).astype(dtype)
    bottom, top = _rounded_bounds(dtype, minval, maxval)
    return np.clip(values, bottom, top).astype(dtype, copy=False)


def csr(
    key: jax.Array,
    shape: Sequence[int],
    density: float,
    dtype: Any = jnp.float32,
    minval: float = 0.0,
    maxval: float = 1.0,
    nse: int | None = None,
) -> CSR:
    """A random CSR matrix with ``round(density * M * K)`` stored entries.

    Positions are uniform without replacement; values are uniform in
    ``[minval, maxval)``.

    Args:
      key: a ``jax.random`` key; the same key gives the same matrix.
      shape: ``(M, K)``.
      density: fraction of the entries that are stored, in ``[0, 1]``.
      dtype: a floating dtype.
      minval: lower end of the range of the values: a finite number that
        ``dtype`` can hold.
      maxval: upper end of the range of the values, ``> minval``, likewise.
      nse: entry slots of the result (default: exactly the stored entries);
        extra slots are padding (column id ``K``, zero data).

    Raises:
      TypeError, ValueError: naming the argument that is not of the kind or
        in the range described above.

    Example:
      >>> import jax, jaxsparse_rows as jsr
      >>> x = jsr.random.csr(jax.random.key(0), (1000, 100), 0.01)
      >>> x, int(x.nnz)
      (CSR(float32[1000, 100], nnz=1000), 1000)
      >>> jsr.random.csr(jax.random.key(0), (4, 6), 0.5, nse=16)
      CSR(float32[4, 6], nnz=12, nse=16)
    """
    rng = _host_rng(key)
    shape = as_shape(shape, index_dims=2)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D (M, K) for a CSR, got {shape}.")
    density = _check_density(density)
    dtype = _check_float(dtype, "csr")
    minval, maxval = _check_range(minval, maxval, dtype)
    m, n = shape
    nnz = int(round(density * m * n))
    cap = nnz if nse is None else check_static_int(nse, "nse")
    if cap < nnz:
        raise ValueError(
            f"`nse` = {cap} is smaller than the {nnz} entries that density {density} of "
            f"{m} x {n} stores; pass an nse >= {nnz} or None."
        )
    flat = _positions(rng, m * n, nnz)
    rows, cols = flat // max(n, 1), flat % max(n, 1)
    idt = index_dtype()
    indptr = np.zeros(m + 1, idt)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    indices = np.full(cap, n, idt)
    indices[:nnz] = cols
    data = np.zeros(cap, dtype)
    data[:nnz] = _uniform(rng, (nnz,), dtype, minval, maxval)
    return CSR._make(jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr), shape)


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
      density: fraction of the rows that are stored, in ``[0, 1]``
        (``k / N`` stores exactly ``k`` rows).
      dtype: a floating dtype.
      minval: lower end of the range of the values: a finite number that
        ``dtype`` can hold.
      maxval: upper end of the range of the values, ``> minval``, likewise.
      capacity: row slots of the result (default: exactly the stored rows);
        extra slots are padding (index ``N``, zero data).

    Raises:
      TypeError, ValueError: naming the argument that is not of the kind or
        in the range described above.

    Example:
      >>> import jax, jaxsparse_rows as jsr
      >>> a = jsr.random.row_sparse(jax.random.key(0), (10, 3), 0.3, capacity=4)
      >>> a, a.data.shape
      (RowSparse(float32[10, 3], rows=3, capacity=4), (4, 3))
    """
    rng = _host_rng(key)
    shape = as_shape(shape)
    if len(shape) < 1:
        raise ValueError("`shape` must have at least one dimension (the rows), got ().")
    density = _check_density(density)
    dtype = _check_float(dtype, "row_sparse")
    minval, maxval = _check_range(minval, maxval, dtype)
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
