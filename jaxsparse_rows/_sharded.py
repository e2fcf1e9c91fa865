"""Row-sharded lookups inside ``jax.shard_map``: :func:`sharded_take` and
:func:`sharded_embedding_bag` read rows of a ``[V, D1..Dn]`` table whose rows
are split over a mesh axis, given only the local shard, with the ids and the
rows exchanged by ``jax.lax.all_to_all`` (TorchRec's row-wise sharding).

Each device holds ``V / n`` rows of the table and a batch of global row ids.
A lookup:

1. maps every id to its owner (the shard that holds the row, by
   ``placement``) and its row within that shard;
2. deduplicates the ids, and puts the distinct ones into one bucket of
   ``capacity`` slots per owner, ``[n, capacity]``, padded with the local
   padding id ``V / n``;
3. sends bucket ``s`` to shard ``s`` (``all_to_all``), and gathers the rows
   asked of it from its shard (``[n * capacity, D1..Dn]``);
4. sends the rows back (``all_to_all``) and lays them out as the ids were.

Every shape is static: ``n * capacity`` ids and rows travel each way, however
many ids a batch holds for each owner. The transposes of the two exchanges
(``all_to_all`` again) send each row's gradient back to its owner, so the
gradient with respect to the shard is the gradient of step 3's local gather:
dense ``[V / n, D1..Dn]`` under ``jax.grad``, and row-sparse (a RowSparse of
the shard's rows that the batch touched, in local row ids) under
:func:`jsr.grad(..., sparse=...) <jaxsparse_rows.grad>`, since that gather
is a row lookup of the table argument.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify
from jax.typing import ArrayLike

from ._args import check_static_int, is_concrete
from ._arraybase import SparseArray
from ._dtypes import index_dtype
from ._embedding import MODES, embedding_bag
from ._limits import check_table_rows
from ._rowops import fit_ids, gather_rows, unique_with_slots
from ._rows import as_ids
from ._vma import match_varying, varying_axes

PLACEMENTS = ("range", "mod")


def _axis_size(axis_name: Any, fn: str) -> int:
    """The number of devices along ``axis_name`` (a mesh axis or a tuple of them)."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if not names or not all(isinstance(a, Hashable) for a in names):
        raise TypeError(
            f"`axis_name` must be a mesh axis name (or a tuple of them), got {axis_name!r}."
        )
    try:
        return int(lax.axis_size(axis_name))
    except NameError:
        raise NameError(
            f"`{fn}` reads the local shard of a row-sharded table and exchanges ids with the "
            f"other shards, so it must run inside `jax.shard_map` over a mesh with the axis "
            f"`axis_name` = {axis_name!r}, which is not bound here. Call it in the function "
            "given to `jax.shard_map` (table in_specs `P(axis_name, None)`), or use "
            "`jsr.take` / `jsr.embedding_bag` on a whole (or jit-sharded) table."
        ) from None


def _check_table(table_shard: Any, fn: str, axis_name: Any) -> jax.Array:
    if isinstance(table_shard, SparseArray):
        raise TypeError(
            f"`table_shard` must be the dense local shard [V / n, D1..Dn] of a row-sharded "
            f"table, got {table_shard!r}. `{fn}` exchanges ids for rows itself: pass the "
            "shard of the parameter, and differentiate with `jsr.grad(..., sparse=...)` for "
            "a row-sparse gradient."
        )
    table_shard = jnp.asarray(table_shard)
    if table_shard.ndim < 1:
        raise ValueError(
            f"`table_shard` must be at least 1-D (rows first), got a scalar {table_shard!r}."
        )
    if table_shard.shape[0] == 0:
        raise ValueError(
            f"`table_shard` must hold at least one row, got shape {tuple(table_shard.shape)}."
        )
    check_table_rows(table_shard, "table_shard")
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    held = varying_axes(table_shard)
    # Under `check_vma` (shard_map's default) the device index varies, and a
    # shard of a row-sharded table varies over its axes too.
    tracked = bool(varying_axes(lax.axis_index(axis_name)))
    if tracked and not set(names) <= held:
        missing = sorted(set(names) - held, key=str)
        raise ValueError(
            f"`table_shard` is the same on every device along {missing} (it does not vary "
            "over that mesh axis), so it is a replicated table, not a shard of one. Pass "
            f"the table to `jax.shard_map` with in_specs `P({axis_name!r}, None)`, or look "
            "rows of a replicated table up with `jsr.take` / `jsr.embedding_bag`."
        )
    return table_shard


def _num_rows(num_rows: Any, n: int, local_rows: int) -> int:
    """The global row count ``V``: ``n * local_rows`` by default; a given one
    must pad to exactly ``local_rows`` rows per shard."""
    if num_rows is None:
        return n * local_rows
    v = check_static_int(num_rows, "num_rows", minimum=1)
    lo, hi = (local_rows - 1) * n + 1, local_rows * n  # ceil(v / n) == local_rows
    if not lo <= v <= hi:
        allowed = f"{hi}" if lo == hi else f"between {lo} and {hi}"
        raise ValueError(
            f"`num_rows` must be {allowed} for shards of {local_rows} rows on {n} device(s) "
            f"(a table of `num_rows` rows is padded to n * ceil(num_rows / n) rows), got {v}. "
            "Pad the table's first axis to a multiple of n (`jnp.pad`) and pass its real row "
            "count, or leave `num_rows` out when the table splits evenly."
        )
    return v


def _check_placement(placement: Any) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(
            f'`placement` must be "range" (shard s holds rows [s * V / n, (s + 1) * V / n), '
            f'as `NamedSharding(mesh, P(axis, None))` places them) or "mod" (row r on shard '
            f"r % n), got {placement!r}."
        )
    return placement


def _overflow_check(most: jax.Array, cap: int, limit: int, fn: str) -> None:
    """Reports ids beyond ``capacity``: ``ValueError`` when concrete, else a
    ``checkify.debug_check`` (an error under ``checkify.checkify``) that
    names the number of distinct ids the fullest bucket needed."""
    message = (
        f"`{fn}`: the ids name {{}} distinct rows of one shard, more than `capacity` = {cap}; "
        "the ids past the capacity would read zero rows and get no gradient. Raise "
        f"`capacity` (the default, min(ids.size, V / n) = {limit}, never overflows)."
    )
    if is_concrete(most):
        if int(most) > cap:
            raise ValueError(message.format(int(most)))
    else:
        checkify.debug_check(most <= cap, message, most)


def _exchange(
    table: jax.Array,
    ids: jax.Array,
    keep: jax.Array,
    *,
    axis_name: Any,
    n: int,
    capacity: int | None,
    placement: str,
    fn: str,
) -> jax.Array:
    """``table``'s global rows for the 1-D ``ids`` where ``keep``, zero rows
    elsewhere: ``[ids.size, D1..Dn]``, through two ``all_to_all`` exchanges."""
    local_rows, row_shape = table.shape[0], tuple(table.shape[1:])
    idt = index_dtype()
    n_ids = ids.shape[0]
    limit = min(n_ids, local_rows)  # distinct ids one owner can be sent
    # (a capacity of 0 would send no id: every lookup would read zeros)
    least = 1 if n_ids else 0
    cap = limit if capacity is None else check_static_int(capacity, "capacity", minimum=least)
    total = n * local_rows
    ids = ids.astype(idt)
    # Owner-major keys: owner * local_rows + the row within the owner's shard.
    if placement == "range":
        key = ids
    else:
        key = (ids % n) * local_rows + ids // n
    key = jnp.where(keep, key, jnp.asarray(total, idt))
    uniq, _, slots = unique_with_slots(key, total, n_ids)  # sorted, so grouped by owner
    bounds = jnp.arange(n + 1, dtype=idt) * local_rows
    # starts[s]: the distinct ids of shards below s (starts[n]: all of them).
    if n_ids * (n + 1) <= 2**22:  # one fused comparison: no loop to compile
        starts = jnp.sum(uniq[:, None] < bounds[None, :], axis=0, dtype=idt)
    else:
        starts = jnp.searchsorted(uniq, bounds).astype(idt)
    per_owner = starts[1:] - starts[:-1]
    if cap < limit:  # (the default cannot overflow: no check, no error effect)
        _overflow_check(jnp.max(per_owner), cap, limit, fn)
    col = jnp.arange(cap, dtype=idt)
    if n_ids:
        pos = jnp.minimum(starts[:-1, None] + col[None, :], n_ids - 1)  # [n, cap]
        send = uniq[pos] - bounds[:-1, None]
        send = jnp.where(col[None, :] < per_owner[:, None], send, jnp.asarray(local_rows, idt))
    else:
        send = jnp.full((n, cap), local_rows, idt)
    send = match_varying(send, table)[0]
    asked = lax.all_to_all(send, axis_name, 0, 0)  # [n, cap]: row s from shard s
    # The local gather: a whole-row lookup of the table argument, which
    # `jsr.grad(..., sparse=...)` turns into a row-sparse gradient.
    dims = lax.GatherDimensionNumbers(
        offset_dims=tuple(range(1, 1 + len(row_shape))),
        collapsed_slice_dims=(0,),
        start_index_map=(0,),
    )
    found = lax.gather(
        table,
        fit_ids(asked.reshape(-1, 1), local_rows),
        dims,
        (1, *row_shape),
        mode=lax.GatherScatterMode.FILL_OR_DROP,
        fill_value=0,
    )
    back = lax.all_to_all(found.reshape(n, cap, *row_shape), axis_name, 0, 0)
    if not n_ids:
        return jnp.zeros((0, *row_shape), table.dtype)
    # Where each distinct id's row came back: bucket owner, slot rank.
    owner = uniq // local_rows  # n for padding
    rank = jnp.arange(n_ids, dtype=idt) - starts[jnp.minimum(owner, n - 1)]
    landed = jnp.where((owner < n) & (rank < cap), owner * cap + rank, n * cap)
    at = landed.at[slots].get(mode="fill", fill_value=n * cap)  # slot n_ids: not kept
    return gather_rows(back.reshape(n * cap, *row_shape), at)


def sharded_take(
    table_shard: ArrayLike,
    ids: ArrayLike,
    *,
    axis_name: Any,
    capacity: int | None = None,
    placement: str = "range",
    num_rows: int | None = None,
) -> jax.Array:
    """Rows of a row-sharded table for global ``ids``, inside ``jax.shard_map``.

    The row-sharded form of :func:`jsr.take <jaxsparse_rows.take>`:
    ``out[i...] = table[ids[i...]]`` of the whole ``[V, D1..Dn]`` table, of
    which each device along ``axis_name`` holds ``table_shard``, ``V / n``
    rows. Each device looks up its own ``ids``: the distinct ids are sent to
    the shards that own them, and the rows come back, with one
    ``jax.lax.all_to_all`` each way of ``n * capacity`` ids and rows.

    The gradient with respect to ``table_shard`` holds the gradients of
    the rows that any device looked up in this shard. Under
    :func:`jsr.grad(..., sparse=...) <jaxsparse_rows.grad>` it is a RowSparse
    ``[V / n, D1..Dn]`` over the shard, in local row ids, with at most
    ``n * capacity`` rows, which the lazy optimizers (``jsr.optim``) apply
    to the shard; ``jax.grad`` gives it dense.

    Args:
      table_shard: this device's rows of the table, ``[V / n, D1..Dn]``: the
        table sharded with ``P(axis_name, None)``.
      ids: global row ids of any shape, duplicates allowed. ``V`` (or
        ``num_rows``) is the padding id: it reads a zero row, as do ids
        outside ``[0, V)`` (check them with :func:`jsr.check_ids
        <jaxsparse_rows.check_ids>` inside ``checkify``).
      axis_name: the mesh axis (or tuple of axes) the table's rows are
        sharded over.
      capacity: distinct ids sent to each shard, a static int (at least 1
        when there are ids). The default,
        ``min(ids.size, V / n)``, never overflows. With fewer, ids beyond
        ``capacity`` distinct ones of one shard (the largest of them) read
        zero rows and get no gradient: wrap the step with
        ``checkify.checkify(f, errors=checkify.user_checks)`` to report it.
      placement: which shard owns row ``r``: ``"range"`` (default) shard
        ``r // (V / n)``, the rows ``jax.sharding.NamedSharding(mesh,
        P(axis_name, None))`` gives each device; ``"mod"`` shard ``r % n``, at
        local row ``r // n``.
      num_rows: the table's real row count ``V`` when it was padded to
        ``n * ceil(V / n)`` rows to split evenly; default ``n * V / n``.

    Returns:
      ``[*ids.shape, D1..Dn]``, the rows in ``table_shard``'s dtype.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
      >>> table = jnp.arange(12.0).reshape(6, 2)
      >>> f = jax.jit(jax.shard_map(
      ...     lambda t, i: jsr.sharded_take(t, i, axis_name="x"),
      ...     mesh=mesh, in_specs=(P("x", None), P("x")), out_specs=P("x")))
      >>> f(table, jnp.array([4, 1, 4, 6]))  # 6 == V: padding
      Array([[8., 9.],
             [2., 3.],
             [8., 9.],
             [0., 0.]], dtype=float32)
    """
    fn = "sharded_take"
    placement = _check_placement(placement)
    n = _axis_size(axis_name, fn)
    table_shard = _check_table(table_shard, fn, axis_name)
    v = _num_rows(num_rows, n, table_shard.shape[0])
    ids = as_ids(ids)
    flat = ids.reshape(-1)
    keep = (flat >= 0) & (flat < v)
    rows = _exchange(
        table_shard,
        flat,
        keep,
        axis_name=axis_name,
        n=n,
        capacity=capacity,
        placement=placement,
        fn=fn,
    )
    return rows.reshape(tuple(ids.shape) + tuple(table_shard.shape[1:]))


def _skip_padding(ids: jax.Array, keep: jax.Array, padding_id: Any) -> jax.Array:
    """``keep`` without the ids equal to ``padding_id`` (a Python int)."""
    if padding_id is None:
        return keep
    number = isinstance(padding_id, int | float | np.integer | np.floating)
    if isinstance(padding_id, bool) or not number or not float(padding_id).is_integer():
        raise TypeError(f"`padding_id` must be a Python int, got {padding_id!r}.")
    info = np.iinfo(ids.dtype)
    if not info.min <= int(padding_id) <= info.max:  # no id of this dtype equals it
        return keep
    return keep & (ids != int(padding_id))


def sharded_embedding_bag(
    table_shard: ArrayLike,
    ids: ArrayLike,
    *,
    axis_name: Any,
    mode: str = "mean",
    weights: ArrayLike | None = None,
    padding_id: int | None = None,
    capacity: int | None = None,
    placement: str = "range",
    num_rows: int | None = None,
) -> jax.Array:
    """Pooled lookups of a row-sharded table, inside ``jax.shard_map``.

    The row-sharded form of :func:`jsr.embedding_bag
    <jaxsparse_rows.embedding_bag>`: the last axis of ``ids`` is the bag,
    each bag's rows of the whole ``[V, D1..Dn]`` table are pooled by ``mode``
    (``"sum"``, ``"mean"``, ``"sqrtn"`` or ``"max"``, optionally weighted by
    ``weights``), and ids equal to ``V`` (or ``num_rows``) or to
    ``padding_id`` are skipped: not sent, not looked up, not counted. The
    rows are fetched as :func:`sharded_take` fetches them (the skipped ids
    take no capacity) and pooled on the device that asked for them.

    Args:
      table_shard: this device's rows of the table, ``[V / n, D1..Dn]``,
        floating point.
      ids: global row ids ``[..., L]``: one bag per index of the leading axes.
      axis_name: the mesh axis (or tuple of axes) the rows are sharded over.
      mode: ``"sum"``, ``"mean"`` (default), ``"sqrtn"`` or ``"max"``, as in
        :func:`jsr.embedding_bag <jaxsparse_rows.embedding_bag>`.
      weights: per-id weights shaped like ``ids``, for every mode but ``"max"``.
      padding_id: an id to skip, besides ``V`` and the ids outside ``[0, V)``.
      capacity: distinct ids sent to each shard; see :func:`sharded_take`.
      placement: ``"range"`` (default) or ``"mod"``; see :func:`sharded_take`.
      num_rows: the real row count of a padded table; see :func:`sharded_take`.

    Returns:
      ``[*ids.shape[:-1], D1..Dn]``, in ``table_shard``'s dtype.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> from jax.sharding import PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
      >>> table = jnp.arange(8.0).reshape(4, 2)
      >>> bag = lambda t, i: jsr.sharded_embedding_bag(t, i, axis_name="x", mode="sum")
      >>> f = jax.jit(
      ...     jax.shard_map(bag, mesh=mesh, in_specs=(P("x", None), P("x")), out_specs=P("x")))
      >>> f(table, jnp.array([[1, 3, 4], [2, 4, 4]]))  # 4 == V: padding
      Array([[ 8., 10.],
             [ 4.,  5.]], dtype=float32)
    """
    fn = "sharded_embedding_bag"
    placement = _check_placement(placement)
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    n = _axis_size(axis_name, fn)
    table_shard = _check_table(table_shard, fn, axis_name)
    if not jnp.issubdtype(table_shard.dtype, jnp.inexact):
        raise TypeError(
            f"`table_shard` must have a floating dtype (rows are pooled), got "
            f"{jnp.dtype(table_shard.dtype).name}; cast it with `.astype`."
        )
    v = _num_rows(num_rows, n, table_shard.shape[0])
    ids = as_ids(ids)
    if ids.ndim == 0:
        raise ValueError("`ids` must have at least one axis (the bag axis, last), got a scalar.")
    keep = _skip_padding(ids, (ids >= 0) & (ids < v), padding_id)
    flat_keep = keep.reshape(-1)
    rows = _exchange(
        table_shard,
        ids.reshape(-1),
        flat_keep,
        axis_name=axis_name,
        n=n,
        capacity=capacity,
        placement=placement,
        fn=fn,
    )
    # Pool the fetched rows with embedding_bag's own rules: bag slot i reads
    # row i of `rows`; skipped slots carry its padding id.
    size = flat_keep.shape[0]
    slot = jnp.arange(size, dtype=ids.dtype).reshape(ids.shape)
    return embedding_bag(rows, jnp.where(keep, slot, size), mode=mode, weights=weights)
