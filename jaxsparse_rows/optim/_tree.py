"""Helpers to walk gradient pytrees whose leaves may be RowSparse, and the
gather / compute / scatter kernel every lazy rule shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .._arraybase import SparseArray, check_unbatched
from .._config import log_inference
from .._limits import check_table_rows
from .._rowops import gather_rows, scatter_rows
from .._rowsparse import RowSparse, mask_padding
from .._storage import stype
from ._fused_rows import rule_rows

PARAMS_REQUIRED = (
    "{name} needs the current parameters: call `update(grads, state, params)` "
    "with `params` (got `params=None`)."
)


def weight_decay_needs_params(name: str, weight_decay: Any) -> ValueError:
    """The error of an update with weight decay but no ``params``. A traced
    ``weight_decay`` is most often the default 0.0 that
    ``optax.inject_hyperparams`` injected along with the learning rate, so the
    message says how to keep it static."""
    message = PARAMS_REQUIRED.format(name=name)
    if isinstance(weight_decay, jax.core.Tracer):
        message += (
            " `weight_decay` is traced here, so it may be non-zero; "
            "`optax.inject_hyperparams` injects it even when left at its default 0.0. "
            "If it stays 0, keep it static: "
            '`optax.inject_hyperparams(opt, static_args=("weight_decay",))`.'
        )
    return ValueError(message)


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


def is_rowsparse(x: Any) -> bool:
    """True for a :class:`~jaxsparse_rows.RowSparse` leaf."""
    return isinstance(x, RowSparse)


def _is_leaf(x: Any) -> bool:
    return x is None or isinstance(x, RowSparse)


def path_name(path: str) -> str:
    """``params['emb']``: how errors name a leaf (``path`` is a ``keystr``)."""
    return f"params{path}"


def short_tree(treedef: Any, limit: int = 240) -> str:
    """A pytree structure for an error message, cut in the middle when long."""
    text = str(treedef)
    return text if len(text) <= limit else f"{text[: limit - 60]} ... {text[-50:]}"


def flatten_like(treedef: Any, tree: Any, names: Sequence[str], hint: str = "") -> list:
    """``treedef.flatten_up_to(tree)``, or a ValueError naming both trees.

    ``names`` are the names of the tree ``treedef`` describes and of ``tree``.
    Only the structures are compared (a Python-level check made once, when
    the step is traced).
    """
    try:
        return treedef.flatten_up_to(tree)
    except (ValueError, TypeError):
        first, second = names
        other = jax.tree.structure(tree, is_leaf=_is_leaf)
        raise ValueError(
            f"`{first}` and `{second}` have different pytree structures: `{first}` is "
            f"{short_tree(treedef)} but `{second}` is {short_tree(other)}.{hint}"
        ) from None


_TREES_HINT = (
    " Gradients, optimizer state and parameters must all have the structure of the "
    "parameters given to `init`."
)


def map_updates(
    fn: Callable[..., tuple[Any, ...]],
    updates: Any,
    *others: Any,
    n_out: int,
    names: Sequence[str] = (),
) -> tuple[Any, ...]:
    """Maps ``fn(path, update_leaf, *other_leaves)`` over the leaves of ``updates``.

    RowSparse objects and ``None`` are leaves of ``updates``; every tree in
    ``others`` is flattened up to that structure (a ``None`` other tree gives
    ``None`` leaves), and a tree that does not fit raises a ValueError naming
    it and ``updates`` by ``names`` (the names of ``updates`` and of each of
    ``others``). ``fn`` returns an ``n_out``-tuple; the result is a tuple of
    ``n_out`` trees with the structure of ``updates``. ``None`` update leaves
    are not passed to ``fn``: they give ``None`` in the first output and the
    other trees' leaves unchanged in the rest (``None`` past the last of them).
    """
    is_leaf = lambda x: x is None or isinstance(x, SparseArray)  # noqa: E731
    flat, treedef = jax.tree_util.tree_flatten_with_path(updates, is_leaf=is_leaf)
    for path, leaf in flat:
        _check_update_leaf(jax.tree_util.keystr(path), leaf)
    names = tuple(names) or ("updates",)
    names += tuple(f"others[{i}]" for i in range(len(names) - 1, len(others)))
    flat_others = [
        [None] * len(flat) if o is None else flatten_like(treedef, o, (names[0], n), _TREES_HINT)
        for o, n in zip(others, names[1:], strict=False)
    ]
    outs = []
    for i, (path, leaf) in enumerate(flat):
        rest = [fo[i] for fo in flat_others]
        if leaf is None:
            outs.append((None, *(*rest, *[None] * n_out)[: n_out - 1]))
        else:
            outs.append(tuple(fn(jax.tree_util.keystr(path), leaf, *rest)))
    return tuple(treedef.unflatten([o[j] for o in outs]) for j in range(n_out))


def _check_update_leaf(path: str, leaf: Any) -> None:
    """Refuses RowSparse cotangents (float0 row ids) and CSR gradients."""
    if is_rowsparse(leaf) and leaf.indices.dtype == jax.dtypes.float0:
        raise TypeError(
            f"the gradient for `{path_name(path)}` is a "
            "RowSparse whose row ids are float0: it is the cotangent `jax.grad` / "
            "`jax.vjp` build for a RowSparse input, not a gradient. Differentiate "
            "with `jsr.grad` / `jsr.value_and_grad`, which return the row ids."
        )
    if isinstance(leaf, SparseArray) and not is_rowsparse(leaf):
        raise TypeError(
            f"the gradient for `{path_name(path)}` is a {type(leaf).__name__}; gradients "
            "and updates are dense arrays or RowSparse (parameters are dense)."
        )
    if is_rowsparse(leaf):
        check_unbatched(leaf, f"the update of `{path_name(path)}`")
        check_table_rows(leaf, path_name(path))


def check_inexact(path: str, grad: Any) -> None:
    """Refuses integer and bool gradients: the learning rate and the rules'
    arithmetic would be cast to their dtype (``0.5`` to ``0``, ``-0.5`` to ``True``)."""
    dtype = grad.dtype if is_rowsparse(grad) else jnp.result_type(grad)
    if dtype == jax.dtypes.float0:
        raise TypeError(
            f"the gradient for `{path_name(path)}` is float0: `jax.grad(..., allow_int=True)` "
            "gives it for an integer input, which has no gradient to apply. Give that leaf "
            "None in the gradients, or leave it out of the optimizer with `optax.masked` "
            "(or `jsr.optim.masked`)."
        )
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(
            f"the gradient for `{path_name(path)}` has dtype {dtype}, but gradients must be "
            "floating (or complex), like the parameters: the learning rate and the update "
            f"would be truncated to {dtype}. Cast the gradient to the parameter's dtype."
        )


RESTORE_HINT = (
    "A checkpoint restored without a target (orbax gives plain dicts and lists where the "
    "state had NamedTuples and tuples) has lost these types: restore with a target, "
    "`target = jax.eval_shape(opt.init, params)` then e.g. "
    "`ocp.StandardCheckpointer().restore(path, target)`, or rebuild the restored tree "
    "with `jsr.optim.restore_structure(target, restored)`."
)


def check_state(state: Any, cls: type, name: str) -> None:
    """Refuses a ``state`` that is not the ``cls`` that ``name``'s ``init`` returns."""
    if not isinstance(state, cls):
        got = type(state).__name__
        if type(state) is tuple:
            got = f"tuple ({', '.join(type(x).__name__ for x in state)})"
        if isinstance(state, dict) or type(state) is list:
            fields = ", ".join(map(str, state)) if isinstance(state, dict) else len(state)
            what = "keys" if isinstance(state, dict) else "items:"
            raise TypeError(
                f"`{name}.update` needs the {cls.__name__} its `init` returns as `state`, got "
                f"a {got} ({what} {fields}). {RESTORE_HINT}"
            )
        raise TypeError(
            f"`{name}.update` needs the {cls.__name__} its `init` returns as `state`, got a "
            f"{got}: was the state made by another optimizer, or for another part of a chain?"
        )


def check_state_shape(path: str, param: Any, state: Any, what: str, *, rows: bool = False) -> None:
    """Raises when a state array does not fit its parameter: shaped like it,
    or (``rows=True``) one entry per row, ``[V]`` for a ``[V, ...]`` parameter."""
    pshape = tuple(jnp.shape(param))
    want = pshape[:1] if rows else pshape
    got = tuple(jnp.shape(state))
    if got != want:
        expected = f" (expected {want})" if rows else ""
        raise ValueError(
            f"the parameter `{path_name(path)}` has shape {pshape}, but the {what} has shape "
            f"{got}{expected}. Pass the state that `init` returned for these parameters."
        )


def check_like(path: str, grad: Any, like: Any, what: str = "parameter") -> None:
    """Raises when the gradient leaf's (dense) shape differs from ``like``'s."""
    if like is None:
        return
    if what == "parameter" and isinstance(like, SparseArray):
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
    lazy_rows: Callable | None = None,
    fused: str | None = None,
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

    ``lazy_rows(g_rows, ids, states, param_rows) -> (update_rows, new_states)``,
    if given, replaces the lazy path's gather, ``rule``, masking and scatter
    with one function that does all of it (a fused kernel); it must give what
    they give.

    ``fused``, the rule's name in :data:`._fused_rows.RULES`, lets the lazy
    path run as one fused GPU kernel where :func:`._fused_rows.use_fused`
    says so (``rule`` must then be elementwise).
    """
    check_inexact(path, grad)
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
            if lazy_rows is not None:
                prow = None if param is None else gather_rows(param, idx, ids_sorted=True)
                upd, new_states = lazy_rows(grad.data, idx, list(states), prow)
                return RowSparse._make(upd, idx, grad.shape), tuple(new_states)
            out = None if fused is None else rule_rows(fused, rule, grad.data, idx, states, param)
            if out is not None:
                return RowSparse._make(out[0], idx, grad.shape), tuple(out[1])
            rows = [gather_rows(s, idx, ids_sorted=True) for s in states]
            prow = None if param is None else gather_rows(param, idx, ids_sorted=True)
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
