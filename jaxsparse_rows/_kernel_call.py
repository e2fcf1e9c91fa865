"""One JAX primitive for "the library's kernel, or its XLA twin".

Every kernel (the native CPU kernels of ``_native``, the Pallas kernels of
``optim/_fused_kernel.py`` on GPU) has an XLA function that computes the
same result (its reference, and what runs everywhere else).
:func:`kernel_call` binds both to :data:`kernel_call_p`, whose lowering picks
one when the program is lowered:

- on CPU the ``native`` kernel (an FFI custom call), on ``cuda`` and ``rocm``
  the ``gpu`` one (a Pallas / Triton kernel), where the call names one;
- the XLA ops when the program is being lowered for :func:`jax.export`: an
  exported program must not depend on this library's custom-call targets or
  on Triton IR, which a process that deserializes it may not have (and which
  carry no compatibility guarantee);
- the XLA ops too when the program is partitioned over several devices by
  XLA (``jax.jit`` of arrays sharded over a mesh, ``shard_map`` with
  automatic axes left): XLA cannot partition a custom call, and would gather
  a sharded table onto every device to run it. A program for one device,
  and the body of a ``shard_map`` manual over every axis of size > 1 (one
  device's shard), get the kernel;
- on every other platform, and for operands sharded over explicit mesh axes
  (whose sharding must stay in the result's type), the XLA ops.

So one traced function runs the kernels under ``jax.jit`` on CPU (and GPU),
and exports to a portable program, with no branch left in any of them.

A call's tangent is that of its XLA function, in XLA ops (callers with a
cheaper one wrap the call in a ``jax.custom_jvp``). A call declared
``linear`` in some operands is a linear map of them: its tangent is the same
call of their tangents, and ``transpose`` (or, without one, the XLA
function's VJP) is its transpose. The row gather and the sum of rows by
id of ``_rowops`` are such calls, each the other's transpose. A call that
returns integers beside floats (the row ids of a transposed product beside
its values) can name a ``known_outputs`` function that computes those
integers from the operands that are not being transposed, so that they stay
known values under ``linear_transpose`` and can index a later scatter. Under
``vmap`` it runs the XLA function batched by JAX, or the call's own ``batch``
rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

from ._sharding import explicit_spec
from ._vma import match_varying, result_aval


@functools.cache
def _jitted_bind(prim: Any, params: tuple) -> Any:
    return jax.jit(lambda *args: prim.bind(*args, **dict(params)))


def jitted_impl(prim: Any) -> Any:
    """An eager evaluation rule for ``prim``: one jitted ``prim.bind`` per set
    of parameters (which must be hashable), compiled once per shape."""

    def impl(*args, **params):
        return _jitted_bind(prim, tuple(sorted(params.items())))(*args)

    return impl


kernel_call_p = Primitive("jsr_kernel_call")
kernel_call_p.multiple_results = True


def kernel_call(
    native: Callable | None,
    xla: Callable,
    *args: Any,
    gpu: Callable | None = None,
    known_outputs: Callable | None = None,
    linear: tuple[int, ...] = (),
    transpose: Callable | None = None,
    batch: Callable | None = None,
    **static: Any,
) -> Any:
    """``native(*args, **static)`` in a program lowered for one CPU device (not
    for export), ``gpu(*args, **static)`` likewise on one GPU, and
    ``xla(*args, **static)`` everywhere else (where the kernel is None: a
    linear call with its own transpose and no kernel is one).

    Both must return the same pytree of arrays, shapes and dtypes; ``xla``'s
    decides. ``native``, ``xla`` and the rules below should be module-level
    functions and the ``static`` values hashable, so that equal calls compare
    equal (JAX caches on them).

    ``linear`` lists the operands the call is linear in (jointly); the others
    must not carry tangents (integer ids). Then its tangent is the same call
    with those operands replaced by their tangents, and its transpose is
    ``transpose(cts, *args, **static)`` (the output cotangents as a list, the
    operands with ``jax.interpreters.ad.UndefinedPrimal`` at the linear ones;
    it returns one cotangent or None per operand), by default the XLA
    function's. ``batch(args, dims, **static)`` returns ``(outputs,
    out_dims)`` under ``vmap`` (by default ``xla`` is batched).

    ``known_outputs(*args, **static)``, if given, returns a list with one
    entry per output leaf: the output computed from ``args`` (it may read
    only operands that are never transposed, such as integer ids; the others
    are passed as ``None``), or ``None``. It is called only while
    ``jax.linear_transpose`` traces the call with a linear operand.

    >>> import jax.numpy as jnp
    >>> from jaxsparse_rows._kernel_call import kernel_call
    >>> kernel_call(jnp.negative, jnp.negative, jnp.arange(3))
    Array([ 0, -1, -2], dtype=int32)
    """
    args = tuple(jax.numpy.asarray(a) for a in args)
    if any(explicit_spec(a) is not None for a in args):
        # Sharded over explicit mesh axes (sharding in types): XLA's ops, whose
        # sharding rules JAX knows, keep the result's sharding in its type.
        return xla(*args, **static)
    args = match_varying(*args)
    shapes = jax.eval_shape(functools.partial(xla, **static), *args)
    leaves, tree = jax.tree.flatten(shapes)
    out = kernel_call_p.bind(
        *args,
        native=native,
        gpu=gpu,
        xla=xla,
        static=tuple(sorted(static.items())),
        out_types=tuple((tuple(s.shape), s.dtype, bool(s.weak_type)) for s in leaves),
        known_outputs=known_outputs,
        linear=tuple(int(i) for i in linear),
        transpose=transpose,
        batch=batch,
    )
    return jax.tree.unflatten(tree, out)


def _flat(fn: Callable, static: tuple) -> Callable:
    def flat(*args):
        return jax.tree.leaves(fn(*args, **dict(static)))

    return flat


def _abstract(*avals, out_types, **params):
    del params
    like = avals[0] if avals else None  # (operands vary over equal axes: kernel_call)
    return [result_aval(like, shape, dtype, weak) for shape, dtype, weak in out_types]


def _xla_lowering(ctx, *args, xla, static, **params):
    del params
    return mlir.lower_fun(_flat(xla, static), multiple_results=True)(ctx, *args)


def _one_device(axis_context: Any) -> bool:
    """Whether a program lowered in ``axis_context`` runs on one device's
    values, unpartitioned: a program for one device, or the body of a
    ``shard_map`` whose automatic axes (those XLA still partitions) all have
    size 1."""
    manual = getattr(axis_context, "manual_axes", None)
    if manual is not None:
        mesh = axis_context.mesh
        return all(size == 1 for name, size in mesh.shape.items() if name not in manual)
    return getattr(axis_context, "num_devices", None) == 1


def _kernel_lowering(ctx, args, kernel, xla, static):
    module = ctx.module_context
    if (
        kernel is None
        or module.lowering_parameters.for_export
        or not _one_device(module.axis_context)
    ):
        return _xla_lowering(ctx, *args, xla=xla, static=static)
    return mlir.lower_fun(_flat(kernel, static), multiple_results=True)(ctx, *args)


def _cpu_lowering(ctx, *args, native, xla, static, **params):
    del params
    return _kernel_lowering(ctx, args, native, xla, static)


def _gpu_lowering(ctx, *args, gpu, xla, static, **params):
    del params
    return _kernel_lowering(ctx, args, gpu, xla, static)


def _jvp(primals, tangents, **params):
    """A linear call's tangent is the same call of its operands' tangents;
    any other call's is the XLA function's, in XLA ops that JAX can transpose.
    (Callers with a cheaper tangent wrap the call in a ``jax.custom_jvp``.)"""
    linear = params["linear"]
    out = kernel_call_p.bind(*primals, **params)
    if not linear:
        flat = _flat(params["xla"], params["static"])
        diff = [jnp.issubdtype(p.dtype, jnp.inexact) for p in primals]

        def of_inexact(*operands):
            it = iter(operands)
            return flat(*[next(it) if d else p for p, d in zip(primals, diff, strict=True)])

        _, t_out = jax.jvp(
            of_inexact,
            [p for p, d in zip(primals, diff, strict=True) if d],
            [ad.instantiate_zeros(t) for t, d in zip(tangents, diff, strict=True) if d],
        )
        return out, t_out
    if all(type(tangents[i]) is ad.Zero for i in linear):
        return out, [ad.Zero.from_primal_value(o) for o in out]
    args = [
        ad.instantiate_zeros(t) if i in linear else p
        for i, (p, t) in enumerate(zip(primals, tangents, strict=True))
    ]
    return out, kernel_call_p.bind(*args, **params)


def _batch(args, dims, *, xla, static, batch, **params):
    del params
    if batch is not None:
        return batch(args, dims, **dict(static))
    out = jax.vmap(_flat(xla, static), in_axes=tuple(dims))(*args)
    return out, [0] * len(out)


def _transpose(cts, *args, xla, static, transpose, **params):
    """Transposes the call: its own ``transpose`` rule, or the XLA function's
    VJP with respect to the linear operands, taken at zero, which for a
    function linear in them is its transpose (``jax.linear_transpose``, and the
    solvers of ``jax.scipy.sparse.linalg`` that transpose their matvec).
    Integer outputs carry no cotangent."""
    del params
    if transpose is not None:
        return transpose(list(cts), *args, **dict(static))
    linear = [ad.is_undefined_primal(a) for a in args]
    fixed = [None if lin else a for a, lin in zip(args, linear, strict=True)]

    def of_linear(*operands):
        it = iter(operands)
        return _flat(xla, static)(*[next(it) if f is None else f for f in fixed])

    at = [jnp.zeros(a.aval.shape, a.aval.dtype) for a, lin in zip(args, linear, strict=True) if lin]
    outs, vjp = jax.vjp(of_linear, *at)
    cts = [
        np.zeros(o.shape, jax.dtypes.float0)
        if not jnp.issubdtype(o.dtype, jnp.inexact)
        else jnp.zeros(o.shape, o.dtype)
        if type(ct) is ad.Zero
        else ct
        for ct, o in zip(cts, outs, strict=True)
    ]
    it = iter(vjp(cts))
    return [next(it) if lin else None for lin in linear]


def _partial_eval(trace, *tracers, **params):
    """Stages the call as usual when an operand is unknown (linear), then
    replaces the outputs that ``known_outputs`` computes from the known
    operands by those known values: integer row ids that a later scatter
    indexes with must not be linear."""
    outs = trace.default_process_primitive(kernel_call_p, tracers, params)
    known_outputs = params["known_outputs"]
    if known_outputs is None or all(t.is_known() for t in tracers):
        return outs
    args = [t.pval.get_known() for t in tracers]
    values = jax.tree.leaves(known_outputs(*args, **dict(params["static"])), is_leaf=_is_none)
    return [o if v is None else trace.new_const(v) for o, v in zip(outs, values, strict=True)]


def _is_none(x: Any) -> bool:
    return x is None


kernel_call_p.def_impl(jitted_impl(kernel_call_p))
pe.custom_partial_eval_rules[kernel_call_p] = _partial_eval
ad.primitive_jvps[kernel_call_p] = _jvp
ad.primitive_transposes[kernel_call_p] = _transpose
kernel_call_p.def_abstract_eval(_abstract)
mlir.register_lowering(kernel_call_p, _xla_lowering)
mlir.register_lowering(kernel_call_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(kernel_call_p, _gpu_lowering, platform="cuda")
mlir.register_lowering(kernel_call_p, _gpu_lowering, platform="rocm")
batching.primitive_batchers[kernel_call_p] = _batch
