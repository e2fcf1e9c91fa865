"""The id bookkeeping of row-sparse ops: the sorted unique ids of a batch, the
slot of each id among them, and summing rows by id.

``pull_rows``, ``take`` on a RowSparse, gradients of lookups, sparse products
and elementwise ops all reduce to these. On CPU, where the native kernels are
available, ``unique_rows`` runs one radix-sort kernel (which also yields every
id's slot) and ``slots_in`` a binary-search kernel; elsewhere, and for inputs
the kernels do not take, they run the XLA implementations below, which the
kernels are tested against. Their outputs are integers, so they need no
derivative. ``coalesce_rows`` sums rows by slot with ``_gather_prim.sum_rows``
(the native sum of rows on CPU), which is linear and carries the derivative
of the summed data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _native
from ._gather_prim import sum_rows
from ._kernel_call import on_cpu
from ._util import explicit_spec, index_dtype, replicated, segments_of_sorted


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
            return sorted_ids.at[pos].get(mode="clip", out_sharding=spec)

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


def _native_ok(*ids: jax.Array) -> bool:
    return _native.native_kernels_enabled() and all(_native.supports_ids(i) for i in ids)


def _unique_native(ids: jax.Array, n_rows: int, capacity: int):
    """``(uniq, count, slots)``: the kernel on CPU, the XLA path elsewhere."""
    return on_cpu(
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
    if _native_ok(ids):
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
    if capacity > 0 and _native_ok(ids):
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
    if not _native_ok(sorted_ids, flat):
        return _slots_xla(sorted_ids, ids, n_rows)
    slots = on_cpu(_native.search_ids_call, _slots_xla, sorted_ids, flat, n_rows=n_rows)
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
