"""Fused Pallas kernels for the lazy optimizers' row updates on GPU: when they run.

A lazy step on a RowSparse gradient gathers the listed rows of every state
array (and of the parameter, for rules that read it), runs the optimizer's
rule on them, and scatters the new rows back; ``apply_updates`` then
scatter-adds the update rows into the parameter. In XLA ops on GPU each of
those is its own pass over the rows. On a GPU each is instead one Pallas
(Triton) kernel (:mod:`._fused_kernel`) that reads every listed row of the
gradient, of the state and of the parameter once, runs the same rule on it
and writes the new state rows (and the update row) once, in place.

:func:`rule_rows` is ``apply_rule``'s lazy path as that kernel, and
:func:`add_rows` ``apply_updates``' scatter-add; each returns None where the
kernel does not run, and the caller runs its XLA ops. The rule is the very
function the XLA path runs, traced once at one row, so the kernel does the
XLA path's operations in the same order and dtypes. Values that the rule
closes over as arrays (bias corrections, a schedule's learning rate,
hyperparameters injected by ``optax.inject_hyperparams``) become scalar
operands of the kernel, so a new value compiles no new kernel; Python
numbers stay constants, as in the XLA program.

:func:`use_fused` decides when a step is traced: on a GPU, with the kernels switched on
(``jsr.set_native_kernels``), for widths and dtypes the kernel takes (see
:data:`MAX_WIDTH`, :data:`DTYPES`). Otherwise the traced program is what it
would be without this module: a CPU trace never holds a ``pallas_call``.
Where it says yes, the step calls :func:`._fused_kernel.fused_call`, whose
lowering picks the kernel per platform and program (Triton on ``cuda`` and
``rocm`` in a program for one device or a ``shard_map`` body, the XLA ops
where XLA partitions the program over several devices, elsewhere and for
``jax.export``).

**Testing.** :func:`force` makes :func:`use_fused` say yes on any platform:
``force(interpret=True)`` runs the kernels through the Pallas interpreter
(so the CPU test suite runs them), ``force(interpret=False)`` makes the
kernel call as on a GPU (a CPU run then lowers it to XLA ops, and a program
lowered for ``cuda`` shows the Triton calls). ``JAXSPARSE_ROWS_FUSED_INTERPRET=1``
forces interpret mode from import. :func:`tuned` replaces the rows and warps
per program of :data:`TUNING`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _native
from .._rowops import fit_ids
from .._sharding import explicit_spec
from .._vma import varying_axes
from ._fused_kernel import fused_call, kernel_ready, pallas_modules, pow2
from ._fused_kernel import kernel as make_kernel

# ------------------------------------------------------------------ settings

#: The rules that have a fused kernel (the names callers pass to :func:`use_fused`).
RULES = ("sgd", "adam", "adagrad", "rowwise_adagrad", "ftrl", "apply_updates")

#: Element dtypes of the gradient, state and parameter rows the kernel takes.
DTYPES = frozenset(map(jnp.dtype, ("float16", "bfloat16", "float32", "float64")))

#: The widest row (elements after the first axis) the kernel takes. A row is
#: held as one block of the next power of two; wider rows run the XLA ops.
MAX_WIDTH = 8192

#: ``(padded width up to, rows per program, warps per program)``, first match.
#: Defaults not yet measured on a GPU for this kernel;
#: ``benchmarks/fused_rows.py --sweep`` measures them.
TUNING = (
    (64, 4, 1),
    (256, 4, 2),
    (1024, 2, 4),
    (MAX_WIDTH, 1, 8),
)

_ENV = "JAXSPARSE_ROWS_FUSED_INTERPRET"
# None: decided by the platform; "interpret" / "lower": forced (see `force`).
_forced: str | None = (
    "interpret" if os.environ.get(_ENV, "0").strip().lower() in ("1", "true", "yes", "on") else None
)


def _switched_on() -> bool:
    """The user's kernel switch (``jsr.set_native_kernels``), on by default."""
    return _native.kernels_switched_on()


@contextlib.contextmanager
def force(interpret: bool = True) -> Iterator[None]:
    """Makes :func:`use_fused` say yes on every platform inside the block.

    With ``interpret=True`` the kernels run in the Pallas interpreter wherever
    the step runs (on CPU too); with ``interpret=False`` the fused primitive
    is bound as on a GPU and lowered per platform (Triton for ``cuda`` and
    ``rocm``, XLA ops elsewhere). The user switch and the operand checks still
    apply. Steps already traced are retraced (``jax.clear_caches()``).

    Args:
      interpret: run the kernels through the Pallas interpreter.

    Example:
      >>> from jaxsparse_rows.optim import _fused_rows
      >>> with _fused_rows.force():
      ...     _fused_rows.forced()
      'interpret'
      >>> _fused_rows.forced() is None
      True
    """
    previous = _forced
    _set_forced("interpret" if interpret else "lower")
    try:
        yield
    finally:
        _set_forced(previous)


def forced() -> str | None:
    """``"interpret"`` or ``"lower"`` inside :func:`force`, else None."""
    return _forced


def _set_forced(mode: str | None) -> None:
    global _forced
    if mode != _forced:
        _forced = mode
        jax.clear_caches()  # the choice is made when a step is traced


# (rows per program, warps per program) set by `tuned`, each None: the table's.
_override: tuple[int | None, int | None] = (None, None)


@contextlib.contextmanager
def tuned(rows_per_program: int | None = None, num_warps: int | None = None) -> Iterator[None]:
    """Replaces :data:`TUNING`'s rows and warps per program inside the block.

    For measurements (``benchmarks/fused_rows.py --sweep``) and for tests
    (the interpreter compiles one row per program fastest). Steps already
    traced are retraced (``jax.clear_caches()``).

    Args:
      rows_per_program: slots of the row ids per program (None: the table's).
      num_warps: warps per program (None: the table's).

    Example:
      >>> from jaxsparse_rows.optim import _fused_rows
      >>> with _fused_rows.tuned(rows_per_program=16):
      ...     _fused_rows.tuning(64)
      (16, 1)
    """
    global _override
    previous = _override
    _override = (rows_per_program, num_warps)
    jax.clear_caches()
    try:
        yield
    finally:
        _override = previous
        jax.clear_caches()


def tuning(width: int) -> tuple[int, int]:
    """``(rows per program, warps per program)`` for rows of ``width`` elements.

    Example:
      >>> from jaxsparse_rows.optim import _fused_rows
      >>> _fused_rows.tuning(64), _fused_rows.tuning(300)
      ((4, 1), (2, 4))
    """
    padded = pow2(width)
    for limit, rows, warps in TUNING:
        if padded <= limit:
            rows_over, warps_over = _override
            return rows_over or rows, warps_over or warps
    raise ValueError(f"no fused kernel for rows of {width} elements (> {MAX_WIDTH})")


# ----------------------------------------------------------------- the choice


def _mode() -> str | None:
    """``"interpret"``, ``"lower"`` (the primitive, lowered per platform) or None."""
    if _forced is not None:
        return _forced
    if jax.default_backend() == "gpu":
        return "lower"
    return None


def _width(shape: Sequence[int]) -> int:
    return math.prod(shape[1:])


def _plain(x: Any) -> bool:
    aval = jax.typeof(x)
    return (
        jnp.dtype(aval.dtype) in DTYPES
        and not getattr(aval, "weak_type", False)
        and explicit_spec(x) is None
        and not varying_axes(aval)
    )


def use_fused(
    rule_name: str,
    states: Sequence[Any],
    ids: Any,
    grad: Any,
    param: Any = None,
) -> bool:
    """Whether the lazy rule ``rule_name`` runs its fused kernel for these operands.

    True when a step traced at this point calls the kernel: on a GPU (see
    :func:`_mode`) or inside :func:`force`, with the kernels switched on
    (``jsr.set_native_kernels``), and for operands it takes: ``ids`` 1-D
    integers, at least one of them, for a table of fewer than ``2**31 - 1``
    rows; ``grad`` the ``[K, ...]`` gradient rows, ``states`` arrays of the
    table's ``[N, ...]`` shape or one entry per row (``[N]``), ``param`` of the
    table's shape or None, at least one state or a parameter; every one of
    them float16, bfloat16, float32 or float64, not weakly typed, not sharded
    over explicit mesh axes, not varying inside ``shard_map``; rows of 1 to
    :data:`MAX_WIDTH` elements. Everything else keeps the XLA ops.

    Args:
      rule_name: one of :data:`RULES`.
      states: the state arrays the rule reads and writes.
      ids: the sorted unique row ids (padding ``N``).
      grad: the gradient (or update) rows, ``[K, ...]``.
      param: the parameter, when the rule reads its rows.

    Returns:
      A bool, decided at trace time.
    """
    if rule_name not in RULES:
        raise ValueError(f"`rule_name` must be one of {RULES}, got {rule_name!r}.")
    if _mode() is None or not _switched_on() or pallas_modules() is None:
        return False
    tables = [*states] + ([] if param is None else [param])
    if not tables or jnp.ndim(ids) != 1 or jnp.ndim(grad) < 1:
        return False
    n, k = jnp.shape(tables[0])[0] if jnp.ndim(tables[0]) else -1, jnp.shape(ids)[0]
    gshape = tuple(jnp.shape(grad))
    row = gshape[1:]
    if not (0 < n < np.iinfo(np.int32).max and k > 0 and gshape[0] == k):
        return False
    if not 1 <= _width(gshape) <= MAX_WIDTH:
        return False
    if not jnp.issubdtype(jax.typeof(ids).dtype, jnp.integer) or explicit_spec(ids) is not None:
        return False
    if varying_axes(ids) or not all(_plain(x) for x in [grad, *tables]):
        return False
    for s in states:
        if tuple(jnp.shape(s)) not in ((n, *row), (n,)):
            return False
    return param is None or tuple(jnp.shape(param)) == (n, *row)


# ------------------------------------------------------------------ entry points

_CONST_DTYPES = DTYPES | frozenset(map(jnp.dtype, ("int32", "int64", "uint32")))


def _trace(rule: Callable, g: Any, states: Sequence[Any], param: Any) -> Any:
    """``rule`` traced to a closed jaxpr of ``(g, *states, param)``, outputs
    ``(update, *new_states)`` (no update when the rule returns None)."""
    n = len(states)

    def flat(g, *rest):
        upd, new = rule(g, list(rest[:n]), rest[n] if len(rest) > n else None)
        return ([] if upd is None else [upd]) + list(new)

    return jax.make_jaxpr(flat)(g, *states, *([] if param is None else [param]))


def rule_rows(
    rule_name: str,
    rule: Callable,
    grad: jax.Array,
    ids: jax.Array,
    states: Sequence[jax.Array],
    param: jax.Array | None = None,
) -> tuple[jax.Array | None, list[jax.Array]] | None:
    """``apply_rule``'s lazy path as one fused kernel, or None where it does not run.

    ``rule(g, state_rows, param_rows) -> (update, new_state_rows)`` is the
    lazy path's rule (``update`` may be None). For the rows ``grad``
    ``[K, ...]`` at the sorted unique ``ids`` it returns what the XLA path
    gives: the update rows (zero in padding slots) and every state array with
    its listed rows replaced by the rule's (cast to its dtype), written in
    place where donated. It returns None, to run the XLA ops, when
    :func:`use_fused` says no or when the rule closes over a value that is not
    a numeric scalar (such values cannot be the kernel's scalar operands).

    Args:
      rule_name: one of :data:`RULES`.
      rule: the elementwise rule (row-wise rules reduce over the row's axis 1
        with the row's true width, not the padded one).
      grad: the gradient rows.
      ids: their sorted unique row ids (padding ``N``).
      states: state arrays, ``[N, ...]`` like the table or ``[N]`` (one entry
        per row; the rule sees those rows as ``[K, 1]``).
      param: the parameter, when the rule reads its rows.

    Returns:
      ``(update, new_states)``, or None.
    """
    if not use_fused(rule_name, states, ids, grad, param):
        return None
    n, k = jnp.shape(states[0] if states else param)[0], grad.shape[0]
    d = _width(grad.shape)
    widths = tuple(1 if jnp.ndim(s) == 1 else d for s in states)
    flat_states = [jnp.reshape(s, (n, w)) for s, w in zip(states, widths, strict=True)]
    flat_param = None if param is None else jnp.reshape(param, (n, d))
    g = jnp.reshape(grad, (k, d))

    def spec(rows: int, w: int, x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((rows, w), x.dtype)

    full = _trace(
        rule,
        spec(k, d, g),
        [spec(k, w, s) for s, w in zip(flat_states, widths, strict=True)],
        None if param is None else spec(k, d, flat_param),
    )
    row = _trace(
        rule,
        spec(1, pow2(d), g),
        [spec(1, pow2(w), s) for s, w in zip(flat_states, widths, strict=True)],
        None if param is None else spec(1, pow2(d), flat_param),
    )
    consts = full.consts
    if not kernel_ready(row.jaxpr):
        return None
    same = len(row.consts) == len(consts)
    if not same or any(a is not b for a, b in zip(row.consts, consts, strict=True)):
        return None
    if not all(
        jnp.ndim(c) == 0 and jnp.dtype(jax.typeof(c).dtype) in _CONST_DTYPES for c in consts
    ):
        return None
    out_avals = full.out_avals
    with_update = len(out_avals) > len(states)
    if with_update and jnp.dtype(out_avals[0].dtype) not in DTYPES:
        return None
    rows_per_program, warps = tuning(d)
    kernel = make_kernel(
        name=rule_name,
        n_rows=int(n),
        n_slots=int(k),
        width=int(d),
        state_widths=widths,
        state_dtypes=tuple(jnp.dtype(s.dtype) for s in flat_states),
        param_dtype=None if param is None else jnp.dtype(flat_param.dtype),
        update_dtype=jnp.dtype(out_avals[0].dtype) if with_update else None,
        const_dtypes=tuple(jnp.dtype(jax.typeof(c).dtype) for c in consts),
        row_jaxpr=row.jaxpr,
        full_jaxpr=full.jaxpr,
        rows_per_program=rows_per_program,
        num_warps=warps,
    )
    args = [fit_ids(ids, n).astype(jnp.int32)]
    args += [jnp.reshape(jnp.asarray(c), (1,)) for c in consts]
    args += [g, *flat_states] + ([] if flat_param is None else [flat_param])
    outs = fused_call(kernel, _mode() == "interpret", *args)
    upd = None
    if with_update:
        upd = outs[0].reshape(grad.shape)
        outs = outs[1:]
    return upd, [o.reshape(s.shape) for o, s in zip(outs, states, strict=True)]


def add_rows(param: jax.Array, ids: jax.Array, rows: jax.Array, dtype: Any) -> jax.Array | None:
    """``apply_updates``' scatter-add of update ``rows`` at sorted unique ``ids``
    into ``param`` as one fused kernel (each row added in ``dtype`` and rounded
    to the parameter's), or None where it does not run (:func:`use_fused`)."""

    def add(u, states, _):
        (p,) = states
        return None, [p.astype(dtype) + u.astype(dtype)]

    out = rule_rows("apply_updates", add, rows, ids, [param])
    return None if out is None else out[1][0]
