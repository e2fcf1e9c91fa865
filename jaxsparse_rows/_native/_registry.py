"""The native CPU kernels, each declared once (:data:`KERNELS`): its
custom-call target, the handler symbol in the ``_kernels`` library, which
operands it takes, and the raw FFI call that runs it.

Adding a kernel means its C++ (a handler exported as ``symbol``), its call
and support test and one :class:`Kernel` here, its case in ``_selftest``, its
use through :func:`jaxsparse_rows._kernel_call.kernel_call` beside its XLA
reference, and its tests. (The compiled library itself is the extension
module ``_kernels`` beside this file.) ``_library`` registers every declared
target when the library loads; callers ask
:func:`jaxsparse_rows._native.use` whether a kernel runs for their operands
(the one on/off rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

_VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def supports(vals: Any, table: Any, *ids: Any) -> bool:
    """Whether the kernels handle these operands: float32/float64 ``vals`` and
    ``table`` of one dtype, int32/int64 ``ids`` of one dtype, nothing empty.

    One value dtype for both operands is also what keeps mixed-dtype products
    (e.g. a bfloat16 table) in XLA, which casts only the gathered rows instead
    of the whole ``[K, D]`` table.
    """
    vdt = np.dtype(vals.dtype)
    idts = {np.dtype(i.dtype) for i in ids}
    return (
        vdt in _VALUE_DTYPES
        and np.dtype(table.dtype) == vdt
        and len(idts) == 1
        and idts <= set(_INDEX_DTYPES)
        and table.ndim >= 1
        and vals.size > 0
        and table.size > 0
    )


def csr_dense_call(vals: Any, cols: Any, indptr: Any, table: Any) -> jax.Array:
    """The raw FFI call: ``out[r] = sum_j vals[j] * table[cols[j]]`` over row ``r``'s
    entries ``indptr[r] <= j < indptr[r+1]``; ids outside ``[0, K)`` read zero.

    CPU only and not differentiable by itself: ``jsr.dot`` wraps it with a JVP
    written in XLA ops. Batching runs the kernel once per batch element.
    """
    out = jax.ShapeDtypeStruct((indptr.shape[0] - 1,) + tuple(table.shape[1:]), table.dtype)
    call = jax.ffi.ffi_call(CSR_DENSE.target, out, vmap_method="sequential")
    return call(vals, cols, indptr, table)


def csr_t_dense_call(vals: Any, cols: Any, rows: Any, table: Any, k: int):
    """The raw FFI call of the transposed product: ``(indices, data)`` of the
    row-sparse ``sum_j vals[j] * table[rows[j]]`` grouped by column ``cols[j]``.

    ``indices`` holds the distinct column ids in ``[0, k)``, sorted and padded
    with ``k`` to ``min(nse, k)`` slots; ``data`` the matching sums (zero in
    padding slots). Row ids outside the table read zero. CPU only and not
    differentiable by itself (``jsr.dot`` adds an XLA JVP).
    """
    cap = min(int(vals.shape[0]), int(k))
    out = (
        jax.ShapeDtypeStruct((cap,), cols.dtype),
        jax.ShapeDtypeStruct((cap,) + tuple(table.shape[1:]), table.dtype),
    )
    call = jax.ffi.ffi_call(CSR_T_DENSE.target, out, vmap_method="sequential")
    return call(vals, cols, rows, table, k=np.int64(k))


_ROW_DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.float16,
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
    )
) + (np.dtype(jax.numpy.bfloat16),)


def supports_rows(table: Any, ids: Any, *, add: bool = False) -> bool:
    """Whether the row kernels handle ``table[ids]`` (and a scatter or a sum of
    rows into it): a table (anything with ``shape`` and ``dtype``) with at
    least one row and one element per row, of a plain numeric dtype
    (float32/float64 when ``add``), and non-empty 1-D int32/int64 ids."""
    shape = tuple(table.shape)
    ok = _VALUE_DTYPES if add else _ROW_DTYPES
    return (
        np.dtype(table.dtype) in ok
        and np.dtype(ids.dtype) in _INDEX_DTYPES
        and ids.ndim == 1
        and ids.shape[0] > 0
        and len(shape) >= 1
        and int(np.prod(shape)) > 0
    )


def gather_rows_call(table: Any, ids: Any) -> jax.Array:
    """The raw FFI call: ``out[i] = table[ids[i]]``, a zero row where ``ids[i]``
    is outside ``[0, N)``. CPU only and not differentiable by itself."""
    out = jax.ShapeDtypeStruct(tuple(ids.shape) + tuple(table.shape[1:]), table.dtype)
    return jax.ffi.ffi_call(GATHER_ROWS.target, out, vmap_method="sequential")(table, ids)


def scatter_rows_call(table: Any, ids: Any, rows: Any, add: bool = False) -> jax.Array:
    """The raw FFI call: ``table`` with ``table[ids[i]] = rows[i]`` (``+=`` when
    ``add``); ids outside ``[0, N)`` are dropped. The result aliases ``table``, so
    XLA updates a donated (or dead) table in place. CPU only and not
    differentiable by itself."""
    out = jax.ShapeDtypeStruct(tuple(table.shape), table.dtype)
    call = jax.ffi.ffi_call(
        SCATTER_ROWS.target, out, vmap_method="sequential", input_output_aliases={0: 0}
    )
    return call(table, ids, rows, add=bool(add))


def sum_rows_call(rows: Any, ids: Any, n: int) -> jax.Array:
    """The raw FFI call: ``out = zeros([n, ...]); out[ids[i]] += rows[i]`` for
    1-D ``ids`` in any order (repeats summed, ids outside ``[0, n)`` dropped),
    float32/float64 rows. CPU only and not differentiable by itself (the
    primitive of ``_rowops`` lowers to it)."""
    out = jax.ShapeDtypeStruct((int(n),) + tuple(rows.shape[1:]), rows.dtype)
    return jax.ffi.ffi_call(SUM_ROWS.target, out, vmap_method="sequential")(rows, ids)


def supports_rowwise_adagrad(acc: Any, ids: Any, grad: Any) -> bool:
    """Whether :func:`rowwise_adagrad_call` takes these operands: a 1-D
    float32/float64 accumulator with at least one row, gradient rows
    ``[K, ...]`` of its dtype with at least one element each, and non-empty
    1-D int32/int64 ``ids`` of length ``K``."""
    return (
        np.dtype(acc.dtype) in _VALUE_DTYPES
        and np.dtype(grad.dtype) == np.dtype(acc.dtype)
        and len(acc.shape) == 1
        and acc.shape[0] > 0
        and np.dtype(ids.dtype) in _INDEX_DTYPES
        and ids.ndim == 1
        and ids.shape[0] > 0
        and grad.ndim >= 1
        and grad.shape[0] == ids.shape[0]
        and int(np.prod(grad.shape)) > 0
    )


def rowwise_adagrad_call(acc: Any, ids: Any, grad: Any, eps: Any, alpha: Any):
    """The raw FFI call of row-wise AdaGrad's per-row work: ``(acc, u)`` with
    ``acc[ids[i]] += mean(grad[i] ** 2)`` and the direction rows ``u[i] =
    (grad[i] * scale) * alpha``, ``scale = 1 / (sqrt(acc[ids[i]]) + eps)``
    (0 where that denominator is 0; ``u[i] = 0`` for ids outside ``[0, N)``);
    ``eps`` and ``alpha`` are scalar arrays of the accumulator's dtype. The
    accumulator result aliases ``acc``. CPU only and not differentiable by
    itself."""
    out = (
        jax.ShapeDtypeStruct(tuple(acc.shape), acc.dtype),
        jax.ShapeDtypeStruct(tuple(grad.shape), acc.dtype),
    )
    call = jax.ffi.ffi_call(
        ROWWISE_ADAGRAD.target, out, vmap_method="sequential", input_output_aliases={0: 0}
    )
    return tuple(call(acc, ids, grad, eps, alpha))


def supports_ids(ids: Any) -> bool:
    """Whether the id kernels take ``ids``: non-empty, 1-D, int32/int64."""
    return np.dtype(ids.dtype) in _INDEX_DTYPES and ids.ndim == 1 and ids.shape[0] > 0


def unique_ids_call(ids: Any, n_rows: int, capacity: int):
    """The raw FFI call: ``(uniq, count, slots)`` of 1-D ``ids``, all of their
    dtype. ``uniq[capacity]`` holds the sorted distinct ids in ``[0, n_rows)``
    (the smallest ``capacity`` of them), padded with ``n_rows``; ``count`` how
    many distinct valid ids there are; ``slots[i]`` the position of ``ids[i]``
    in ``uniq``, or ``capacity`` where it is outside ``[0, n_rows)`` or left
    out. CPU only; integer results, so nothing to differentiate. The target
    exists once :func:`native_kernels_status` has loaded the library (callers
    check :func:`native_kernels_enabled` first)."""
    out = (
        jax.ShapeDtypeStruct((capacity,), ids.dtype),
        jax.ShapeDtypeStruct((), ids.dtype),
        jax.ShapeDtypeStruct(ids.shape, ids.dtype),
    )
    call = jax.ffi.ffi_call(UNIQUE_IDS.target, out, vmap_method="sequential")
    return tuple(call(ids, n_rows=np.int64(n_rows)))


def search_ids_call(sorted_ids: Any, queries: Any, n_rows: int) -> jax.Array:
    """The raw FFI call: the position of each of the 1-D ``queries`` in the
    ascending ``sorted_ids`` (same dtype), or ``len(sorted_ids)`` where absent
    or outside ``[0, n_rows)``. CPU only; needs the library loaded, as
    :func:`unique_ids_call`."""
    out = jax.ShapeDtypeStruct(queries.shape, queries.dtype)
    call = jax.ffi.ffi_call(SEARCH_IDS.target, out, vmap_method="sequential")
    return call(sorted_ids, queries, n_rows=np.int64(n_rows))


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One native kernel: the custom-call ``target`` its programs name, the
    ``symbol`` of its XLA FFI handler in the library, and ``supports(*operands,
    **options)``: whether it takes operands of these shapes and dtypes. Its
    raw FFI call (CPU only, not differentiable by itself) is the ``*_call``
    function of this module named after it."""

    target: str
    symbol: str
    supports: Callable[..., bool]


def supports_each_ids(*ids: Any) -> bool:
    """Whether the id kernels take every one of ``ids`` (:func:`supports_ids`)."""
    return all(supports_ids(i) for i in ids)


CSR_DENSE = Kernel("jaxsparse_rows_csr_dense", "jsr_csr_dense", supports)
CSR_T_DENSE = Kernel("jaxsparse_rows_csr_t_dense", "jsr_csr_t_dense", supports)
GATHER_ROWS = Kernel("jaxsparse_rows_gather_rows", "jsr_gather_rows", supports_rows)
SCATTER_ROWS = Kernel("jaxsparse_rows_scatter_rows", "jsr_scatter_rows", supports_rows)
SUM_ROWS = Kernel("jaxsparse_rows_sum_rows", "jsr_sum_rows", supports_rows)
UNIQUE_IDS = Kernel("jaxsparse_rows_unique_ids", "jsr_unique_ids", supports_each_ids)
SEARCH_IDS = Kernel("jaxsparse_rows_search_ids", "jsr_search_ids", supports_each_ids)
ROWWISE_ADAGRAD = Kernel(
    "jaxsparse_rows_rowwise_adagrad", "jsr_rowwise_adagrad", supports_rowwise_adagrad
)
KERNELS = (
    CSR_DENSE,
    CSR_T_DENSE,
    GATHER_ROWS,
    SCATTER_ROWS,
    SUM_ROWS,
    UNIQUE_IDS,
    SEARCH_IDS,
    ROWWISE_ADAGRAD,
)
TARGETS = tuple(kernel.target for kernel in KERNELS)
"""Every custom-call target name of the kernels. A program lowered for
``jax.export`` contains none of them (``_kernel_call``)."""
