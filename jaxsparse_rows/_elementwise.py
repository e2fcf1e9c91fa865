"""Elementwise arithmetic with storage-type inference.

The rules (tested row by row in ``tests/test_elementwise.py`` and listed in
``docs/storage.md``):

=====================================  ==============================
expression                             result storage
=====================================  ==============================
``rsp * scalar``, ``rsp / scalar``     row_sparse (same rows)
``-rsp``, zero-preserving unary f      row_sparse (same rows)
``rsp + rsp``, ``rsp - rsp``           row_sparse (union of rows)
``rsp * rsp``                          row_sparse (intersection)
``rsp * dense``, ``dense * rsp``       row_sparse (same rows)
``rsp + dense``, ``dense + rsp``       dense (scatter-add)
``csr * scalar``, ``csr / scalar``     csr
``-csr``, zero-preserving unary f      csr
``csr + csr``, ``csr - csr``           csr (union of entries)
``csr * dense``                        csr (same entries)
``csr + dense``                        dense
anything else                          dense, StorageFallbackWarning
=====================================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._args import capacity_check, check_static_int
from ._arraybase import broadcast_row_mask, check_unbatched_args
from ._config import log_inference, warn_fallback
from ._csr import CSR, add_entries, whole_csr
from ._dtypes import index_dtype
from ._rowops import (
    coalesce_rows,
    fit_ids,
    gather_rows_xla,
    scatter_rows,
    segments_of_sorted,
    slots_in,
)
from ._rowsparse import RowSparse
from ._storage import apply_dense, bool_via_int, is_sparse, operand_dtype, stype


def _is_scalar(x: Any) -> bool:
    if isinstance(x, int | float | complex | np.number | bool):
        return True
    return isinstance(x, jax.Array | np.ndarray) and x.ndim == 0


def with_data(x: Any, data: jax.Array) -> Any:
    if isinstance(x, RowSparse):
        return RowSparse._make(data, x.indices, x.shape)
    return CSR._make(data, x.indices, x.indptr, x.shape)


def _in_result_dtype(data: Any, b: Any) -> np.ndarray:
    """``b`` as the op ``data (op) b`` computes with it: cast to the result's
    floating dtype (65536.0 is inf in float16, 1e-8 is 0)."""
    v = np.asarray(b)
    dtype = jnp.result_type(data, b)
    if jnp.issubdtype(dtype, jnp.floating) and v.dtype.kind != "c":
        with np.errstate(over="ignore", under="ignore"):
            v = v.astype(dtype)
    return v


def _finite_scalar(b: Any, data: Any, *, nonzero: bool = False) -> bool:
    """True when ``b`` is a concrete scalar known to keep zero padding at zero
    in ``data * b`` (``data / b`` with ``nonzero``), in the dtype the op
    computes in."""
    if isinstance(b, jax.core.Tracer):
        return False
    v = _in_result_dtype(data, b)
    ok = v.dtype.kind not in "fc" and v.dtype.name != "bfloat16" or bool(np.isfinite(v))
    return ok and (not nonzero or bool(np.all(v != 0)))


def _positive_scalar(p: Any, data: Any) -> bool:
    """True for a real Python or numpy scalar that is > 0 in the dtype
    ``data ** p`` computes in: then ``0 ** p == 0`` and ``x ** p`` keeps the
    storage type. A JAX scalar is not taken: it is traced under jit, so the
    result's type would differ between eager and jit."""
    if not _is_scalar(p) or isinstance(p, jax.Array | bool | complex):
        return False
    v = np.asarray(p)
    if not (v.dtype.kind in "iuf" or v.dtype.name == "bfloat16"):
        return False
    return bool(_in_result_dtype(data, p) > 0)


def with_data_masked(x: Any, data: jax.Array) -> Any:
    """``with_data`` that forces padding slots back to zero (after ``* inf``, ``/ 0``)."""
    if isinstance(x, RowSparse):
        mask = broadcast_row_mask(x.row_mask, data.ndim)
    else:
        # indptr[..., -1:]: each array's entry count, also for leaves stacked
        # by jax.vmap ([S.., M + 1] indptr, [S.., nse] data).
        pos = lax.broadcasted_iota(x.indptr.dtype, x.indices.shape, x.indices.ndim - 1)
        mask = pos < x.indptr[..., -1:]
    return with_data(x, jnp.where(mask, data, jnp.zeros_like(data, shape=())))


def _same_shape(op: str, a: Any, b: Any) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"{op}: operands must have the same shape, got {tuple(a.shape)} and "
            f"{tuple(b.shape)}. Sparse operands do not broadcast against each other."
        )


def _broadcastable(op: str, a: Any, b: Any) -> None:
    """A ValueError naming ``op`` unless ``a`` and ``b`` broadcast together (the
    ops whose result is dense; see :func:`_same_shape` for sparse results)."""
    sa, sb = (tuple(x.shape) if is_sparse(x) else tuple(np.shape(x)) for x in (a, b))
    try:
        np.broadcast_shapes(sa, sb)
    except ValueError:
        raise ValueError(
            f"{op}: operands of shapes {sa} and {sb} do not broadcast together "
            f"({stype(a)} and {stype(b)})."
        ) from None


# -- unary ---------------------------------------------------------------------
def _zero_preserving(fn: Callable[[jax.Array], jax.Array], name: str) -> Callable[[Any], Any]:
    def op(x: Any) -> Any:
        if is_sparse(x):
            log_inference(name, (stype(x),), stype(x))
            return with_data(x, fn(x.data))
        return fn(x)

    op.__name__ = op.__qualname__ = name
    source = "jax.nn" if fn is jax.nn.relu else "jnp"
    op.__doc__ = f"""Elementwise ``{source}.{fn.__name__}``; keeps the storage type (f(0) == 0).

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[0.25, 1.]], [1]), shape=(3, 2))
      >>> jsr.{name}(a).stype
      'row_sparse'
    """
    return op


_UNARY = {
    "abs": jnp.abs,
    "sign": jnp.sign,
    "negative": jnp.negative,
    "sqrt": jnp.sqrt,
    "square": jnp.square,
    "sin": jnp.sin,
    "tan": jnp.tan,
    "sinh": jnp.sinh,
    "tanh": jnp.tanh,
    "arcsin": jnp.arcsin,
    "arctan": jnp.arctan,
    "arcsinh": jnp.arcsinh,
    "arctanh": jnp.arctanh,
    "expm1": jnp.expm1,
    "log1p": jnp.log1p,
    "floor": jnp.floor,
    "ceil": jnp.ceil,
    "trunc": jnp.trunc,
    "rint": jnp.rint,
    "deg2rad": jnp.deg2rad,
    "rad2deg": jnp.rad2deg,
    "relu": jax.nn.relu,
}
ZERO_PRESERVING_UNARY = tuple(_UNARY)
"""Names of the unary functions with f(0) == 0 (``jsr.abs``, ``jsr.sqrt``, ...):
on a RowSparse or CSR they map ``data`` and keep the storage type."""

abs = _zero_preserving(jnp.abs, "abs")  # noqa: A001
sign = _zero_preserving(jnp.sign, "sign")
negative = _zero_preserving(jnp.negative, "negative")
sqrt = _zero_preserving(jnp.sqrt, "sqrt")
square = _zero_preserving(jnp.square, "square")
sin = _zero_preserving(jnp.sin, "sin")
tan = _zero_preserving(jnp.tan, "tan")
sinh = _zero_preserving(jnp.sinh, "sinh")
tanh = _zero_preserving(jnp.tanh, "tanh")
arcsin = _zero_preserving(jnp.arcsin, "arcsin")
arctan = _zero_preserving(jnp.arctan, "arctan")
arcsinh = _zero_preserving(jnp.arcsinh, "arcsinh")
arctanh = _zero_preserving(jnp.arctanh, "arctanh")
expm1 = _zero_preserving(jnp.expm1, "expm1")
log1p = _zero_preserving(jnp.log1p, "log1p")
floor = _zero_preserving(jnp.floor, "floor")
ceil = _zero_preserving(jnp.ceil, "ceil")
trunc = _zero_preserving(jnp.trunc, "trunc")
rint = _zero_preserving(jnp.rint, "rint")
deg2rad = _zero_preserving(jnp.deg2rad, "deg2rad")
rad2deg = _zero_preserving(jnp.rad2deg, "rad2deg")
relu = _zero_preserving(jax.nn.relu, "relu")


def power(x: Any, p: Any) -> Any:
    """``x ** p``; keeps the storage type for a real Python or numpy scalar
    ``p > 0`` (0 ** p == 0); anything else, JAX scalars included (they are
    traced under jit), gives a dense result.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> (jsr.row_sparse_array(([[2., 3.]], [0]), shape=(2, 2)) ** 2).data
      Array([[4., 9.]], dtype=float32)
    """
    if is_sparse(x) and _positive_scalar(p, x.data):
        log_inference("power", (stype(x), "scalar"), stype(x))
        return with_data(x, x.data**p)
    return apply_dense(jnp.power, x, p)


# -- binary --------------------------------------------------------------------
def multiply(a: Any, b: Any) -> Any:
    """Elementwise product with storage inference (see the module table).

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> (a * 2).stype, (a * jnp.ones((3, 2))).stype
      ('row_sparse', 'row_sparse')
    """
    sa, sb = stype(a), stype(b)
    if not is_sparse(a) and not is_sparse(b):
        return jnp.multiply(a, b)
    if not is_sparse(a):  # make `a` the sparse one
        a, b, sa, sb = b, a, sb, sa
    if _is_scalar(b):  # data only: leaves stacked by jax.vmap are fine
        log_inference("multiply", (sa, "scalar"), sa)
        if _finite_scalar(b, a.data):
            return with_data(a, a.data * b)
        return with_data_masked(a, a.data * b)
    check_unbatched_args("multiply", a, b)
    if sa == sb == "row_sparse":
        _same_shape("multiply", a, b)
        log_inference("multiply", (sa, sb), "row_sparse")
        return _rsp_intersect_multiply(a, b)
    if sb == "default":
        b = jnp.asarray(b)
        log_inference("multiply", (sa, sb), sa)
        if sa == "row_sparse":
            return with_data_masked(a, a.data * _dense_rows(b, a))
        return _csr_times_dense(a, b)
    _broadcastable("multiply", a, b)
    warn_fallback("multiply", (sa, sb))
    return jnp.multiply(a.todense(), b.todense())


def divide(a: Any, b: Any) -> Any:
    """``a / b``; ``sparse / scalar`` keeps the storage type, the rest is dense.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> (jsr.row_sparse_array(([[2., 4.]], [0]), shape=(2, 2)) / 2).data
      Array([[1., 2.]], dtype=float32)
    """
    if is_sparse(a) and _is_scalar(b):
        log_inference("divide", (stype(a), "scalar"), stype(a))
        if _finite_scalar(b, a.data, nonzero=True):
            return with_data(a, a.data / b)
        return with_data_masked(a, a.data / b)
    if not is_sparse(a) and not is_sparse(b):
        return jnp.divide(a, b)
    check_unbatched_args("divide", a, b)
    _broadcastable("divide", a, b)
    return apply_dense(jnp.divide, a, b)


def add(a: Any, b: Any, *, capacity: int | None = None) -> Any:
    """``a + b`` with storage inference (see the module table).

    ``sparse + dense`` is a scatter-add into the dense operand, which is what
    makes ``optax.apply_updates(params, row_sparse_updates)`` work. The sum of
    two RowSparse lists the union of their rows, repeats summed: this is the
    way to add two row-sparse gradients (``jax.tree.map(jnp.add, g1, g2)``
    adds their row ids instead).

    Args:
      a: the first operand (dense, RowSparse or CSR).
      b: the second operand.
      capacity: for the sum of two RowSparse, the static row capacity of the
        result (default ``a.capacity + b.capacity``, which cannot overflow).
        A fixed capacity keeps the type of a ``lax.scan`` carry or of
        ``lax.cond`` branches the same from step to step. More distinct rows
        than ``capacity``: ``ValueError`` when concrete; under jit the
        largest row ids are left out, which ``checkify.checkify(f,
        errors=checkify.user_checks)`` reports.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> b = jsr.row_sparse_array(([[1., 1.]], [2]), shape=(3, 2))
      >>> (a + b).indices, jsr.stype(a + jnp.ones((3, 2)))
      (Array([1, 2], dtype=int32), 'default')
      >>> jsr.add(a, a, capacity=1)
      RowSparse(float32[3, 2], rows=1)
    """
    if capacity is not None:
        capacity = check_static_int(capacity, "capacity")
        if not (stype(a) == stype(b) == "row_sparse"):
            raise TypeError(
                "`capacity` sets the row slots of the sum of two RowSparse, got operands of "
                f"storage types {stype(a)!r} and {stype(b)!r}. Leave it out for other sums."
            )
    return _add(a, b, "add", capacity)


def _add(a: Any, b: Any, name: str, capacity: int | None = None) -> Any:
    """:func:`add`, naming ``name`` (``subtract`` routes here) in errors and logs."""
    sa, sb = stype(a), stype(b)
    if sa == sb == "default":
        return jnp.add(a, b)
    check_unbatched_args(name, a, b)
    if _bool_operands(a, b):
        return bool_via_int(lambda x, y: _add(x, y, name, capacity), a, b)
    if sa == sb == "row_sparse":
        _same_shape(name, a, b)
        log_inference(name, (sa, sb), "row_sparse")
        ids = jnp.concatenate([a.indices, b.indices])
        dtype = jnp.result_type(a.data, b.data)
        data = jnp.concatenate([a.data.astype(dtype), b.data.astype(dtype)])
        full = a.capacity + b.capacity
        cap = full if capacity is None else capacity
        idx, summed, count = coalesce_rows(ids, data, a.shape[0], cap)
        if cap < min(full, a.shape[0]):  # else it cannot overflow: no check emitted
            capacity_check(
                count <= cap,
                f"{name}: the operands hold more distinct rows than `capacity` = {cap}; rows "
                "would be left out. Raise `capacity` (a.capacity + b.capacity never overflows).",
            )
        return RowSparse._make(summed, idx, a.shape)
    if sa == sb == "csr":
        _same_shape(name, a, b)
        log_inference(name, (sa, sb), "csr")
        return _csr_union_add(a, b)
    if sa == "default" or sb == "default":
        if _is_scalar(a) or _is_scalar(b):
            return apply_dense(jnp.add, a, b)
        _broadcastable(name, a, b)
        sparse, dense = (a, b) if sb == "default" else (b, a)
        dense = jnp.asarray(dense)
        log_inference(name, (sa, sb), "default")
        return _scatter_add_dense(sparse, dense)
    _broadcastable(name, a, b)
    warn_fallback(name, (sa, sb))
    return jnp.add(a.todense(), b.todense())


def _bool_operands(a: Any, b: Any) -> bool:
    """True when ``a + b`` is a sum of bools (logical or) on a sparse operand."""
    if _is_scalar(a) or _is_scalar(b):
        return False
    return jnp.result_type(operand_dtype(a), operand_dtype(b)) == jnp.bool_


def subtract(a: Any, b: Any) -> Any:
    """``a - b`` with the storage rules of :func:`add`.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> (a - a).stype
      'row_sparse'
    """
    if not is_sparse(a) and not is_sparse(b):
        return jnp.subtract(a, b)
    if _is_scalar(a) or _is_scalar(b):
        return apply_dense(jnp.subtract, a, b)
    if not is_sparse(b):
        b = jnp.asarray(b)
    # Promote before negating: -b in b's own dtype wraps unsigned values
    # (float32 - uint8 gave 255 for -1) and does not exist for bool.
    dtype = jnp.result_type(operand_dtype(a), operand_dtype(b))
    if dtype == jnp.bool_:
        raise TypeError(
            "`a - b` of bool operands is not defined (as in numpy and jax.numpy); use "
            "`jnp.logical_xor` on dense arrays, or cast with `.astype`."
        )
    return _add(a, negative(b.astype(dtype)), "subtract")


# -- kernels -------------------------------------------------------------------
def _dense_rows(dense: jax.Array, rsp: RowSparse) -> jax.Array:
    """The rows of ``dense`` (broadcastable to ``rsp.shape``) at ``rsp.indices``."""
    if dense.ndim > rsp.ndim:
        raise ValueError(
            f"a dense operand of shape {tuple(dense.shape)} does not broadcast to the "
            f"row_sparse shape {rsp.shape}."
        )
    dense = dense.reshape((1,) * (rsp.ndim - dense.ndim) + tuple(dense.shape))
    try:
        np.broadcast_shapes(dense.shape, rsp.shape)
    except ValueError:
        raise ValueError(
            f"a dense operand of shape {tuple(dense.shape)} does not broadcast to the "
            f"row_sparse shape {rsp.shape}."
        ) from None
    if np.broadcast_shapes(dense.shape, rsp.shape) != rsp.shape:
        raise ValueError(
            f"the result of broadcasting {tuple(dense.shape)} with {rsp.shape} is not "
            f"{rsp.shape}; sparse results cannot grow."
        )
    if dense.shape[0] == 1:
        return dense
    return gather_rows_xla(dense, rsp.indices)


def _scatter_add_dense(sparse: Any, dense: jax.Array) -> jax.Array:
    shape = np.broadcast_shapes(tuple(dense.shape), sparse.shape)
    dtype = jnp.result_type(dense, sparse.data)
    base = jnp.broadcast_to(dense, shape).astype(dtype)
    if shape != sparse.shape:
        raise ValueError(
            f"adding a sparse {sparse.shape} array to a dense {tuple(dense.shape)} array "
            f"would broadcast the sparse operand to {shape}; that is not supported."
        )
    if isinstance(sparse, RowSparse):
        return scatter_rows(base, sparse.indices, sparse.data.astype(dtype), add=True)
    return add_entries(base, sparse)


def _rsp_intersect_multiply(a: RowSparse, b: RowSparse) -> RowSparse:
    if a.capacity > b.capacity:
        a, b = b, a  # probe the smaller index set
    n = a.shape[0]
    dtype = jnp.result_type(a.data, b.data)
    kb = b.capacity
    if kb == 0 or a.capacity == 0:
        return RowSparse._make(
            jnp.zeros((0,) + a.shape[1:], dtype), jnp.zeros((0,), index_dtype()), a.shape
        )
    pos = slots_in(b.indices, a.indices, n)  # kb where b lacks the row
    hit = pos < kb
    prod = a.data.astype(dtype) * gather_rows_xla(b.data, pos).astype(dtype)
    # Compact the hits to the front, keeping their (sorted) order.
    (slots,) = jnp.nonzero(hit, size=a.capacity, fill_value=a.capacity)
    idx = a.indices.at[slots].get(mode="fill", fill_value=n)
    data = prod.at[slots].get(mode="fill", fill_value=0)
    return RowSparse._make(data, idx.astype(index_dtype()), a.shape)


def _csr_times_dense(a: CSR, b: jax.Array) -> CSR:
    try:
        ok = b.ndim <= 2 and np.broadcast_shapes(tuple(b.shape), a.shape) == a.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"a dense operand of shape {tuple(b.shape)} does not broadcast to the csr "
            f"shape {a.shape}."
        )
    if a.size == 0:
        return CSR._make(a.data * jnp.zeros((), b.dtype), a.indices, a.indptr, a.shape)
    a = whole_csr(a)  # the entries' rows and columns pick b's values
    m, n = a.shape
    b2 = b.reshape((1,) * (2 - b.ndim) + tuple(b.shape))
    rows = a.row_ids()  # M for padding
    cols = fit_ids(a.indices, n)  # an int64 id past 2**32 must not wrap
    # Read b at each entry's (row, column), an axis of size 1 at index 0, never
    # broadcasting b to [M, K]: a per-row scale of a [64, 10**9] CSR would be
    # a 256 GB temporary. Padding and malformed ids read the fill value 0.
    if b2.shape[0] == 1:
        rows = jnp.where(rows < m, 0, 1)
    if b2.shape[1] == 1:
        cols = jnp.where((cols >= 0) & (cols < n), 0, 1)
    vals = b2.at[rows, cols].get(mode="fill", fill_value=0, wrap_negative_indices=False)
    return CSR._make(a.data * vals, a.indices, a.indptr, a.shape)


def _csr_union_add(a: CSR, b: CSR) -> CSR:
    a, b = whole_csr(a), whole_csr(b)  # one sort over both operands' entries
    m, n = a.shape
    idt = index_dtype()
    nse = a.nse + b.nse
    dtype = jnp.result_type(a.data, b.data)
    rows = jnp.concatenate([a.row_ids(), b.row_ids()])
    cols = jnp.concatenate([a.indices, b.indices]).astype(idt)
    vals = jnp.concatenate([a.data.astype(dtype), b.data.astype(dtype)])
    if nse == 0:
        return CSR._make(vals, cols, jnp.zeros((m + 1,), idt), a.shape)
    pad = rows >= m
    rows = jnp.where(pad, m, rows)
    cols = jnp.where(pad, n, cols)
    iota = lax.iota(idt, nse)
    rows_s, cols_s, perm = lax.sort((rows, cols, iota), num_keys=2)
    _, starts_r = segments_of_sorted(rows_s)
    _, starts_c = segments_of_sorted(cols_s)
    starts = starts_r | starts_c
    seg = jnp.cumsum(starts.astype(idt)) - 1
    real = rows_s < m
    seg = jnp.where(real, seg, nse)
    out_vals = jax.ops.segment_sum(vals[perm], seg, num_segments=nse, indices_are_sorted=True)
    out_cols = jnp.full((nse,), n, idt).at[seg].set(cols_s, mode="drop")
    out_rows = jnp.full((nse,), m, idt).at[seg].set(rows_s, mode="drop")
    counts = jnp.zeros((m,), idt).at[out_rows].add(1, mode="drop")
    indptr = jnp.concatenate([jnp.zeros((1,), idt), jnp.cumsum(counts, dtype=idt)])
    return CSR._make(out_vals.astype(dtype), out_cols, indptr, a.shape)
