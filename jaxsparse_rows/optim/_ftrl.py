"""Lazy FTRL-proximal (McMahan et al. 2013, MXNet's ``Ftrl`` optimizer)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._hparams import NONNEG, POSITIVE, check_learning_rate, check_number
from ._tree import (
    PARAMS_REQUIRED,
    apply_rule,
    check_dense_params,
    check_state,
    map_updates,
    zeros_like_params,
)


class LazyFtrlState(NamedTuple):
    """State of :func:`lazy_ftrl`.

    Attributes:
      count: the global step count (``int32``), used by a learning-rate schedule.
      z: the FTRL ``z`` accumulators, shaped like the parameters.
      n: the accumulated squared gradients, shaped like the parameters.
    """

    count: jax.Array
    z: Any
    n: Any


def lazy_ftrl(
    learning_rate: optax.ScalarOrSchedule = 0.1,
    lamda1: float = 0.01,
    beta: float = 1.0,
    weight_decay: float = 0.0,
) -> optax.GradientTransformation:
    """FTRL-proximal on the listed rows (MXNet's ``Ftrl`` with ``lazy_update``).

    For each listed row ``r`` (every row of a dense gradient), with ``lr`` the
    learning rate of this step::

        z_r += g_r - (sqrt(n_r + g_r**2) - sqrt(n_r)) * w_r / lr
        n_r += g_r**2
        w_r = (sign(z_r) * lamda1 - z_r) / ((beta + sqrt(n_r)) / lr + weight_decay)
              * (|z_r| > lamda1)

    The new weight is a function of ``(z, n)``, not a step added to the old
    one, so the learning rate lives inside the rule and this optimizer is one
    transformation rather than a ``scale_by_*`` piece chained with a learning
    rate. ``update`` needs ``params`` and returns ``w_new - w_old`` (RowSparse
    on RowSparse gradients). A zero gradient leaves ``z`` and ``n`` unchanged
    and recomputes the same weight, so from a zero start (weights and state
    zero, as MXNet initialises FTRL models) lazy equals dense up to float rounding.

    Args:
      learning_rate: a float > 0 or an optax schedule.
      lamda1: L1 strength (>= 0; weights with ``|z| <= lamda1`` are exactly zero).
      beta: the FTRL ``beta`` (>= 0, added to ``sqrt(n)``).
      weight_decay: L2 strength (>= 0, added to the denominator).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> w = jnp.zeros((3, 1))
      >>> opt = jsr.optim.lazy_ftrl(learning_rate=0.1, lamda1=0.01)
      >>> u, state = opt.update(jsr.RowSparse([[1.]], [1], shape=(3, 1)), opt.init(w), w)
      >>> print(jsr.optim.apply_updates(w, u)[:, 0])
      [ 0.     -0.0495  0.    ]
    """
    check_learning_rate(learning_rate, POSITIVE, why=" (FTRL divides by it)")
    for name, value in (("lamda1", lamda1), ("beta", beta), ("weight_decay", weight_decay)):
        check_number(name, value, NONNEG)

    def init_fn(params):
        check_dense_params(params, "lazy_ftrl")
        return LazyFtrlState(
            count=jnp.zeros([], jnp.int32),
            z=zeros_like_params(params),
            n=zeros_like_params(params),
        )

    def update_fn(updates, state, params=None):
        check_state(state, LazyFtrlState, "lazy_ftrl")
        if params is None:
            raise ValueError(PARAMS_REQUIRED.format(name="lazy_ftrl"))
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate

        def rule(g, states, w):
            z, n = states
            dt = jnp.result_type(z, g)
            lr_ = jnp.asarray(lr, dt)
            g2 = jnp.square(g)
            z = z + g - (jnp.sqrt(n + g2) - jnp.sqrt(n)) * w / lr_
            n = n + g2
            new_w = (jnp.sign(z) * lamda1 - z) / ((beta + jnp.sqrt(n)) / lr_ + weight_decay)
            new_w = jnp.where(jnp.abs(z) > lamda1, new_w, jnp.zeros((), new_w.dtype))
            return (new_w - w).astype(dt), [z, n]

        def leaf(path, g, z, n, p):
            u, (z, n) = apply_rule(path, g, [z, n], p, rule, lazy=True, fused="ftrl")
            return u, z, n

        names = ("updates", "state.z", "state.n", "params")
        updates, z, n = map_updates(leaf, updates, state.z, state.n, params, n_out=3, names=names)
        return updates, LazyFtrlState(optax.safe_increment(state.count), z, n)

    return optax.GradientTransformation(init_fn, update_fn)
