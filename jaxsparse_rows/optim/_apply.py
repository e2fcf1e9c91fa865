"""Applying updates (some of them RowSparse) to dense parameters."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .._args import as_jax
from .._arraybase import SparseArray, check_unbatched
from .._limits import check_table_rows
from .._rowops import gather_rows, scatter_rows
from ._fused_rows import add_rows
from ._tree import check_like, flatten_like, is_rowsparse, path_name


def _check_update_dtype(path: str, param_dtype: Any, update_dtype: Any) -> None:
    """Refuses an update that the cast back to the parameter's dtype would
    corrupt: a floating (or complex) update of an integer or bool parameter
    (``1 + 0.7`` stays ``1``), or a complex update of a real parameter (its
    imaginary part would be dropped). Rounding a float32 update into a
    bfloat16 parameter (mixed precision) and integer updates of integer
    parameters are exact or intended, and pass."""
    if jnp.issubdtype(param_dtype, jnp.inexact):
        if jnp.issubdtype(param_dtype, jnp.complexfloating) or not jnp.issubdtype(
            update_dtype, jnp.complexfloating
        ):
            return
        lost = "its imaginary part would be dropped"
        fix = "Take the real part of the update (`jnp.real`), or make the parameter complex."
    elif jnp.issubdtype(update_dtype, jnp.inexact):
        lost = f"the update would be truncated to {jnp.dtype(param_dtype).name}"
        fix = (
            "Keep trainable parameters floating (e.g. `.astype(jnp.float32)`), or pass None "
            "as the update of a parameter that must not change."
        )
    else:
        return
    raise TypeError(
        f"the update for `{path_name(path)}` has dtype {jnp.dtype(update_dtype).name}, but the "
        f"parameter has dtype {jnp.dtype(param_dtype).name}: {lost} when the result is cast "
        f"back to the parameter's dtype. {fix}"
    )


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf; RowSparse updates are scatter-added.

    A RowSparse update adds its ``data`` into the listed rows of the dense
    parameter (``mode="drop"``, so padding slots are ignored), an O(k) write
    that XLA performs in place when ``params`` is donated. Dense updates are
    added as in ``optax.apply_updates``. The parameter dtype is preserved
    (a float32 update of a bfloat16 parameter is rounded into bfloat16) and
    ``None`` parameters stay ``None``. A ``None`` update, or a ``float0`` one
    (what ``jax.grad(..., allow_int=True)`` gives an integer input), leaves its
    parameter unchanged. For floating parameters ``optax.apply_updates`` gives
    the same result (through ``RowSparse.__radd__``); this version also checks
    structures, shapes and dtypes and names the offending parameter.

    Args:
      params: a pytree of dense arrays.
      updates: a pytree with the same structure; leaves dense, RowSparse,
        ``None`` or ``float0``.

    Returns:
      The updated parameters.

    Raises:
      ValueError: ``updates`` does not have the structure of ``params``, a
        leaf's shape differs from its parameter's, or the concrete row ids of
        a RowSparse update are out of ``[0, N]``, unsorted or repeated (what
        an optax transform that maps over every leaf makes of them; not
        checked under ``jax.jit``).
      TypeError: a parameter is a RowSparse; or an integer or bool parameter
        gets a floating (or complex) update, or a real parameter a complex
        one, which the cast back to the parameter's dtype would truncate
        (``optax.apply_updates`` does so silently: ``int32 1 + 0.7`` stays
        ``1``). Checked when traced, so under ``jax.jit`` too.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> u = jsr.RowSparse([[1., 2.]], [1], shape=(3, 2))
      >>> jsr.optim.apply_updates({"w": jnp.zeros((3, 2))}, {"w": u})["w"]
      Array([[0., 0.],
             [1., 2.],
             [0., 0.]], dtype=float32)
      >>> params = {"w": jnp.zeros(2), "step": jnp.array([3])}
      >>> jsr.optim.apply_updates(params, {"w": jnp.ones(2), "step": None})["step"]
      Array([3], dtype=int32)
      >>> jsr.optim.apply_updates(params, {"w": jnp.ones(2), "step": jnp.array([0.7])})
      Traceback (most recent call last):
        ...
      TypeError: the update for `params['step']` has dtype float32, but the parameter has ...
    """

    def leaf(path, p, u):
        if p is None:
            return None
        path = jax.tree_util.keystr(path)
        if u is None or getattr(u, "dtype", None) == jax.dtypes.float0:
            # Nothing to add. A RowSparse parameter is still refused, and a
            # float0 update must still have the parameter's shape.
            if u is not None or isinstance(p, SparseArray):
                check_like(path, u, p)
            return as_jax(p)
        if not isinstance(u, SparseArray):
            u = as_jax(u)
        check_like(path, u, p)
        p = as_jax(p)
        _check_update_dtype(path, p.dtype, u.dtype)
        if is_rowsparse(u):
            check_unbatched(u, f"the update of `{path_name(path)}`")
            check_table_rows(p, path_name(path))
            dtype = jnp.result_type(p, u.data)
            fused = add_rows(p, u.indices, u.data, dtype)  # one Pallas kernel on GPU
            if fused is not None:
                return fused
            if dtype == p.dtype:
                return scatter_rows(p, u.indices, u.data, add=True)
            rows = gather_rows(p, u.indices, ids_sorted=True).astype(dtype) + u.data.astype(dtype)
            return scatter_rows(p, u.indices, rows)
        return jnp.asarray(p + u).astype(p.dtype)

    # Sparse arrays are leaves, so a RowSparse in `params` reaches `check_like`
    # (and is refused) instead of being mapped over its data and row ids.
    is_leaf = lambda x: x is None or isinstance(x, SparseArray)  # noqa: E731
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_leaf)
    hint = " `updates` must have the structure of `params`."
    flat_u = flatten_like(treedef, updates, ("params", "updates"), hint)
    return treedef.unflatten([leaf(path, p, u) for (path, p), u in zip(flat, flat_u, strict=True)])
