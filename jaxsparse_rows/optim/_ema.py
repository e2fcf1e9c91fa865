"""``ema`` and ``lookahead`` as optax names them, for row-sparse updates."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._hparams import UNIT, check_inexact_dtype, check_lazy, check_number, check_transformation
from ._tree import (
    apply_rule,
    check_dense_params,
    check_state,
    is_rowsparse,
    map_updates,
    zeros_like_params,
)


class EmaState(NamedTuple):
    """State of :func:`ema` (``optax.EmaState``'s fields).

    Attributes:
      count: the global step count (``int32``), advanced on every call.
      ema: the averages, dense arrays shaped like the parameters.
    """

    count: jax.Array
    ema: Any


def ema(
    decay: float, debias: bool = True, accumulator_dtype: Any = None, lazy: bool = True
) -> optax.GradientTransformation:
    """An exponential moving average of the updates (``optax.ema``) on the listed rows.

    For each processed row ``r`` (the listed rows of a RowSparse update with
    ``lazy=True``; every row of a dense update or with ``lazy=False``)::

        ema_r = decay * ema_r + (1 - decay) * u_r
        out_r = ema_r / (1 - decay**count)     # debias=True

    Untouched rows keep their average and get no output (the result is
    RowSparse with the update's indices). ``count`` is global, as in the
    lazy optimizers' bias correction. With ``lazy=False`` it equals
    ``optax.ema`` on the densified updates.

    Args:
      decay: the decay rate, in [0, 1).
      debias: divide by ``1 - decay**count``.
      accumulator_dtype: dtype of the averages; default the parameters'.
      lazy: True (listed rows only) or False (dense-equivalent).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> tx = jsr.optim.ema(0.5, debias=False)
      >>> state = tx.init(jnp.zeros((3, 1)))
      >>> u, state = tx.update(jsr.RowSparse([[2.]], [1], shape=(3, 1)), state)
      >>> u.data, u.indices, state.ema[:, 0]
      (Array([[1.]], dtype=float32), Array([1], dtype=int32), Array([0., 1., 0.], dtype=float32))
    """
    check_number("decay", decay, UNIT)
    lazy = check_lazy(lazy, (True, False), "ema")
    accumulator_dtype = check_inexact_dtype("accumulator_dtype", accumulator_dtype)
    if not isinstance(debias, bool):
        raise TypeError(f"`debias` must be a bool, got {debias!r}.")

    def init_fn(params):
        check_dense_params(params, "ema")
        return EmaState(
            count=jnp.zeros([], jnp.int32), ema=zeros_like_params(params, accumulator_dtype)
        )

    def update_fn(updates, state, params=None):
        del params
        check_state(state, EmaState, "ema")
        count = optax.safe_increment(state.count)
        correction = 1 - jnp.asarray(decay, jnp.float32) ** count

        def rule(u, states, _):
            (avg,) = states
            avg = (1 - decay) * u + decay * avg
            out = avg / correction.astype(avg.dtype) if debias else avg
            return out, [avg]

        def leaf(path, u, avg):
            out, (avg,) = apply_rule(path, u, [avg], None, rule, lazy=lazy)
            return out, avg

        names = ("updates", "state.ema")
        updates, avg = map_updates(leaf, updates, state.ema, n_out=2, names=names)
        return updates, EmaState(count=count, ema=avg)

    return optax.GradientTransformation(init_fn, update_fn)


def _densify() -> optax.GradientTransformation:
    def update_fn(updates, state, params=None):
        del params
        dense = jax.tree.map(
            lambda u: u.todense() if is_rowsparse(u) else u, updates, is_leaf=is_rowsparse
        )
        return dense, state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lookahead(
    fast_optimizer: optax.GradientTransformation,
    sync_period: int,
    slow_step_size: float,
    reset_state: bool = False,
) -> optax.GradientTransformation:
    """``optax.lookahead`` around a lazy optimizer.

    ``optax.lookahead`` adds the fast optimizer's updates to the fast
    parameters leaf by leaf with ``jax.tree.map``, which does not fit a
    RowSparse update. Here the fast optimizer's RowSparse updates are made
    dense (zeros where no row is listed) before lookahead sees them, so the
    fast parameters follow the lazy rule, and the slow ones move toward them
    every ``sync_period`` steps (rows no fast step touched stay put). Use it
    with ``optax.LookaheadParams`` as ``optax.lookahead``; each step costs
    O(V·D) for the dense updates, as lookahead's synchronisation does.

    Args:
      fast_optimizer: e.g. ``jsr.optim.lazy_adam(1e-3)``.
      sync_period: fast steps between synchronisations (an int >= 1).
      slow_step_size: step of the slow parameters toward the fast ones.
      reset_state: reset the fast optimizer's state at each synchronisation.

    Returns:
      An ``optax.GradientTransformation`` on ``optax.LookaheadParams``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp, optax
      >>> opt = jsr.optim.lookahead(jsr.optim.lazy_sgd(1.0), sync_period=2, slow_step_size=0.5)
      >>> params = optax.LookaheadParams.init_synced(jnp.zeros((3, 1)))
      >>> state = opt.init(params)
      >>> g = jsr.RowSparse([[1.]], [1], shape=(3, 1))
      >>> for _ in range(2):
      ...     u, state = opt.update(g, state, params)
      ...     params = optax.apply_updates(params, u)
      >>> params.fast[:, 0], params.slow[:, 0]
      (Array([ 0., -1.,  0.], dtype=float32), Array([ 0., -1.,  0.], dtype=float32))
    """
    check_transformation("fast_optimizer", fast_optimizer)
    return optax.lookahead(
        optax.chain(fast_optimizer, _densify()), sync_period, slow_step_size, reset_state
    )
