"""Checks of optimizer hyperparameters and flags, run when an optimizer is built.

Host values (Python and NumPy numbers) are checked at once, so a bad value
fails at construction with the argument's name instead of turning the
updates into NaN steps later. JAX arrays (what ``optax.inject_hyperparams``
passes, traced under ``jit``) are checked for shape and dtype only and never
read, as :func:`~jaxsparse_rows.optim._tree.known_zero` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._args import check_flag


class Range(NamedTuple):
    """An allowed range of a hyperparameter: its description and its test."""

    text: str
    ok: Callable[[float], bool]


FINITE = Range("a finite number", math.isfinite)
NONNEG = Range("a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
POSITIVE = Range("a finite number > 0", lambda v: math.isfinite(v) and v > 0)
UNIT = Range("a number in [0, 1)", lambda v: 0 <= v < 1)
ABOVE_ZERO = Range("a number > 0", lambda v: v > 0)  # inf allowed: no limit

_KINDS = "a Python or NumPy scalar, or a 0-d JAX array"


def describe(value: Any) -> str:
    """How an error shows a received value: its repr (short) and its type."""
    if isinstance(value, (jax.Array, np.ndarray)):
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _is_real(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)


def _host_value(name: str, value: Any, expected: str) -> float | None:
    """``value`` as a float when it is a host number, None when it is a JAX
    scalar (not read); TypeError for anything else."""
    if isinstance(value, (jax.Array, jax.core.Tracer)):
        if jnp.ndim(value) == 0 and _is_real(value.dtype):
            return None
    elif isinstance(value, (int, float, np.integer, np.floating, np.ndarray)) and not isinstance(
        value, (bool, np.bool_)
    ):
        if jnp.ndim(value) == 0 and _is_real(np.result_type(value)):
            try:
                return float(value)
            except OverflowError:  # a huge Python int
                return math.inf
    raise TypeError(f"`{name}` must be {expected}, got {describe(value)}.")


def check_number(
    name: str,
    value: Any,
    allowed: Range = FINITE,
    *,
    none_ok: bool = False,
    schedule_ok: bool = False,
    why: str = "",
) -> None:
    """Raises unless ``value`` is a real scalar in ``allowed`` (host values only).

    Args:
      name: the argument's name, for the error.
      value: the hyperparameter.
      allowed: the allowed range of a host value.
      none_ok: accept ``None`` (the term is off).
      schedule_ok: accept a callable (an optax schedule ``count -> value``).
      why: a parenthetical reason appended to the range in the error.

    Raises:
      TypeError: ``value`` is not a number (a string, None, a non-scalar array...).
      ValueError: ``value`` is a host number outside ``allowed``.
    """
    if (none_ok and value is None) or (schedule_ok and callable(value)):
        return
    others = (", or None" if none_ok else "") + (", or an optax schedule" if schedule_ok else "")
    v = _host_value(name, value, f"{allowed.text} ({_KINDS}){others}")
    if v is not None and not allowed.ok(v):
        raise ValueError(f"`{name}` must be {allowed.text}{why}{others}, got {value!r}.")


def check_learning_rate(value: Any, allowed: Range = FINITE, why: str = "") -> None:
    """``learning_rate``: a number in ``allowed`` (finite by default) or a schedule."""
    check_number("learning_rate", value, allowed, schedule_ok=True, why=why)


def check_clip(clip_gradient: Any) -> None:
    """``clip_gradient`` must be None (off) or positive; MXNet's ``-1`` (off)
    would clip every element to ``[1, -1]``, i.e. to ``-1``."""
    if clip_gradient is None:
        return
    v = _host_value("clip_gradient", clip_gradient, f"a number > 0 ({_KINDS}), or None")
    if v is not None and not v > 0:
        raise ValueError(
            f"`clip_gradient` must be > 0, or None to turn clipping off, got {clip_gradient!r} "
            "(MXNet's `clip_gradient=-1` means off: pass None)."
        )


def check_inexact_dtype(name: str, value: Any) -> Any:
    """``None``, or ``value`` as a floating (or complex) dtype, canonicalized."""
    if value is None:
        return None
    try:
        dtype = jax.dtypes.canonicalize_dtype(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"`{name}` must be None or a floating dtype (e.g. `jnp.float32`), got "
            f"{describe(value)}, which is not a dtype."
        ) from None
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(
            f"`{name}` must be None or a floating dtype (e.g. `jnp.float32`), got {dtype}: "
            "optimizer state in it would be truncated."
        )
    return dtype


def check_transformation(name: str, value: Any) -> None:
    """``value`` must be an optax ``GradientTransformation`` (``init`` and ``update``)."""
    if callable(getattr(value, "init", None)) and callable(getattr(value, "update", None)):
        return
    raise TypeError(
        f"`{name}` must be an optax GradientTransformation (with `init` and `update`), "
        f"got {describe(value)}."
    )


def check_lazy(lazy: Any, allowed: tuple[Any, ...], name: str) -> bool | str:
    """``lazy`` as one of ``allowed`` (a numpy bool counts as a bool, as
    :func:`check_flag` takes it); a ValueError naming ``name`` otherwise."""
    if isinstance(lazy, np.bool_):
        lazy = bool(lazy)
    if not any(type(lazy) is type(a) and lazy == a for a in allowed):
        raise ValueError(f"`lazy` must be one of {allowed} for `{name}`, got {lazy!r}.")
    return lazy


def check_sgd_hparams(
    momentum: Any, nesterov: Any, weight_decay: Any, rescale_grad: Any, clip_gradient: Any
) -> bool:
    """Checks SGD's hyperparameters (see :mod:`._hparams`); returns ``nesterov``."""
    check_number("momentum", momentum, NONNEG, none_ok=True)
    check_number("weight_decay", weight_decay, none_ok=True)
    check_number("rescale_grad", rescale_grad)
    check_clip(clip_gradient)
    return check_flag(nesterov, "nesterov")
