"""Reductions: ``sum``, ``square_sum`` and ``norm`` over sparse arrays, and
``sum_stacked`` over a batch of them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._args import capacity_check, check_flag, check_static_int
from ._arraybase import check_unbatched_args
from ._config import log_inference
from ._csr import CSR, whole_csr
from ._dtypes import accumulation_dtype
from ._elementwise import square
from ._rowops import coalesce_rows, scatter_rows_xla, sum_rows_xla, zeros_rows
from ._rowsparse import RowSparse
from ._storage import is_sparse, stype


def _check_axis(x: Any, axis: Any) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"`axis` must be None or an int, got {axis!r}.")
    axis = int(axis)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"`axis` {axis} is out of range for a {x.ndim}-D array.")
    return axis % x.ndim


def sum(x: Any, axis: int | None = None, keepdims: bool = False) -> jax.Array:  # noqa: A001
    """Sum of all entries, or along ``axis``; the result is dense.

    ``axis=0`` sums the stored rows (a ``[D1..Dn]`` result); other axes reduce
    the stored data and scatter it into the ``N`` rows.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.], [3., 4.]], [0, 2]), shape=(3, 2))
      >>> jsr.sum(a), jsr.sum(a, axis=0)
      (Array(10., dtype=float32), Array([4., 6.], dtype=float32))
      >>> jsr.sum(a, axis=1)
      Array([3., 0., 7.], dtype=float32)
    """
    check_unbatched_args("sum", x)
    keepdims = check_flag(keepdims, "keepdims")
    if not is_sparse(x):
        return jnp.sum(x, axis=axis, keepdims=keepdims)
    axis = _check_axis(x, axis)
    log_inference("sum", (stype(x),), "default")
    if axis is None:
        out = jnp.sum(x.data)
        return out.reshape((1,) * x.ndim) if keepdims else out
    if isinstance(x, RowSparse):
        if axis == 0:
            return jnp.sum(x.data, axis=0, keepdims=keepdims)
        reduced = jnp.sum(x.data, axis=axis, keepdims=keepdims)
        return scatter_rows_xla(zeros_rows(x.shape[0], reduced), x.indices, reduced, False)
    x = whole_csr(x)  # the entries' rows and columns place them
    dtype = jnp.sum(x.data[:0]).dtype  # jnp.sum's result dtype (int8 sums to int32)
    data = x.data.astype(accumulation_dtype(dtype))  # and its float32 sums of halves
    if axis == 0:
        out = sum_rows_xla(data, x.indices, x.shape[1]).astype(dtype)
        return out[None] if keepdims else out
    out = sum_rows_xla(data, x.row_ids(), x.shape[0], ids_sorted=True).astype(dtype)
    return out[:, None] if keepdims else out


def square_sum(x: Any, axis: int | None = 1, keepdims: bool = True) -> Any:
    """Sum of squares (MXNet's ``_square_sum``).

    For a row_sparse ``x`` and ``axis=1`` with ``keepdims=True`` the result is
    row_sparse with the same rows (shape ``[N, 1, D2..]``); otherwise dense.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.], [3., 4.]], [0, 2]), shape=(3, 2))
      >>> s = jsr.square_sum(a)
      >>> s, s.data
      (RowSparse(float32[3, 1], rows=2), Array([[ 5.],
             [25.]], dtype=float32))
    """
    check_unbatched_args("square_sum", x)
    keepdims = check_flag(keepdims, "keepdims")
    if isinstance(x, RowSparse) and axis is not None and _check_axis(x, axis) >= 1 and keepdims:
        axis = _check_axis(x, axis)
        log_inference("square_sum", ("row_sparse",), "row_sparse")
        data = jnp.sum(jnp.square(x.data), axis=axis, keepdims=True)
        shape = x.shape[:axis] + (1,) + x.shape[axis + 1 :]
        return RowSparse._make(data, x.indices, shape)
    if isinstance(x, RowSparse | CSR):
        return sum(square(x), axis=axis, keepdims=keepdims)
    return jnp.sum(jnp.square(x), axis=axis, keepdims=keepdims)


def norm(x: Any) -> jax.Array:
    """The Frobenius (L2) norm over all entries, padding excluded.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.norm(jsr.row_sparse_array(([[3., 4.]], [1]), shape=(5, 2)))
      Array(5., dtype=float32)
    """
    check_unbatched_args("norm", x)
    data = x.data if is_sparse(x) else jnp.asarray(x)
    # As jnp.linalg.norm: |x| for complex and a float result for integers
    # (and, as there, the squares of float16 values overflow past 256).
    return jnp.linalg.norm(data.reshape(-1))


def sum_stacked(x: RowSparse, *, capacity: int | None = None) -> RowSparse:
    """The sum of a batch of RowSparse arrays stacked by ``jax.vmap`` (per-example
    gradients): one RowSparse over the union of their rows, repeats summed.

    ``x`` is what ``jax.vmap`` returns for a function that returns a RowSparse:
    its ``data`` is ``[B.., k, D1..Dn]`` and its ``indices`` ``[B.., k]`` (any
    number of batch axes). No ``[V, ...]`` array is built.

    Args:
      x: a stacked RowSparse (an unstacked one is returned as it is).
      capacity: static row slots of the result; default ``B * k``, which cannot
        overflow. More distinct rows than ``capacity``: ``ValueError`` when
        concrete; under jit the largest row ids are left out, which
        ``checkify.checkify(f, errors=checkify.user_checks)`` reports.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> table = jnp.ones((10, 2))
      >>> def loss(rows, ids):
      ...     return jnp.sum(jsr.take(rows, ids) ** 2)
      >>> def per_example(ids):
      ...     return jsr.grad(loss)(jsr.pull_rows(table, ids), ids)
      >>> batch = jax.vmap(per_example)(jnp.array([[1, 3], [3, 7]]))
      >>> total = jsr.sum_stacked(batch)
      >>> total.indices[:3], total.data[:3]
      (Array([1, 3, 7], dtype=int32), Array([[2., 2.],
             [4., 4.],
             [2., 2.]], dtype=float32))
    """
    if not isinstance(x, RowSparse):
        raise TypeError(f"`x` must be a (stacked) RowSparse, got {type(x).__name__}.")
    ids = x.indices
    if getattr(ids, "ndim", 1) <= 1:
        return x if capacity is None else x.with_capacity(capacity)
    batch = tuple(ids.shape[:-1])
    flat_ids = ids.reshape(-1)
    flat_data = x.data.reshape((flat_ids.shape[0],) + tuple(x.shape[1:]))
    full = flat_ids.shape[0]
    cap = full if capacity is None else check_static_int(capacity, "capacity")
    idx, summed, count = coalesce_rows(flat_ids, flat_data, x.shape[0], cap)
    if cap < min(full, x.shape[0]):  # else it cannot overflow: no check emitted
        capacity_check(
            count <= cap,
            f"sum_stacked: the batch of {batch} arrays holds more distinct rows than "
            f"`capacity` = {cap}; rows would be left out. Raise `capacity`.",
        )
    return RowSparse._make(summed, idx, x.shape)
