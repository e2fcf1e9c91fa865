"""Row-wise AdaGrad's work on the listed rows, as one native kernel on CPU.

For the rows of a RowSparse gradient, :func:`rowwise_adagrad_rows` adds each
row's mean square to its accumulator and returns the direction
``g / (sqrt(acc) + eps)``, times the learning rate when one is folded in. In
XLA ops that is a gather of the ``[N]`` accumulator, a row reduction, a
scatter back and elementwise passes over the ``[K, ...]`` rows, each a
separate step on XLA:CPU (the reduction of 64-wide rows alone cost more than
the whole fused loop). On CPU it is one pass of
``_native/rowwise_adagrad.cc``, which reads each gradient row from memory
once, and on GPU one Pallas kernel (``_fused_rows.py``) that does the same;
the XLA ops below are the reference both are tested against, the path on
other platforms, for other dtypes and with the kernels off, and they supply
their derivatives.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import _native
from .._kernel_call import kernel_call
from .._rowops import gather_rows, scatter_rows
from .._rowsparse import mask_padding
from ._fused_rows import rule_rows
from ._tree import abs_sq


def rowwise_scales(
    g: jax.Array, acc: jax.Array, eps, size: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """``(scale, acc)`` for rows ``g`` ``[K, ...]`` (or a whole dense gradient) and
    their accumulators ``acc`` ``[K]``: ``acc += mean(|g|**2)`` over each row, and
    ``scale = 1 / (sqrt(acc) + eps)``, 0 where that denominator is 0. The
    direction is ``g * scale`` (see :func:`scale_rows`).

    ``size`` is the number of elements a mean divides by (default: a row's),
    for rows padded with zeros; ``acc`` ``[K, 1]`` beside ``g`` ``[K, D]``
    keeps that shape."""
    axes = tuple(range(1, g.ndim))
    # mean over the row's elements; a row of no elements (D = 0) adds 0, not 0/0
    size = max(math.prod(g.shape[1:]), 1) if size is None else size
    # squared in the accumulator's dtype when it is wider (a float16
    # gradient above 256 would square to inf and freeze the row for good)
    wide = g.astype(jnp.promote_types(g.dtype, acc.dtype))
    keep = g.ndim > 1 and acc.ndim == g.ndim
    acc = acc + (jnp.sum(abs_sq(wide), axis=axes, keepdims=keep) / size).astype(acc.dtype)
    denom = jnp.sqrt(acc) + eps
    # A row whose accumulator is still 0 (zero gradients so far) with eps = 0
    # gets a zero update, not 0/0; a NaN or infinite gradient stays visible
    # (its accumulator is NaN or inf, so its scale is NaN or 0, and inf * 0
    # is NaN).
    zero = denom == 0
    return jnp.where(zero, 0, 1 / jnp.where(zero, 1, denom)), acc


def scale_rows(g: jax.Array, scale: jax.Array) -> jax.Array:
    """``g * scale`` with one ``scale`` per row (its leading axis)."""
    return g * scale.reshape(scale.shape + (1,) * (g.ndim - scale.ndim))


def _xla(acc, ids, grad, eps, alpha):
    scale, rows = rowwise_scales(grad, gather_rows(acc, ids, ids_sorted=True), eps)
    u = mask_padding(scale_rows(grad, scale), ids, acc.shape[0])
    if alpha is not None:
        u = jnp.asarray(alpha, u.dtype) * u
    return scatter_rows(acc, ids, rows), u


def _rule(grad: jax.Array, eps, alpha):
    """:func:`_xla`'s arithmetic as a lazy rule on rows ``g`` ``[k, ...]`` with
    accumulator rows ``[k, 1]``, dividing by the width of ``grad``'s rows."""
    size = max(math.prod(grad.shape[1:]), 1)

    def rule(g, states, _):
        (acc,) = states
        scale, acc = rowwise_scales(g, acc, eps, size)
        u = scale_rows(g, scale)
        return (u if alpha is None else jnp.asarray(alpha, u.dtype) * u), [acc]

    return rule


def _native_call(acc, ids, grad, eps, alpha):
    return _native.rowwise_adagrad_call(acc, ids, grad, eps, alpha)


def _fused(acc, ids, grad, eps, alpha):
    # (its tangent is the XLA ops', which kernel_call supplies)
    return kernel_call(_native_call, _xla, acc, ids, grad, eps, alpha)


def _native_ok(acc: jax.Array, ids: jax.Array, grad: jax.Array, eps) -> bool:
    # A weakly typed accumulator stays in XLA, whose scatter keeps it weakly
    # typed (a kernel's result is not); an eps that would widen the
    # arithmetic (a float64 eps for a float32 accumulator) too. (alpha is
    # cast to the rows' dtype either way, as scale_by_learning_rate casts it.)
    return (
        not getattr(getattr(acc, "aval", None), "weak_type", False)
        and jnp.result_type(acc.dtype, eps) == acc.dtype
        and _native.use(_native.ROWWISE_ADAGRAD, acc, ids, grad)
    )


def rowwise_adagrad_rows(
    acc: jax.Array, ids: jax.Array, grad: jax.Array, eps, alpha=None
) -> tuple[jax.Array, jax.Array]:
    """``(acc, u)`` for the rows ``grad`` ``[K, ...]`` of a RowSparse gradient at
    its sorted unique ``ids``: the accumulator with ``acc[ids[i]] +=
    mean(|grad[i]|**2)``, and the direction rows ``u[i] = grad[i] /
    (sqrt(acc[ids[i]]) + eps)`` (0 where that denominator is 0, and in padding
    slots), times ``alpha`` when given (``alpha * u``, as a following
    ``scale_by_learning_rate`` computes it: one pass over the rows instead of
    two). A donated accumulator is updated in place."""
    acc, ids, grad = jnp.asarray(acc), jnp.asarray(ids), jnp.asarray(grad)
    fused = rule_rows("rowwise_adagrad", _rule(grad, eps, alpha), grad, ids, [acc])
    if fused is not None:  # one Pallas kernel on GPU
        u, (acc,) = fused
        return acc, u
    # (a schedule that returns a non-scalar keeps XLA's broadcasting)
    if _native_ok(acc, ids, grad, eps) and (alpha is None or jnp.ndim(alpha) == 0):
        a = jnp.asarray(1.0 if alpha is None else alpha, acc.dtype)
        return _fused(acc, ids, grad, jnp.asarray(eps, acc.dtype), a)
    return _xla(acc, ids, grad, eps, alpha)
