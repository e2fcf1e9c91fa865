"""RowSparse-aware versions of the small optax transforms that the optimizers
are chained from, and a wrapper that makes elementwise optax transforms safe
on RowSparse updates."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .._args import check_flag
from .._csr import CSR
from .._rowops import gather_rows
from .._rowsparse import RowSparse
from ._hparams import (
    ABOVE_ZERO,
    check_learning_rate,
    check_number,
    check_transformation,
)
from ._tree import (
    abs_sq,
    check_inexact,
    check_like,
    check_state,
    is_rowsparse,
    known_zero,
    map_updates,
    mask_rows,
    weight_decay_needs_params,
)


def scale_leaf(u: Any, factor: jax.Array) -> Any:
    if is_rowsparse(u):
        return RowSparse._make(jnp.asarray(factor, u.dtype) * u.data, u.indices, u.shape)
    return jnp.asarray(factor, jnp.result_type(u)) * u


def _tree_scale(updates: Any, factor: jax.Array) -> Any:
    def leaf(path, u):
        check_inexact(path, u)
        return (scale_leaf(u, factor),)

    return map_updates(leaf, updates, n_out=1)[0]


class ScaleByLearningRateState(NamedTuple):
    """State of :func:`scale_by_learning_rate` with a schedule.

    Attributes:
      count: the number of updates made so far (``int32`` scalar).
    """

    count: jax.Array


def scale_by_learning_rate(
    learning_rate: optax.ScalarOrSchedule, *, flip_sign: bool = True
) -> optax.GradientTransformation:
    """Scales updates by ``-learning_rate``, RowSparse updates on their ``data`` only.

    ``learning_rate`` is a float or an optax schedule ``count -> lr``; with a
    schedule the state counts the calls (one global count, advanced on every
    call whatever rows the gradient lists).

    Integer and bool updates are refused (``TypeError``): the learning rate
    would be cast to their dtype.

    Args:
      learning_rate: a finite float (or a 0-d array) or an ``optax.Schedule``.
      flip_sign: multiply by ``-learning_rate`` (descent) when True.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> g = jsr.RowSparse([[1., 2.]], [1], shape=(3, 2))
      >>> tx = jsr.optim.scale_by_learning_rate(0.5)
      >>> u, _ = tx.update(g, tx.init(jnp.zeros((3, 2))))
      >>> u.data, u.indices
      (Array([[-0.5, -1. ]], dtype=float32), Array([1], dtype=int32))
    """
    check_learning_rate(learning_rate)
    sign = -1.0 if check_flag(flip_sign, "flip_sign") else 1.0

    def update_fn(updates, state, params=None):
        del params
        step, state = learning_rate_step(learning_rate, state, sign)
        return _tree_scale(updates, step), state

    return optax.GradientTransformation(_learning_rate_init(learning_rate), update_fn)


def _learning_rate_init(learning_rate: optax.ScalarOrSchedule):
    if not callable(learning_rate):
        return optax.init_empty_state

    def init_fn(params):
        del params
        return ScaleByLearningRateState(count=jnp.zeros([], jnp.int32))

    return init_fn


def learning_rate_step(
    learning_rate: optax.ScalarOrSchedule, state: Any, sign: float = -1.0
) -> tuple[Any, Any]:
    """``(factor, new_state)`` of :func:`scale_by_learning_rate` for its
    ``state``: ``sign * learning_rate`` (of the count, for a schedule), by
    which it multiplies the updates, and its next state. For optimizers that
    fuse the learning rate into their own pass over the rows."""
    if callable(learning_rate):
        check_state(state, ScaleByLearningRateState, "scale_by_learning_rate")
        step = sign * learning_rate(state.count)
        return step, ScaleByLearningRateState(optax.safe_increment(state.count))
    return sign * learning_rate, state


def add_decayed_weights(
    weight_decay: float = 0.0, lazy: bool = True
) -> optax.GradientTransformation:
    """Adds ``weight_decay * params`` to the updates (decoupled weight decay).

    On a RowSparse update with ``lazy=True`` only the listed rows are decayed
    (the result stays RowSparse); with ``lazy=False`` the update is densified
    and every row is decayed, as ``optax.add_decayed_weights`` does.

    Args:
      weight_decay: the decay coefficient (a finite number, or None: off).
      lazy: decay only the listed rows of RowSparse updates (a bool).

    Returns:
      An ``optax.GradientTransformation`` (needs ``params`` in ``update``).

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> u = jsr.RowSparse([[1., 1.]], [0], shape=(2, 2))
      >>> tx = jsr.optim.add_decayed_weights(0.5)
      >>> out, _ = tx.update(u, tx.init(None), jnp.full((2, 2), 2.))
      >>> out.asnumpy()
      array([[2., 2.],
             [0., 0.]], dtype=float32)
    """
    check_number("weight_decay", weight_decay, none_ok=True)
    lazy = check_flag(lazy, "lazy")

    def update_fn(updates, state, params=None):
        if known_zero(weight_decay):
            return updates, state
        if params is None:
            raise weight_decay_needs_params("add_decayed_weights", weight_decay)

        def leaf(path, u, p):
            check_like(path, u, p)
            if is_rowsparse(u):
                if lazy:
                    rows = gather_rows(p, u.indices, ids_sorted=True)
                    data = mask_rows(u.data + weight_decay * rows, u.indices, u.shape[0])
                    return (RowSparse._make(data, u.indices, u.shape),)
                u = u.todense()
            return (u + weight_decay * p,)

        return map_updates(leaf, updates, params, n_out=1, names=("updates", "params"))[0], state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def global_norm(updates: Any) -> jax.Array:
    """The L2 norm of all leaves together, counting only real rows of RowSparse leaves.

    Use it instead of ``optax.tree.norm`` (``optax.global_norm``), which
    reduces the row ids of RowSparse leaves too and so refuses them. Complex values count
    ``|g|**2``. Squares and sum are taken in float32 (float64 for float64
    leaves), so float16, bfloat16 and integer leaves cannot overflow.

    Args:
      updates: a pytree of dense arrays and RowSparse leaves (``None`` leaves
        are skipped).

    Returns:
      A scalar array.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> g = {"emb": jsr.RowSparse([[3., 4.], [0., 0.]], [1, 5], shape=(5, 2)),
      ...      "b": jnp.zeros(2)}
      >>> jsr.optim.global_norm(g)
      Array(5., dtype=float32)
    """

    for path, leaf in jax.tree_util.tree_leaves_with_path(
        updates, is_leaf=lambda x: isinstance(x, CSR)
    ):
        if isinstance(leaf, CSR):
            raise TypeError(
                f"`updates{jax.tree_util.keystr(path)}` is a CSR, whose column ids would be "
                "counted as values; gradients of parameters are dense or RowSparse."
            )

    def sq(_, u):
        data = mask_rows(u.data, u.indices, u.shape[0]) if is_rowsparse(u) else jnp.asarray(u)
        # Widen before squaring: float16 squares overflow at 256 and int32's
        # at 46341 (and bfloat16's lose digits).
        if jnp.iscomplexobj(data):
            return (
                jnp.sum(abs_sq(data.astype(jnp.promote_types(data.dtype, jnp.complex64))).real),
            )
        dtype = jnp.promote_types(
            jnp.float32, data.dtype if jnp.issubdtype(data.dtype, jnp.floating) else jnp.float32
        )
        return (jnp.sum(jnp.square(data.astype(dtype))),)

    sums = jax.tree.leaves(map_updates(sq, updates, n_out=1)[0])
    dtype = jnp.result_type(jnp.float32, *sums) if sums else jnp.float32
    return jnp.sqrt(sum((x.astype(dtype) for x in sums), jnp.zeros([], dtype)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Clips updates to a global L2 norm, counting only real rows of RowSparse leaves.

    Same rule as ``optax.clip_by_global_norm``: when the norm of all leaves
    together (:func:`global_norm`) exceeds ``max_norm`` every leaf is
    multiplied by ``max_norm / norm``. RowSparse leaves contribute their real
    rows (padding slots are ignored) and are scaled on ``data`` only, keeping
    ``indices``.

    Integer and bool updates are refused (``TypeError``): the scaled values
    would be truncated.

    Args:
      max_norm: the largest allowed global norm (> 0).

    Returns:
      A stateless ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> g = {"emb": jsr.RowSparse([[3., 4.]], [1], shape=(5, 2)), "b": jnp.zeros(2)}
      >>> tx = jsr.optim.clip_by_global_norm(1.0)
      >>> u, _ = tx.update(g, tx.init(None))
      >>> u["emb"].data, u["emb"].indices
      (Array([[0.6, 0.8]], dtype=float32), Array([1], dtype=int32))
    """
    check_number("max_norm", max_norm, ABOVE_ZERO)

    def update_fn(updates, state, params=None):
        del params

        g_norm = global_norm(updates)
        trigger = g_norm < max_norm

        def clip(path, u):
            check_inexact(path, u)
            data = u.data if is_rowsparse(u) else u
            # scaled in the norm's (wider) dtype: a float16 norm above 65504 is inf
            wide = jnp.promote_types(data.dtype, g_norm.dtype)
            scaled = (data.astype(wide) / g_norm.astype(wide)) * max_norm
            out = jnp.where(trigger, data, scaled.astype(data.dtype))
            return (RowSparse._make(out, u.indices, u.shape) if is_rowsparse(u) else out,)

        return map_updates(clip, updates, n_out=1)[0], state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


# optax transforms whose rule reads a whole leaf (its norm, RMS or mean): run
# on a RowSparse update's ``[k, ...]`` data, they would see k rows of a
# ``[V, ...]`` leaf and give another number. Keyed by the factory's name (the
# ``update`` function's qualified name), with what to use instead.
_WHOLE_LEAF_RULES = {
    "clip_by_block_rms": "`jsr.optim.clip_by_block_rms`",
    "clip_by_global_norm": "`jsr.optim.clip_by_global_norm`",
    "adaptive_grad_clip": None,
    "scale_by_trust_ratio": None,
    "centralize": None,
    "normalize_by_update_norm": None,
    "scale_by_param_block_norm": None,
    "scale_by_param_block_rms": None,
}


def _refuse_whole_leaf_rules(inner: optax.GradientTransformation) -> None:
    """Refuses optax transforms known to reduce over a whole leaf."""
    update = inner.update
    module = getattr(update, "__module__", "") or ""
    factory = (getattr(update, "__qualname__", "") or "").split(".<locals>", 1)[0]
    if not module.startswith("optax") or factory not in _WHOLE_LEAF_RULES:
        return
    use = _WHOLE_LEAF_RULES[factory]
    fix = f"Use {use}." if use else "It has no row-sparse version: apply it to dense leaves only."
    raise TypeError(
        f"`lift_elementwise` needs an elementwise transform, but `inner` is "
        f"`optax.{factory}`, which reduces over a whole leaf: on the listed rows of a "
        f"RowSparse update it would compute another value than on the dense leaf. {fix}"
    )


def clip_by_block_rms(threshold: float) -> optax.GradientTransformation:
    """Clips each leaf to a root mean square of at most ``threshold``.

    Same rule as ``optax.clip_by_block_rms``: each leaf is divided by
    ``max(1, rms / threshold)``. The RMS of a RowSparse
    leaf is that of its dense array (the squares of its real rows, divided by
    every element of the ``[N, ...]`` shape), and the leaf is scaled on
    ``data`` only, keeping ``indices``.

    Args:
      threshold: the largest allowed RMS of a leaf (> 0).

    Returns:
      A stateless ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> g = jsr.RowSparse([[4., 4.]], [1], shape=(2, 2))  # dense RMS 2.83
      >>> tx = jsr.optim.clip_by_block_rms(1.0)
      >>> u, _ = tx.update(g, tx.init(None))
      >>> u.data.round(4), u.indices
      (Array([[1.4142, 1.4142]], dtype=float32), Array([1], dtype=int32))
    """
    check_number("threshold", threshold, ABOVE_ZERO)

    def update_fn(updates, state, params=None):
        del params

        def clip(path, u):
            check_inexact(path, u)
            if is_rowsparse(u):
                data = mask_rows(u.data, u.indices, u.shape[0])
                size = max(u.size, 1)
            else:
                data = jnp.asarray(u)
                size = max(data.size, 1)
            wide = jnp.promote_types(jnp.float32, data.dtype)
            if jnp.iscomplexobj(data):
                sq = abs_sq(data.astype(wide)).real
            else:
                sq = jnp.square(data.astype(wide))
            denom = jnp.maximum(1.0, jnp.sqrt(jnp.sum(sq) / size) / threshold)
            out = (data.astype(wide) / denom).astype(data.dtype)
            return (RowSparse._make(out, u.indices, u.shape) if is_rowsparse(u) else out,)

        return map_updates(clip, updates, n_out=1)[0], state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lift_elementwise(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Lifts an elementwise optax transform so it acts on RowSparse ``data`` only.

    Plain optax transforms ``tree_map`` over every leaf, and a RowSparse leaf
    has two: ``data`` and ``indices``; ``optax.scale(-1.0)`` would negate the
    row ids. The lifted transform hands ``inner`` each RowSparse update's
    ``data`` (``[k, ...]``) and, when ``params`` are given, the matching
    ``[k, ...]`` rows of the parameter, then rebuilds the RowSparse with the
    same ``indices`` and zeroed padding. So ``add_decayed_weights`` lifted
    decays only the listed rows (the lazy rule).

    ``inner`` must be elementwise (each output element depends on the same
    element of updates/params only) and its state must hold no per-parameter
    arrays (scalars such as a step count are fine): ``init`` raises otherwise.
    optax transforms that reduce over a whole leaf (``clip_by_block_rms``,
    ``clip_by_global_norm``, ``centralize``, ...) are refused with
    ``TypeError`` when lifted, naming the jsr version where there is one.

    Args:
      inner: e.g. ``optax.scale(-1.0)``, ``optax.clip(1.0)``,
        ``optax.add_decayed_weights(1e-4)``, ``optax.scale_by_schedule(f)``.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp, optax
      >>> g = jsr.RowSparse([[1., -2.]], [2], shape=(4, 2))
      >>> tx = jsr.optim.lift_elementwise(optax.scale(-1.0))
      >>> u, _ = tx.update(g, tx.init(jnp.zeros((4, 2))))
      >>> u.data, u.indices
      (Array([[-1.,  2.]], dtype=float32), Array([2], dtype=int32))
    """
    check_transformation("inner", inner)
    _refuse_whole_leaf_rules(inner)

    def init_fn(params):
        state = inner.init(params)
        for leaf in jax.tree.leaves(state):
            if jnp.ndim(leaf) > 0:
                raise TypeError(
                    "`lift_elementwise` needs a transform whose state holds no per-parameter "
                    f"arrays, but `inner.init` returned a state with an array of shape "
                    f"{tuple(jnp.shape(leaf))}. Use a lazy optimizer from `jsr.optim` for "
                    "stateful rules."
                )
        return state

    def update_fn(updates, state, params=None):
        def split(path, u, p):
            if is_rowsparse(u):
                check_like(path, u, p)
                rows = None if p is None else gather_rows(p, u.indices, ids_sorted=True)
                return u.data, rows
            return u, p

        data, rows = map_updates(split, updates, params, n_out=2, names=("updates", "params"))
        new_data, state = inner.update(data, state, None if params is None else rows)

        def join(_, u, d):
            if is_rowsparse(u):
                d = mask_rows(jnp.asarray(d), u.indices, u.shape[0])
                return (RowSparse._make(d, u.indices, u.shape),)
            return (d,)

        names = ("updates", "inner.update's updates")
        return map_updates(join, updates, new_data, n_out=1, names=names)[0], state

    return optax.GradientTransformation(init_fn, update_fn)


class SkipNonfiniteState(NamedTuple):
    """State of :func:`skip_nonfinite`.

    Attributes:
      inner_state: the wrapped transformation's state.
      skipped: how many updates were skipped so far (``int32``; it stays at
        ``2**31 - 1`` once it gets there, as ``optax.safe_increment`` counts).
    """

    inner_state: Any
    skipped: jax.Array


def all_finite(updates: Any) -> jax.Array:
    def leaf(_, u):
        data = mask_rows(u.data, u.indices, u.shape[0]) if is_rowsparse(u) else jnp.asarray(u)
        return (jnp.all(jnp.isfinite(data)),)

    flags = jax.tree.leaves(map_updates(leaf, updates, n_out=1)[0])
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def zero_like_output(x: Any) -> Any:
    if is_rowsparse(x):
        n = x.shape[0]
        return RowSparse._make(
            jnp.zeros(x.data.shape, x.data.dtype),
            jnp.full(x.indices.shape, n, x.indices.dtype),
            x.shape,
        )
    return jnp.zeros(x.shape, x.dtype)


def skip_nonfinite(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """Skips a whole step when any gradient value (real rows only) is NaN or inf.

    A skipped step returns zero updates (RowSparse updates with no real row)
    and leaves ``inner``'s state untouched, step count included; ``skipped``
    counts such steps. Unlike ``optax.apply_if_finite`` (whose skipped step
    sets a RowSparse update's row ids to 0 too, and which selects between
    whole state trees), the choice is a ``lax.cond``, so the donated state is
    still updated in place.

    Args:
      inner: the transformation to protect, e.g. ``lazy_adam(1e-3)``.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> opt = jsr.optim.skip_nonfinite(jsr.optim.lazy_sgd(0.1))
      >>> w = jnp.ones((3, 1))
      >>> g = jsr.RowSparse([[jnp.nan]], [1], shape=(3, 1))
      >>> u, state = opt.update(g, opt.init(w), w)
      >>> jsr.optim.apply_updates(w, u)[:, 0], state.skipped
      (Array([1., 1., 1.], dtype=float32), Array(1, dtype=int32))
    """
    check_transformation("inner", inner)

    def init_fn(params):
        return SkipNonfiniteState(inner.init(params), jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None):
        check_state(state, SkipNonfiniteState, "skip_nonfinite")
        finite = all_finite(updates)

        def run(inner_state):
            return inner.update(updates, inner_state, params)

        def skip(inner_state):
            shapes = jax.eval_shape(run, inner_state)[0]
            zeros = jax.tree.map(zero_like_output, shapes, is_leaf=is_rowsparse)
            return zeros, inner_state

        new_updates, inner_state = jax.lax.cond(finite, run, skip, state.inner_state)
        skipped = jnp.where(finite, state.skipped, optax.safe_increment(state.skipped))
        return new_updates, SkipNonfiniteState(inner_state, skipped)

    return optax.GradientTransformation(init_fn, update_fn)
