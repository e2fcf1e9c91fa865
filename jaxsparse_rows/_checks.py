"""Run-time validation of sparse invariants, usable eagerly and with checkify."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ._csr import CSR, whole_csr
from ._rowsparse import RowSparse
from ._util import check_unbatched_args, is_concrete


def row_id_conditions(idx: Any, n: int) -> list[tuple[Any, str]]:
    """The row-id invariants of a RowSparse with ``n`` rows as ``(condition,
    message)`` pairs: ids in ``[0, n]``, the real ones (``< n``) strictly
    increasing with padding (``n``) only after them. Compared in the ids' own
    dtype: where it cannot hold ``n`` (int8 ids of 300 rows), every id is
    below ``n`` and real."""
    fits = n <= jnp.iinfo(idx.dtype).max
    conds = [(jnp.all(idx >= 0), "RowSparse `indices` must be >= 0 (negative ids wrap).")]
    if fits:
        conds.append(
            (jnp.all(idx <= n), f"RowSparse `indices` must be <= N = {n} (N marks padding).")
        )
    if idx.shape[0] > 1:
        real_next = idx[1:] < n if fits else jnp.ones(idx.shape[0] - 1, bool)
        conds.append(
            (
                jnp.all(jnp.where(real_next, idx[1:] > idx[:-1], True)),
                "RowSparse `indices` must be sorted ascending without duplicates, with padding "
                "(id N) only at the end.",
            )
        )
    return conds


def _rowsparse_conditions(x: RowSparse) -> list[tuple[Any, str]]:
    n = x.shape[0]
    idx = x.indices
    conds = row_id_conditions(idx, n)
    pad = idx >= n if n <= jnp.iinfo(idx.dtype).max else jnp.zeros(idx.shape, bool)
    pad_mask = pad.reshape(pad.shape + (1,) * (x.ndim - 1))
    conds.append(
        (
            jnp.all(jnp.where(pad_mask, x.data == 0, True)),
            "RowSparse padding slots must hold zero `data`.",
        )
    )
    return conds


def _csr_conditions(x: CSR) -> list[tuple[Any, str]]:
    m, n = x.shape
    ptr = x.indptr
    rows = x.row_ids()
    real = rows < m
    conds = [
        (ptr[0] == 0, "CSR `indptr[0]` must be 0."),
        (jnp.all(ptr[1:] >= ptr[:-1]), "CSR `indptr` must be non-decreasing."),
        (ptr[-1] <= x.nse, "CSR `indptr[-1]` must not exceed the capacity nse."),
        (
            jnp.all(jnp.where(real, (x.indices >= 0) & (x.indices < n), True)),
            f"CSR column ids must lie in [0, {n}).",
        ),
        (
            jnp.all(jnp.where(real, True, (x.indices == n) & (x.data == 0))),
            f"CSR padding slots must carry column id {n} and zero `data`.",
        ),
    ]
    if x.nse > 1:
        same_row = (rows[1:] == rows[:-1]) & real[1:]
        conds.append(
            (
                jnp.all(jnp.where(same_row, x.indices[1:] > x.indices[:-1], True)),
                "CSR column ids must be sorted ascending without duplicates in each row.",
            )
        )
    return conds


def check(x: Any) -> None:
    """Validates the invariants of a RowSparse or CSR array.

    Eagerly, a violation raises ``ValueError`` with the reason. Under
    ``jax.jit`` the values are unknown at trace time, so the conditions are
    emitted as ``checkify.check`` calls: wrap the function with
    ``jax.experimental.checkify.checkify`` and call ``err.throw()``.

    What the constructors check without this: shapes and dtypes always; index
    values only when they are concrete.

    Example:
      >>> import jax, jaxsparse_rows as jsr
      >>> from jax.experimental import checkify
      >>> def build(indices):  # under jit the constructor cannot see the values
      ...     return jsr.check(jsr.RowSparse(jax.numpy.ones((2, 1)), indices, shape=(4, 1)))
      >>> err, _ = checkify.checkify(jax.jit(build))(jax.numpy.array([3, 1]))
      >>> print(err.get())  # doctest: +ELLIPSIS
      RowSparse `indices` must be sorted ascending ...
    """
    check_unbatched_args("check", x)
    if isinstance(x, RowSparse):
        conds = _rowsparse_conditions(x)
    elif isinstance(x, CSR):
        conds = _csr_conditions(whole_csr(x))
    else:
        raise TypeError(f"`x` must be a RowSparse or CSR, got {type(x).__name__}.")
    concrete = all(is_concrete(c) for c, _ in conds)
    for cond, message in conds:
        if concrete:
            if not bool(cond):
                raise ValueError(message)
        else:
            checkify.check(cond, message)


def check_ids(ids: Any, num_rows: int) -> None:
    """Validates row ids for ``take``, ``pull_rows``, ``retain`` or ``embedding_bag``.

    Every id must lie in ``[0, num_rows]`` (``num_rows`` itself is the padding
    id). Eagerly those functions check this themselves and a violation raises
    ``ValueError``; under ``jax.jit`` they cannot see the values and treat an
    out-of-range id as padding (it reads zeros and gets no gradient). Call this
    inside the jitted function and wrap it with
    ``jax.experimental.checkify.checkify`` to get the error back.

    Args:
      ids: integer array of row ids, any shape.
      num_rows: the table's row count ``V``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> from jax.experimental import checkify
      >>> table = jnp.ones((4, 2))
      >>> def lookup(ids):
      ...     jsr.check_ids(ids, table.shape[0])
      ...     return jsr.take(table, ids)
      >>> err, _ = checkify.checkify(jax.jit(lookup))(jnp.array([1, 7]))
      >>> print(err.get())  # doctest: +ELLIPSIS
      `ids` must lie in [0, 4) (or equal 4, the padding id)...
      >>> err, _ = checkify.checkify(jax.jit(lookup))(jnp.array([1, 4]))
      >>> err.get() is None
      True
    """
    from ._rows import _as_ids, _check_id_range, _id_range_message

    if isinstance(num_rows, bool) or not isinstance(num_rows, int | np.integer):
        raise TypeError(f"`num_rows` must be an int, got {num_rows!r}.")
    num_rows = int(num_rows)
    if num_rows < 0:
        raise ValueError(f"`num_rows` must be >= 0, got {num_rows}.")
    ids = _as_ids(ids)  # widened: `ids <= num_rows` cannot wrap num_rows
    if ids.size == 0:
        return
    if is_concrete(ids):
        _check_id_range(ids, num_rows, "ids")  # the eager check of take & co.
        return
    message = _id_range_message("ids", num_rows) + "."
    checkify.check(jnp.all((ids >= 0) & (ids <= num_rows)), message)
