"""``dot`` with storage-type inference (MXNet's ``sparse.dot``)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero, zero_from_primal

from . import _native
from ._args import check_flag
from ._arraybase import check_unbatched_args
from ._config import log_inference, warn_fallback
from ._csr import CSR, csr_row_ids, whole_csr
from ._dtypes import accumulation_dtype, index_dtype
from ._kernel_call import kernel_call
from ._rowops import (
    coalesce_rows,
    fit_ids,
    gather_rows_xla,
    slots_in,
    sum_rows_xla,
    unique_with_slots,
)
from ._rows import lookup_slots
from ._rowsparse import RowSparse, mask_padding
from ._storage import bool_via_int, operand_dtype, stype


def _matrix_shape(x: Any, transpose: bool, name: str) -> tuple[int, ...]:
    shape = tuple(x.shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"dot: `{name}` must be 1-D or 2-D, got shape {shape}.")
    return shape[::-1] if transpose and len(shape) == 2 else shape


def _check_inner(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...], ta: bool, tb: bool):
    k_l = lhs_shape[-1]
    k_r = rhs_shape[0]
    if k_l != k_r:
        raise ValueError(
            f"dot: inner dimensions differ: lhs{' (transposed)' if ta else ''} has shape "
            f"{lhs_shape} and rhs{' (transposed)' if tb else ''} has shape {rhs_shape} "
            f"({k_l} != {k_r})."
        )


def _rows_times(rows: jax.Array, scale: jax.Array) -> jax.Array:
    """``scale[:, None] * rows`` for 2-D rows, ``scale * rows`` for 1-D."""
    return rows * (scale[:, None] if rows.ndim == 2 else scale)


def dot(lhs: Any, rhs: Any, transpose_a: bool = False, transpose_b: bool = False) -> Any:
    """Matrix product with storage-type inference.

    ===========================================  ==========================
    call                                         result
    ===========================================  ==========================
    ``dot(csr, dense)``                          dense
    ``dot(csr, dense, transpose_a=True)``        row_sparse (rows = column ids present)
    ``dot(csr, rsp)``                            dense (unstored rows read 0)
    ``dot(csr, rsp, transpose_a=True)``          row_sparse
    ``dot(rsp, dense)``                          row_sparse (same rows)
    ``dot(rsp, dense, transpose_a=True)``        dense
    ``dot(dense, csr)``, ``dot(dense, rsp)``     dense (2-D dense lhs)
    ``dot(dense, dense)``                        dense (``jnp.dot``)
    anything else                                dense, StorageFallbackWarning
    ===========================================  ==========================

    ``rhs`` may be 1-D (a vector) where it is dense. The transposed product of
    a csr has ``min(nse, K)`` row slots, which can never overflow. No ``[K, P]``
    dense temporary is built for the row-sparse results, and gradients with respect
    to the dense operand or to a RowSparse operand's ``data`` stay as small.

    On CPU the four csr products run native kernels when they were built (see
    :func:`native_kernels_available`); elsewhere, and for other dtypes, they
    run XLA ops. Both give the same result rows and values to rounding.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> lhs = jsr.csr_matrix(([7., 8., 9.], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
      >>> out = jsr.dot(lhs, jnp.ones((3, 2)), transpose_a=True)
      >>> out, out.asnumpy()
      (RowSparse(float32[5, 2], rows=3), array([[7., 7.],
             [9., 9.],
             [8., 8.],
             [0., 0.],
             [0., 0.]], dtype=float32))
    """
    check_unbatched_args("dot", lhs, rhs)
    transpose_a = check_flag(transpose_a, "transpose_a")
    transpose_b = check_flag(transpose_b, "transpose_b")
    sl, sr = stype(lhs), stype(rhs)
    lhs, rhs = whole_csr(lhs), whole_csr(rhs)
    if sl == "default":
        lhs = _as_dense(lhs, "lhs")
    if sr == "default":
        rhs = _as_dense(rhs, "rhs")
    if sl != sr and jnp.result_type(operand_dtype(lhs), operand_dtype(rhs)) == jnp.bool_:
        # A product of bools sums with logical or (as jnp.dot); XLA's segment
        # sums and the kernels take numbers.
        return bool_via_int(
            lambda x, y: dot(x, y, transpose_a=transpose_a, transpose_b=transpose_b), lhs, rhs
        )
    ls = _matrix_shape(lhs, transpose_a, "lhs")
    rs = _matrix_shape(rhs, transpose_b, "rhs")
    _check_inner(ls, rs, transpose_a, transpose_b)
    if sr == "default" and transpose_b and rhs.ndim == 2:
        rhs = rhs.T
    elif sr != "default" and transpose_b:
        return _fallback(lhs, rhs, transpose_a, transpose_b, sl, sr)

    if sl == "csr" and sr in ("default", "row_sparse"):
        if sr == "default" or rhs.ndim == 2:
            out_stype = "row_sparse" if transpose_a else "default"
            log_inference("dot" + (".T" if transpose_a else ""), (sl, sr), out_stype)
            return _csr_t_dot(lhs, rhs) if transpose_a else _csr_dot(lhs, rhs)
    if sl == "row_sparse" and sr == "default" and lhs.ndim == 2:
        if transpose_a:
            log_inference("dot.T", (sl, sr), "default")
            gathered = gather_rows_xla(rhs, lhs.indices)
            return jnp.tensordot(lhs.data, gathered, axes=(0, 0))
        log_inference("dot", (sl, sr), "row_sparse")
        out = mask_padding(jnp.tensordot(lhs.data, rhs, axes=(1, 0)), lhs.indices, lhs.shape[0])
        return RowSparse._make(out, lhs.indices, (lhs.shape[0],) + tuple(rhs.shape[1:]))
    if sl == "default" and not transpose_a and lhs.ndim == 2 and sr != "default":
        log_inference("dot", (sl, sr), "default")
        if lhs.shape[1] == 0:  # nothing to sum (and XLA cannot gather from 0 columns)
            dtype = jnp.result_type(lhs, rhs.data)
            return jnp.zeros((lhs.shape[0],) + tuple(rhs.shape[1:]), dtype)
        if sr == "row_sparse" and rhs.ndim == 2:
            ids = fit_ids(rhs.indices, lhs.shape[1])
            cols = lhs.at[:, ids].get(mode="fill", fill_value=0, wrap_negative_indices=False)
            return cols @ rhs.data
        if sr == "csr":
            gathered = lhs.at[:, rhs.row_ids()].get(mode="fill", fill_value=0)
            dtype = jnp.result_type(gathered, rhs.data)
            acc = accumulation_dtype(dtype)  # half precision sums in float32
            contrib = gathered.astype(acc) * rhs.data[None, :].astype(acc)
            out = jnp.zeros((lhs.shape[0], rhs.shape[1]), acc)
            cols = fit_ids(rhs.indices, rhs.shape[1])
            out = out.at[:, cols].add(contrib, mode="drop", wrap_negative_indices=False)
            return out.astype(dtype)
    if sl == sr == "default":
        return jnp.dot(lhs.T if transpose_a else lhs, rhs)
    return _fallback(lhs, rhs, transpose_a, transpose_b, sl, sr)


def _as_dense(x: Any, name: str) -> jax.Array:
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"`{name}` must be an array (dense, RowSparse or CSR), got {type(x).__name__} {x!r}."
        ) from e


def _fallback(lhs, rhs, transpose_a, transpose_b, sl, sr):
    warn_fallback("dot", (sl, sr))
    a = lhs.todense() if sl != "default" else lhs
    b = rhs.todense() if sr != "default" else rhs
    a = a.T if transpose_a else a
    b = b.T if transpose_b and b.ndim == 2 else b
    return jnp.dot(a, b)


def _rhs_table(rhs: Any, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(rows, table)`` the csr products read for ``rhs[ids]``: a dense rhs is
    the table itself; a RowSparse rhs reads its stored rows, at the slots of
    ``ids`` (``lookup_slots``: an absent id gets an out-of-range slot, which
    reads a zero row)."""
    if isinstance(rhs, RowSparse):
        return lookup_slots(rhs, ids), rhs.data
    return ids, jnp.asarray(rhs)


def _csr_dense_xla(vals, cols, indptr, table, dtype=None) -> jax.Array:
    """``out[r] = sum_j vals[j] * table[cols[j]]`` over row ``r``'s entries, in XLA ops:
    gather the rows, cast them to ``dtype`` (default: the table's), scale them,
    segment-sum them by row. Ids outside ``[0, K)`` read zero rows; slots past
    ``indptr[-1]`` (padding) are left out. Only the gathered rows are cast, never
    the whole table."""
    m = indptr.shape[0] - 1
    dtype = table.dtype if dtype is None else dtype
    acc = accumulation_dtype(dtype)  # half precision sums in float32, as jnp.dot
    rows = gather_rows_xla(table, cols).astype(acc)
    contrib = _rows_times(rows, vals.astype(acc))
    row_ids = csr_row_ids(indptr, vals.shape[0])
    return sum_rows_xla(contrib, row_ids, m, ids_sorted=True).astype(dtype)


@jax.custom_jvp
def _csr_dense_native(vals, cols, indptr, table) -> jax.Array:
    """:func:`_csr_dense_xla` run by the native CPU kernel (the XLA ops elsewhere)."""
    return kernel_call(_native.csr_dense_call, _csr_dense_xla, vals, cols, indptr, table)


def _csr_dense_native_jvp(primals, tangents):
    # The product is linear in vals and in table: its tangent is the sum of two XLA
    # products, which JAX can transpose for reverse mode. A symbolic-zero tangent
    # drops its product, so e.g. a JVP in the table alone never runs the values'
    # product (a second full gather from the table).
    vals, cols, indptr, table = primals
    d_vals, _, _, d_table = tangents
    out = _csr_dense_native(vals, cols, indptr, table)
    terms = []
    if not isinstance(d_table, SymbolicZero):
        terms.append(_csr_dense_xla(vals, cols, indptr, d_table))
    if not isinstance(d_vals, SymbolicZero):
        terms.append(_csr_dense_xla(d_vals, cols, indptr, table))
    d_out = sum(terms[1:], terms[0]) if terms else jnp.zeros_like(out)
    return out, d_out


_csr_dense_native.defjvp(_csr_dense_native_jvp, symbolic_zeros=True)


def _csr_dot(lhs: CSR, rhs: Any) -> jax.Array:
    """``lhs @ rhs``: for every row, the sum of its entries times the rhs rows they
    select (the native CPU kernel where it applies, else XLA ops)."""
    dtype = jnp.result_type(lhs.data, rhs.data if isinstance(rhs, RowSparse) else rhs)
    cols, table = _rhs_table(rhs, lhs.indices)
    cols = cols.astype(lhs.indptr.dtype)
    if lhs.shape[0] > 0 and _native.use(_native.CSR_DENSE, lhs.data, table, cols, lhs.indptr):
        return _csr_dense_native(lhs.data, cols, lhs.indptr, table)
    return _csr_dense_xla(lhs.data, cols, lhs.indptr, table, dtype)


def _csr_t_dense_xla(vals, cols, rows, table, k, dtype=None):
    """``(indices, data)`` of ``lhs.T @ table`` in XLA ops: gather the rows, cast
    them to ``dtype``, scale them, coalesce them by column (sort-based). At most
    ``min(nse, K)`` distinct columns occur, so that capacity never overflows."""
    dtype = table.dtype if dtype is None else dtype
    acc = accumulation_dtype(dtype)  # half precision sums in float32, as jnp.dot
    contrib = _rows_times(gather_rows_xla(table, rows).astype(acc), vals.astype(acc))
    idx, data, _ = coalesce_rows(cols, contrib, k, _t_capacity(cols, k))
    return idx, data.astype(dtype)


def _t_capacity(cols: jax.Array, k: int) -> int:
    """The transposed product's row capacity: at most ``min(nse, K)`` distinct
    columns occur (shared by the product and :func:`_csr_t_dense_indices`,
    whose known row ids must have the product's shape)."""
    return min(cols.shape[0], k)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _csr_t_dense_native(vals, cols, rows, table, k):
    """:func:`_csr_t_dense_xla` run by the native CPU kernel (the XLA ops elsewhere)."""
    # Both branches must return the RowSparse index dtype.
    cols, rows = cols.astype(index_dtype()), rows.astype(index_dtype())
    return kernel_call(
        _native.csr_t_dense_call,
        _csr_t_dense_xla,
        vals,
        cols,
        rows,
        table,
        k=k,
        known_outputs=_csr_t_dense_indices,
    )


def _csr_t_dense_indices(vals, cols, rows, table, k):
    """``[indices, None]``: the result's row ids alone, which depend on the
    column ids only (for ``jax.linear_transpose`` with respect to ``vals`` or
    ``table``, which are then ``None``)."""
    del vals, rows, table
    uniq, _, _ = unique_with_slots(cols, k, _t_capacity(cols, k))
    return [uniq, None]


def _csr_t_dense_native_jvp(k, primals, tangents):
    # Linear in vals and in table. The tangent rows land in the primal's slots
    # (a binary search of each column id in the sorted indices), so no second
    # sort runs; both terms are XLA ops that JAX can transpose.
    vals, cols, rows, table = primals
    d_vals, _, _, d_table = tangents
    idx, data = _csr_t_dense_native(vals, cols, rows, table, k)
    terms = []
    if not isinstance(d_table, SymbolicZero):
        terms.append(_rows_times(gather_rows_xla(d_table, rows), vals))
    if not isinstance(d_vals, SymbolicZero):
        terms.append(_rows_times(gather_rows_xla(table, rows), d_vals))
    if terms:
        slots = slots_in(idx, cols, k)
        d_data = jnp.zeros_like(data).at[slots].add(sum(terms[1:], terms[0]), mode="drop")
    else:
        d_data = jnp.zeros_like(data)
    return (idx, data), (zero_from_primal(idx), d_data)


_csr_t_dense_native.defjvp(_csr_t_dense_native_jvp, symbolic_zeros=True)


def _csr_t_dot(lhs: CSR, rhs: Any) -> RowSparse:
    """``lhs.T @ rhs`` as a RowSparse over the column ids present in ``lhs`` (the
    native CPU kernel where it applies, else XLA ops)."""
    k = lhs.shape[1]
    dtype = jnp.result_type(lhs.data, rhs.data if isinstance(rhs, RowSparse) else rhs)
    rows, table = _rhs_table(rhs, lhs.row_ids())
    cols, rows = lhs.indices.astype(index_dtype()), rows.astype(index_dtype())
    if (
        0 < k <= np.iinfo(index_dtype()).max  # k pads the result's indices
        and _native.use(_native.CSR_T_DENSE, lhs.data, table, cols, rows)
    ):
        idx, data = _csr_t_dense_native(lhs.data, cols, rows, table, k)
    else:
        idx, data = _csr_t_dense_xla(lhs.data, cols, rows, table, k, dtype)
    return RowSparse._make(data, idx, (k,) + tuple(rhs.shape[1:]))
