"""Non-finite values in row-sparse updates: ``zero_nans`` and ``apply_if_finite``
as optax names them, reading only the real rows and keeping the row ids."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._hparams import check_transformation, describe
from ._transforms import all_finite, zero_like_output
from ._tree import RowSparse, check_state, is_rowsparse, map_updates, mask_rows


class ZeroNansState(NamedTuple):
    """State of :func:`zero_nans` (``optax.ZeroNansState``'s fields).

    Attributes:
      found_nan: one ``bool`` scalar per parameter leaf: whether the last
        update of that leaf held a NaN (in a real row, for a RowSparse one).
    """

    found_nan: Any


def zero_nans() -> optax.GradientTransformation:
    """Replaces NaNs in the updates by zeros (``optax.zero_nans`` for RowSparse updates).

    ``optax.zero_nans`` maps its NaN test over a RowSparse leaf's row ids too,
    so its state becomes a RowSparse of flags after the first step (a jitted
    step compiles again, ``lax.scan`` refuses the carry). This one keeps one
    flag per leaf, as optax does for a dense leaf, tests only the real rows,
    and zeroes NaNs in ``data`` keeping ``indices``.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> g = jsr.RowSparse([[1., jnp.nan]], [2], shape=(4, 2))
      >>> tx = jsr.optim.zero_nans()
      >>> u, state = tx.update(g, tx.init(jnp.zeros((4, 2))))
      >>> u.data, u.indices, state.found_nan
      (Array([[1., 0.]], dtype=float32), Array([2], dtype=int32), Array(True, dtype=bool))
    """

    def init_fn(params):
        flags = jax.tree.map(lambda _: jnp.zeros([], jnp.bool_), params, is_leaf=is_rowsparse)
        return ZeroNansState(found_nan=flags)

    def update_fn(updates, state, params=None):
        del params
        check_state(state, ZeroNansState, "zero_nans")

        def leaf(_, u):
            if is_rowsparse(u):
                data = mask_rows(u.data, u.indices, u.shape[0])
                clean = jnp.where(jnp.isnan(data), jnp.zeros_like(data), data)
                return RowSparse._make(clean, u.indices, u.shape), jnp.any(jnp.isnan(data))
            u = jnp.asarray(u)
            return jnp.where(jnp.isnan(u), jnp.zeros_like(u), u), jnp.any(jnp.isnan(u))

        updates, found = map_updates(leaf, updates, n_out=2)
        # A None update (a frozen parameter) finds no NaN; a flag keeps the
        # state's structure that of `init`.
        found = jax.tree.map(
            lambda f: jnp.zeros([], jnp.bool_) if f is None else f,
            found,
            is_leaf=lambda x: x is None,
        )
        return updates, ZeroNansState(found_nan=found)

    return optax.GradientTransformation(init_fn, update_fn)


class ApplyIfFiniteState(NamedTuple):
    """State of :func:`apply_if_finite` (``optax.ApplyIfFiniteState``'s fields).

    Attributes:
      notfinite_count: consecutive non-finite updates so far (``int32``).
      last_finite: whether the last update was finite (``bool``).
      total_notfinite: non-finite updates in all (``int32``, saturating).
      inner_state: the wrapped transformation's state.
    """

    notfinite_count: jax.Array
    last_finite: jax.Array
    total_notfinite: jax.Array
    inner_state: Any


def apply_if_finite(
    inner: optax.GradientTransformation, max_consecutive_errors: int
) -> optax.GradientTransformation:
    """Ignores updates with NaN or inf values (``optax.apply_if_finite`` for RowSparse updates).

    The rule of ``optax.apply_if_finite``: an update with a non-finite value
    (in a real row, for a RowSparse leaf) leaves ``inner``'s state as it is
    and returns zero updates, until more than ``max_consecutive_errors``
    consecutive ones, which are applied. optax's rejected step returns
    ``optax.tree.zeros_like(updates)``, which sets a RowSparse update's row
    ids to 0 (an invalid RowSparse that eager entry points refuse); this one
    returns RowSparse updates with no real row (padding ids).

    Args:
      inner: the transformation to protect, e.g. ``jsr.optim.lazy_adam(1e-3)``.
      max_consecutive_errors: how many consecutive non-finite updates to
        ignore (an int >= 0).

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jaxsparse_rows as jsr, jax.numpy as jnp
      >>> opt = jsr.optim.apply_if_finite(jsr.optim.lazy_sgd(0.1), 2)
      >>> w = jnp.ones((3, 1))
      >>> u, state = opt.update(jsr.RowSparse([[jnp.inf]], [1], shape=(3, 1)), opt.init(w), w)
      >>> jsr.optim.apply_updates(w, u)[:, 0], state.total_notfinite
      (Array([1., 1., 1.], dtype=float32), Array(1, dtype=int32))
    """
    check_transformation("inner", inner)
    if (
        not isinstance(max_consecutive_errors, int)
        or isinstance(max_consecutive_errors, bool)
        or max_consecutive_errors < 0
    ):
        raise TypeError(
            f"`max_consecutive_errors` must be an int >= 0, got {describe(max_consecutive_errors)}."
        )

    def init_fn(params):
        zero = jnp.zeros([], jnp.int32)
        return ApplyIfFiniteState(zero, jnp.array(True), zero, inner.init(params))

    def update_fn(updates, state, params=None):
        check_state(state, ApplyIfFiniteState, "apply_if_finite")
        finite = all_finite(updates)
        count = jnp.where(finite, 0, optax.safe_increment(state.notfinite_count))

        def run(inner_state):
            return inner.update(updates, inner_state, params)

        def reject(inner_state):
            shapes = jax.eval_shape(run, inner_state)[0]
            return jax.tree.map(zero_like_output, shapes, is_leaf=is_rowsparse), inner_state

        apply = finite | (count > max_consecutive_errors)
        new_updates, inner_state = jax.lax.cond(apply, run, reject, state.inner_state)
        total = jnp.where(
            finite, state.total_notfinite, optax.safe_increment(state.total_notfinite)
        )
        return new_updates, ApplyIfFiniteState(count.astype(jnp.int32), finite, total, inner_state)

    return optax.GradientTransformation(init_fn, update_fn)
