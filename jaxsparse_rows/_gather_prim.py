"""The row gather ``table[ids]`` and its transpose, the row sum
``zeros[N].at[ids].add(rows)``, as a pair of linear JAX primitives.

Each primitive is the other's transpose, so ``grad``, ``vjp``, ``jvp``,
``linear_transpose`` and ``vmap`` all go through them. Each has two lowerings:

- on CPU, when the native kernels take the operands (``rows.cc``: the
  prefetching row gather, and a column-split sum of rows into a zeroed table);
- everywhere else, and as the reference the kernels are tested against, XLA's
  gather (``mode="fill"``, zero rows for ids outside ``[0, N)``) and
  scatter-add (``mode="drop"``).

Which one a program uses is chosen per platform when it is lowered, so one
traced function lowers to the kernels on CPU and to XLA on GPU, and the
choice leaves no branch in the compiled program. A program lowered for
``jax.export`` always gets XLA's (see ``_kernel_call``). Ids are 1-D, in any order,
repeats allowed; ids outside ``[0, N)`` (negative ones too) read zero rows and
are dropped from sums.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _native
from ._util import (
    accumulation_dtype,
    explicit_spec,
    fit_ids,
    jitted_impl,
    replicated,
    zeros_rows,
)
from ._util import gather_rows as _gather_rows_xla
from ._vma import match_varying, result_aval

gather_rows_p = Primitive("jsr_gather_rows")
sum_rows_p = Primitive("jsr_sum_rows")


def _gather_ref(table, ids, *, ids_sorted):
    return _gather_rows_xla(table, ids, indices_are_sorted=ids_sorted)


def _sum_ref(rows, ids, *, n, ids_sorted):
    out = zeros_rows(n, rows)
    if n == 0:
        return out
    return out.at[fit_ids(ids, n)].add(
        rows, mode="drop", indices_are_sorted=ids_sorted, wrap_negative_indices=False
    )


def _use_native(dtype, row_shape, n: int, ids, add: bool) -> bool:
    table = jax.ShapeDtypeStruct((n,) + tuple(row_shape), dtype)
    return _native.native_kernels_enabled() and _native.supports_rows(table, ids, add=add)


def gather(table: jax.Array, ids: jax.Array, *, ids_sorted: bool = False) -> jax.Array:
    """``table[ids]`` for 1-D ``ids``: ``[K, *table.shape[1:]]``, zero rows where
    an id is outside ``[0, N)``. Linear in ``table``; its transpose is
    :func:`sum_rows`. ``ids_sorted`` promises ascending ids (an XLA hint)."""
    table, ids = jnp.asarray(table), jnp.asarray(ids)
    if explicit_spec(table) is not None or explicit_spec(ids) is not None:
        # Sharded over explicit mesh axes (sharding in types): XLA's gather,
        # whose sharding and transpose rules JAX knows.
        return _gather_ref(table, ids, ids_sorted=ids_sorted)
    native = _use_native(table.dtype, table.shape[1:], table.shape[0], ids, add=False)
    table, ids = match_varying(table, ids)
    return gather_rows_p.bind(table, ids, ids_sorted=bool(ids_sorted), native=native)


def sum_rows(rows: jax.Array, ids: jax.Array, n: int, *, ids_sorted: bool = False) -> jax.Array:
    """``zeros([n, ...]).at[ids].add(rows)`` for 1-D ``ids`` in any order: repeated
    ids are summed, ids outside ``[0, n)`` dropped. Linear in ``rows``; its
    transpose is :func:`gather`.

    float16 and bfloat16 rows are summed in float32 and rounded once, as
    ``jnp.sum`` sums them (a bfloat16 running sum of ones stops at 256): the
    gradient of a lookup that repeats an id is the rounded sum of its rows."""
    rows, ids = jnp.asarray(rows), jnp.asarray(ids)
    n, ids_sorted = int(n), bool(ids_sorted)
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
    from ._ids import unique_with_slots  # (which sums rows with this module)

    uniq, _, slots = unique_with_slots(ids, n, k)
    partial = _sum_rows(rows.astype(acc), slots, k, False)  # (slot k, dropped, can come first)
    return _sum_rows(partial.astype(rows.dtype), uniq, n, True)


def _sum_rows(rows: jax.Array, ids: jax.Array, n: int, ids_sorted: bool) -> jax.Array:
    """:func:`sum_rows` in the dtype of ``rows`` (``n`` an int, ``ids_sorted`` a
    bool: :func:`sum_rows` and the primitive's parameters are both)."""
    if explicit_spec(rows) is not None or explicit_spec(ids) is not None:
        return _sum_ref(rows, ids, n=n, ids_sorted=ids_sorted)
    native = _use_native(rows.dtype, rows.shape[1:], n, ids, add=True)
    rows, ids = match_varying(rows, ids)
    return sum_rows_p.bind(rows, ids, n=n, ids_sorted=ids_sorted, native=native)


# ------------------------------------------------------------ evaluation rules


gather_rows_p.def_impl(jitted_impl(gather_rows_p))
sum_rows_p.def_impl(jitted_impl(sum_rows_p))


@gather_rows_p.def_abstract_eval
def _gather_abstract(table, ids, *, ids_sorted, native):
    del ids_sorted, native
    shape = tuple(ids.shape) + tuple(table.shape[1:])
    return result_aval(table, shape, table.dtype, table.weak_type)


@sum_rows_p.def_abstract_eval
def _sum_abstract(rows, ids, *, n, ids_sorted, native):
    del ids, ids_sorted, native
    shape = (n,) + tuple(rows.shape[1:])
    return result_aval(rows, shape, rows.dtype, rows.weak_type)


# ------------------------------------------------------------------ lowerings


def _gather_lowering(ctx, table, ids, *, ids_sorted, native):
    del native
    ref = functools.partial(_gather_ref, ids_sorted=ids_sorted)
    return mlir.lower_fun(ref, multiple_results=False)(ctx, table, ids)


def _for_export(ctx) -> bool:
    # An exported program must not name this library's custom-call targets
    # (see ``_kernel_call``): it gets the XLA lowering.
    return ctx.module_context.lowering_parameters.for_export


def _gather_cpu_lowering(ctx, table, ids, *, ids_sorted, native):
    if native and not _for_export(ctx):
        return jax.ffi.ffi_lowering(_native.GATHER_ROWS_TARGET)(ctx, table, ids)
    return _gather_lowering(ctx, table, ids, ids_sorted=ids_sorted, native=native)


def _sum_lowering(ctx, rows, ids, *, n, ids_sorted, native):
    del native
    ref = functools.partial(_sum_ref, n=n, ids_sorted=ids_sorted)
    return mlir.lower_fun(ref, multiple_results=False)(ctx, rows, ids)


def _sum_cpu_lowering(ctx, rows, ids, *, n, ids_sorted, native):
    if native and not _for_export(ctx):
        return jax.ffi.ffi_lowering(_native.SUM_ROWS_TARGET)(ctx, rows, ids)
    return _sum_lowering(ctx, rows, ids, n=n, ids_sorted=ids_sorted, native=native)


mlir.register_lowering(gather_rows_p, _gather_lowering)
mlir.register_lowering(gather_rows_p, _gather_cpu_lowering, platform="cpu")
mlir.register_lowering(sum_rows_p, _sum_lowering)
mlir.register_lowering(sum_rows_p, _sum_cpu_lowering, platform="cpu")


# ------------------------------------------------------------ differentiation


def _gather_tangent(d_table, table, ids, *, ids_sorted, native):
    del table, native
    return gather(d_table, ids, ids_sorted=ids_sorted)


def _sum_tangent(d_rows, rows, ids, *, n, ids_sorted, native):
    del rows, native
    return _sum_rows(d_rows, ids, n, ids_sorted)  # the primitive's own dtype


ad.defjvp(gather_rows_p, _gather_tangent, None)
ad.defjvp(sum_rows_p, _sum_tangent, None)


def _gather_transpose(ct, table, ids, *, ids_sorted, native):
    del native
    if ad.is_undefined_primal(ids):
        raise ValueError("jsr_gather_rows is not linear in its ids")
    aval = table.aval
    if type(ct) is ad.Zero:
        return [ad.Zero(aval), None]
    # The primitive only runs on operands not sharded over explicit mesh axes,
    # so its output was replicated; a cotangent that a batch-sharded factor
    # made sharded (labels, weights) is gathered back first.
    ct = replicated(ct)
    return [sum_rows(ct, ids, aval.shape[0], ids_sorted=ids_sorted).astype(aval.dtype), None]


def _sum_transpose(ct, rows, ids, *, n, ids_sorted, native):
    del n, native
    if ad.is_undefined_primal(ids):
        raise ValueError("jsr_sum_rows is not linear in its ids")
    aval = rows.aval
    if type(ct) is ad.Zero:
        return [ad.Zero(aval), None]
    ct = replicated(ct)  # as in _gather_transpose
    return [gather(ct, ids, ids_sorted=ids_sorted).astype(aval.dtype), None]


ad.primitive_transposes[gather_rows_p] = _gather_transpose
ad.primitive_transposes[sum_rows_p] = _sum_transpose


# ------------------------------------------------------------------ batching


def _gather_batch(args, dims, *, ids_sorted, native):
    del native
    table, ids = args
    t_dim, i_dim = dims
    if t_dim is None:  # (batching.not_mapped)
        # One table, a batch of id lists: one gather of all the ids.
        ids = jnp.moveaxis(ids, i_dim, 0)
        out = gather(table, ids.reshape(-1))
        return out.reshape(tuple(ids.shape) + tuple(table.shape[1:])), 0
    ref = functools.partial(_gather_ref, ids_sorted=ids_sorted)
    return jax.vmap(ref, in_axes=(t_dim, i_dim))(table, ids), 0


def _sum_batch(args, dims, *, n, ids_sorted, native):
    del native
    ref = functools.partial(_sum_ref, n=n, ids_sorted=ids_sorted)
    return jax.vmap(ref, in_axes=tuple(dims))(*args), 0


batching.primitive_batchers[gather_rows_p] = _gather_batch
batching.primitive_batchers[sum_rows_p] = _sum_batch
