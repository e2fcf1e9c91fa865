"""Row operations: every way the library moves rows of a ``[N, ...]`` array,
each under one name, with its XLA reference beside it.

============================  ==================================================
operation                     meaning
============================  ==================================================
``gather_rows``               ``table[ids]``; ids outside ``[0, N)`` read zeros
``sum_rows``                  ``zeros[n].at[ids].add(rows)``: rows summed by id
``scatter_rows``              ``table.at[ids].set/add(rows)`` at sorted unique ids
``unique_rows``               the sorted unique ids of a batch, padded to a capacity
``unique_with_slots``         the same, and every id's slot among them
``slots_in``                  the slot of every id in a sorted id list
``coalesce_rows``             rows sorted by id, repeats summed, padded
============================  ==================================================

``gather_rows`` and ``sum_rows`` are a pair of linear calls of the library's
one dispatch primitive (``_kernel_call.kernel_call``), each the other's transpose,
so ``grad``, ``vjp``, ``jvp``, ``linear_transpose`` and ``vmap`` all go
through them. On CPU, in a program for one device (or a ``shard_map`` body),
where the native kernels are available and take the operands (``_native``:
``rows.cc``, ``ids.cc``), each operation lowers to its kernel; everywhere
else, for a program lowered for ``jax.export``, and for operands sharded over
explicit mesh axes, it runs the XLA reference (``gather_rows_xla``,
``sum_rows_xla``, ``scatter_rows_xla``, ``_unique_with_slots_xla``,
``_slots_xla``), which the kernels are tested against. The choice is made per
platform when a program is lowered, so one traced function lowers to the
kernels on CPU and to XLA on GPU with no branch left in either. Ids are 1-D
unless said otherwise; ids outside ``[0, N)`` (negative ones too) read zero
rows and are dropped from sums and scatters.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from . import _native
from ._arraybase import ROWSPARSE_INDEXING
from ._dtypes import accumulation_dtype, index_dtype
from ._kernel_call import kernel_call
from ._sharding import explicit_spec, replicated, sharding_like

# ------------------------------------------------------------ XLA references


def fit_ids(ids: jax.Array, n: int) -> jax.Array:
    """64-bit ``ids`` clipped to ``[-1, n]`` (``[0, n]`` if unsigned), as int32
    where ``n`` fits; other ids unchanged. Ids in ``[0, n)`` keep their value,
    the others stay out of range, and the order is kept (sorted ids stay
    sorted, for ``indices_are_sorted``).

    XLA's CPU gather and scatter keep only the low 32 bits of a 64-bit index
    (``jnp.arange(10).at[2**32 + 1].get(mode="fill")`` reads element 1), so an
    out-of-range int64 id would read or write a real row. Every gather or
    scatter at user-given ids goes through this first.
    """
    if jnp.dtype(ids.dtype).itemsize <= 4:
        return ids
    low = -1 if jnp.issubdtype(ids.dtype, jnp.signedinteger) else 0
    fitted = jnp.clip(ids, low, n)
    return fitted.astype(jnp.int32) if n < np.iinfo(np.int32).max else fitted


def zeros_rows(n: int, like: Any, dtype: Any = None) -> jax.Array:
    """Zeros ``[n, *like.shape[1:]]`` (``like``'s dtype unless given) to scatter
    rows of ``like`` into. Where ``like`` is sharded over explicit mesh axes
    along its trailing axes, the zeros are too (replicated along the rows),
    so that the scatter's operand and updates agree."""
    shape = (int(n),) + tuple(like.shape[1:])
    dtype = like.dtype if dtype is None else dtype
    spec = explicit_spec(like)
    if spec is None or all(a is None for a in tuple(spec)[1:]):
        return jnp.zeros(shape, dtype)
    tail = tuple(spec)[1:] + (None,) * (len(shape) - len(spec))
    spec = jax.sharding.PartitionSpec(None, *tail)
    return jnp.zeros(shape, dtype, out_sharding=sharding_like(like, spec))


def gathered_sharding(x: jax.Array, rows: jax.Array) -> dict:
    """``out_sharding`` for ``x[rows]`` where ``x`` or ``rows`` is explicitly
    sharded (JAX cannot resolve it alone): the rows' own sharding along their
    axes (else replicated), then ``x``'s along the row's axes; ``{}``
    otherwise."""
    spec, rows_spec = explicit_spec(x), explicit_spec(rows)
    if spec is None and rows_spec is None:
        return {}
    spec = tuple(spec or (None,))
    tail = tuple(spec[1:]) + (None,) * (x.ndim - 1 - len(spec[1:]))
    used = {a for a in tail if a is not None}
    head = tuple(rows_spec or ()) + (None,) * rows.ndim
    head = tuple(None if a in used else a for a in head[: rows.ndim])
    spec = jax.sharding.PartitionSpec(*head, *tail)
    return {"out_sharding": sharding_like(x if explicit_spec(x) is not None else rows, spec)}


def segments_of_sorted(sorted_keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Segment id of each element of a sorted array and a mask of segment starts."""
    m = sorted_keys.shape[0]
    if m == 0:
        return jnp.zeros((0,), index_dtype()), jnp.zeros((0,), bool)
    starts = jnp.concatenate([jnp.ones((1,), bool), sorted_keys[1:] != sorted_keys[:-1]])
    seg = jnp.cumsum(starts.astype(index_dtype())) - 1
    return seg, starts


def gather_rows_xla(x: jax.Array, rows: jax.Array, *, ids_sorted: bool = False) -> jax.Array:
    """``x[rows]`` along axis 0 with out-of-range rows (negative ones too) reading zero.

    Works when ``x`` has no rows at all (XLA rejects a gather from an empty axis).
    """
    x = jnp.asarray(x)
    if x.shape[0] == 0:
        return jnp.zeros(tuple(rows.shape) + tuple(x.shape[1:]), x.dtype)
    rows = fit_ids(rows, x.shape[0])
    return x.at[rows].get(
        mode="fill",
        fill_value=0,
        wrap_negative_indices=False,
        indices_are_sorted=ids_sorted,
        **gathered_sharding(x, rows),
    )


def sum_rows_xla(rows: jax.Array, ids: jax.Array, n: int, *, ids_sorted: bool = False) -> jax.Array:
    """``zeros([n, ...]).at[ids].add(rows)`` in XLA ops (ids outside ``[0, n)``
    dropped), into :func:`zeros_rows`, so explicitly sharded rows keep their
    sharding."""
    out = zeros_rows(n, rows)
    if n == 0:
        return out
    return out.at[fit_ids(ids, n)].add(
        rows, mode="drop", indices_are_sorted=ids_sorted, wrap_negative_indices=False
    )


def sum_repeats(values: Any, inverse: np.ndarray, n: int) -> Any:
    """``values`` (``[k, ...]``) summed into ``n`` slots by ``inverse`` (a
    host array of slot ids in ``[0, n)``), as the constructors merge repeated
    ids: in numpy for host values (no compilation per shape), else with
    :func:`sum_rows`. Like the library's other sums, float16 and bfloat16
    accumulate in float32 and round once, and bools combine by logical or."""
    dtype = jnp.dtype(values.dtype)
    if isinstance(values, np.ndarray):
        acc = accumulation_dtype(dtype)
        out = np.zeros((n,) + values.shape[1:], acc)
        np.add.at(out, inverse, values.astype(acc))  # (numpy's bool add is logical or)
        return out.astype(dtype)
    return sum_rows(values, jnp.asarray(inverse.astype(index_dtype())), n)


def scatter_rows_xla(table: jax.Array, ids: jax.Array, rows: jax.Array, add: bool) -> jax.Array:
    """``table.at[ids].set(rows)`` (``.add`` with ``add``) in XLA ops at sorted
    unique ``ids``; ids outside ``[0, N)`` (padding) dropped."""
    table = jnp.asarray(table)
    ref = table.at[fit_ids(ids, table.shape[0])]  # XLA:CPU truncates 64-bit indices
    kw = dict(ROWSPARSE_INDEXING, wrap_negative_indices=False)
    spec = explicit_spec(table)  # sharding in types: the result keeps the table's
    if spec is not None:
        kw["out_sharding"] = sharding_like(table, spec)
    return (ref.add if add else ref.set)(rows, mode="drop", **kw)


# ------------------------------------------------- the gather / sum pair


def _gather_native(table, ids, *, ids_sorted):
    del ids_sorted
    return _native.gather_rows_call(table, ids)


def _sum_native(rows, ids, *, n, ids_sorted):
    del ids_sorted
    return _native.sum_rows_call(rows, ids, n)


def gather_rows(table: jax.Array, ids: jax.Array, *, ids_sorted: bool = False) -> jax.Array:
    """``table[ids]`` along axis 0 for ids of any shape, shaped
    ``[*ids.shape, *table.shape[1:]]``; ids outside ``[0, N)`` (negative ones
    too) read zero rows. Linear in ``table``; its transpose is
    :func:`sum_rows`. ``ids_sorted`` promises ascending ids (an XLA hint)."""
    table, ids = jnp.asarray(table), jnp.asarray(ids)
    if ids.ndim != 1:
        out = gather_rows(table, ids.reshape(-1), ids_sorted=ids_sorted)
        return out.reshape(tuple(ids.shape) + tuple(table.shape[1:]))
    if explicit_spec(table) is not None or explicit_spec(ids) is not None:
        # Sharded over explicit mesh axes (sharding in types): XLA's gather,
        # whose sharding and transpose rules JAX knows.
        return gather_rows_xla(table, ids, ids_sorted=ids_sorted)
    native = _native.use(_native.GATHER_ROWS, table, ids)
    return kernel_call(
        _gather_native if native else None,
        gather_rows_xla,
        table,
        ids,
        linear=(0,),
        transpose=_gather_transpose,
        batch=_gather_batch,
        ids_sorted=bool(ids_sorted),
    )


def sum_rows(rows: jax.Array, ids: jax.Array, n: int, *, ids_sorted: bool = False) -> jax.Array:
    """``zeros([n, ...]).at[ids].add(rows)`` for 1-D ``ids`` in any order: repeated
    ids are summed, ids outside ``[0, n)`` dropped. Linear in ``rows``; its
    transpose is :func:`gather_rows`.

    float16 and bfloat16 rows are summed in float32 and rounded once, as
    ``jnp.sum`` sums them (a bfloat16 running sum of ones stops at 256): the
    gradient of a lookup that repeats an id is the rounded sum of its rows.
    Bool rows combine by logical or."""
    rows, ids = jnp.asarray(rows), jnp.asarray(ids)
    n, ids_sorted = int(n), bool(ids_sorted)
    if rows.dtype == jnp.bool_:  # logical or, as numpy sums bools (XLA's scatter-add refuses bool)
        return sum_rows(rows.astype(jnp.int32), ids, n, ids_sorted=ids_sorted) != 0
    acc = accumulation_dtype(rows.dtype)
    if acc == rows.dtype or rows.shape[0] < 2:  # (fewer than 2 rows: nothing to round)
        return _sum_rows(rows, ids, n, ids_sorted)
    k = rows.shape[0]
    if n <= k:  # a result no larger than the rows: sum into float32 rows
        return _sum_rows(rows.astype(acc), ids, n, ids_sorted).astype(rows.dtype)
    # A result larger than the rows (the gradient of a lookup into a dense
    # [V, ...] table): repeated ids are summed into [k] float32 rows first, so
    # there is no float32 copy of the result; each distinct id is then written
    # once, which rounds nothing more.
    uniq, _, slots = unique_with_slots(ids, n, k)
    partial = _sum_rows(rows.astype(acc), slots, k, False)  # (slot k, dropped, can come first)
    return _sum_rows(partial.astype(rows.dtype), uniq, n, True)


def _sum_rows(rows: jax.Array, ids: jax.Array, n: int, ids_sorted: bool) -> jax.Array:
    """:func:`sum_rows` in the dtype of ``rows``."""
    if explicit_spec(rows) is not None or explicit_spec(ids) is not None:
        return sum_rows_xla(rows, ids, n, ids_sorted=ids_sorted)
    table = jax.ShapeDtypeStruct((n,) + tuple(rows.shape[1:]), rows.dtype)
    native = _native.use(_native.SUM_ROWS, table, ids, add=True)
    return kernel_call(
        _sum_native if native else None,
        sum_rows_xla,
        rows,
        ids,
        linear=(0,),
        transpose=_sum_transpose,
        batch=_sum_batch,
        n=n,
        ids_sorted=ids_sorted,
    )


def _gather_transpose(cts, table, ids, *, ids_sorted):
    (ct,) = cts
    if ad.is_undefined_primal(ids):
        raise ValueError("gather_rows is not linear in its ids")
    aval = table.aval
    if type(ct) is ad.Zero:
        return [ad.Zero(aval), None]
    # The call runs on operands not sharded over explicit mesh axes only, so
    # its output was replicated; a cotangent that a batch-sharded factor made
    # sharded (labels, weights) is gathered back first.
    ct = replicated(ct)
    return [sum_rows(ct, ids, aval.shape[0], ids_sorted=ids_sorted).astype(aval.dtype), None]


def _sum_transpose(cts, rows, ids, *, n, ids_sorted):
    del n
    (ct,) = cts
    if ad.is_undefined_primal(ids):
        raise ValueError("sum_rows is not linear in its ids")
    aval = rows.aval
    if type(ct) is ad.Zero:
        return [ad.Zero(aval), None]
    ct = replicated(ct)  # as in _gather_transpose
    return [gather_rows(ct, ids, ids_sorted=ids_sorted).astype(aval.dtype), None]


def _gather_batch(args, dims, *, ids_sorted):
    table, ids = args
    t_dim, i_dim = dims
    if t_dim is None:  # (batching.not_mapped)
        # One table, a batch of id lists: one gather of all the ids.
        ids = jnp.moveaxis(ids, i_dim, 0)
        out = gather_rows(table, ids.reshape(-1))
        return [out.reshape(tuple(ids.shape) + tuple(table.shape[1:]))], [0]
    ref = functools.partial(gather_rows_xla, ids_sorted=ids_sorted)
    return [jax.vmap(ref, in_axes=(t_dim, i_dim))(table, ids)], [0]


def _sum_batch(args, dims, *, n, ids_sorted):
    ref = functools.partial(sum_rows_xla, n=n, ids_sorted=ids_sorted)
    return [jax.vmap(ref, in_axes=tuple(dims))(*args)], [0]


# ------------------------------------------------ scatters at sorted unique ids


def _scatter_kernel(table, ids, rows, *, add):
    return _native.scatter_rows_call(table, ids, rows, add)


def _scatter_native(table, ids, rows, add):
    """The scatter run by the native kernel on CPU (XLA's elsewhere): linear in
    ``(table, rows)``, for a set and an add alike."""
    return kernel_call(_scatter_kernel, scatter_rows_xla, table, ids, rows, linear=(0, 2), add=add)


def _native_rows_ok(table: jax.Array, ids: jax.Array, add: bool = False) -> bool:
    # A weakly typed table (e.g. ``jnp.full(shape, 1.0)``) stays in XLA, whose
    # scatter keeps it weakly typed (a kernel's result is not).
    weak = getattr(getattr(table, "aval", None), "weak_type", False)
    return not weak and _native.use(_native.SCATTER_ROWS, table, ids, add=add)


def scatter_rows(
    table: jax.Array, ids: jax.Array, rows: jax.Array, *, add: bool = False
) -> jax.Array:
    """``table`` with ``table[ids[i]] = rows[i]`` (``+=`` with ``add``) for sorted
    unique 1-D ``ids``; ids outside ``[0, N)`` (padding) are dropped. ``rows`` is
    cast to the table's dtype. A donated table is updated in place."""
    table = jnp.asarray(table)
    rows = jnp.broadcast_to(jnp.asarray(rows).astype(table.dtype), ids.shape + table.shape[1:])
    if _native_rows_ok(table, ids, add):
        return _scatter_native(table, ids, rows, bool(add))
    return scatter_rows_xla(table, ids, rows, bool(add))


# ------------------------------------------------------------ id bookkeeping


def _unique_xla(ids: jax.Array, n_rows: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """One single-key sort, segment starts by adjacent difference, and a
    compaction scatter. (On XLA:CPU ``jnp.unique`` and any sort that carries a
    permutation along are several times slower than a plain sort.)"""
    idt = ids.dtype
    valid = (ids >= 0) & (ids < n_rows)
    sorted_keys = jnp.sort(jnp.where(valid, ids, jnp.asarray(n_rows, idt)))
    seg, starts = segments_of_sorted(sorted_keys)
    sorted_valid = sorted_keys < n_rows
    count = jnp.sum(starts & sorted_valid, dtype=idt)
    seg = jnp.where(sorted_valid, seg, jnp.asarray(capacity, idt))
    uniq = (
        jnp.full((capacity,), n_rows, idt)
        .at[seg]
        .set(sorted_keys, mode="drop", indices_are_sorted=True)
    )
    return uniq, count


def _slots_xla(sorted_ids: jax.Array, ids: jax.Array, n_rows: int, spec=None) -> jax.Array:
    """A binary search (``searchsorted``'s default scan method: on CPU the
    ``"sort"`` method is ~50x slower at 4096 ids).

    With ``spec``, the PartitionSpec of ``ids`` sharded over explicit mesh
    axes, a branchless binary search of its own (one gather per halving)
    whose gathers from the replicated ``sorted_ids`` keep ``spec``
    (``jnp.searchsorted`` cannot resolve that sharding)."""
    k = sorted_ids.shape[0]
    idt = ids.dtype
    if spec is None:
        read = sorted_ids.__getitem__
        below = jnp.searchsorted(sorted_ids, ids).astype(idt)
    else:

        def read(pos):
            return sorted_ids.at[pos].get(mode="clip", out_sharding=sharding_like(ids, spec))

        below = jnp.zeros_like(ids)  # number of sorted ids below each query so far
        step = 1 << (k.bit_length() - 1)  # the largest power of two <= k
        while step:
            cand = below + step
            below = jnp.where((cand <= k) & (read(cand - 1) < ids), cand, below)
            step >>= 1
    pos = jnp.minimum(below, k - 1)
    hit = (read(pos) == ids) & (ids >= 0) & (ids < n_rows)
    return jnp.where(hit, pos, jnp.asarray(k, idt))


def _unique_with_slots_xla(ids, n_rows, capacity):
    uniq, count = _unique_xla(ids, n_rows, capacity)
    return uniq, count, _slots_xla(uniq, ids, n_rows)


def _native_ids_ok(*ids: jax.Array) -> bool:
    return _native.use(_native.UNIQUE_IDS, *ids)


def _unique_native(ids: jax.Array, n_rows: int, capacity: int):
    """``(uniq, count, slots)``: the kernel on CPU, the XLA path elsewhere."""
    return kernel_call(
        _native.unique_ids_call, _unique_with_slots_xla, ids, n_rows=n_rows, capacity=capacity
    )


def unique_with_slots(
    ids: jax.Array, n_rows: int, capacity: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`unique_rows` and, for every id, its slot in the result.

    Returns:
      ``(uniq, count, slots)``; ``slots[i]`` is the position of ``ids[i]`` in
      ``uniq``, or ``capacity`` when the id is outside ``[0, n_rows)`` or was
      left out past the capacity.
    """
    idt = index_dtype()
    ids = replicated(ids.astype(idt))  # a sort must see every id
    if capacity == 0:
        return jnp.zeros((0,), idt), _unique_xla(ids, n_rows, 0)[1], jnp.zeros(ids.shape, idt)
    if _native_ids_ok(ids):
        return _unique_native(ids, n_rows, capacity)
    return _unique_with_slots_xla(ids, n_rows, capacity)


def unique_rows(ids: jax.Array, n_rows: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Sorted unique valid row ids, padded with ``n_rows`` to ``capacity`` slots.

    Args:
      ids: 1-D integer ids; values outside ``[0, n_rows)`` are treated as padding.
      n_rows: the row count ``N``; padding slots of the result carry ``N``.
      capacity: the static number of slots of the result.

    Returns:
      ``(uniq, count)``: ``uniq[capacity]`` and the number of distinct valid
      ids, which may exceed ``capacity`` (then the largest ids are left out; the
      caller reports it).
    """
    idt = index_dtype()
    ids = replicated(ids.astype(idt))  # a sort must see every id
    if capacity > 0 and _native_ids_ok(ids):
        uniq, count, _ = _unique_native(ids, n_rows, capacity)
        return uniq, count
    return _unique_xla(ids, n_rows, capacity)


def slots_in(sorted_ids: jax.Array, ids: jax.Array, n_rows: int) -> jax.Array:
    """Position of every id (any shape) in a sorted, padded id list;
    ``len(sorted_ids)`` where absent or outside ``[0, n_rows)``."""
    k = sorted_ids.shape[0]
    idt = index_dtype()
    ids = ids.astype(idt)
    if k == 0:
        return jnp.zeros_like(ids)
    sorted_ids = replicated(sorted_ids.astype(idt))  # each search reads all of it
    spec = explicit_spec(ids)
    if spec is not None:
        # Queries sharded over explicit mesh axes (a data-parallel batch):
        # each device searches its own ids, and the slots keep their sharding.
        return _slots_xla(sorted_ids, ids, n_rows, spec)
    flat = ids.reshape(-1)
    if not _native_ids_ok(sorted_ids, flat):
        return _slots_xla(sorted_ids, ids, n_rows)
    slots = kernel_call(_native.search_ids_call, _slots_xla, sorted_ids, flat, n_rows=n_rows)
    return slots.reshape(ids.shape)


def coalesce_rows(
    ids: jax.Array, data: jax.Array, n_rows: int, capacity: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sorts rows by id, sums duplicates and pads to ``capacity``.

    Returns ``(indices, data, count)`` where ``count`` is the number of distinct
    valid ids, for the caller's overflow check. Rows whose id is out of
    ``[0, n_rows)`` (padding) are dropped.
    """
    uniq, count, slots = unique_with_slots(ids, n_rows, capacity)
    return uniq, sum_rows(data, slots, capacity), count
