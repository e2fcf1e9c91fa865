"""Gathering the listed rows of a dense table and writing them back.

Every lazy optimizer step, ``optim.apply_updates``, ``pull_rows`` and ``take``
reduce to ``table[ids]`` and ``table.at[ids].set / add(rows)``. The gathers
are the linear primitive of ``_gather_prim`` (native on CPU, XLA elsewhere,
transposing to a sum of rows). The scatters, at the sorted unique ids of a
RowSparse (padding ids ``N`` included), run ``_native``'s prefetching row
kernel on CPU where it is available (updating a donated table in place);
elsewhere, and for dtypes the kernels do not take, they are the XLA ops
below, which the kernels are tested against and which supply the derivatives.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from . import _native
from ._gather_prim import gather
from ._kernel_call import on_cpu
from ._util import explicit_spec, fit_ids


def _scatter_xla(table: jax.Array, ids: jax.Array, rows: jax.Array, add: bool) -> jax.Array:
    table = jnp.asarray(table)
    ref = table.at[fit_ids(ids, table.shape[0])]  # XLA:CPU truncates 64-bit indices
    kw = dict(indices_are_sorted=True, unique_indices=True, wrap_negative_indices=False)
    spec = explicit_spec(table)  # sharding in types: the result keeps the table's
    if spec is not None:
        kw["out_sharding"] = spec
    return (ref.add if add else ref.set)(rows, mode="drop", **kw)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _scatter_native(table, ids, rows, add):
    return on_cpu(_native.scatter_rows_call, _scatter_xla, table, ids, rows, add=add)


def _scatter_native_jvp(add, primals, tangents):
    # Linear in (table, rows) for both set and add: the tangent is the same
    # scatter of the tangents, in XLA ops that JAX can transpose.
    table, ids, rows = primals
    d_table, _, d_rows = tangents
    out = _scatter_native(table, ids, rows, add)
    if isinstance(d_table, SymbolicZero) and isinstance(d_rows, SymbolicZero):
        return out, jnp.zeros_like(out)
    d_table = jnp.zeros_like(table) if isinstance(d_table, SymbolicZero) else d_table
    d_rows = jnp.zeros_like(rows) if isinstance(d_rows, SymbolicZero) else d_rows
    return out, _scatter_xla(d_table, ids, d_rows, add)


_scatter_native.defjvp(_scatter_native_jvp, symbolic_zeros=True)


def _native_ok(table: jax.Array, ids: jax.Array, add: bool = False) -> bool:
    # A weakly typed table (e.g. ``jnp.full(shape, 1.0)``) stays in XLA, whose
    # scatter keeps it weakly typed (a kernel's result is not).
    return (
        _native.native_kernels_enabled()
        and not getattr(getattr(table, "aval", None), "weak_type", False)
        and _native.supports_rows(table, ids, add=add)
    )


def gather_sorted_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """``table[ids]`` along axis 0 for sorted 1-D ``ids``; ids outside ``[0, N)``
    (the RowSparse padding id ``N``) read zero rows."""
    return gather(table, ids, ids_sorted=True)


def gather_rows(table: jax.Array, ids: jax.Array) -> jax.Array:
    """``table[ids]`` along axis 0 for ids of any shape and order, shaped
    ``[*ids.shape, *table.shape[1:]]``; ids outside ``[0, N)`` (negative ones
    too) read zero rows."""
    table = jnp.asarray(table)
    out = gather(table, jnp.asarray(ids).reshape(-1))
    return out.reshape(tuple(ids.shape) + tuple(table.shape[1:]))


def scatter_sorted_rows(
    table: jax.Array, ids: jax.Array, rows: jax.Array, *, add: bool = False
) -> jax.Array:
    """``table`` with ``table[ids[i]] = rows[i]`` (``+=`` with ``add``) for sorted
    unique 1-D ``ids``; ids outside ``[0, N)`` (padding) are dropped. ``rows`` is
    cast to the table's dtype. A donated table is updated in place."""
    table = jnp.asarray(table)
    rows = jnp.broadcast_to(jnp.asarray(rows).astype(table.dtype), ids.shape + table.shape[1:])
    if _native_ok(table, ids, add):
        return _scatter_native(table, ids, rows, bool(add))
    return _scatter_xla(table, ids, rows, bool(add))
