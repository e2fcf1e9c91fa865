"""Test data: canonical RowSparse / CSR arrays drawn from a numpy Generator,
with stored values from ``jsr.testing.random_dense`` (non-zero and exact in
every dtype, integer and complex ones included) and a chosen number of
stored rows, capacity or padding. Users draw random sparse arrays with
``jsr.random``."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

import jaxsparse_rows as jsr
from jaxsparse_rows._dtypes import index_dtype
from jaxsparse_rows.testing import random_dense


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    out = tuple(operator.index(d) for d in shape)
    if any(d < 0 for d in out):
        raise ValueError(f"`shape` must be a tuple of non-negative ints, got {shape!r}.")
    return out


def random_rowsparse(
    rng: np.random.Generator,
    shape: Sequence[int],
    *,
    n_rows: int | None = None,
    capacity: int | None = None,
    dtype: Any = np.float32,
) -> jsr.RowSparse:
    """A canonical RowSparse of ``shape`` ``(N, D1..Dn)`` with ``n_rows``
    stored rows (uniform in ``[0, N]`` if omitted) holding non-zero values,
    in ``capacity`` slots (default ``n_rows``): padding slots (id ``N``, zero
    data) last."""
    shape = _shape(shape)
    if not shape:
        raise ValueError(f"`shape` must have at least 1 dimension (the rows), got {shape!r}.")
    n = shape[0]
    n_rows = int(rng.integers(0, n + 1)) if n_rows is None else operator.index(n_rows)
    if not 0 <= n_rows <= n:
        raise ValueError(f"`n_rows` must lie in [0, N] = [0, {n}], got {n_rows}.")
    capacity = n_rows if capacity is None else operator.index(capacity)
    if capacity < n_rows:
        raise ValueError(f"`capacity` must be >= `n_rows` = {n_rows}, got {capacity}.")
    rows = np.sort(rng.choice(n, size=n_rows, replace=False)) if n_rows else np.zeros(0, int)
    idx = np.full((capacity,), n, dtype=index_dtype())
    idx[:n_rows] = rows
    data = np.zeros((capacity,) + shape[1:], dtype=jnp.dtype(dtype))
    data[:n_rows] = random_dense(rng, (n_rows,) + shape[1:], dtype)
    return jsr.RowSparse(data, idx, shape)


def random_csr(
    rng: np.random.Generator,
    shape: Sequence[int],
    *,
    density: float = 0.3,
    nse: int | None = None,
    dtype: Any = np.float32,
) -> jsr.CSR:
    """A canonical CSR of ``shape`` ``(M, K)`` storing each entry with
    probability ``density`` (a non-zero value), in ``nse`` slots (default
    the stored entries): more slots are padding (column id ``K``, zero data),
    fewer thin the entries to fit."""
    shape = _shape(shape)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D, got {shape!r}.")
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"`density` must lie in [0, 1], got {density!r}.")
    nse = None if nse is None else operator.index(nse)
    if nse is not None and nse < 0:
        raise ValueError(f"`nse` must be >= 0, got {nse}.")
    m, k = shape
    mask = rng.random((m, k)) < density
    rows, cols = np.nonzero(mask)
    if nse is not None and len(rows) > nse:
        keep = np.sort(rng.choice(len(rows), size=nse, replace=False))
        rows, cols = rows[keep], cols[keep]
    cap = len(rows) if nse is None else nse
    idt = index_dtype()
    data = np.zeros((cap,), jnp.dtype(dtype))
    data[: len(rows)] = random_dense(rng, (len(rows),), dtype)
    ind = np.full((cap,), k, idt)
    ind[: len(rows)] = cols
    indptr = np.zeros((m + 1,), idt)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return jsr.CSR(data, ind, indptr, shape)
