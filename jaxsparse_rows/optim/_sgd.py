"""Lazy SGD with momentum, Nesterov momentum and coupled weight decay."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._exact import exact_lazy_sgd
from ._hparams import check_lazy, check_learning_rate, check_sgd_hparams
from ._transforms import scale_by_learning_rate
from ._tree import (
    apply_rule,
    check_dense_params,
    check_like,
    check_state,
    known_one,
    known_zero,
    map_updates,
    weight_decay_needs_params,
    zeros_like_params,
)


class ScaleByLazySgdState(NamedTuple):
    """State of :func:`scale_by_lazy_sgd`.

    Attributes:
      trace: the momentum buffers, dense arrays shaped like the parameters
        (``None`` leaves when ``momentum`` is ``None`` or a host scalar 0).
    """

    trace: Any


def _no_buffer(momentum: Any) -> bool:
    """True when ``momentum`` is off for good: ``None`` or a host scalar 0.

    ``optax.inject_hyperparams`` passes its hyperparameters as JAX arrays, and
    may raise an injected 0 later, so an array keeps its momentum buffer (as
    ``optax.sgd`` keeps its trace for any ``momentum`` that is not ``None``).
    """
    if momentum is None:
        return True
    if isinstance(momentum, (int, float, np.generic)):
        return float(momentum) == 0.0
    return False


def scale_by_lazy_sgd(
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lazy: bool = True,
) -> optax.GradientTransformation:
    """The SGD direction (before the learning rate), lazily on RowSparse gradients.

    For each gradient row ``r`` that is processed (the listed rows of a
    RowSparse gradient with ``lazy=True``; every row otherwise)::

        g = clip(rescale_grad * g_r, -clip_gradient, clip_gradient) + weight_decay * w_r
        m_r = momentum * m_r + g          # when momentum > 0
        u_r = m_r                          # or g + momentum * m_r with nesterov

    Args:
      momentum: momentum decay (>= 0). ``None`` or a Python / NumPy scalar 0
        disables the momentum buffer; a JAX array keeps it even when 0 (so a
        momentum injected by ``optax.inject_hyperparams`` can be raised later).
      nesterov: Nesterov momentum, as ``optax.trace(nesterov=True)``.
      weight_decay: coupled (L2) weight decay; needs ``params`` in ``update``.
      rescale_grad: factor applied to the gradient before clipping.
      clip_gradient: clip each gradient element to ``[-c, c]``, ``c > 0``
        (None: off).
      lazy: True updates only listed rows for RowSparse gradients; False
        densifies them (optax semantics).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> tx = jsr.optim.scale_by_lazy_sgd(momentum=0.5)
      >>> state = tx.init(jnp.zeros((3, 1)))
      >>> g = jsr.RowSparse([[2.]], [1], shape=(3, 1))
      >>> u, state = tx.update(g, state)
      >>> u, state = tx.update(g, state)
      >>> u.data, state.trace[:, 0]
      (Array([[3.]], dtype=float32), Array([0., 3., 0.], dtype=float32))
    """
    lazy = check_lazy(lazy, (True, False), "scale_by_lazy_sgd")
    nesterov = check_sgd_hparams(momentum, nesterov, weight_decay, rescale_grad, clip_gradient)
    decay = not known_zero(weight_decay)

    def init_fn(params):
        check_dense_params(params, "scale_by_lazy_sgd")
        if _no_buffer(momentum):
            return ScaleByLazySgdState(trace=jax.tree.map(lambda _: None, params))
        return ScaleByLazySgdState(trace=zeros_like_params(params))

    def rule(g, states, w):
        if not known_one(rescale_grad):
            g = rescale_grad * g
        if clip_gradient is not None:
            g = jnp.clip(g, -clip_gradient, clip_gradient)
        if decay:
            g = g + weight_decay * w
        if not states:  # no momentum buffer (momentum 0 at init)
            return g, []
        (m,) = states
        m = momentum * m + g
        u = g + momentum * m if nesterov else m
        return u, [m]

    def update_fn(updates, state, params=None):
        check_state(state, ScaleByLazySgdState, "scale_by_lazy_sgd")
        if decay and params is None:
            raise weight_decay_needs_params("lazy SGD with weight_decay", weight_decay)

        def leaf(path, g, m, p):
            states = [] if m is None else [m]
            if p is not None:
                check_like(path, g, p)
            w = p if decay else None
            u, new = apply_rule(path, g, states, w, rule, lazy=lazy, fused="sgd")
            return u, (new[0] if new else None)

        names = ("updates", "state.trace", "params")
        updates, trace = map_updates(leaf, updates, state.trace, params, n_out=2, names=names)
        return updates, ScaleByLazySgdState(trace=trace)

    return optax.GradientTransformation(init_fn, update_fn)


def lazy_sgd(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    rescale_grad: float = 1.0,
    clip_gradient: float | None = None,
    lazy: bool | str = True,
) -> optax.GradientTransformation:
    """SGD that updates only the rows a RowSparse gradient lists (MXNet ``lazy_update``).

    ``w_r -= learning_rate * u_r`` with ``u_r`` from :func:`scale_by_lazy_sgd`.
    Dense gradient leaves get the ordinary dense rule. With ``lazy=True``
    untouched rows keep their weights and momentum (momentum does not decay,
    weight decay does not act); ``lazy=False`` gives exactly the dense update
    (``optax.sgd`` fed the densified gradient); ``lazy="exact"`` replays the
    skipped steps in closed form when a row is touched again, equal to
    ``lazy=False`` to float tolerance at lazy cost (see :func:`flush`).

    Args:
      learning_rate: a float or an optax schedule.
      momentum: momentum decay (>= 0). ``None`` or a Python / NumPy scalar 0
        disables the momentum buffer; a JAX array keeps it even when 0 (see
        :func:`scale_by_lazy_sgd`).
      nesterov: Nesterov momentum.
      weight_decay: coupled (L2) weight decay; needs ``params`` in ``update``.
      rescale_grad: factor applied to the gradient before clipping.
      clip_gradient: clip each gradient element to ``[-c, c]``, ``c > 0``
        (None: off).
      lazy: True, False or ``"exact"``.

    Returns:
      An ``optax.GradientTransformation``.

    Example (the MXNet tutorial's lazy SGD step):
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> w = jnp.ones((4, 2))
      >>> g = jsr.RowSparse([[1., 2.], [4., 5.]], [1, 2], shape=(4, 2))
      >>> opt = jsr.optim.lazy_sgd(0.01, momentum=0.01)
      >>> u, state = opt.update(g, opt.init(w), w)
      >>> jsr.optim.apply_updates(w, u)
      Array([[1.  , 1.  ],
             [0.99, 0.98],
             [0.96, 0.95],
             [1.  , 1.  ]], dtype=float32)
    """
    check_learning_rate(learning_rate)
    lazy = check_lazy(lazy, (True, False, "exact"), "lazy_sgd")
    if lazy == "exact":
        return exact_lazy_sgd(
            learning_rate, momentum, nesterov, weight_decay, rescale_grad, clip_gradient
        )
    return optax.chain(
        scale_by_lazy_sgd(momentum, nesterov, weight_decay, rescale_grad, clip_gradient, lazy),
        scale_by_learning_rate(learning_rate),
    )
