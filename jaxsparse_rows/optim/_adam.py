"""Lazy Adam and AdamW (TF's LazyAdam, PyTorch's SparseAdam, MXNet's
``lazy_update`` Adam): the moments of untouched rows are left alone."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._hparams import (
    NONNEG,
    UNIT,
    check_inexact_dtype,
    check_lazy,
    check_learning_rate,
    check_number,
)
from ._transforms import scale_by_learning_rate
from ._tree import (
    abs_sq,
    apply_rule,
    check_dense_params,
    check_state,
    known_zero,
    map_updates,
    weight_decay_needs_params,
    zeros_like_params,
)


class ScaleByLazyAdamState(NamedTuple):
    """State of :func:`scale_by_lazy_adam`.

    Attributes:
      count: the global step count (``int32``), advanced on every call.
      mu: first moments, dense arrays shaped like the parameters.
      nu: second moments, dense arrays shaped like the parameters.
    """

    count: jax.Array
    mu: Any
    nu: Any


def scale_by_lazy_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    lazy: bool = True,
    *,
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adam's direction (``optax.scale_by_adam``) restricted to the listed rows.

    One global ``count`` is advanced on every call. For each processed row
    ``r`` (the listed rows of a RowSparse gradient with ``lazy=True``; every
    row of a dense gradient or with ``lazy=False``)::

        mu_r = b1 * mu_r + (1 - b1) * g_r
        nu_r = b2 * nu_r + (1 - b2) * g_r**2
        u_r = (mu_r / (1 - b1**count)) / (sqrt(nu_r / (1 - b2**count) + eps_root) + eps)

    Untouched rows keep ``mu`` and ``nu`` and get no update (no decay, no
    ``eps`` term). Bias correction uses the global count, as LazyAdam does.
    ``eps`` is added where optax adds it, to the bias-corrected root; PyTorch's
    ``SparseAdam`` and TF's ``LazyAdam`` add it before the correction (an
    effective ``eps / sqrt(1 - b2**count)``), the only difference from them.

    Args:
      b1: first-moment decay, in [0, 1).
      b2: second-moment decay, in [0, 1).
      eps: term added to the denominator outside the square root (>= 0).
      eps_root: term added inside the square root (>= 0).
      lazy: True updates only listed rows of RowSparse gradients; False
        densifies them (exactly ``optax.scale_by_adam``).
      mu_dtype: dtype of the first moments, as in ``optax.scale_by_adam``
        (e.g. ``jnp.float32`` for bfloat16 parameters); default the
        parameters' dtype.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> tx = jsr.optim.scale_by_lazy_adam()
      >>> state = tx.init(jnp.zeros((3, 2)))
      >>> u, state = tx.update(jsr.RowSparse([[2., -2.]], [1], shape=(3, 2)), state)
      >>> u.data.round(4), state.count
      (Array([[ 1., -1.]], dtype=float32), Array(1, dtype=int32))
    """
    lazy = check_lazy(lazy, (True, False), "scale_by_lazy_adam")
    return _adam_direction(b1, b2, eps, eps_root, lazy, mu_dtype, None)


def _adam_direction(
    b1: float,
    b2: float,
    eps: float,
    eps_root: float,
    lazy: bool,
    mu_dtype: Any,
    weight_decay: Any,
) -> optax.GradientTransformation:
    """:func:`scale_by_lazy_adam`, with ``weight_decay * w_r`` added to each
    processed row's update when ``weight_decay`` is not None: AdamW's
    ``add_decayed_weights`` folded into the row rule, so each listed row of the
    parameter is read with the moments (one fused kernel on a GPU) rather
    than gathered again afterwards. The arithmetic is the chained one's."""
    check_number("b1", b1, UNIT)
    check_number("b2", b2, UNIT)
    check_number("eps", eps, NONNEG)
    check_number("eps_root", eps_root, NONNEG)
    mu_dtype = check_inexact_dtype("mu_dtype", mu_dtype)
    decays = not known_zero(weight_decay)

    def init_fn(params):
        check_dense_params(params, "scale_by_lazy_adam")
        return ScaleByLazyAdamState(
            count=jnp.zeros([], jnp.int32),
            mu=zeros_like_params(params, mu_dtype),
            nu=zeros_like_params(params),
        )

    def update_fn(updates, state, params=None):
        check_state(state, ScaleByLazyAdamState, "scale_by_lazy_adam")
        if decays and params is None:
            raise weight_decay_needs_params("lazy_adamw", weight_decay)
        count = optax.safe_increment(state.count)
        c1, c2 = 1 - jnp.array([b1, b2]) ** count  # one fusion for both corrections

        def rule(g, states, p):
            mu, nu = states
            mu = (1 - b1) * g + b1 * mu
            nu = (1 - b2) * abs_sq(g) + b2 * nu
            mu_hat = mu / c1.astype(mu.dtype)
            nu_hat = nu / c2.astype(nu.dtype)
            u = mu_hat / (jnp.sqrt(nu_hat + eps_root) + eps)
            return (u if p is None else u + weight_decay * p), [mu, nu]

        def leaf(path, g, mu, nu, p):
            u, (mu, nu) = apply_rule(path, g, [mu, nu], p, rule, lazy=lazy, fused="adam")
            return u, mu, nu

        names = ("updates", "state.mu", "state.nu", "params")
        params = params if decays else None
        updates, mu, nu = map_updates(
            leaf, updates, state.mu, state.nu, params, n_out=3, names=names
        )
        return updates, ScaleByLazyAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(init_fn, update_fn)


def lazy_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    lazy: bool = True,
    *,
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
    """Adam that updates only the rows a RowSparse gradient lists.

    ``chain(scale_by_lazy_adam(...), scale_by_learning_rate(learning_rate))``,
    as ``optax.adam`` is built. Dense gradient leaves get plain Adam. With
    every row listed at every step it equals ``optax.adam``; with
    ``lazy=False`` it equals ``optax.adam`` fed the densified gradient.

    Args:
      learning_rate: a float or an optax schedule.
      b1: first-moment decay, in [0, 1).
      b2: second-moment decay, in [0, 1).
      eps: term added to the denominator outside the square root (>= 0).
      eps_root: term added inside the square root (>= 0).
      lazy: True (lazy rows) or False (dense-equivalent).
      mu_dtype: dtype of the first moments (``optax.adam``'s ``mu_dtype``);
        default the parameters' dtype.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp, numpy as np
      >>> params = {"emb": jnp.zeros((4, 2)), "bias": jnp.zeros(2)}
      >>> grads = {"emb": jsr.RowSparse([[1., -1.]], [2], shape=(4, 2)),
      ...          "bias": jnp.array([1., 0.])}
      >>> opt = jsr.optim.lazy_adam(0.1)
      >>> updates, state = opt.update(grads, opt.init(params))
      >>> np.asarray(jsr.optim.apply_updates(params, updates)["emb"]).round(4)
      array([[ 0. ,  0. ],
             [ 0. ,  0. ],
             [-0.1,  0.1],
             [ 0. ,  0. ]], dtype=float32)
    """
    check_learning_rate(learning_rate)
    lazy = check_lazy(lazy, (True, False), "lazy_adam")
    return optax.chain(
        scale_by_lazy_adam(b1, b2, eps, eps_root, lazy, mu_dtype=mu_dtype),
        scale_by_learning_rate(learning_rate),
    )


def lazy_adamw(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    lazy: bool = True,
    *,
    mu_dtype: Any = None,
) -> optax.GradientTransformation:
    """AdamW (decoupled weight decay, as ``optax.adamw``) on the listed rows.

    What ``chain(scale_by_lazy_adam, add_decayed_weights(weight_decay, lazy),
    scale_by_learning_rate)`` computes, with that chain's state: touched rows
    get ``-lr * (u_r + wd * w_r)``; untouched rows are not decayed when
    ``lazy=True`` and are decayed (``-lr * wd * w_r``) when ``lazy=False``.
    The decay is added inside Adam's row rule, so each listed row of the
    parameter is read along with its moments (on a GPU, in the same fused
    kernel). Needs ``params`` in ``update``.

    Args:
      learning_rate: a float or an optax schedule.
      b1: first-moment decay, in [0, 1).
      b2: second-moment decay, in [0, 1).
      eps: term added to the denominator outside the square root (>= 0).
      eps_root: term added inside the square root (>= 0).
      weight_decay: decoupled weight decay coefficient.
      lazy: True (lazy rows) or False (dense-equivalent).
      mu_dtype: dtype of the first moments; default the parameters' dtype.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp, numpy as np
      >>> w = jnp.ones((3, 1))
      >>> opt = jsr.optim.lazy_adamw(0.1, weight_decay=0.5)
      >>> u, _ = opt.update(jsr.RowSparse([[1.]], [0], shape=(3, 1)), opt.init(w), w)
      >>> np.asarray(jsr.optim.apply_updates(w, u)[:, 0]).round(4)
      array([0.85, 1.  , 1.  ], dtype=float32)
    """
    check_learning_rate(learning_rate)
    lazy = check_lazy(lazy, (True, False), "lazy_adamw")
    check_number("weight_decay", weight_decay, none_ok=True)
    # The decay runs inside Adam's row rule; the middle slot keeps the state
    # of the three-transform chain (its EmptyState), so states and checkpoints
    # are those of chain(scale_by_lazy_adam, add_decayed_weights, ...).
    return optax.chain(
        _adam_direction(b1, b2, eps, eps_root, lazy, mu_dtype, weight_decay),
        optax.identity(),
        scale_by_learning_rate(learning_rate),
    )
