"""The base class of the library's sparse arrays (``RowSparse`` and ``CSR``),
and the helpers both use for their leaves: reprs, batch and unflatten checks.

``isinstance(x, SparseArray)`` is how the library tells its sparse arrays
from everything else. The class holds no behaviour of its own: the Python
operators and the methods that compute with the library's ops (``x + y``,
``x @ y``, ``x.sum()``, ``x.tostype(...)``) are attached by ``_methods``,
which sits above the ops, so the array types import nothing above them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._invariants import refuse_invalid


class SparseArray:
    """Base class of :class:`~jaxsparse_rows.RowSparse` and
    :class:`~jaxsparse_rows.CSR`."""

    __slots__ = ()


# Flags for a scatter at the indices of a RowSparse: they are sorted, and
# unique apart from padding ids (== N), which ``mode="drop"`` skips, so no two
# writes ever land on one row. On GPU XLA may then store without atomics; on
# CPU an A/B run of AdaGrad steps was about 7% faster with them.
ROWSPARSE_INDEXING = {"indices_are_sorted": True, "unique_indices": True}


def shape_str(dtype: Any, shape: tuple[int, ...]) -> str:
    """``float32[6, 2]``: the compact shape notation used by reprs and errors."""
    return f"{jnp.dtype(dtype).name}[{', '.join(str(int(d)) for d in shape)}]"


def stacked_repr(cls_name: str, shape: tuple[int, ...], leaves: dict[str, Any]) -> str | None:
    """The repr of a sparse array whose leaves are not one array's: stacked by
    ``jax.vmap`` (ids with leading batch axes) or replaced by ``tree.map``
    (``jnp.shape``, ``None``); ``None`` for an ordinary one."""
    ids = list(leaves.values())[-1]
    if not all(hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves.values()):
        parts = ", ".join(f"{k}={v!r}" for k, v in leaves.items())
        return f"{cls_name}(shape={tuple(shape)}, {parts})"
    ndim = len(ids.shape)  # (placeholders such as flax's ArrayRepr have no ndim)
    if ndim == 1:
        return None
    data = leaves["data"]
    head = shape_str(data.dtype, shape)
    if ndim > 1:
        slots = list(leaves.values())[1].shape[-1]
        size = "capacity" if cls_name == "RowSparse" else "nse"
        return f"{cls_name}({head}, batch={tuple(ids.shape[:-1])}, {size}={slots})"
    parts = ", ".join(f"{k}={shape_str(v.dtype, v.shape)}" for k, v in leaves.items())
    return f"{cls_name}({head}, {parts})"


def check_unflattened_ids(cls_name: str, data: Any, **children: Any) -> None:
    """Refuses index children that a ``tree_map`` over a sparse array's leaves
    has turned into something other than row ids, instead of building an array
    whose ids are wrong:

    * floats of the same shape: ``optax.scale`` multiplies every leaf, row ids
      included; a whole-tree cast converts them;
    * 0-d numbers beside 0-d ``data``: a reduction of every leaf
      (``optax.tree.norm``, ``optax.global_norm``,
      ``optax.clip_by_global_norm``, ``jax.tree.map(jnp.sum, x)``) has reduced
      the row ids too, and a sum over the leaves would count them as values.
      (0-d ids beside rows of ``data`` are ``jax.vmap`` over the rows, which
      the ops refuse by name.)

    Everything else passes: integer ids, leaves without a dtype
    (``jax.tree.map(jnp.shape, x)``, vmap axis specs), ``float0`` tangents of
    integer leaves and bool leaves (``jax.tree.map(jnp.isfinite, x)``,
    ``optax.zero_nans``'s flags, ``optax.tree.allclose``).
    """
    for name, child in children.items():
        dtype = getattr(child, "dtype", None)
        if dtype is None:
            continue
        kind = getattr(dtype, "kind", "i")
        if getattr(child, "ndim", None) == 0 and getattr(data, "ndim", 0) == 0 and kind != "b":
            if isinstance(child, jax.Array | np.ndarray) and dtype != jax.dtypes.float0:
                raise TypeError(
                    f"{cls_name} `{name}` must stay an index array, got a 0-d "
                    f"{jnp.dtype(dtype).name}: a function reduced every leaf of a "
                    f"{cls_name}, its indices included (e.g. `optax.tree.norm`, "
                    "`optax.global_norm`, `optax.clip_by_global_norm`, or "
                    "`jax.tree.map(jnp.sum, ...)`), so a sum over the leaves would count "
                    "them as values. Use `jsr.optim.global_norm` and "
                    "`jsr.optim.clip_by_global_norm`, or map with `is_leaf=jsr.is_sparse` "
                    "and reduce `.data`."
                )
        if kind in "iub":
            continue  # the common case, decided cheaply: this runs at every unflatten
        if dtype == jax.dtypes.float0 or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        raise TypeError(
            f"{cls_name} `{name}` must stay integer, got {jnp.dtype(dtype).name}: a "
            f"function mapped over every leaf of a {cls_name} (e.g. an optax transform "
            "such as `optax.scale` or `optax.clip`, or a dtype cast of a whole pytree) "
            "changed its row ids. Map over `.data` only (`jsr.optim.lift_elementwise`, "
            "`jsr.optim.scale_by_learning_rate`), or skip sparse leaves with "
            "`is_leaf=jsr.is_sparse`."
        )


def check_unbatched_args(what: str, *args: Any) -> None:
    """:func:`check_unbatched` for every sparse array among ``args``."""
    for a in args:
        if getattr(a, "stype", "default") != "default":
            check_unbatched(a, what)


def check_unbatched(x: Any, what: str) -> None:
    """Refuses a sparse array whose leaves ``jax.vmap`` stacked (its ids have
    leading batch axes) where ``what`` needs one array, and a concrete
    RowSparse that breaks its invariant (see ``_invariants``)."""
    ids = x.indptr if hasattr(x, "indptr") else x.indices
    if getattr(ids, "ndim", 1) == 0:
        raise ValueError(
            f"{what} needs one {type(x).__name__}, got one whose row ids are a scalar: "
            "jax.vmap over the rows of a RowSparse (axis 0 of its `data` and `indices`) "
            "would break its sorted-unique invariant. Map over a dense array instead, e.g. "
            "`jax.vmap(f)(x.todense())`, or over rows looked up with `jsr.take`."
        )
    if getattr(ids, "ndim", 1) != 1:
        name = type(x).__name__
        raise ValueError(
            f"{what} needs one {name}, got a batch of shape {tuple(ids.shape[:-1])} (leaves "
            f"stacked by jax.vmap: {repr(x)}). Map over the batch with jax.vmap, e.g. "
            f"`jax.vmap(jsr.todense)(x)`, pick one with `jax.tree.map(lambda a: a[i], x)`, or "
            "sum them into one RowSparse (per-example gradients) with `jsr.sum_stacked(x)`."
        )
    if getattr(x, "stype", None) == "row_sparse":
        refuse_invalid(x, what if what.startswith("the ") else f"the RowSparse given to {what}")


def broadcast_row_mask(mask: jax.Array, ndim: int) -> jax.Array:
    """Reshapes a ``[k]`` mask so it broadcasts against ``[k, D1..Dn]`` data
    (a ``[S.., k]`` mask of leaves stacked by ``jax.vmap`` against
    ``[S.., k, D1..Dn]``)."""
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))
