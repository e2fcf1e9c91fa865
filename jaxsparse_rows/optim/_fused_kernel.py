"""The fused row kernel of the lazy optimizers: one Pallas (Triton) kernel per
rule, called through the library's one kernel call, which lowers it per
platform.

A :class:`Kernel` is one lazy rule fixed when a step is traced: the rule
traced once at one row (``row_jaxpr``) and once at ``[K, D]`` rows
(``full_jaxpr``), with the arrays it closes over as scalar operands.
:func:`pallas_call` runs it over a 1-D grid whose programs each take
``rows_per_program`` consecutive slots of the sorted unique row ids. A slot
reads its id; a padding slot (an id outside ``[0, N)``) reads and writes no
row of the state or the parameter and gets a zero update row. A real slot
loads its gradient row and the row ``id`` of every state array and of the
parameter (refs in ``pl.ANY`` memory, one ``pl.ds(id, 1)`` row each, as a
power-of-two block with the columns past the row's width masked), evaluates
the rule on them (:func:`eval_widened`) and stores the results. The state
arrays are the call's outputs aliased to its inputs (``input_output_aliases``),
so the rows it does not list keep their values and a donated buffer is
written in place.

:func:`fused_call` binds a kernel with ``_kernel_call.kernel_call``. Its
lowering is Triton on ``cuda`` and ``rocm`` (on one device, or in a
``shard_map`` body), and elsewhere, and for ``jax.export`` (Triton IR carries
no stability guarantee), the XLA ops the kernel fuses (:func:`xla`: gather,
rule, mask, scatter), or the Pallas interpreter when asked. Its JVP and its
``vmap`` are those of the XLA ops. :mod:`._fused_rows` decides when a step
binds it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from .._kernel_call import kernel_call
from .._rowops import gather_rows, scatter_rows
from .._rowsparse import mask_padding


@functools.cache
def pallas_modules() -> tuple[Any, Any] | None:
    """``(pallas, pallas.triton)``, or None where this jaxlib lacks them.

    Loaded on first use, so that a process that never traces a fused step
    (every CPU process) does not import Pallas and its Triton lowering.
    """
    try:
        pl = importlib.import_module("jax.experimental.pallas")
        plt = importlib.import_module("jax.experimental.pallas.triton")
    except ImportError:
        return None
    return pl, plt


def pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``).

    Example:
      >>> from jaxsparse_rows.optim._fused_kernel import pow2
      >>> pow2(1), pow2(3), pow2(64), pow2(300)
      (1, 4, 64, 512)
    """
    return 1 << max(int(n) - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Kernel:
    """One fused row update, fixed when a step is traced.

    Equal traces share one object (see :func:`kernel`), which JAX's caches
    compare by identity.

    Attributes:
      name: the rule's name, in the kernel's name.
      n_rows: ``N``, the rows of the table.
      n_slots: ``K``, the slots of the row ids (padding included).
      width: ``D``, the elements of a gradient row.
      state_widths: per state array, ``D`` or 1 (one entry per row).
      state_dtypes: per state array, its dtype.
      param_dtype: the parameter's dtype, or None when the rule reads none.
      update_dtype: the update rows' dtype, or None when the rule makes none.
      const_dtypes: per scalar operand of the rule, its dtype.
      row_jaxpr: the rule at one row (padded widths), its operands
        ``(*consts, g, *states, param)``.
      full_jaxpr: the rule at ``[K, D]`` rows, the same operands.
      rows_per_program: slots per program of the grid.
      num_warps: warps per program.
    """

    name: str
    n_rows: int
    n_slots: int
    width: int
    state_widths: tuple[int, ...]
    state_dtypes: tuple[Any, ...]
    param_dtype: Any
    update_dtype: Any
    const_dtypes: tuple[Any, ...]
    row_jaxpr: Any
    full_jaxpr: Any
    rows_per_program: int
    num_warps: int

    def __repr__(self) -> str:  # (shown in printed jaxprs)
        return (
            f"jsr_fused_rows({self.name}, N={self.n_rows}, K={self.n_slots}, D={self.width}, "
            f"states={len(self.state_widths)}, consts={len(self.const_dtypes)})"
        )


_KERNELS: collections.OrderedDict = collections.OrderedDict()
_KERNELS_KEPT = 256
_KERNELS_LOCK = threading.Lock()


def kernel(**fields: Any) -> Kernel:
    """The :class:`Kernel` of these fields, one object per distinct trace."""
    key = tuple(
        (name, str(value) if name.endswith("jaxpr") else value) for name, value in fields.items()
    )
    with _KERNELS_LOCK:
        found = _KERNELS.get(key)
        if found is None:
            found = _KERNELS[key] = Kernel(**fields)
            if len(_KERNELS) > _KERNELS_KEPT:
                _KERNELS.popitem(last=False)
        else:
            _KERNELS.move_to_end(key)
        return found


def _split(kernel: Kernel, args: Sequence[Any]) -> tuple[Any, list, Any, list, Any]:
    """``(ids, consts, g, states, param)`` from the primitive's operands."""
    nc, ns = len(kernel.const_dtypes), len(kernel.state_widths)
    ids, consts, g = args[0], list(args[1 : 1 + nc]), args[1 + nc]
    states = list(args[2 + nc : 2 + nc + ns])
    param = args[2 + nc + ns] if kernel.param_dtype is not None else None
    return ids, consts, g, states, param


# The primitives a rule may use in a kernel. Those in _WIDENED compute in
# float32 when given float16 or bfloat16 operands and round the result back
# (Pallas lowers no half-precision division to Triton): one rounding of a
# float32 result that is exact or correctly rounded, which for these widths
# is the correctly rounded half-precision result.
_WIDENED = frozenset(
    "add sub mul div sqrt rsqrt square integer_pow pow exp log max min neg abs sign clamp".split()
)
_KERNEL_PRIMITIVES = _WIDENED | frozenset(
    "convert_element_type select_n eq ne lt le gt ge and or not broadcast_in_dim reshape "
    "squeeze reduce_sum reduce_max copy jit pjit".split()
)
_HALF = frozenset(map(jnp.dtype, ("float16", "bfloat16")))


def kernel_ready(jaxpr: Any) -> bool:
    """Whether every equation of ``jaxpr`` (nested ``jit`` ones too) can run in a kernel."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name not in _KERNEL_PRIMITIVES:
            return False
        inner = eqn.params.get("jaxpr")
        if inner is not None and not kernel_ready(getattr(inner, "jaxpr", inner)):
            return False
    return True


def eval_widened(jaxpr: Any, consts: Sequence[Any], *args: Any) -> list:
    """``jaxpr`` evaluated with :data:`_WIDENED` operations on half-precision
    operands done in float32 (see there), ``jit`` equations inlined."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, jex_core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        inner = eqn.params.get("jaxpr")
        if eqn.primitive.name in ("jit", "pjit"):
            outs = eval_widened(inner.jaxpr, inner.consts, *ins)
        elif eqn.primitive.name in _WIDENED and any(
            jnp.dtype(v.aval.dtype) in _HALF for v in eqn.invars
        ):
            wide = [x.astype(jnp.float32) if jnp.dtype(x.dtype) in _HALF else x for x in ins]
            outs = eqn.primitive.bind(*wide, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            outs = [o.astype(v.aval.dtype) for o, v in zip(outs, eqn.outvars, strict=True)]
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _run_rule(
    jaxpr: Any, consts: Sequence[Any], g: Any, rows: Sequence[Any], prow: Any, kernel: bool
) -> tuple:
    """``(update or None, new state rows)`` of a traced rule (evaluated as in a
    kernel, :func:`eval_widened`, with ``kernel``)."""
    args = [g, *rows] + ([] if prow is None else [prow])
    if kernel:
        outs = eval_widened(jaxpr, consts, *args)
    else:
        outs = jex_core.jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, list(consts)))(*args)
    n_states = len(rows)
    return (outs[0] if len(outs) > n_states else None), list(outs[len(outs) - n_states :])


def xla(kernel: Kernel, *args: Any) -> list:
    """The XLA ops of the lazy path: gather, rule, mask, scatter."""
    ids, consts, g, states, param = _split(kernel, args)
    consts = [c.reshape(()) for c in consts]
    rows = [gather_rows(s, ids, ids_sorted=True) for s in states]
    prow = None if param is None else gather_rows(param, ids, ids_sorted=True)
    upd, new_rows = _run_rule(kernel.full_jaxpr, consts, g, rows, prow, kernel=False)
    new_states = [scatter_rows(s, ids, r) for s, r in zip(states, new_rows, strict=True)]
    head = [] if upd is None else [mask_padding(upd, ids, kernel.n_rows)]
    return head + new_states


def _start(row: Any) -> Any:
    """Column 0 in the integer type of ``row`` (index operands share one type)."""
    return np.zeros((), jax.typeof(row).dtype)


def _load(pl: Any, plt: Any, ref: Any, row: Any, width: int) -> jax.Array:
    """Row ``row`` of a ``[*, width]`` ref as ``[1, pow2(width)]``, zeros past ``width``."""
    padded = pow2(width)
    view = ref.at[pl.ds(row, 1), pl.ds(_start(row), padded)]
    if padded == width:
        return view[...]
    mask = (jnp.arange(padded) < width)[None, :]
    return plt.load(view, mask=mask, other=jnp.zeros((), ref.dtype))


def _store(pl: Any, plt: Any, ref: Any, row: Any, width: int, value: jax.Array) -> None:
    """Writes ``value`` ``[1, pow2(width)]`` to row ``row``'s first ``width`` elements."""
    padded = pow2(width)
    view = ref.at[pl.ds(row, 1), pl.ds(_start(row), padded)]
    value = value.astype(ref.dtype)
    if padded == width:
        view[...] = value
    else:
        plt.store(view, value, mask=(jnp.arange(padded) < width)[None, :])


def _body(kernel: Kernel, *refs: Any) -> None:
    """One program: ``rows_per_program`` consecutive slots of the row ids."""
    pl, plt = pallas_modules()
    n_in = 2 + len(kernel.const_dtypes) + len(kernel.state_widths)
    n_in += kernel.param_dtype is not None
    ids_ref, const_refs, g_ref, state_refs, param_ref = _split(kernel, refs[:n_in])
    outs = refs[n_in:]
    upd_ref = outs[0] if kernel.update_dtype is not None else None
    new_refs = outs[len(outs) - len(state_refs) :]
    consts = [r[0] for r in const_refs]
    n, k, d = kernel.n_rows, kernel.n_slots, kernel.width
    widths = kernel.state_widths

    def slot(i):
        rid = ids_ref[i]
        real = (rid >= 0) & (rid < n)

        @pl.when(real)
        def _():
            g = _load(pl, plt, g_ref, i, d)
            rows = [_load(pl, plt, r, rid, w) for r, w in zip(state_refs, widths, strict=True)]
            prow = None if param_ref is None else _load(pl, plt, param_ref, rid, d)
            upd, new_rows = _run_rule(kernel.row_jaxpr, consts, g, rows, prow, kernel=True)
            if upd_ref is not None:
                _store(pl, plt, upd_ref, i, d, upd)
            for ref, w, value in zip(new_refs, widths, new_rows, strict=True):
                _store(pl, plt, ref, rid, w, value)

        if upd_ref is not None:

            @pl.when(jnp.logical_not(real))
            def _():
                _store(pl, plt, upd_ref, i, d, jnp.zeros((1, pow2(d)), upd_ref.dtype))

    rows_per_program = kernel.rows_per_program
    first = pl.program_id(0) * rows_per_program
    for j in range(rows_per_program):
        if k % rows_per_program:
            pl.when(first + j < k)(functools.partial(slot, first + j))
        else:
            slot(first + j)


def pallas_call(kernel: Kernel, interpret: bool, *args: Any) -> list:
    """The kernel as a ``pallas_call`` over ``cdiv(K, rows_per_program)`` programs."""
    pl, plt = pallas_modules()
    ids, consts, g, states, param = _split(kernel, args)
    anywhere = pl.BlockSpec(memory_space=pl.ANY)
    head = []
    if kernel.update_dtype is not None:
        head = [jax.ShapeDtypeStruct((kernel.n_slots, kernel.width), kernel.update_dtype)]
    out_shape = head + [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in states]
    first_state = 2 + len(consts)
    aliases = {first_state + i: len(head) + i for i in range(len(states))}
    call = pl.pallas_call(
        functools.partial(_body, kernel),
        out_shape=out_shape,
        grid=(pl.cdiv(kernel.n_slots, kernel.rows_per_program),),
        in_specs=[anywhere] * len(args),
        out_specs=[anywhere] * len(out_shape),
        input_output_aliases=aliases,
        interpret=interpret,
        name=f"jsr_fused_{kernel.name}_rows",
        compiler_params=plt.CompilerParams(num_warps=kernel.num_warps, num_stages=1),
    )
    return list(call(ids, *consts, g, *states, *([] if param is None else [param])))


# ------------------------------------------------------------------ the call


def _xla_call(*args: Any, kernel: Kernel) -> list:
    return xla(kernel, *args)


def _interpreted(*args: Any, kernel: Kernel) -> list:
    return pallas_call(kernel, True, *args)


def _triton(*args: Any, kernel: Kernel) -> list:
    return pallas_call(kernel, False, *args)


def fused_call(kernel: Kernel, interpret: bool, *args: Any) -> list:
    """The kernel as the library's kernel call (``_kernel_call``): Triton on
    ``cuda`` and ``rocm``, the Pallas interpreter on every platform when
    ``interpret``, and the XLA ops (:func:`xla`) elsewhere and in exported
    programs. Its JVP and its ``vmap`` are those of the XLA ops."""
    run = _interpreted if interpret else None
    return kernel_call(run, _xla_call, *args, gpu=run or _triton, kernel=kernel)
