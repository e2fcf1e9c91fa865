"""Storage types: ``stype``, ``cast_storage``, ``zeros`` and the dense fallback."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._args import check_static_int, is_concrete
from ._arraybase import check_unbatched_args
from ._config import log_inference, warn_fallback
from ._csr import CSR, csr_row_ids, empty_csr, whole_csr
from ._dtypes import index_dtype
from ._limits import check_table_rows
from ._rowsparse import RowSparse, as_shape, empty_rowsparse

STYPES = ("default", "row_sparse", "csr")


def stype(x: Any) -> str:
    """The storage type of ``x``: ``"row_sparse"``, ``"csr"`` or ``"default"``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> jsr.stype(jnp.ones(3)), jsr.stype(jsr.zeros("csr", (2, 2)))
      ('default', 'csr')
    """
    return getattr(x, "stype", "default") if isinstance(x, RowSparse | CSR) else "default"


_stype_of = stype  # `cast_storage` and `zeros` take an argument named `stype`


def is_sparse(x: Any) -> bool:
    """True for RowSparse and CSR arrays.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> jsr.is_sparse(jsr.zeros("csr", (2, 3))), jsr.is_sparse(jnp.zeros((2, 3)))
      (True, False)
    """
    return isinstance(x, RowSparse | CSR)


def todense(x: Any) -> Any:
    """Dense form of a sparse array; dense input is returned unchanged.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> jsr.todense(jsr.RowSparse([[1., 2.]], [1], shape=(2, 2)))
      Array([[0., 0.],
             [1., 2.]], dtype=float32)
      >>> x = jnp.ones(2)
      >>> jsr.todense(x) is x
      True
    """
    return x.todense() if is_sparse(x) else x


def _check_stype(stype_: str) -> str:
    if stype_ not in STYPES:
        raise ValueError(f"`stype` must be one of {STYPES}, got {stype_!r}.")
    return stype_


def zeros(stype: str, shape: Sequence[int], dtype: Any = jnp.float32, *, capacity: int = 0) -> Any:
    """An all-zero array of the given storage type.

    Args:
      stype: ``"default"``, ``"row_sparse"`` or ``"csr"``.
      shape: the dense shape.
      dtype: the dtype of the values.
      capacity: row slots of a ``"row_sparse"`` result (all padding), e.g. the
        initial value of a ``lax.scan`` carry that :func:`jsr.add(..., capacity=k)
        <jaxsparse_rows.add>` keeps at ``k`` slots; entries of a ``"csr"`` one.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.zeros("row_sparse", (100, 8))
      RowSparse(float32[100, 8], rows=0)
      >>> jsr.zeros("row_sparse", (100, 8), capacity=4).capacity
      4
      >>> jsr.zeros("csr", (3, 4), dtype="float16")
      CSR(float16[3, 4], nnz=0)
    """
    stype = _check_stype(stype)
    capacity = check_static_int(capacity, "capacity")
    try:
        dtype = jnp.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"`dtype` must be a dtype (e.g. jnp.float32 or 'bfloat16'), got {dtype!r}."
        ) from None
    if stype == "row_sparse":
        out = empty_rowsparse(shape, dtype)
        return out.with_capacity(capacity) if capacity else out
    if stype == "csr":
        out = empty_csr(shape, dtype)
        if not capacity:
            return out
        pad = jnp.full((capacity,), out.shape[1], out.indices.dtype)  # padding column id
        return CSR._make(jnp.zeros((capacity,), out.dtype), pad, out.indptr, out.shape)
    if capacity:
        raise ValueError(f"`capacity` applies to sparse storage types, got stype {stype!r}.")
    return jnp.zeros(as_shape(shape, index_dims=0), jnp.dtype(dtype))


def _rowsparse_to_csr(x: RowSparse) -> CSR:
    if x.ndim != 2:
        raise ValueError(f"only 2-D row_sparse arrays convert to csr, got shape {x.shape}.")
    if is_concrete(x.data, x.indices):
        return CSR.fromdense(x.todense())
    # Under jit: keep every stored row entry (explicit zeros are valid CSR entries).
    n, d = x.shape
    k = x.capacity
    idt = index_dtype()
    real = x.indices < n
    counts = jnp.zeros((n,), idt).at[x.indices].add(jnp.full((k,), d, idt), mode="drop")
    indptr = jnp.concatenate([jnp.zeros((1,), idt), jnp.cumsum(counts, dtype=idt)])
    cols = jnp.where(real[:, None], jnp.arange(d, dtype=idt)[None, :], d).reshape(-1)
    return CSR._make(x.data.reshape(-1), cols, indptr, x.shape)


def _csr_to_rowsparse(x: CSR) -> RowSparse:
    if is_concrete(x.data, x.indices, x.indptr):
        return RowSparse.fromdense(x.todense())
    m, n = x.shape
    idt = index_dtype()
    if m == 0 or n == 0 or x.nse == 0:
        return RowSparse._make(jnp.zeros((0, n), x.dtype), jnp.zeros((0,), idt), x.shape)
    x = whole_csr(x)
    nonempty = jnp.diff(x.indptr) > 0
    (rows,) = jnp.nonzero(nonempty, size=min(m, x.nse), fill_value=m)
    rows = rows.astype(idt)
    dense_rows = jnp.zeros((rows.shape[0], n), x.dtype)
    slot = jnp.cumsum(nonempty.astype(idt)) - 1  # slot of every non-empty row
    entry_rows = csr_row_ids(x.indptr, x.nse)
    entry_slot = slot.at[entry_rows].get(mode="fill", fill_value=rows.shape[0])
    dense_rows = dense_rows.at[entry_slot, x.indices].add(x.data, mode="drop")
    return RowSparse._make(dense_rows, rows, x.shape)


def bool_via_int(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` on bool operands: runs it on int32 casts and returns ``!= 0`` as
    bool, dense or sparse like the result.

    numpy's sums of bools are logical or (``True + True`` is ``True``), while
    XLA's scatter-add and segment sums reject bool; a count of one or more
    is ``True``, which is the same thing.
    """

    def up(x: Any) -> Any:
        return x.astype(jnp.int32) if isinstance(x, RowSparse | CSR) else jnp.asarray(x, jnp.int32)

    out = fn(*(up(a) for a in args))
    if isinstance(out, RowSparse):
        return RowSparse._make(out.data != 0, out.indices, out.shape)
    if isinstance(out, CSR):
        return CSR._make(out.data != 0, out.indices, out.indptr, out.shape)
    return out != 0


def operand_dtype(x: Any) -> Any:
    """The dtype an operand takes part in promotion with (``x.data`` for sparse)."""
    if isinstance(x, RowSparse | CSR):
        return x.data
    return (
        x if hasattr(x, "dtype") or isinstance(x, int | float | complex | bool) else np.asarray(x)
    )


def cast_storage(x: Any, stype: str) -> Any:
    """Converts ``x`` to storage type ``stype`` (``"default"``, ``"row_sparse"``, ``"csr"``).

    Concrete input converts exactly (zero rows / entries are not stored). Under
    jit a dense array has no known sparsity, so converting it to a sparse type
    needs a capacity: use ``RowSparse.fromdense(x, max_rows=...)`` or
    ``CSR.fromdense(x, nse=...)``. Sparse-to-sparse conversion under jit keeps
    every stored entry.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> rsp = jsr.cast_storage(jnp.ones((2, 2)), "row_sparse")
      >>> rsp, jsr.cast_storage(rsp, "default")
      (RowSparse(float32[2, 2], rows=2), Array([[1., 1.],
             [1., 1.]], dtype=float32))
    """
    check_unbatched_args("cast_storage", x)
    stype = _check_stype(stype)
    src = _stype_of(x)
    log_inference("cast_storage", (src,), stype)
    if src == stype:
        return x
    if stype == "default":
        return x.todense()
    if src != "default" and x.dtype == jnp.bool_:
        return bool_via_int(lambda y: cast_storage(y, stype), x)
    if src == "default":
        x = jnp.asarray(x)
        check_table_rows(x, "x", axes=1 if stype == "row_sparse" else 2)
        if not is_concrete(x):
            target = (
                "RowSparse.fromdense(x, max_rows=...)"
                if stype == "row_sparse"
                else ("CSR.fromdense(x, nse=...)")
            )
            raise ValueError(
                f"cast_storage of a traced dense array to {stype!r} needs a static capacity; "
                f"use `jsr.{target}` inside jit."
            )
        return RowSparse.fromdense(x) if stype == "row_sparse" else CSR.fromdense(x)
    if stype == "csr":
        return _rowsparse_to_csr(x)
    return _csr_to_rowsparse(x)


def apply_dense(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs ``fn`` on densified inputs and returns its dense result.

    This is the storage fallback: every sparse positional argument is
    converted with ``todense()`` and a :class:`StorageFallbackWarning` naming
    ``fn`` is emitted (only when an input was sparse).

    Example:
      >>> import warnings, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(2, 2))
      >>> with warnings.catch_warnings(record=True) as w:
      ...     warnings.simplefilter("always")
      ...     out = jsr.apply_dense(jnp.exp, a)
      >>> out.shape, w[0].category.__name__
      ((2, 2), 'StorageFallbackWarning')
    """
    check_unbatched_args("apply_dense", *args, *kwargs.values())
    stypes = tuple(_stype_of(a) for a in args)
    if any(s != "default" for s in stypes):
        warn_fallback(getattr(fn, "__name__", repr(fn)), stypes)
    return fn(*(todense(a) for a in args), **kwargs)
