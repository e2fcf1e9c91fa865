"""Pooled embedding lookups (``embedding_bag``): PyTorch's
``F.embedding_bag`` on fixed-length bags and TF's lookup combiners, built on
:func:`~jaxsparse_rows.take`, so that the gradient with respect to a
:func:`~jaxsparse_rows.pull_rows` view stays row-sparse."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ._args import is_concrete
from ._arraybase import check_unbatched_args
from ._csr import CSR
from ._limits import check_table_rows
from ._rows import as_ids, check_id_range, take
from ._rowsparse import RowSparse

MODES = ("sum", "mean", "sqrtn", "max")


def embedding_bag(
    table: Any,
    ids: ArrayLike,
    *,
    mode: str = "mean",
    weights: ArrayLike | None = None,
    padding_id: int | None = None,
) -> jax.Array:
    """Looks up the rows of ``table`` that each bag of ``ids`` names and pools them.

    A bag is the last axis of ``ids``: ``ids`` ``[..., L]`` gives a result
    ``[..., D1..Dn]`` for a table ``[V, D1..Dn]``. Ids equal to ``V`` (the
    padding id of ``pull_rows`` and of padded CSR batches) or to
    ``padding_id`` are skipped: they are not looked up, add nothing and are
    not counted. Other ids outside ``[0, V)`` raise ``ValueError`` when
    concrete and are skipped under ``jit``. Pooling, per bag, over the kept ids ``i``
    with weights ``w_i`` (1 without ``weights``):

    * ``"sum"``: ``sum_i w_i * table[i]``;
    * ``"mean"``: ``sum_i w_i * table[i] / sum_i w_i`` (PyTorch's mean, TF's
      ``"mean"`` combiner with weights);
    * ``"sqrtn"``: ``sum_i w_i * table[i] / sqrt(sum_i w_i**2)`` (TF's combiner);
    * ``"max"``: elementwise max over the kept rows (no ``weights``); on a
      tie the gradient goes to the first of the tied ids, as in PyTorch.

    A bag with nothing kept (or zero total weight) pools to zeros, as in PyTorch.

    ``table`` may be dense or a RowSparse view from :func:`pull_rows`; with a
    view, differentiate with :func:`jsr.value_and_grad
    <jaxsparse_rows.value_and_grad>` for a row-sparse gradient. Build the view
    without the padding row (``pull_rows`` ignores the id ``V``; for another
    ``padding_id`` pull ``jnp.where(ids == padding_id, V, ids)``): a row the
    view lists is touched by the lazy optimizers even when its gradient is 0.

    Args:
      table: dense ``[V, D1..Dn]`` array or a RowSparse of that shape.
      ids: integer ids ``[..., L]``: one bag per index of the leading axes.
      mode: ``"sum"``, ``"mean"`` (default, as PyTorch), ``"sqrtn"`` or ``"max"``.
      weights: per-id weights shaped like ``ids`` (PyTorch's
        ``per_sample_weights``), for every mode but ``"max"``.
      padding_id: an id to skip (PyTorch's ``padding_idx``), besides the
        out-of-range ids.

    Returns:
      The pooled rows, ``[*ids.shape[:-1], D1..Dn]``, in ``table``'s (floating)
      dtype; ``weights`` are cast to it.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> table = jnp.arange(8.).reshape(4, 2)
      >>> ids = jnp.array([[1, 3, 4], [2, 4, 4]])  # 4 == V: padding
      >>> jsr.embedding_bag(table, ids, mode="mean")
      Array([[4., 5.],
             [4., 5.]], dtype=float32)
      >>> jsr.embedding_bag(table, ids, mode="sum", weights=jnp.array([[1., .5, 9.], [2., 0., 0.]]))
      Array([[ 5. ,  6.5],
             [ 8. , 10. ]], dtype=float32)
    """
    check_unbatched_args("embedding_bag", table)
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    ids = as_ids(ids)  # widened: `ids < n` below cannot wrap n
    if ids.ndim == 0:
        raise ValueError("`ids` must have at least one axis (the bag axis, last), got a scalar.")
    if isinstance(table, CSR):
        raise TypeError(
            "`table` must be a dense array or a RowSparse (rows first), got a CSR; an "
            "embedding table is dense (or a view from `pull_rows`): pass `table.todense()`."
        )
    if not isinstance(table, RowSparse):
        table = jnp.asarray(table)
        if table.ndim == 0:
            raise ValueError("`table` must be at least 1-D (rows first), got a scalar.")
        check_table_rows(table, "table")
    if not jnp.issubdtype(table.dtype, jnp.inexact):
        raise TypeError(
            f"`table` must have a floating dtype (as PyTorch's embedding_bag), got "
            f"{jnp.dtype(table.dtype).name}; cast it with `.astype`."
        )
    n = table.shape[0]
    keep = (ids >= 0) & (ids < n)
    if padding_id is not None:
        number = isinstance(padding_id, int | float | np.integer | np.floating)
        if isinstance(padding_id, bool) or not number or not float(padding_id).is_integer():
            raise TypeError(f"`padding_id` must be a Python int, got {padding_id!r}.")
        padding_id = int(padding_id)
        info = np.iinfo(ids.dtype)
        if info.min <= padding_id <= info.max:
            keep = keep & (ids != padding_id)
        else:  # no id of this dtype can equal it (and comparing would overflow)
            padding_id = None
    if is_concrete(ids):
        host = np.asarray(ids)
        if padding_id is not None:
            host = np.where(host == padding_id, n, host)
        check_id_range(host, n, "ids")
    # Skipped ids become V: not looked up, so they get no gradient entry.
    rows = take(table, jnp.where(keep, ids, n))  # [..., L, D1..Dn]
    row_axes = (1,) * (rows.ndim - ids.ndim)
    dtype = rows.dtype
    if mode == "max":
        if weights is not None:
            raise ValueError('`weights` are not defined for mode="max"; pass weights=None.')
        lowest = jnp.array(-jnp.inf, dtype)  # tables are floating (checked above)
        masked = jnp.where(keep.reshape(keep.shape + row_axes), rows, lowest)
        # The row holding each maximum, then a gather: on ties the whole
        # gradient goes to the first such id, as in PyTorch (`jnp.max` would
        # split it evenly). Values equal `jnp.max`'s, NaN included.
        bag = ids.ndim - 1
        if ids.shape[-1]:
            # First kept slot holding the maximum (or a NaN): a skipped slot's
            # -inf must not win a tie with kept rows that hold -inf.
            kept = keep.reshape(keep.shape + row_axes)
            top = jnp.max(masked, axis=bag, keepdims=True)
            holds = kept & ((masked == top) | jnp.isnan(masked))
            first = jnp.argmax(holds, axis=bag, keepdims=True)
            pooled = jnp.take_along_axis(masked, first, axis=bag).squeeze(bag)
        else:  # bags of length 0 (argmax needs an element); zeroed below
            pooled = jnp.full(rows.shape[:bag] + rows.shape[bag + 1 :], lowest)
        any_kept = jnp.any(keep, axis=-1)
        return jnp.where(any_kept.reshape(any_kept.shape + row_axes), pooled, jnp.zeros((), dtype))
    if weights is None:
        w = keep.astype(dtype)
    else:
        weights = jnp.asarray(weights)
        if weights.shape != ids.shape:
            raise ValueError(
                f"`weights` must have the shape of `ids` {tuple(ids.shape)}, got "
                f"{tuple(weights.shape)}."
            )
        if jnp.iscomplexobj(weights) and not jnp.iscomplexobj(rows):
            raise TypeError(
                f"`weights` are complex ({weights.dtype}) but the table is real ({dtype}): "
                "the imaginary parts would be dropped."
            )
        w = jnp.where(keep, weights, 0).astype(dtype)
    total = jnp.sum(rows * w.reshape(w.shape + row_axes), axis=ids.ndim - 1)
    if mode == "sum":
        return total
    norm = jnp.sum(w, axis=-1) if mode == "mean" else jnp.sum(w * w, axis=-1)
    norm = norm.reshape(norm.shape + row_axes)
    empty = norm == 0  # nothing kept, or zero total weight: zeros, as PyTorch
    safe = jnp.where(empty, jnp.ones((), dtype), norm)
    if mode == "sqrtn":
        safe = jnp.sqrt(safe)  # sqrt only of non-zero values: no NaN gradient at 0
    return jnp.where(empty, jnp.zeros((), dtype), total / safe)
