"""Coercion and checks of user arguments (ids, data, static sizes, flags),
and of values that are checked eagerly when concrete and through
``checkify`` under a trace."""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def is_concrete(*xs: Any) -> bool:
    """True when every argument has a value known now (not a tracer)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool; a TypeError naming ``name`` unless it is one
    (a string such as ``"false"`` is truthy, so it would mean the opposite)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"`{name}` must be True or False, got {type(value).__name__} {value!r}.")


def as_int_array(x: Any, name: str, dtype: Any = None, *, host: bool = False) -> Any:
    """``x`` as an integer JAX array of ``dtype`` (default: its own dtype,
    canonicalised), for ids and indices given by a caller.

    Raises ``TypeError`` for a non-integer dtype and ``ValueError`` for a
    concrete value that the conversion would wrap (a 64-bit id when x64 is off),
    naming ``name``. ``[]`` (float64 to numpy) is taken as an empty int array.
    With ``host=True`` host input comes back as a numpy array, so that its
    values can be checked inside ``jit`` too (``jnp.asarray`` would trace it).
    """
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
        if x.size == 0 and x.dtype == np.float64:
            x = x.astype(np.int64)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"`{name}` must have an integer dtype, got {x.dtype}.")
    target = jnp.dtype(jax.dtypes.canonicalize_dtype(x.dtype if dtype is None else dtype))
    src, info = np.iinfo(x.dtype), np.iinfo(target)
    narrows = src.min < info.min or src.max > info.max  # int32 -> int64 cannot wrap
    if narrows and x.size and is_concrete(x):
        values = np.asarray(x)
        bad = (values < info.min) | (values > info.max)
        if np.any(bad):
            hint = "" if jax.config.jax_enable_x64 else " (enable jax_enable_x64 for 64-bit ids)"
            raise ValueError(
                f"`{name}` must fit in {target.name}{hint}, got {int(values[bad][0])}."
            )
    if host and isinstance(x, np.ndarray):
        return x.astype(target, copy=False)
    if isinstance(x, jax.Array) and x.dtype == target:
        return x  # jnp.asarray would dispatch a no-op conversion (about 13 us)
    return jnp.asarray(x, dtype=target)


def check_static_int(value: Any, name: str, *, minimum: int = 0) -> int:
    """``value`` as a Python int ``>= minimum``, for a static argument such as a
    capacity: errors name ``name``.

    Takes what ``operator.index`` takes (a Python or NumPy int, a concrete
    integer JAX scalar); refuses a bool, a float such as ``16.0`` (it would
    hide a computed size that is not whole) and a traced value.

    Example:
      >>> from jaxsparse_rows._args import check_static_int
      >>> check_static_int(16, "capacity")
      16
      >>> check_static_int(16.0, "capacity")
      Traceback (most recent call last):
        ...
      TypeError: `capacity` must be an int >= 0, got float 16.0.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"`{name}` must be a concrete Python int because it fixes an array shape; "
            "got a traced value. Pass it as a static argument (e.g. "
            "`jax.jit(f, static_argnames=...)`) or compute it outside jit."
        )
    expected = f"`{name}` must be an int >= {minimum}"
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        ivalue = operator.index(value)
    except TypeError:
        raise TypeError(f"{expected}, got {type(value).__name__} {value!r}.") from None
    if ivalue < minimum:
        raise ValueError(f"{expected}, got {value!r}.")
    return ivalue


def capacity_check(ok: Any, message: str) -> None:
    """Reports a static-capacity overflow.

    Concrete values raise ``ValueError`` now. Under a trace the check is a
    ``checkify.debug_check``: it does nothing by default, and is an error when
    the caller wraps the function with
    ``checkify.checkify(f, errors=checkify.user_checks)``. It is not free,
    though: a jitted function that contains one carries an error effect, which
    sends every call down JAX's slower dispatch path (about 0.1 ms per call on
    CPU, and up to 1 ms on the embedding benchmark's step). Callers therefore
    emit it only when the capacity can actually overflow.
    """
    if is_concrete(ok):
        if not bool(ok):
            raise ValueError(message)
    else:
        checkify.debug_check(ok, message)


def as_jax(x: Any) -> jax.Array:
    """``x`` as a JAX array; a JAX array (or tracer) as it is, without the
    dispatch ``jnp.asarray`` costs."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def _check_numeric(data: np.ndarray, name: str) -> None:
    """Raise a TypeError naming ``name`` unless ``data`` holds numbers or bools."""
    if not (jnp.issubdtype(data.dtype, jnp.number) or data.dtype == np.bool_):
        raise TypeError(
            f"`{name}` must hold numbers or bools, got an array of dtype {data.dtype} "
            f"({np.ravel(data)[:3].tolist()!r}...)."
        )


def _check_int_range(
    values: np.ndarray, target: np.dtype, name: str, *, x64_hint: bool = False
) -> None:
    """Raise a ValueError naming ``name`` if integer ``values`` would wrap in ``target``."""
    if values.dtype.kind not in "iu" or target.kind not in "iu" or not values.size:
        return
    src, info = np.iinfo(values.dtype), np.iinfo(target)
    if src.min >= info.min and src.max <= info.max:
        return
    bad = (values < info.min) | (values > info.max)
    if np.any(bad):
        hint = " (enable jax_enable_x64 for 64-bit values)" if x64_hint else ""
        raise ValueError(f"`{name}` must fit in {target.name}{hint}, got {values[bad][0]}.")


def as_data(data: Any, dtype: Any = None, *, host: bool = False, name: str = "data") -> Any:
    """``jnp.asarray`` for the values of a sparse array; float64 numpy input (or
    lists of floats) become float32 when x64 is off, without a truncation warning.

    ``dtype`` is canonicalised first (``float`` means float32 when x64 is off).
    With ``host=True`` host input stays a numpy array (no device round trip).
    Errors name the argument ``name``.
    """
    if dtype is not None:
        dtype = jax.dtypes.canonicalize_dtype(dtype)
    if not isinstance(data, jax.Array):
        if dtype is not None and not isinstance(data, np.ndarray):
            # Check the values before converting: numpy turns None into NaN and
            # "1" into 1.0 for a float dtype.
            try:
                _check_numeric(np.asarray(data), name)
            except ValueError as e:  # ragged nesting
                raise ValueError(f"`{name}` could not be converted to an array: {e}") from e
        if dtype is not None and isinstance(data, np.ndarray):
            _check_int_range(data, np.dtype(dtype), name)  # numpy's cast would wrap
        try:
            data = np.asarray(data, dtype=dtype)
        except (ValueError, OverflowError) as e:
            target = "an array" if dtype is None else f"an array of {dtype}"
            raise ValueError(f"`{name}` could not be converted to {target}: {e}") from e
        _check_numeric(data, name)
        if not data.dtype.isnative:  # big-endian input: JAX takes native order only
            data = data.astype(data.dtype.newbyteorder("="))
        if data.dtype == np.float64 and dtype is None and not jax.config.jax_enable_x64:
            data = data.astype(np.float32)
        # int64 becomes int32 when x64 is off: refuse values that would wrap.
        target = np.dtype(jax.dtypes.canonicalize_dtype(data.dtype))
        _check_int_range(data, target, name, x64_hint=True)
        if host:
            return data
    return jnp.asarray(data, dtype=dtype)


def is_shape_tuple(arg: Any) -> bool:
    """True for a tuple of ints (a shape): the MXNet / scipy ``(M, N)`` form
    of a constructor, which builds an empty array."""
    return (
        isinstance(arg, tuple)
        and len(arg) > 0
        and all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in arg)
    )
