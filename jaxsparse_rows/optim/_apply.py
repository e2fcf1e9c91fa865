"""Applying updates (some of them RowSparse) to dense parameters."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._operators import SparseOperators
from ._tree import check_like, flatten_like, gather_rows, is_rowsparse, scatter_rows


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf; RowSparse updates are scatter-added.

    A RowSparse update adds its ``data`` into the listed rows of the dense
    parameter (``mode="drop"``, so padding slots are ignored), an O(k) write
    that XLA performs in place when ``params`` is donated. Dense updates are
    added as in ``optax.apply_updates``. The parameter dtype is preserved and
    ``None`` parameters stay ``None``. ``optax.apply_updates`` gives the same
    result (through ``RowSparse.__radd__``); this version also checks
    structures and shapes and names the offending parameter.

    Args:
      params: a pytree of dense arrays.
      updates: a pytree with the same structure; leaves dense or RowSparse.

    Returns:
      The updated parameters.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> u = jsr.RowSparse([[1., 2.]], [1], shape=(3, 2))
      >>> jsr.optim.apply_updates({"w": jnp.zeros((3, 2))}, {"w": u})["w"]
      Array([[0., 0.],
             [1., 2.],
             [0., 0.]], dtype=float32)
    """

    def leaf(path, p, u):
        if p is None:
            return None
        path = jax.tree_util.keystr(path)
        check_like(path, u, p)
        p = jnp.asarray(p)
        if is_rowsparse(u):
            dtype = jnp.result_type(p, u.data)
            if dtype == p.dtype:
                return scatter_rows(p, u.indices, u.data, add=True)
            rows = gather_rows(p, u.indices).astype(dtype) + u.data.astype(dtype)
            return scatter_rows(p, u.indices, rows)
        return jnp.asarray(p + u).astype(p.dtype)

    # Sparse arrays are leaves, so a RowSparse in `params` reaches `check_like`
    # (and is refused) instead of being mapped over its data and row ids.
    is_leaf = lambda x: x is None or isinstance(x, SparseOperators)  # noqa: E731
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_leaf)
    hint = " `updates` must have the structure of `params`."
    flat_u = flatten_like(treedef, updates, ("params", "updates"), hint)
    return treedef.unflatten([leaf(path, p, u) for (path, p), u in zip(flat, flat_u, strict=True)])
