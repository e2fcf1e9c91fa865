"""One JAX primitive for "the native CPU kernel, or its XLA twin".

Every native kernel in ``_native`` has an XLA function that computes the same
result (its reference, and what runs on other platforms). :func:`on_cpu` binds
both to :data:`kernel_call_p`, whose lowering picks one when the program is
lowered:

- on CPU, the kernel (an FFI custom call), unless the program is being lowered
  for :func:`jax.export`: an exported program must not depend on this
  library's custom-call targets, which a process that deserializes it may not
  have (and which carry no compatibility guarantee), so it gets the XLA ops;
- on every other platform, and for operands sharded over explicit mesh axes
  (whose sharding must stay in the result's type), the XLA ops.

So one traced function runs the kernels under ``jax.jit`` on CPU, runs XLA on
GPU, and exports to a portable program, with no branch left in any of them.
The primitive has no JVP: its callers wrap it in a ``jax.custom_jvp``
written in XLA ops (or return integers). Its transpose, for programs that
``jax.linear_transpose`` inlines, is the XLA function's. A call that returns
integers beside floats (the row ids of a transposed product beside its
values) can name a ``known_outputs`` function that computes those integers
from the operands that are not being transposed, so that they stay known
values under ``linear_transpose`` and can index a later scatter. Under
``vmap`` it runs the XLA function, batched by JAX.
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


def on_cpu(
    native: Callable,
    xla: Callable,
    *args: Any,
    known_outputs: Callable | None = None,
    **static: Any,
) -> Any:
    """``native(*args, **static)`` in a program lowered for CPU (not for
    export), ``xla(*args, **static)`` everywhere else.

    Both must return the same pytree of arrays, shapes and dtypes; ``xla``'s
    decides. ``native`` and ``xla`` should be module-level functions and the
    ``static`` values hashable, so that equal calls compare equal (JAX caches
    on them).

    ``known_outputs(*args, **static)``, if given, returns a list with one
    entry per output leaf: the output computed from ``args`` (it may read
    only operands that are never transposed, such as integer ids; the others
    are passed as ``None``), or ``None``. It is called only while
    ``jax.linear_transpose`` traces the call with a linear operand.

    >>> import jax.numpy as jnp
    >>> from jaxsparse_rows._kernel_call import on_cpu
    >>> on_cpu(jnp.negative, jnp.negative, jnp.arange(3))
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
        xla=xla,
        static=tuple(sorted(static.items())),
        out_types=tuple((tuple(s.shape), s.dtype) for s in leaves),
        known_outputs=known_outputs,
    )
    return jax.tree.unflatten(tree, out)


def _flat(fn: Callable, static: tuple) -> Callable:
    def flat(*args):
        return jax.tree.leaves(fn(*args, **dict(static)))

    return flat


def _abstract(*avals, native, xla, static, out_types, known_outputs):
    del native, xla, static, known_outputs
    like = avals[0] if avals else None  # (operands vary over equal axes: on_cpu)
    return [result_aval(like, shape, dtype) for shape, dtype in out_types]


def _xla_lowering(ctx, *args, native, xla, static, out_types, known_outputs):
    del native, out_types, known_outputs
    return mlir.lower_fun(_flat(xla, static), multiple_results=True)(ctx, *args)


def _cpu_lowering(ctx, *args, native, xla, static, out_types, known_outputs):
    if ctx.module_context.lowering_parameters.for_export:
        return _xla_lowering(
            ctx, *args, native=native, xla=xla, static=static, out_types=None, known_outputs=None
        )
    del known_outputs
    return mlir.lower_fun(_flat(native, static), multiple_results=True)(ctx, *args)


def _batch(args, dims, *, native, xla, static, out_types, known_outputs):
    del native, out_types, known_outputs
    out = jax.vmap(_flat(xla, static), in_axes=tuple(dims))(*args)
    return out, [0] * len(out)


def _transpose(cts, *args, native, xla, static, out_types, known_outputs):
    """Transposes the XLA function (``jax.linear_transpose``, and the solvers
    of ``jax.scipy.sparse.linalg`` that transpose their matvec): its VJP with
    respect to the linear operands, taken at zero, which for a function linear
    in them is its transpose. Integer outputs carry no cotangent."""
    del native, out_types, known_outputs
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
ad.primitive_transposes[kernel_call_p] = _transpose
kernel_call_p.def_abstract_eval(_abstract)
mlir.register_lowering(kernel_call_p, _xla_lowering)
mlir.register_lowering(kernel_call_p, _cpu_lowering, platform="cpu")
batching.primitive_batchers[kernel_call_p] = _batch
