"""Exact lazy SGD: momentum and weight decay of skipped steps replayed in
closed form when a row is touched again, :func:`catch_up` to bring the rows a
batch reads up to date before its forward pass, and :func:`flush` to bring
every row up to date.

With a zero gradient one SGD step is linear in ``(w_r, m_r)``::

    [w', m'] = A @ [w, m]
    A = [[1 - lr*wd, -lr*mu], [wd, mu]]                        (heavy ball)
    A = [[1 - lr*wd*(1 + mu), -lr*mu**2], [wd, mu]]             (Nesterov)

so ``s`` skipped steps are ``A**s``. ``A**(2**j)`` are constants computed
once (float64, at trace time); each touched row multiplies those selected by
the bits of its own ``s``: O(31) scalar work per row plus O(D) to apply.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._limits import check_table_rows
from .._rowops import gather_rows, scatter_rows, unique_rows
from .._rows import as_ids, check_id_range
from .._rowsparse import RowSparse
from ._hparams import check_sgd_hparams
from ._tree import (
    PARAMS_REQUIRED,
    check_dense_params,
    check_inexact,
    check_like,
    check_state,
    check_state_shape,
    flatten_like,
    is_rowsparse,
    known_one,
    map_updates,
    mask_rows,
    short_tree,
    zeros_like_params,
)

_BITS = 31  # counts are int32
_TRACE = "optimizer state (shaped like the parameter)"
_LAST = "optimizer state's per-row step counter `last_step`"


class StaticHparams(tuple):
    """A tuple of Python numbers that is a pytree node without leaves, so the
    hyperparameters travel with the state through ``jit`` as static data:
    ``(learning_rate, momentum, nesterov, weight_decay)``."""

    __slots__ = ()

    def __repr__(self) -> str:
        names = ("learning_rate", "momentum", "nesterov", "weight_decay")
        return (
            "StaticHparams("
            + ", ".join(f"{n}={v!r}" for n, v in zip(names, self, strict=True))
            + ")"
        )


jax.tree_util.register_pytree_node(
    StaticHparams, lambda h: ((), tuple(h)), lambda aux, _: StaticHparams(aux)
)


class ExactLazySgdState(NamedTuple):
    """State of ``lazy_sgd(..., lazy="exact")``.

    A NamedTuple like every other state here, so ``optax.tree_utils.tree_get``
    finds its fields by name.

    Attributes:
      count: the global step count (``int32``). It stops at ``2**31 - 1``
        (``optax.safe_increment``); a later step is owed only by the rows it
        lists, so :func:`flush` and :func:`catch_up` replay the steps counted
        before the limit and none after it.
      trace: momentum buffers shaped like the parameters (``None`` leaves when
        ``momentum == 0``).
      last_step: per-row step number up to which each row is current (``[V]``
        ``int32`` per parameter, never above ``count``).
      hparams: static ``(learning_rate, momentum, nesterov, weight_decay)``
        (a tuple that is not a pytree leaf), used by :func:`flush`.
    """

    count: jax.Array
    trace: Any
    last_step: Any
    hparams: StaticHparams


@functools.lru_cache(maxsize=64)
def _powers(lr: float, mu: float, nesterov: bool, wd: float) -> np.ndarray:
    """``A**(2**j)`` for ``j < 31`` as a ``[31, 2, 2]`` float64 array."""
    if nesterov:
        a = np.array([[1 - lr * wd * (1 + mu), -lr * mu * mu], [wd, mu]], np.float64)
    else:
        a = np.array([[1 - lr * wd, -lr * mu], [wd, mu]], np.float64)
    out = np.empty((_BITS, 2, 2), np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for j in range(_BITS):
            out[j] = a
            a = a @ a
    return out


def _catch_up(w, m, skipped, powers, dtype):
    """Applies ``A**skipped`` (per row) to rows ``w`` (and momentum ``m``)."""
    table = jnp.asarray(powers.reshape(_BITS, 4), dtype)

    def body(j, r):
        r00, r01, r10, r11 = r
        p00, p01, p10, p11 = table[j, 0], table[j, 1], table[j, 2], table[j, 3]
        bit = ((skipped >> j) & 1).astype(bool)
        n = (
            r00 * p00 + r01 * p10,
            r00 * p01 + r01 * p11,
            r10 * p00 + r11 * p10,
            r10 * p01 + r11 * p11,
        )
        return tuple(jnp.where(bit, a, b) for a, b in zip(n, r, strict=True))

    one = jnp.ones(skipped.shape, dtype)
    zero = jnp.zeros(skipped.shape, dtype)
    r00, r01, r10, r11 = jax.lax.fori_loop(0, _BITS, body, (one, zero, zero, one))
    shape = skipped.shape + (1,) * (w.ndim - skipped.ndim)
    r00, r01, r10, r11 = (x.reshape(shape) for x in (r00, r01, r10, r11))
    if m is None:
        return r00 * w, None
    return r00 * w + r01 * m, r10 * w + r11 * m


def _compute_dtype(*xs: Any) -> Any:
    """The dtype the rule computes in: the widest of the parameter, gradient
    and momentum (float32 momentum of bfloat16 parameters stays float32)."""
    return jnp.result_type(*(x for x in xs if x is not None))


@functools.partial(jax.jit, static_argnames=("hparams",))
def _flush_leaf(p, m, last, t, hparams):
    dt = _compute_dtype(p, m)
    w, m2 = _catch_up(
        p.astype(dt), None if m is None else m.astype(dt), t - last, _powers(*hparams), dt
    )
    m2 = None if m is None else m2.astype(m.dtype)
    return w.astype(p.dtype), m2, jnp.full_like(last, t)


def exact_lazy_sgd(
    learning_rate: Any,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
    rescale_grad: float,
    clip_gradient: float | None,
) -> optax.GradientTransformation:
    """``lazy_sgd(..., lazy="exact")``; see :func:`jaxsparse_rows.optim.lazy_sgd`."""
    if callable(learning_rate):
        raise ValueError(
            '`lazy_sgd(..., lazy="exact")` needs a constant float `learning_rate`: the '
            "closed-form replay of skipped steps assumes the same step matrix every step. "
            "Use `lazy=False` with a schedule."
        )
    values = {"learning_rate": learning_rate, "momentum": momentum, "weight_decay": weight_decay}
    traced = [name for name, value in values.items() if isinstance(value, jax.core.Tracer)]
    if traced:
        names = ", ".join(f"`{n}`" for n in traced)
        raise TypeError(
            f'`lazy_sgd(..., lazy="exact")` needs a static learning_rate, momentum and '
            f"weight_decay, got traced values for {names}: the closed-form replay of skipped "
            "steps is computed when the optimizer is built. Under `optax.inject_hyperparams`, "
            'list them in `static_args` (static_args=("lazy", "learning_rate", "momentum", '
            '"weight_decay")).'
        )
    nesterov = check_sgd_hparams(momentum, nesterov, weight_decay, rescale_grad, clip_gradient)
    momentum = 0.0 if momentum is None else momentum
    weight_decay = 0.0 if weight_decay is None else weight_decay
    lr = float(learning_rate)
    use_trace = momentum != 0.0
    hparams = StaticHparams((lr, float(momentum), bool(nesterov), float(weight_decay)))
    powers = _powers(lr, float(momentum), bool(nesterov), float(weight_decay))

    def init_fn(params):
        check_dense_params(params, "lazy_sgd(lazy='exact')")
        trace = zeros_like_params(params) if use_trace else jax.tree.map(lambda _: None, params)
        last = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p)[:1], jnp.int32), params)
        return ExactLazySgdState(jnp.zeros([], jnp.int32), trace, last, hparams)

    def step_rows(g, w, m, skipped):
        dt = _compute_dtype(w, g, m)
        w0 = w
        w, m = _catch_up(w.astype(dt), None if m is None else m.astype(dt), skipped, powers, dt)
        if not known_one(rescale_grad):
            g = rescale_grad * g
        if clip_gradient is not None:
            g = jnp.clip(g, -clip_gradient, clip_gradient)
        g = g + weight_decay * w
        if m is None:
            u = g
        else:
            m = momentum * m + g
            u = g + momentum * m if nesterov else m
        w_new = w - lr * u
        return (w_new - w0).astype(jnp.result_type(w0, g)), m

    def update_fn(updates, state, params=None):
        check_state(state, ExactLazySgdState, "lazy_sgd(lazy='exact')")
        if params is None:
            raise ValueError(PARAMS_REQUIRED.format(name="lazy_sgd(lazy='exact')"))
        t = state.count
        # The count saturates at int32's maximum (optax.safe_increment); a row
        # brought up to date by this step is current up to the new count, so
        # no counter passes the count and none wraps.
        count = optax.safe_increment(t)

        def leaf(path, g, m, last, p):
            check_inexact(path, g)
            check_like(path, g, p)
            if m is not None:
                check_like(path, g, m, _TRACE)
            check_state_shape(path, p, last, _LAST, rows=True)
            if is_rowsparse(g):
                idx = g.indices
                w = gather_rows(p, idx, ids_sorted=True)
                mr = None if m is None else gather_rows(m, idx, ids_sorted=True)
                skipped = t - gather_rows(last, idx, ids_sorted=True)
                u, mr = step_rows(g.data, w, mr, skipped)
                u = mask_rows(u, idx, g.shape[0])
                if m is not None:
                    m = scatter_rows(m, idx, mr)
                last = scatter_rows(last, idx, jnp.broadcast_to(count, idx.shape))
                return RowSparse._make(u, idx, g.shape), m, last
            u, m_new = step_rows(jnp.asarray(g), p, m, t - last)
            m = None if m is None else m_new.astype(m.dtype)
            return u, m, jnp.full_like(last, count)

        names = ("updates", "state.trace", "state.last_step", "params")
        new_updates, trace, last = map_updates(
            leaf, updates, state.trace, state.last_step, params, n_out=3, names=names
        )
        # A None gradient leaves its parameter and momentum as they are (as with
        # lazy=False): this step is not one its rows owe, so their counters move
        # with the count (past the step; not at all once the count saturates)
        # and no later replay applies it.
        last = jax.tree.map(
            lambda g, n: n + (count - t) if g is None else n,
            updates,
            last,
            is_leaf=lambda x: x is None or is_rowsparse(x),
        )
        updates = new_updates
        return updates, ExactLazySgdState(count, trace, last, hparams)

    return optax.GradientTransformation(init_fn, update_fn)


def flush(params: Any, state: Any) -> tuple[Any, Any]:
    """Brings every row of ``lazy_sgd(..., lazy="exact")`` parameters up to date.

    Rows not touched since step ``t0`` owe ``count - t0`` momentum / weight
    decay steps; ``flush`` applies them all (O(V) work), so ``params`` equal
    what ``lazy=False`` SGD would hold. Call it before evaluating or saving.
    ``state`` may be the optimizer state itself or any tree containing it
    (e.g. a chain's tuple); ``params`` must have the structure the exact
    optimizer was initialised with. Other state is returned unchanged.

    Args:
      params: the parameters.
      state: the optimizer state.

    Returns:
      ``(params, state)`` with every row current.

    Raises:
      ValueError: ``state`` contains no exact-SGD state, or its arrays do not
        fit ``params`` (structure or shapes).

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")
      >>> w = jnp.zeros((2, 1))
      >>> s = opt.init(w)
      >>> u, s = opt.update(jsr.RowSparse([[1.]], [0], shape=(2, 1)), s, w)
      >>> w = jsr.optim.apply_updates(w, u)
      >>> u, s = opt.update(jsr.RowSparse([[1.]], [1], shape=(2, 1)), s, w)
      >>> w = jsr.optim.apply_updates(w, u)
      >>> w, s = jsr.optim.flush(w, s)  # row 0 owes one momentum step
      >>> w[:, 0]
      Array([-0.15, -0.1 ], dtype=float32)
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: x is None)
    paths = [jax.tree_util.keystr(path) for path, _ in flat]
    flat_p = [p for _, p in flat]
    new_nodes = {}
    for node in _exact_nodes(state, "flush"):
        flat_m, flat_last = _node_leaves(treedef, node, "params")
        for i, (p, m, last) in enumerate(zip(flat_p, flat_m, flat_last, strict=True)):
            if p is None or isinstance(last, optax.MaskedNode):
                continue
            _check_node_leaf(paths[i], p, m, last)
            flat_p[i], flat_m[i], flat_last[i] = _flush_leaf(
                jnp.asarray(p), m, last, node.count, node.hparams
            )
        params = treedef.unflatten(flat_p)
        trace = treedef.unflatten(flat_m)
        last = treedef.unflatten(flat_last)
        new_nodes[id(node)] = ExactLazySgdState(node.count, trace, last, node.hparams)
    return params, _replace_nodes(state, new_nodes)


def _is_exact(x: Any) -> bool:
    return isinstance(x, ExactLazySgdState)


def _exact_nodes(state: Any, name: str) -> list[ExactLazySgdState]:
    """Every exact-SGD state inside ``state`` (a chain's tuple, multi_transform's...);
    a ValueError naming ``name`` when there is none."""
    nodes = [x for x in jax.tree.leaves(state, is_leaf=_is_exact) if _is_exact(x)]
    if not nodes:
        raise ValueError(
            f'`{name}` needs the state of `lazy_sgd(..., lazy="exact")` (or a tree containing '
            "it, such as a chain's state), but `state` contains no ExactLazySgdState: got "
            f"{short_tree(jax.tree.structure(state))}."
        )
    return nodes


def _node_leaves(treedef: Any, node: ExactLazySgdState, name: str) -> tuple[list, list]:
    """``node.trace`` and ``node.last_step`` flattened up to ``treedef`` (of ``name``)."""
    hint = " `state` must be the one `init` returned for these parameters."
    flat_m = flatten_like(treedef, node.trace, (name, "state.trace"), hint)
    flat_last = flatten_like(treedef, node.last_step, (name, "state.last_step"), hint)
    return flat_m, flat_last


def _check_node_leaf(path: str, p: Any, m: Any, last: Any) -> None:
    """The momentum buffer and step counter of one parameter must fit it."""
    if m is not None:
        check_state_shape(path, p, m, _TRACE)
    check_state_shape(path, p, last, _LAST, rows=True)


def _replace_nodes(state: Any, new_nodes: dict) -> Any:
    """``state`` with the exact-SGD states listed by ``id`` in ``new_nodes`` replaced."""
    return jax.tree.map(
        lambda x: new_nodes.get(id(x), x) if _is_exact(x) else x, state, is_leaf=_is_exact
    )


def _catch_up_leaf(p, m, last, ids, t, hparams, name):
    p = jnp.asarray(p)
    n = p.shape[0]
    flat = as_ids(ids, name).reshape(-1)
    check_id_range(flat, n, name)  # concrete ids only: under jit they are not known
    if flat.shape[0] == 0 or n == 0:
        return p, m, last
    # Sorted unique ids in [0, n), padded with n: every other id (the padding
    # id n, negative ids, ids > n) is left out here, so under jit an
    # out-of-range id touches no row (it is never wrapped into row n - 1).
    uniq, _ = unique_rows(flat, n, flat.shape[0])
    dt = _compute_dtype(p, m)
    w = gather_rows(p, uniq, ids_sorted=True).astype(dt)
    mr = None if m is None else gather_rows(m, uniq, ids_sorted=True).astype(dt)
    w, mr = _catch_up(w, mr, t - gather_rows(last, uniq, ids_sorted=True), _powers(*hparams), dt)
    p = scatter_rows(p, uniq, w.astype(p.dtype))
    m = None if m is None else scatter_rows(m, uniq, mr.astype(m.dtype))
    return p, m, scatter_rows(last, uniq, jnp.broadcast_to(t, uniq.shape))


def catch_up(params: Any, state: Any, ids: Any) -> tuple[Any, Any]:
    """Brings the rows ``ids`` of ``lazy_sgd(..., lazy="exact")`` parameters up to date.

    Exact mode replays a row's skipped momentum and weight-decay steps when
    the row is next *updated*, but the forward pass that computes that update
    reads the row first. Call ``catch_up`` with the batch's ids before the
    forward pass (before :func:`~jaxsparse_rows.pull_rows`) and the gradient is
    taken at the row's current value, so training equals dense SGD (to float
    tolerance after :func:`flush`). It costs O(k) rows, like the update.

    Args:
      params: the parameters.
      state: the optimizer state, or any tree containing it (a chain's tuple,
        ``optax.multi_transform``'s state).
      ids: the row ids the forward pass reads, for each parameter: a tree with
        ``params``' structure, or a prefix of it, whose leaves are integer id
        arrays (any shape, duplicates and the padding id ``V`` allowed) or
        ``None`` for parameters to leave alone. For a single array ``params``,
        an id array.

    Returns:
      ``(params, state)`` with those rows current.

    Raises:
      ValueError: ``state`` contains no exact-SGD state, or its arrays do not
        fit ``params`` (structure or shapes), or ``ids`` do not fit ``params``,
        or concrete ``ids`` lie outside ``[0, V]`` (the error names the id
        array, e.g. ``ids['emb']``).
      TypeError: an id array does not have an integer dtype.

    Under ``jax.jit`` the ids are not known when the function is traced, so
    they are not checked: as in :func:`~jaxsparse_rows.take` and
    :func:`~jaxsparse_rows.pull_rows`, an out-of-range id (negative, or
    ``> V``) is treated as padding and ignored. It brings no row up to date
    (it is never wrapped into row ``V - 1``), and the other ids are caught up
    as usual. To get the error back, call :func:`jsr.check_ids
    <jaxsparse_rows.check_ids>` on the ids inside the jitted function and wrap
    it with ``jax.experimental.checkify.checkify`` (second example).

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")
      >>> w = jnp.zeros((2, 1))
      >>> s = opt.init(w)
      >>> u, s = opt.update(jsr.RowSparse([[1.]], [0], shape=(2, 1)), s, w)
      >>> w = jsr.optim.apply_updates(w, u)
      >>> u, s = opt.update(jsr.RowSparse([[1.]], [1], shape=(2, 1)), s, w)
      >>> w = jsr.optim.apply_updates(w, u)
      >>> w2, s2 = jsr.optim.catch_up(w, s, jnp.array([0]))  # row 0 owes one step
      >>> w2[:, 0]
      Array([-0.15, -0.1 ], dtype=float32)

      Under ``jit``, check the ids with ``checkify``; the bad id is ignored:

      >>> import jax
      >>> from jax.experimental import checkify
      >>> def step(w, s, ids):
      ...     jsr.check_ids(ids, w.shape[0])
      ...     return jsr.optim.catch_up(w, s, ids)
      >>> err, (w3, s3) = checkify.checkify(jax.jit(step))(w, s, jnp.array([-1]))
      >>> print(err.get())  # doctest: +ELLIPSIS
      `ids` must lie in [0, 2) (or equal 2, the padding id)...
      >>> bool((w3 == w).all())
      True
    """
    is_none = lambda x: x is None  # noqa: E731
    flat_ids, ids_def = jax.tree.flatten(ids, is_leaf=is_none)
    try:
        flat_p = ids_def.flatten_up_to(params)
    except (ValueError, TypeError) as e:
        raise ValueError(
            "`ids` must have the structure of `params`, or a prefix of it, with an id "
            f"array or None per parameter; got ids {ids_def} for params "
            f"{jax.tree.structure(params)}."
        ) from e
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_leaves_with_path(ids, is_leaf=is_none)
    ]
    new_nodes = {}
    for node in _exact_nodes(state, "catch_up"):
        flat_m, flat_last = _node_leaves(ids_def, node, "ids")
        for j, i in enumerate(flat_ids):
            last = flat_last[j]
            if i is None or flat_p[j] is None or isinstance(last, optax.MaskedNode):
                continue
            if not hasattr(flat_p[j], "shape") or not hasattr(last, "shape"):
                raise ValueError(
                    "each id array in `ids` must stand for one parameter array; at "
                    f"position {j} it stands for {jax.tree.structure(flat_p[j])}."
                )
            _check_node_leaf(paths[j], flat_p[j], flat_m[j], last)
            check_table_rows(flat_p[j], f"params{paths[j]}")
            flat_p[j], flat_m[j], flat_last[j] = _catch_up_leaf(
                flat_p[j], flat_m[j], last, i, node.count, node.hparams, f"ids{paths[j]}"
            )
        trace, last_step = ids_def.unflatten(flat_m), ids_def.unflatten(flat_last)
        new_nodes[id(node)] = ExactLazySgdState(node.count, trace, last_step, node.hparams)
    return ids_def.unflatten(flat_p), _replace_nodes(state, new_nodes)
