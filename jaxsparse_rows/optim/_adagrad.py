"""Lazy AdaGrad (elementwise, as ``optax.adagrad``) and row-wise AdaGrad (one
accumulator per row, FBGEMM's EXACT_ROWWISE_ADAGRAD / MXNet's GroupAdaGrad)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._hparams import NONNEG, check_learning_rate, check_number
from ._rowwise_rows import rowwise_adagrad_rows, rowwise_scales, scale_rows
from ._transforms import learning_rate_step, scale_by_learning_rate, scale_leaf
from ._tree import (
    abs_sq,
    apply_rule,
    check_dense_params,
    check_like,
    check_state,
    known_zero,
    map_updates,
    weight_decay_needs_params,
    zeros_like_params,
)


class ScaleByLazyAdagradState(NamedTuple):
    """State of :func:`scale_by_lazy_adagrad`.

    Attributes:
      sum_of_squares: accumulated squared gradients, shaped like the parameters.
    """

    sum_of_squares: Any


def scale_by_lazy_adagrad(
    initial_accumulator_value: float = 0.1, eps: float = 1e-7
) -> optax.GradientTransformation:
    """AdaGrad's direction (``optax.scale_by_rss``) on the listed rows.

    For each listed row: ``s_r += g_r**2``; ``u_r = g_r / sqrt(s_r + eps)``
    (0 where ``s_r == 0``). A zero gradient changes neither ``s`` nor the
    weight, so the lazy rule equals the dense one exactly: there is no
    ``lazy`` switch.

    Args:
      initial_accumulator_value: starting value of every accumulator (>= 0).
      eps: term added inside the square root (>= 0).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> tx = jsr.optim.scale_by_lazy_adagrad(initial_accumulator_value=0.0, eps=0.0)
      >>> state = tx.init(jnp.zeros((2, 1)))
      >>> u, state = tx.update(jsr.RowSparse([[3.]], [1], shape=(2, 1)), state)
      >>> u.data, state.sum_of_squares[:, 0]
      (Array([[1.]], dtype=float32), Array([0., 9.], dtype=float32))
    """
    check_number("initial_accumulator_value", initial_accumulator_value, NONNEG)
    check_number("eps", eps, NONNEG)

    def init_fn(params):
        check_dense_params(params, "scale_by_lazy_adagrad")
        return ScaleByLazyAdagradState(zeros_like_params(params, fill=initial_accumulator_value))

    def rule(g, states, _):
        (acc,) = states
        acc = abs_sq(g) + acc
        scale = jnp.where(acc > 0, jax.lax.rsqrt(acc + eps), jnp.zeros((), acc.dtype))
        return scale * g, [acc]

    def update_fn(updates, state, params=None):
        del params
        check_state(state, ScaleByLazyAdagradState, "scale_by_lazy_adagrad")

        def leaf(path, g, acc):
            u, (acc,) = apply_rule(path, g, [acc], None, rule, lazy=True, fused="adagrad")
            return u, acc

        names = ("updates", "state.sum_of_squares")
        updates, acc = map_updates(leaf, updates, state.sum_of_squares, n_out=2, names=names)
        return updates, ScaleByLazyAdagradState(acc)

    return optax.GradientTransformation(init_fn, update_fn)


def lazy_adagrad(
    learning_rate: optax.ScalarOrSchedule,
    initial_accumulator_value: float = 0.1,
    eps: float = 1e-7,
) -> optax.GradientTransformation:
    """AdaGrad on the listed rows; equal to dense ``optax.adagrad`` exactly.

    Args:
      learning_rate: a float or an optax schedule.
      initial_accumulator_value: starting value of every accumulator (>= 0).
      eps: term added inside the square root (>= 0).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> w = jnp.zeros((3, 1))
      >>> opt = jsr.optim.lazy_adagrad(1.0, initial_accumulator_value=0.0, eps=0.0)
      >>> u, _ = opt.update(jsr.RowSparse([[-4.]], [2], shape=(3, 1)), opt.init(w))
      >>> jsr.optim.apply_updates(w, u)[:, 0]
      Array([0., 0., 1.], dtype=float32)
    """
    check_learning_rate(learning_rate)
    return optax.chain(
        scale_by_lazy_adagrad(initial_accumulator_value, eps),
        scale_by_learning_rate(learning_rate),
    )


class ScaleByLazyRowwiseAdagradState(NamedTuple):
    """State of :func:`scale_by_lazy_rowwise_adagrad`.

    Attributes:
      sum_of_squares: one accumulator per row: ``[V]`` for a ``[V, ...]``
        parameter (a scalar for a scalar parameter).
    """

    sum_of_squares: Any


def scale_by_lazy_rowwise_adagrad(
    eps: float = 1e-8, weight_decay: float = 0.0
) -> optax.GradientTransformation:
    """Row-wise AdaGrad's direction: one accumulator per row, D times less memory.

    For each listed row ``r`` (every row of a dense gradient)::

        g = g_r + weight_decay * w_r
        M_r += mean(g**2)                 # over the row's elements
        u_r = g / (sqrt(M_r) + eps)

    Args:
      eps: term added to the denominator (>= 0).
      weight_decay: coupled (L2) weight decay on the listed rows; needs
        ``params`` in ``update``.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> tx = jsr.optim.scale_by_lazy_rowwise_adagrad(eps=0.0)
      >>> state = tx.init(jnp.zeros((3, 2)))
      >>> u, state = tx.update(jsr.RowSparse([[3., 4.]], [0], shape=(3, 2)), state)
      >>> state.sum_of_squares
      Array([12.5,  0. ,  0. ], dtype=float32)
    """
    init_fn, rowwise_update = _rowwise_adagrad(eps, weight_decay)

    def update_fn(updates, state, params=None):
        return rowwise_update(updates, state, params)

    return optax.GradientTransformation(init_fn, update_fn)


def _rowwise_adagrad(eps: float, weight_decay: float):
    """``(init, update)`` of :func:`scale_by_lazy_rowwise_adagrad`, where
    ``update(updates, state, params=None, alpha=None)`` also multiplies the
    updates by ``alpha`` (a learning rate folded into the same pass over the
    rows, as a following ``scale_by_learning_rate`` would multiply them)."""
    check_number("eps", eps, NONNEG)
    check_number("weight_decay", weight_decay, none_ok=True)

    def init_fn(params):
        check_dense_params(params, "scale_by_lazy_rowwise_adagrad")
        return ScaleByLazyRowwiseAdagradState(
            jax.tree.map(lambda p: jnp.zeros(jnp.shape(p)[:1], jnp.result_type(p)), params)
        )

    decay = not known_zero(weight_decay)

    def update_fn(updates, state, params=None, alpha=None):
        check_state(state, ScaleByLazyRowwiseAdagradState, "scale_by_lazy_rowwise_adagrad")
        if decay and params is None:
            raise weight_decay_needs_params("rowwise AdaGrad with weight_decay", weight_decay)

        def rule(g, states, w):
            (acc,) = states
            if decay:
                g = g + weight_decay * w
            scale, acc = rowwise_scales(g, acc, eps)
            u = scale_rows(g, scale)
            # a dense leaf scaled as scale_by_learning_rate scales it
            return (u if alpha is None else scale_leaf(u, alpha)), [acc]

        def lazy_rows(g, ids, states, w):
            # The rule, fused with the gather and scatter of the accumulator
            # and with alpha (one native kernel on CPU; XLA ops elsewhere).
            (acc,) = states
            if decay:
                g = g + weight_decay * w
            acc, u = rowwise_adagrad_rows(acc, ids, g, eps, alpha)
            return u, [acc]

        def leaf(path, g, acc, p):
            if p is not None:
                check_like(path, g, p)
            if tuple(jnp.shape(acc)) != tuple(g.shape[:1]):
                raise ValueError(
                    f"the gradient for `params{path}` has shape {tuple(g.shape)}, but the "
                    f"row-wise accumulator has shape {tuple(jnp.shape(acc))}; expected "
                    f"{tuple(g.shape[:1])}."
                )
            w = p if decay else None
            u, (acc,) = apply_rule(
                path, g, [acc], w, rule, lazy=True, check_states=False, lazy_rows=lazy_rows
            )
            return u, acc

        names = ("updates", "state.sum_of_squares", "params")
        updates, acc = map_updates(
            leaf, updates, state.sum_of_squares, params, n_out=2, names=names
        )
        return updates, ScaleByLazyRowwiseAdagradState(acc)

    return init_fn, update_fn


def lazy_rowwise_adagrad(
    learning_rate: optax.ScalarOrSchedule,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """Row-wise AdaGrad (FBGEMM EXACT_ROWWISE_ADAGRAD, MXNet GroupAdaGrad).

    ``M_r += mean(g_r**2)``; ``w_r -= lr * g_r / (sqrt(M_r) + eps)``, on the
    listed rows only. Without weight decay this equals the dense rule exactly
    (a zero row changes nothing); with it, untouched rows are not decayed.

    Args:
      learning_rate: a float or an optax schedule.
      eps: term added to the denominator (>= 0).
      weight_decay: coupled (L2) weight decay on the listed rows.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> w = jnp.zeros((2, 2))
      >>> opt = jsr.optim.lazy_rowwise_adagrad(1.0, eps=0.0)
      >>> u, state = opt.update(jsr.RowSparse([[2., 2.]], [1], shape=(2, 2)), opt.init(w), w)
      >>> jsr.optim.apply_updates(w, u)
      Array([[ 0.,  0.],
             [-1., -1.]], dtype=float32)
    """
    check_learning_rate(learning_rate)
    chained = optax.chain(
        scale_by_lazy_rowwise_adagrad(eps, weight_decay),
        scale_by_learning_rate(learning_rate),
    )
    _, rowwise_update = _rowwise_adagrad(eps, weight_decay)

    def update_fn(updates, state, params=None, **extra_args):
        # The chain above, with the learning rate folded into the row-wise
        # pass (on CPU the native kernel writes the final update rows, instead
        # of writing the direction for XLA to read and scale again). Same
        # state, same results, and the chain's errors in the chain's order
        # (the row-wise state is checked before the learning rate's); a state
        # of another shape gets the chain's own error.
        if not (isinstance(state, tuple) and len(state) == 2):
            return chained.update(updates, state, params, **extra_args)
        rowwise_state, lr_state = state
        check_state(rowwise_state, ScaleByLazyRowwiseAdagradState, "scale_by_lazy_rowwise_adagrad")
        step, lr_state = learning_rate_step(learning_rate, lr_state)
        updates, rowwise_state = rowwise_update(updates, rowwise_state, params, alpha=step)
        return updates, (rowwise_state, lr_state)

    # optax.chain's type: its update takes (and ignores) extra arguments
    return optax.GradientTransformationExtraArgs(chained.init, update_fn)
