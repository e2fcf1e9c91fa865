"""Gradient accumulation over micro-batches (``optax.MultiSteps``) with
row-sparse accumulators of a static capacity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._dtypes import index_dtype
from ._hparams import check_transformation, describe
from ._tree import (
    RowSparse,
    check_inexact,
    check_like,
    check_state,
    is_rowsparse,
    map_updates,
    path_name,
)


class MultiStepsState(NamedTuple):
    """State of :class:`MultiSteps`.

    Attributes:
      mini_step: micro-batches accumulated in the current window (``int32``).
      gradient_step: windows completed so far (``int32``, saturating).
      inner_opt_state: the wrapped optimizer's state.
      acc_grads: the gradients summed over the window: a RowSparse of the
        leaf's capacity for a table given a capacity, a dense array otherwise.
      overflowed: whether the current window listed more distinct rows than
        some accumulator's capacity holds (``bool``).
      skipped: windows whose update was skipped because they overflowed
        (``int32``, saturating).
    """

    mini_step: jax.Array
    gradient_step: jax.Array
    inner_opt_state: Any
    acc_grads: Any
    overflowed: jax.Array
    skipped: jax.Array


def _empty_rows(param: Any, capacity: int) -> RowSparse:
    shape = tuple(jnp.shape(param))
    dtype = jnp.result_type(param)
    return RowSparse._make(
        jnp.zeros((capacity, *shape[1:]), dtype),
        jnp.full((capacity,), shape[0], index_dtype()),
        shape,
    )


def _check_capacity(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if value >= 0:
            return int(value)
    raise TypeError(
        "`capacity` must be None (a dense accumulator), an int >= 0 (the most distinct rows "
        "a window of micro-batches may list), or a pytree prefix of `params` of those, got "
        f"{describe(value)} in it."
    )


def _zeros_like_updates(x: Any) -> Any:
    if is_rowsparse(x):
        return RowSparse._make(
            jnp.zeros(x.data.shape, x.data.dtype),
            jnp.full(x.indices.shape, x.shape[0], x.indices.dtype),
            x.shape,
        )
    return jnp.zeros(x.shape, x.dtype)


def _empty_like(acc: Any) -> Any:
    return _zeros_like_updates(acc)


class MultiSteps:
    """``optax.MultiSteps`` for row-sparse gradients: accumulate k micro-batches, then update.

    Each call adds the gradient to an accumulator and returns zero updates,
    except every ``k``-th call (``k = every_k_schedule(gradient_step)``), which
    hands ``opt`` the mean (``use_grad_mean=True``) or the sum of the window's
    gradients and returns its updates, then empties the accumulators. As in
    ``optax.MultiSteps``, ``opt``'s state (its step count included) moves once
    per window.

    A leaf given an int in ``capacity`` keeps a RowSparse accumulator of that
    many row slots (memory ``capacity x D`` instead of the table's ``V x D``)
    and takes RowSparse gradients: the window's gradient lists every row any
    micro-batch listed, with the rows of repeated ids summed, so a lazy
    optimizer updates exactly those rows (the lazy rule applied to the
    window's gradient ``jsr.add(g_1, ..., g_k) / k``). A leaf given ``None``
    keeps a dense accumulator, as optax, and takes dense gradients. A
    RowSparse gradient for a dense accumulator, or a dense one for a
    row-sparse accumulator, raises ``TypeError`` when traced: densifying it
    would make a lazy optimizer update every row.

    **Overflow.** A window may list more distinct rows than ``capacity``
    holds. When the ids are concrete (eager calls) this raises
    ``ValueError`` naming the leaf and the rows needed. Under ``jax.jit``
    the window is marked ``overflowed``: its update is skipped (zero
    updates, ``opt``'s state unchanged), ``state.skipped`` counts it, and the
    next window starts empty. No row is dropped from an update that is
    applied. A capacity of ``k`` times the gradients' capacity never
    overflows.

    Args:
      opt: the optimizer to run once per window, e.g. ``jsr.optim.lazy_adam(1e-3)``.
      every_k_schedule: ``k``, an int >= 1, or a function of the window count
        ``gradient_step`` returning it (as ``optax.MultiSteps``).
      use_grad_mean: give ``opt`` the window's mean gradient (True) or its
        sum (False).
      capacity: an int >= 0, None, or a pytree prefix of ``params`` of them:
        the row slots of each leaf's accumulator, None for a dense one.

    Example:
      >>> import jax.numpy as jnp, numpy as np, jaxsparse_rows as jsr
      >>> params = {"emb": jnp.zeros((6, 2)), "w": jnp.zeros(2)}
      >>> opt = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(1.0), 2,
      ...                            capacity={"emb": 4, "w": None})
      >>> state = opt.init(params)
      >>> g1 = {"emb": jsr.RowSparse([[2., 2.]], [1], shape=(6, 2)), "w": jnp.ones(2)}
      >>> g2 = {"emb": jsr.RowSparse([[4., 4.]], [3], shape=(6, 2)), "w": jnp.ones(2)}
      >>> u, state = opt.update(g1, state, params)
      >>> int(u["emb"].nnz_rows)                     # a mid-window call: zero updates
      0
      >>> u, state = opt.update(g2, state, params)
      >>> np.asarray(u["emb"].indices[:2]), np.asarray(u["emb"].data[:2])
      (array([1, 3], dtype=int32), array([[-1., -1.],
             [-2., -2.]], dtype=float32))
    """

    def __init__(
        self,
        opt: optax.GradientTransformation,
        every_k_schedule: int | Callable[[jax.Array], jax.Array],
        use_grad_mean: bool = True,
        *,
        capacity: Any = None,
    ):
        check_transformation("opt", opt)
        if not callable(every_k_schedule):
            ok = isinstance(every_k_schedule, (int, np.integer)) and not isinstance(
                every_k_schedule, (bool, np.bool_)
            )
            if not ok or every_k_schedule < 1:
                raise ValueError(
                    "`every_k_schedule` must be an int >= 1 (micro-batches per update) or a "
                    f"function of the window count, got {describe(every_k_schedule)}."
                )
        if not isinstance(use_grad_mean, (bool, np.bool_)):
            raise TypeError(f"`use_grad_mean` must be a bool, got {describe(use_grad_mean)}.")
        jax.tree.map(_check_capacity, capacity, is_leaf=lambda x: x is None)
        self._opt = opt
        self._every_k_schedule = every_k_schedule
        self._use_grad_mean = bool(use_grad_mean)
        self._capacity = capacity

    @property
    def inner_opt(self) -> optax.GradientTransformation:
        """The wrapped optimizer."""
        return self._opt

    def _k(self, gradient_step: jax.Array) -> jax.Array:
        if callable(self._every_k_schedule):
            return jnp.asarray(self._every_k_schedule(gradient_step), jnp.int32)
        return jnp.asarray(self._every_k_schedule, jnp.int32)

    def init(self, params: Any) -> MultiStepsState:
        """The initial state: empty accumulators and ``opt.init(params)``."""

        def accumulators(cap, sub):
            cap = _check_capacity(cap)

            def one(p):
                if p is None:
                    return None
                if cap is None:
                    return jnp.zeros(jnp.shape(p), jnp.result_type(p))
                if jnp.ndim(p) < 1:
                    raise ValueError(
                        f"`capacity` gives a scalar parameter {cap} row slots; row-sparse "
                        "accumulators are for tables ([V, ...]). Give it None."
                    )
                return _empty_rows(p, cap)

            return jax.tree.map(one, sub, is_leaf=lambda x: x is None)

        try:
            acc = jax.tree.map(accumulators, self._capacity, params, is_leaf=lambda x: x is None)
        except ValueError as err:
            if "capacity" in str(err):
                raise
            raise ValueError(
                "`capacity` must be an int, None, or a pytree prefix of `params` (the same "
                f"keys, with an int or None where a subtree is): got {self._capacity!r} for "
                f"parameters of structure {jax.tree.structure(params)}."
            ) from None
        zero = jnp.zeros([], jnp.int32)
        return MultiStepsState(
            mini_step=zero,
            gradient_step=zero,
            inner_opt_state=self._opt.init(params),
            acc_grads=acc,
            overflowed=jnp.zeros([], jnp.bool_),
            skipped=zero,
        )

    def _accumulate(self, updates: Any, acc_grads: Any) -> tuple[Any, jax.Array]:
        def leaf(path, g, acc):
            check_inexact(path, g)
            name = path_name(path)
            if is_rowsparse(acc):
                if not is_rowsparse(g):
                    raise TypeError(
                        f"`MultiSteps` keeps a row-sparse accumulator of capacity "
                        f"{acc.capacity} for `{name}`, but its gradient is dense: pass the "
                        "RowSparse gradient of a `pull_rows` view, or give this leaf "
                        "`capacity=None` for a dense accumulator."
                    )
                check_like(path, g, acc, "accumulator")
                total = acc + g.astype(acc.dtype)
                cap = acc.capacity
                over = total.nnz_rows > cap
                if not isinstance(over, jax.core.Tracer) and bool(over):
                    raise ValueError(
                        f"`MultiSteps`: the micro-batches of this window list "
                        f"{int(total.nnz_rows)} distinct rows of `{name}`, more than its "
                        f"accumulator's `capacity` of {cap}. Give it a capacity of at least "
                        "the distinct rows of a window (k times the gradients' capacity "
                        "always suffices). Under `jax.jit` such a window's update is skipped "
                        "and counted in `state.skipped`."
                    )
                # the accumulator's id dtype, whatever the gradient's: the state keeps its type
                ids = total.indices[:cap].astype(acc.indices.dtype)
                kept = RowSparse._make(total.data[:cap], ids, acc.shape)
                return kept, over
            if is_rowsparse(g):
                raise TypeError(
                    f"`MultiSteps` keeps a dense accumulator for `{name}` (its capacity is "
                    "None), but its gradient is a RowSparse: densifying it would make a lazy "
                    f"optimizer update every row. Give `{name}` a capacity, e.g. "
                    "`capacity={'emb': k * grads['emb'].capacity, ...}`."
                )
            check_like(path, g, acc, "accumulator")
            return acc + jnp.asarray(g).astype(acc.dtype), jnp.zeros([], jnp.bool_)

        names = ("updates", "state.acc_grads")
        acc, over = map_updates(leaf, updates, acc_grads, n_out=2, names=names)
        flags = [f for f in jax.tree.leaves(over) if getattr(f, "dtype", None) == jnp.bool_]
        overflowed = jnp.any(jnp.stack(flags)) if flags else jnp.zeros([], jnp.bool_)
        return acc, overflowed

    def update(
        self, updates: Any, state: MultiStepsState, params: Any = None
    ) -> tuple[Any, MultiStepsState]:
        """Accumulates ``updates``; on the window's last call runs ``opt``.

        Args:
          updates: the micro-batch's gradients (RowSparse for leaves with a
            capacity, dense otherwise).
          state: the state from :meth:`init` or the previous call.
          params: the current parameters (passed to ``opt`` on the last call).

        Returns:
          ``(updates, state)``: zero updates until the window is complete,
          then ``opt``'s updates.
        """
        check_state(state, MultiStepsState, "MultiSteps")
        acc, over = self._accumulate(updates, state.acc_grads)
        overflowed = state.overflowed | over
        k = self._k(state.gradient_step)
        emit = state.mini_step + 1 >= k

        def scaled(a):
            if not self._use_grad_mean:
                return a
            if is_rowsparse(a):
                return RowSparse._make(a.data / k.astype(a.dtype), a.indices, a.shape)
            return a / k.astype(a.dtype)

        grads = jax.tree.map(scaled, acc, is_leaf=is_rowsparse)

        def run(inner_state):
            return self._opt.update(grads, inner_state, params)

        def hold(inner_state):
            shapes = jax.eval_shape(run, inner_state)[0]
            zeros = jax.tree.map(_zeros_like_updates, shapes, is_leaf=is_rowsparse)
            return zeros, inner_state

        new_updates, inner_state = jax.lax.cond(
            emit & ~overflowed, run, hold, state.inner_opt_state
        )
        acc = jax.tree.map(
            lambda a: jax.tree.map(lambda x, e: jnp.where(emit, e, x), a, _empty_like(a)),
            acc,
            is_leaf=is_rowsparse,
        )
        skipped = jnp.where(emit & overflowed, optax.safe_increment(state.skipped), state.skipped)
        return new_updates, MultiStepsState(
            mini_step=jnp.where(emit, 0, state.mini_step + 1).astype(jnp.int32),
            gradient_step=jnp.where(
                emit, optax.safe_increment(state.gradient_step), state.gradient_step
            ),
            inner_opt_state=inner_state,
            acc_grads=acc,
            overflowed=jnp.where(emit, False, overflowed),
            skipped=skipped,
        )

    @staticmethod
    def has_updated(state: MultiStepsState) -> jax.Array:
        """Whether the last call completed a window (and ran ``opt``, unless it overflowed)."""
        return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> optax.GradientTransformation:
        """``self`` as an ``optax.GradientTransformation`` (``init``, ``update``)."""
        return optax.GradientTransformation(init=self.init, update=self.update)
