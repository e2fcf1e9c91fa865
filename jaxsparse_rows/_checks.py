"""Run-time validation of sparse invariants, usable eagerly and with checkify."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ._args import is_concrete
from ._arraybase import check_unbatched_args
from ._csr import CSR, whole_csr
from ._invariants import padding_condition, row_id_conditions
from ._rows import as_ids, check_id_range, check_stored, id_range_message, stored_condition
from ._rowsparse import RowSparse


def _rowsparse_conditions(x: RowSparse) -> list[tuple[Any, str]]:
    n = x.shape[0]
    return [*row_id_conditions(x.indices, n), padding_condition(x.data, x.indices, n)]


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


def check_ids(ids: Any, num_rows: Any) -> None:
    """Validates row ids for ``take``, ``pull_rows``, ``retain`` or ``embedding_bag``.

    Every id must lie in ``[0, V]`` (``V`` itself is the padding id). With a
    RowSparse for ``num_rows`` (a :func:`pull_rows <jaxsparse_rows.pull_rows>`
    view), every id in ``[0, V)`` must also be a row it stores: a lookup of
    any other row reads zeros and that row gets no gradient. Eagerly
    ``take``, ``pull_rows`` and ``embedding_bag`` check this themselves and a
    violation raises ``ValueError``; under ``jax.jit`` they cannot see the
    values (an out-of-range id is treated as padding, an unstored one reads
    zeros). Call this inside the jitted function and wrap it with
    ``jax.experimental.checkify.checkify`` to get the error back.

    Args:
      ids: integer array of row ids, any shape.
      num_rows: the table's row count ``V``, or a RowSparse whose stored rows
        the ids must name.

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
      >>> def lookup_view(ids):
      ...     view = jsr.pull_rows(table, jnp.array([0, 1]))
      ...     jsr.check_ids(ids, view)
      ...     return jsr.take(view, ids)
      >>> err, _ = checkify.checkify(jax.jit(lookup_view))(jnp.array([1, 3]))
      >>> print(err.get())  # doctest: +ELLIPSIS
      `ids` names rows that the RowSparse does not store...
    """

    view = None
    if isinstance(num_rows, RowSparse):
        check_unbatched_args("check_ids", num_rows)
        view, num_rows = num_rows, num_rows.shape[0]
    if isinstance(num_rows, bool) or not isinstance(num_rows, int | np.integer):
        raise TypeError(f"`num_rows` must be an int or a RowSparse, got {num_rows!r}.")
    num_rows = int(num_rows)
    if num_rows < 0:
        raise ValueError(f"`num_rows` must be >= 0, got {num_rows}.")
    ids = as_ids(ids)  # widened: `ids <= num_rows` cannot wrap num_rows
    if ids.size == 0:
        return
    if is_concrete(ids):
        check_id_range(ids, num_rows, "ids")  # the eager check of take & co.
        if view is not None:
            check_stored(view, ids, "ids")
        if view is None or is_concrete(view.indices):
            return
    message = id_range_message("ids", num_rows) + "."
    checkify.check(jnp.all((ids >= 0) & (ids <= num_rows)), message)
    if view is not None:
        checkify.check(*stored_condition(view, ids, "ids"))
