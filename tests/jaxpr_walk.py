"""A walk over every equation of a jaxpr, for the structural (cost) tests.

It opens every nested program: the sub-jaxprs in an equation's parameters
(``pjit``, ``closed_call``, ``custom_jvp_call`` / ``custom_vjp_call``,
``remat``, ``scan``, ``cond``'s branches, ``while``'s condition and body), and
the library's primitives that stand for two programs chosen when lowered:

- ``jsr_kernel_call`` (``_kernel_call.kernel_call``): both its native form (the FFI
  call run on CPU) and its XLA twin (what runs on GPU and in exported
  programs), each traced as its own program. A call with no native form (the
  row gather and the sum of rows with the kernels off, linear calls with their
  own transpose) is named ``jsr_xla_call`` by :func:`primitive_names`, so that
  ``"jsr_kernel_call" in primitive_names(...)`` says whether a native kernel
  runs.

So a ``[V, ...]`` temporary in either form of a kernel is seen whatever the
kernels setting of the process that traced the program.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
from jax.extend import core as jex_core


def _param_jaxprs(eqn) -> Iterator[jex_core.Jaxpr]:
    for name, value in eqn.params.items():
        if name == "update_jaxpr":  # a scatter's combiner (e.g. add), not a program
            continue
        for v in value if isinstance(value, tuple | list) else (value,):
            if isinstance(v, jex_core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jex_core.Jaxpr):
                yield v


def _trace(fn, eqn) -> jex_core.Jaxpr:
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    return jax.make_jaxpr(fn)(*avals).jaxpr


def _twin_jaxprs(eqn) -> Iterator[jex_core.Jaxpr]:
    """The programs a library primitive may lower to, traced at its operands."""
    name, params = eqn.primitive.name, eqn.params
    if name == "jsr_kernel_call":
        static = dict(params["static"])
        for fn in (params["native"], params["xla"]):
            if fn is not None:
                yield _trace(functools.partial(fn, **static), eqn)


def all_eqns(jaxpr, *, twins: bool = True) -> Iterator[jex_core.JaxprEqn]:
    """Every equation of ``jaxpr`` (a Jaxpr or ClosedJaxpr) and of every program
    nested in it, containers (``pjit``, ``scan``, ``jsr_kernel_call``...) included;
    with ``twins=False``, not the programs a library primitive may lower to."""
    if isinstance(jaxpr, jex_core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in (*_param_jaxprs(eqn), *(_twin_jaxprs(eqn) if twins else ())):
            yield from all_eqns(sub, twins=twins)


def big_values(jaxpr, n_rows: int) -> list[tuple[str, tuple[int, ...]]]:
    """``(primitive, shape)`` of every equation output, nested ones included,
    with an axis of ``n_rows`` or at least ``n_rows`` elements."""
    found = []
    for eqn in all_eqns(jaxpr):
        for var in eqn.outvars:
            shape = tuple(getattr(var.aval, "shape", ()))
            size = 1
            for s in shape:
                size *= s
            if n_rows in shape or size >= n_rows:
                found.append((eqn.primitive.name, shape))
    return found


def primitive_names(jaxpr) -> set[str]:
    """The names of the primitives anywhere in ``jaxpr``."""
    return {_name(eqn) for eqn in all_eqns(jaxpr)}


def _name(eqn) -> str:
    name = eqn.primitive.name
    if name == "jsr_kernel_call" and eqn.params["native"] is None:
        return "jsr_xla_call"
    return name
