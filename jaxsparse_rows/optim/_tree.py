"""Helpers to walk gradient pytrees whose leaves may be RowSparse, and the
gather / compute / scatter kernel every lazy rule shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._config import log_inference
from .._operators import SparseOperators
from .._row_moves import gather_sorted_rows, scatter_sorted_rows
from .._rowsparse import RowSparse, mask_padding
from .._storage import stype

PARAMS_REQUIRED = (
    "{name} needs the current parameters: call `update(grads, state, params)` "
    "with `params` (got `params=None`)."
)


def known_zero(x: Any) -> bool:
    """True when a hyperparameter is ``None`` or known now to be 0.

    Hyperparameters injected by ``optax.inject_hyperparams`` are arrays, traced
    under ``jit``: rules branch on this (to skip a term) instead of on
    ``x != 0``, and a traced value takes the general path.
    """
    return x is None or (not isinstance(x, jax.core.Tracer) and float(x) == 0.0)


def known_one(x: Any) -> bool:
    """True when a factor is known now to be 1 (see :func:`known_zero`)."""
    return not isinstance(x, jax.core.Tracer) and float(x) == 1.0


def abs_sq(g: jax.Array) -> jax.Array:
    """``|g|**2`` elementwise (``g * conj(g)`` for complex ``g``, as optax)."""
    if jnp.iscomplexobj(g):
        return (g * jnp.conj(g)).real.astype(g.dtype)
    return jnp.square(g)


def check_clip(clip_gradient: Any) -> None:
    """``clip_gradient`` must be None (off) or positive; MXNet's ``-1`` (off)
    would clip every element to ``[1, -1]``, i.e. to ``-1``."""
    if clip_gradient is None or isinstance(clip_gradient, jax.core.Tracer):
        return
    if not float(clip_gradient) > 0:
        raise ValueError(
            f"`clip_gradient` must be > 0, or None to turn clipping off, got {clip_gradient!r} "
            "(MXNet's `clip_gradient=-1` means off: pass None)."
        )


def is_rowsparse(x: Any) -> bool:
    """True for a :class:`~jaxsparse_rows.RowSparse` leaf."""
    return isinstance(x, RowSparse)


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, RowSparse)


def path_name(path: str) -> str:
    """``params['emb']``: how errors name a leaf (``path`` is a ``keystr``)."""
    return f"params{path}"


def map_updates(
    fn: Callable[..., tuple[Any, ...]],
    updates: Any,
    *others: Any,
    n_out: int,
) -> tuple[Any, ...]:
    """Maps ``fn(path, update_leaf, *other_leaves)`` over the leaves of ``updates``.

    RowSparse objects and ``None`` are leaves of ``updates``; every tree in
    ``others`` is flattened up to that structure (a ``None`` other tree gives
    ``None`` leaves). ``fn`` returns an ``n_out``-tuple; the result is a tuple of
    ``n_out`` trees with the structure of ``updates``. ``None`` update leaves
    are not passed to ``fn``: they give ``None`` in the first output and the
    other trees' leaves unchanged in the rest.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(updates, is_leaf=_is_leaf)
    for path, leaf in flat:
        if is_rowsparse(leaf) and leaf.indices.dtype == jax.dtypes.float0:
            raise TypeError(
                f"the gradient for `{path_name(jax.tree_util.keystr(path))}` is a "
                "RowSparse whose row ids are float0: it is the cotangent `jax.grad` / "
                "`jax.vjp` build for a RowSparse input, not a gradient. Differentiate "
                "with `jsr.grad` / `jsr.value_and_grad`, which return the row ids."
            )
    flat_others = [[None] * len(flat) if o is None else treedef.flatten_up_to(o) for o in others]
    outs = []
    for i, (path, leaf) in enumerate(flat):
        rest = [fo[i] for fo in flat_others]
        if leaf is None:
            outs.append((None, *rest[: n_out - 1]))
        else:
            outs.append(tuple(fn(jax.tree_util.keystr(path), leaf, *rest)))
    return tuple(treedef.unflatten([o[j] for o in outs]) for j in range(n_out))


def check_like(path: str, grad: Any, like: Any, what: str = "parameter") -> None:
    """Raises when the gradient leaf's (dense) shape differs from ``like``'s."""
    if like is None:
        return
    if what == "parameter" and isinstance(like, SparseOperators):
        raise TypeError(
            f"`{path_name(path)}` is a {type(like).__name__}, but parameters are dense "
            "arrays: only gradients and updates are RowSparse. A RowSparse parameter "
            "usually means the updates were applied to a `pull_rows` view: write "
            "`apply_updates(params, updates)` with the dense parameters, not the view."
        )
    gshape = tuple(grad.shape)
    lshape = tuple(jnp.shape(like))
    if gshape != lshape:
        kind = "a RowSparse gradient" if is_rowsparse(grad) else "a dense gradient"
        raise ValueError(
            f"the gradient for `{path_name(path)}` is {kind} of shape {gshape}, but the "
            f"{what} has shape {lshape}. Gradients must have exactly the shape of their "
            "parameter (check which gradient leaf goes with which parameter)."
        )


def check_dense_params(params: Any, name: str) -> None:
    """``init`` takes dense parameters: RowSparse parameters are rejected."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_leaf)[0]:
        if is_rowsparse(leaf):
            raise TypeError(
                f"`{name}.init` got a RowSparse parameter at "
                f"`{path_name(jax.tree_util.keystr(path))}`. Parameters (and therefore "
                "optimizer state) are dense arrays; only gradients and updates are "
                "RowSparse. Pass `params` densified (`x.todense()`)."
            )


# Rows of a dense array at sorted RowSparse indices (padding ids read zero rows),
# and writing them back (set, or add with ``add=True``; padding ids dropped).
gather_rows = gather_sorted_rows
scatter_rows = scatter_sorted_rows


# Zeros the padding slots of update data so updates keep the RowSparse invariant.
mask_rows = mask_padding


Rule = Callable[[jax.Array, Sequence[jax.Array], Any], tuple[jax.Array, Sequence[jax.Array]]]


def apply_rule(
    path: str,
    grad: Any,
    states: Sequence[jax.Array],
    param: Any,
    rule: Rule,
    *,
    lazy: bool,
    check_states: bool = True,
) -> tuple[Any, tuple[jax.Array, ...]]:
    """Applies an elementwise (or row-wise) update ``rule`` to one leaf.

    ``rule(g, state_rows, param_rows) -> (update, new_state_rows)`` is written
    once for dense arrays and used on ``[k, ...]`` row blocks. A RowSparse
    ``grad`` with ``lazy=True`` gathers the listed rows of every state array
    (and of ``param`` when given), runs ``rule`` on them and scatters the new
    rows back: O(k) rows of work, the state arrays updated in place under jit
    with donation. Otherwise the gradient is densified and ``rule`` runs on
    whole arrays. State dtypes are preserved. Shapes are checked against
    ``param`` and (with ``check_states``) against each state array.
    """
    check_like(path, grad, param)
    if check_states:
        for s in states:
            check_like(path, grad, s, "optimizer state (shaped like the parameter)")
    # Verbose mode says, once per trace, which update each parameter got: a
    # dense gradient for a table is the usual sign of a missing pull_rows view.
    kind = "lazy" if is_rowsparse(grad) and lazy else "dense"
    out = "row_sparse" if kind == "lazy" else "default"
    log_inference(f"{kind} update {path_name(path)}", (stype(grad),), out)
    if is_rowsparse(grad):
        if lazy:
            idx = grad.indices
            rows = [gather_rows(s, idx) for s in states]
            prow = None if param is None else gather_rows(param, idx)
            upd, new_rows = rule(grad.data, rows, prow)
            upd = mask_rows(upd, idx, grad.shape[0])
            pairs = zip(states, new_rows, strict=True)
            new_states = tuple(scatter_rows(s, idx, r) for s, r in pairs)
            return RowSparse._make(upd, idx, grad.shape), new_states
        grad = grad.todense()
    grad = jnp.asarray(grad)
    upd, new = rule(grad, list(states), param)
    return upd, tuple(n.astype(s.dtype) for s, n in zip(states, new, strict=True))


def zeros_like_params(params: Any, dtype: Any = None, fill: float = 0.0) -> Any:
    """Dense state arrays shaped like each (dense) parameter leaf, and sharded
    like it where it carries a sharding (as ``optax``'s ``zeros_like``)."""
    return jax.tree.map(
        lambda p: None if p is None else jnp.full_like(p, fill, dtype or jnp.result_type(p)),
        params,
        is_leaf=lambda x: x is None,
    )
