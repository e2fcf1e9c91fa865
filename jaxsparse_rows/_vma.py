"""Varying manual axes: the part of an array's type that ``jax.shard_map``
(with ``check_vma=True``, its default) tracks, and this library's primitives
must carry through their forward, JVP and transpose rules.

Inside ``shard_map`` a value is *varying* over a mesh axis when its shards
may differ along it (a table sharded over ``"x"``, anything computed from
``jax.lax.axis_index("x")``) and *invariant* otherwise. JAX's own primitives
make all their operands vary over the same axes (an invariant operand gets a
``pvary``, whose transpose is a ``psum``) and give their results those axes.
The library's primitives do the same through :func:`match_varying` at bind
time and :func:`result_aval` in their abstract evaluation, so that their
gradients get the ``psum`` where JAX's would and no other.
"""

from __future__ import annotations

from typing import Any

import jax


def varying_axes(x: Any) -> frozenset:
    """The manual mesh axes that ``x`` (an array, tracer or abstract value)
    varies over; empty outside ``shard_map``."""
    aval = x if isinstance(x, jax.core.AbstractValue) else jax.typeof(x)
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()))
    return frozenset(getattr(aval, "vma", ()))


def pvary(x: Any, axes: tuple) -> Any:
    """``x`` cast to vary over the manual mesh ``axes`` too (a no-op on the
    values; its transpose sums the cotangent over them)."""
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)  # (JAX releases before ``pcast``)


def vary_over(x: Any, axes: Any) -> Any:
    """``x`` cast to vary over ``axes`` as well (a no-op where it already does)."""
    extra = tuple(sorted(frozenset(axes) - varying_axes(x), key=str))
    return pvary(x, extra) if extra else x


def match_varying(*xs: Any) -> tuple:
    """``xs`` cast to vary over the union of their varying axes (a no-op cast
    of each invariant operand, transposed to a ``psum`` of its cotangent)."""
    axes = [varying_axes(x) for x in xs]
    union = frozenset().union(*axes)
    if not union:
        return xs
    return tuple(
        pvary(x, tuple(sorted(union - a))) if union - a else x
        for x, a in zip(xs, axes, strict=True)
    )


def result_aval(like: Any, shape: tuple, dtype: Any, weak_type: bool = False) -> Any:
    """The abstract value of a primitive's result of ``shape`` and ``dtype``
    whose operands have the varying axes of ``like`` (:func:`match_varying`
    made them equal)."""
    if like is None or not varying_axes(like):
        return jax.core.ShapedArray(shape, dtype, weak_type=weak_type)
    return like.update(shape=tuple(shape), dtype=dtype, weak_type=weak_type)
