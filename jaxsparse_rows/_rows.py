"""Row gathers: ``pull_rows`` (dense table -> RowSparse view), ``take``
(embedding lookup from a RowSparse) and ``retain`` (keep listed rows)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ._args import as_int_array, capacity_check, check_static_int, is_concrete
from ._arraybase import SparseArray, check_unbatched_args
from ._csr import CSR
from ._dtypes import index_dtype
from ._limits import check_table_rows
from ._rowops import gather_rows, slots_in, unique_rows, zeros_rows
from ._rowsparse import RowSparse


def as_ids(ids: Any, name: str = "ids") -> jax.Array:
    """``ids`` as an integer array at least as wide as the index dtype, so that
    comparing them with the row count cannot wrap it (int8 ids against V = 300)."""
    ids = as_int_array(ids, name)
    if jnp.iinfo(ids.dtype).bits < jnp.iinfo(index_dtype()).bits:
        ids = ids.astype(index_dtype())
    return ids


def id_range_message(name: str, n_rows: int) -> str:
    """What ids must be: in ``[0, n_rows)``, or ``n_rows`` (the padding id)."""
    return f"`{name}` must lie in [0, {n_rows}) (or equal {n_rows}, the padding id)"


def check_id_range(ids: jax.Array, n_rows: int, name: str) -> None:
    """Concrete ids must lie in ``[0, n_rows]`` (``n_rows`` is the padding id)."""
    if not is_concrete(ids) or ids.size == 0:
        return
    arr = np.asarray(ids)
    bad = (arr < 0) | (arr > n_rows)
    if np.any(bad):
        raise ValueError(f"{id_range_message(name, n_rows)}, got {int(arr[bad][0])}.")


def pull_rows(table: ArrayLike, ids: ArrayLike, size: int | None = None) -> RowSparse:
    """A RowSparse view of the rows of ``table`` that ``ids`` mention.

    The result holds the sorted unique ids and their rows, gathered from the
    dense ``table`` ``[V, D1..Dn]`` (MXNet's ``row_sparse_pull``). Differentiate a
    loss with respect to it with :func:`jsr.value_and_grad
    <jaxsparse_rows.value_and_grad>` to get a row-sparse gradient.

    Args:
      table: dense ``[V, D1..Dn]`` array.
      ids: integer ids of any shape, duplicates allowed. An id equal to ``V``
        is padding (as in a padded CSR's column ids) and is ignored.
      size: static capacity of the result; default ``ids.size``, which can
        never overflow. If more than ``size`` distinct ids occur: ``ValueError``
        when concrete; under jit the largest ids are left out, silently unless
        the caller wraps with ``checkify.checkify(f,
        errors=checkify.user_checks)``, which reports it. The check is only
        emitted when ``size`` is below both ``ids.size`` and ``V``, and makes
        each call of the jitted function dispatch more slowly (see the ops
        docs).

    Out-of-range ids (``< 0`` or ``> V``) raise when concrete; under jit they
    are treated as padding. A ``table`` of more rows than the index dtype
    holds with its padding id (``2**31 - 1`` without ``jax_enable_x64``)
    raises ``ValueError``.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> table = jnp.arange(12.).reshape(6, 2)
      >>> rows = jsr.pull_rows(table, jnp.array([[4, 1], [4, 4]]))
      >>> rows, rows.indices
      (RowSparse(float32[6, 2], rows=2, capacity=4), Array([1, 4, 6, 6], dtype=int32))
      >>> rows.data[:2]
      Array([[2., 3.],
             [8., 9.]], dtype=float32)
    """
    if isinstance(table, SparseArray):
        raise TypeError(
            f"`table` must be a dense [V, ...] array, got {table!r}. A RowSparse table "
            "usually means the updates were applied to the view rather than the "
            "parameters: write `jsr.optim.apply_updates(params, updates)`, not "
            "`apply_updates(view, updates)`. Densify on purpose with `table.todense()`."
        )
    if not isinstance(table, jax.Array):
        table = jnp.asarray(table)
    if table.ndim < 1:
        raise ValueError(f"`table` must be at least 1-D ([V, ...]), got a scalar {table!r}.")
    check_table_rows(table, "table")
    ids = as_ids(ids)
    n = table.shape[0]
    flat = ids.reshape(-1)
    cap = flat.shape[0] if size is None else check_static_int(size, "size")
    check_id_range(flat, n, "ids")
    uniq, count = unique_rows(flat, n, cap)
    # At most min(ids.size, V) distinct rows: a capacity that large cannot
    # overflow, so no check is emitted (see capacity_check for its cost).
    if cap < min(flat.shape[0], n):
        capacity_check(
            count <= cap,
            f"pull_rows: `ids` hold more distinct rows than `size` = {cap}; rows would be "
            "dropped. Raise `size` (the default, ids.size, never overflows).",
        )
    if n == 0:
        data = zeros_rows(cap, table)
    else:
        data = gather_rows(table, uniq, ids_sorted=True)
    return RowSparse._make(data, uniq, table.shape)


def lookup_slots(rsp: RowSparse, ids: jax.Array) -> jax.Array:
    """Slot of every id in ``rsp.indices``; ``rsp.capacity`` where it is absent."""
    return slots_in(rsp.indices, ids, rsp.shape[0])


def _missing_message(name: str, missing: Any, n_missing: int) -> str:
    shown = ", ".join(str(int(i)) for i in missing[:8])
    more = f" and {n_missing - 8} more" if n_missing > 8 else ""
    return (
        f"`{name}` names rows that the RowSparse does not store: {shown}{more}. A lookup "
        "in a `pull_rows` view reads zeros for them and their rows get no gradient. "
        "Pull every id the function looks up (`jsr.pull_rows(table, all_ids)`), or pass "
        '`missing="zero"` to read unstored rows as zeros on purpose.'
    )


def check_stored(x: RowSparse, ids: jax.Array, name: str) -> None:
    """Concrete ids in ``[0, V)`` must be among the rows ``x`` stores."""
    if not is_concrete(ids, x.indices) or ids.size == 0:
        return
    arr = np.asarray(ids).reshape(-1)
    n = x.shape[0]
    stored = np.asarray(x.indices)
    wanted = arr[(arr >= 0) & (arr < n)]
    absent = wanted[~np.isin(wanted, stored[stored < n])]
    if absent.size:
        uniq = np.unique(absent)
        raise ValueError(_missing_message(name, uniq, uniq.size))


def stored_condition(x: RowSparse, ids: jax.Array, name: str = "ids") -> tuple[Any, str]:
    """``(condition, message)``: every id in ``[0, V)`` is a row ``x`` stores,
    as a traced boolean (for ``checkify``)."""
    flat = ids.reshape(-1)
    slots = lookup_slots(x, flat)
    real = (flat >= 0) & (flat < x.shape[0])
    message = (
        f"`{name}` names rows that the RowSparse does not store; a lookup in a `pull_rows` "
        "view reads zeros for them and their rows get no gradient."
    )
    return jnp.all(jnp.where(real, slots < x.capacity, True)), message


def take(x: Any, ids: ArrayLike, *, missing: str = "error") -> jax.Array:
    """Dense lookup of rows: ``out[i...] = x[ids[i...]]``, shape ``[*ids.shape, D1..Dn]``.

    For a RowSparse ``x`` (e.g. a :func:`pull_rows` view) the gradient with
    respect to ``x.data`` is a ``[k, D]`` array: no ``[V, D]`` temporary.
    Every id must name a row that ``x`` stores (or be the padding id ``V``):
    a view that lacks a looked-up row would read zeros for it, and the row
    would get no gradient. Concrete ids that ``x`` lacks raise
    ``ValueError``; under ``jax.jit`` they are not checked (they read zeros):
    call :func:`jsr.check_ids(ids, x) <jaxsparse_rows.check_ids>` in a
    function wrapped with ``checkify`` to check them there. With
    ``missing="zero"`` unstored rows read zeros on purpose (the rows a
    RowSparse does not store are zero). A dense ``x`` is gathered directly; it may
    have at most ``2**31 - 1`` rows without ``jax_enable_x64`` (``ValueError``
    otherwise), since its row count is the padding id.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> rows = jsr.pull_rows(jnp.arange(12.).reshape(6, 2), jnp.array([1, 4]))
      >>> jsr.take(rows, jnp.array([4, 1]))
      Array([[8., 9.],
             [2., 3.]], dtype=float32)
      >>> jsr.take(rows, jnp.array([4, 0]), missing="zero")
      Array([[8., 9.],
             [0., 0.]], dtype=float32)
    """
    if missing not in ("error", "zero"):
        raise ValueError(f'`missing` must be "error" or "zero", got {missing!r}.')
    check_unbatched_args("take", x)
    ids = as_ids(ids)
    if isinstance(x, RowSparse):
        check_id_range(ids, x.shape[0], "ids")
        if missing == "error":
            check_stored(x, ids, "ids")
        # The gather primitive: on CPU its transpose (the gradient with
        # respect to `x.data`) is the native sum of rows into [K, D].
        slots = lookup_slots(x, ids.reshape(-1))
        return gather_rows(x.data, slots).reshape(tuple(ids.shape) + x.shape[1:])
    if isinstance(x, CSR):
        raise TypeError("`take` needs a RowSparse or dense `x`; use `x[a:b]` to slice CSR rows.")
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError("`x` must be at least 1-D (rows first), got a scalar.")
    check_table_rows(x, "x")
    check_id_range(ids, x.shape[0], "ids")
    return gather_rows(x, ids)


def retain(x: RowSparse, rows: ArrayLike) -> RowSparse:
    """Keeps only the listed rows of ``x`` (MXNet's ``sparse.retain``).

    The result stores exactly the sorted unique ``rows`` (capacity
    ``rows.size``); a requested row that ``x`` lacks comes back as a zero row.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.], [3., 4.], [5., 6.]], [0, 2, 3]), shape=(5, 2))
      >>> jsr.retain(a, [0, 1]).asnumpy()
      array([[1., 2.],
             [0., 0.],
             [0., 0.],
             [0., 0.],
             [0., 0.]], dtype=float32)
    """
    check_unbatched_args("retain", x)
    if not isinstance(x, RowSparse):
        raise TypeError(f"`x` must be a RowSparse, got {type(x).__name__}.")
    rows = as_ids(rows, "rows").reshape(-1)
    n = x.shape[0]
    check_id_range(rows, n, "rows")
    uniq, _ = unique_rows(rows, n, rows.shape[0])
    return RowSparse._make(take(x, uniq, missing="zero"), uniq, x.shape)
