"""Row lookups in a traced function: which input arrays a jaxpr reads only as
whole rows along axis 0, and the equations that read them.

A *lookup* of a table ``[V, D1..Dn]`` is one of

- a ``gather`` whose operand is the table, with slice sizes ``(1, D1..Dn)``,
  the row among its start indices and no batching dimensions: ``x[ids]``,
  ``jnp.take(x, ids, axis=0)`` (any ``mode``), ``x.at[ids].get(...)``, and the
  gathers ``jax.vmap`` makes of them (flax's ``Embed`` layers call
  ``jnp.take(table, ids, axis=0)``, equinox's ``Embedding`` ``weight[x]``);
- a ``dynamic_slice`` with slice sizes ``(1, D1..Dn)``: ``x[i]`` for a traced
  scalar ``i``, ``lax.dynamic_index_in_dim(x, i)``;
- the library's own row gather (a ``jsr_kernel_call`` of
  ``_rowops.gather_rows_xla``): ``jsr.take`` and ``jsr.embedding_bag`` on a
  dense table;

either of the table itself or of the table cast to another floating dtype
(``convert_element_type``: flax's ``Embed(dtype=jnp.bfloat16)`` over a
float32 table casts the table and then looks rows up). A cast whose every use
is a lookup is not evaluated: the rewritten lookups cast the rows they read.

:func:`find_lookups` walks a jaxpr and the programs nested in it (``jit``,
``closed_call``, ``checkpoint``, the branches of ``cond``, the body of
``scan`` for a table it closes over or carries unchanged) and sorts every use
of each table: a lookup (a :class:`Site`), another use (by primitive name),
or a lookup inside a program that cannot be rewritten (``custom_jvp_call``,
``custom_vjp_call``, ``while``, a ``scan`` that scans over the table or
changes it). :func:`plan` then builds the :class:`Scope` tree that
``_sparsify`` follows to rewrite the lookups of the accepted tables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr, Var

from ._kernel_call import kernel_call_p
from ._rowops import gather_rows_xla
from ._vma import varying_axes

# Programs whose body is evaluated once, in place, with the equation's inputs.
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint"})
REMATS = frozenset({"remat", "remat2", "checkpoint"})


@dataclasses.dataclass(frozen=True)
class Site:
    """One lookup equation, executed ``prod(lead)`` times.

    Attributes:
      number: its position among all sites of the traced function.
      table: the position of its table among the traced inputs.
      lead: the lengths of the enclosing ``scan`` s, outermost first.
      n: the number of row ids one execution looks up.
      n_rows: ``V``, the table's row count.
      row_shape: ``(D1..Dn)`` of the table.
      varying: the manual mesh axes its result varies over (inside
        ``jax.shard_map``; empty elsewhere).
    """

    number: int
    table: int
    lead: tuple[int, ...]
    n: int
    n_rows: int
    row_shape: tuple[int, ...]
    varying: frozenset = frozenset()

    @property
    def total(self) -> int:
        """Row ids looked up over all executions."""
        return math.prod(self.lead) * self.n


@dataclasses.dataclass
class Scope:
    """What to rewrite in one jaxpr, by equation index.

    Attributes:
      depth: the number of enclosing ``scan`` s.
      lookups: lookup equations and their sites.
      calls: nested programs holding lookups: one scope for a call,
        ``checkpoint`` or ``scan``, one per branch for a ``cond``.
      casts: the ``convert_element_type`` equations of a table whose result
        is looked up (their output stands for the table, uncast).
      sites: every site of this scope and of those nested in it.
    """

    depth: int
    lookups: dict[int, Site] = dataclasses.field(default_factory=dict)
    casts: set[int] = dataclasses.field(default_factory=set)
    calls: dict[int, tuple[Scope, ...]] = dataclasses.field(default_factory=dict)
    sites: list[Site] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Findings:
    """Every use of every table, sorted (see :func:`find_lookups`)."""

    sites: list[Site] = dataclasses.field(default_factory=list)
    other_uses: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    blocked: dict[int, list[str]] = dataclasses.field(default_factory=dict)

    def site(
        self, table: int, lead: tuple[int, ...], n: int, aval: Any, varying: frozenset = frozenset()
    ) -> Site:
        shape = tuple(aval.shape)
        s = Site(len(self.sites), table, lead, n, shape[0], shape[1:], varying)
        self.sites.append(s)
        return s

    def has_lookup(self, table: int) -> bool:
        return any(s.table == table for s in self.sites) or table in self.blocked


def _is_var(v: Any) -> bool:
    return isinstance(v, Var)


def _body(sub: Any) -> tuple[Jaxpr, list[Any]]:
    if isinstance(sub, ClosedJaxpr):
        return sub.jaxpr, list(sub.consts)
    return sub, []


def call_body(eqn: Any) -> tuple[Jaxpr, list[Any]]:
    """The jaxpr and constants of a call or ``checkpoint`` equation."""
    params = eqn.params
    return _body(params["jaxpr"] if "jaxpr" in params else params["call_jaxpr"])


def is_row_gather_call(eqn: Any) -> bool:
    """Whether ``eqn`` is the library's row gather (``gather_rows``: ids
    outside ``[0, V)`` read zeros and get no gradient)."""
    return eqn.primitive is kernel_call_p and eqn.params["xla"] is gather_rows_xla


LOOKUP_PRIMITIVES = ("gather", "dynamic_slice", kernel_call_p.name)


def row_lookup_size(eqn: Any) -> int | None:
    """The number of row ids ``eqn`` looks up from its first operand when it is
    a whole-row lookup along axis 0 (see the module docstring), else None."""
    aval = eqn.invars[0].aval
    shape = tuple(getattr(aval, "shape", ()))
    if len(shape) < 1 or not jnp.issubdtype(aval.dtype, jnp.floating):
        return None
    if is_row_gather_call(eqn):
        return math.prod(eqn.invars[1].aval.shape)
    whole_rows = tuple(eqn.params.get("slice_sizes", ())) == (1, *shape[1:])
    name = eqn.primitive.name
    if name == "dynamic_slice":
        return 1 if whole_rows else None
    if name != "gather" or not whole_rows:
        return None
    dn = eqn.params["dimension_numbers"]
    if dn.operand_batching_dims or dn.start_indices_batching_dims:
        return None
    if 0 not in dn.start_index_map or not set(dn.collapsed_slice_dims) <= {0}:
        return None
    return math.prod(eqn.invars[1].aval.shape[:-1])


def _float_cast(eqn: Any) -> bool:
    """Whether ``eqn`` (a ``convert_element_type``) casts a floating array to
    another floating dtype."""
    new = eqn.params["new_dtype"]
    return jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.floating) and jnp.issubdtype(
        new, jnp.floating
    )


def _where(containers: tuple[str, ...]) -> str:
    return "".join(f" inside `{c}`" for c in reversed(containers))


def _nested(eqn: Any) -> Iterator[tuple[Jaxpr, dict[int, int]]]:
    """Programs nested in an equation that cannot be rewritten, with the map
    from the equation's operand positions to the program's inputs (for
    telling a lookup inside them from other uses)."""
    name, params = eqn.primitive.name, eqn.params
    n_in = len(eqn.invars)
    if name == "while":
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        cond, body = _body(params["cond_jaxpr"])[0], _body(params["body_jaxpr"])[0]
        yield cond, {p: p for p in range(nc)} | {p: p - nb for p in range(nc + nb, n_in)}
        yield body, {p: p - nc for p in range(nc, n_in)}
        return
    for value in params.values():
        for v in value if isinstance(value, tuple | list) else (value,):
            if isinstance(v, ClosedJaxpr | Jaxpr):
                sub = _body(v)[0]
                if len(sub.invars) == n_in:
                    yield sub, {p: p for p in range(n_in)}


class _Walk:
    """One pass over a jaxpr: sorts the uses of the tables (``findings``) and
    builds the scopes of the lookups it meets."""

    def __init__(self, findings: Findings):
        self.findings = findings

    def scope(
        self,
        jaxpr: Jaxpr,
        tables: dict[Var, int],
        lead: tuple[int, ...],
        containers: tuple[str, ...],
        checked_outputs: Any = None,
        passthrough: frozenset = frozenset(),
    ) -> Scope:
        tables = dict(tables)
        scope = Scope(depth=len(lead))
        for i, eqn in enumerate(jaxpr.eqns):
            hits = [(p, tables[v]) for p, v in enumerate(eqn.invars) if _is_var(v) and v in tables]
            if hits:
                self._eqn(i, eqn, hits, tables, scope, lead, containers)
        outs = jaxpr.outvars if checked_outputs is None else checked_outputs
        for v in outs:
            if _is_var(v) and v in tables and v not in passthrough:
                where = _where(containers) or " as the function's output"
                self._other(tables[v], f"returned{where}")
        return scope

    def _other(self, table: int, what: str) -> None:
        self.findings.other_uses.setdefault(table, []).append(what)

    def _add(self, scope: Scope, i: int, subs: tuple[Scope, ...]) -> None:
        found = [s for sub in subs for s in sub.sites]
        if found:
            scope.calls[i] = subs
            scope.sites.extend(found)

    def _eqn(self, i, eqn, hits, tables, scope, lead, containers) -> None:
        name = eqn.primitive.name
        label = f"{name}({eqn.params['name']})" if isinstance(eqn.params.get("name"), str) else name
        inner = (*containers, label)
        if name in LOOKUP_PRIMITIVES and (name != kernel_call_p.name or is_row_gather_call(eqn)):
            n = row_lookup_size(eqn)
            for p, t in hits:
                if p == 0 and n is not None:
                    out = eqn.outvars[0].aval
                    site = self.findings.site(t, lead, n, eqn.invars[0].aval, varying_axes(out))
                    scope.lookups[i] = site
                    scope.sites.append(site)
                else:
                    detail = "not a lookup of whole rows along axis 0"
                    self._other(t, f"`{name}` ({detail}){_where(containers)}")
        elif name == "convert_element_type" and _float_cast(eqn):
            # The cast table stands for the table: its lookups are the table's.
            (_, t), out = hits[0], eqn.outvars[0]
            if _is_var(out) and type(out) is Var:
                tables[out] = t
                scope.casts.add(i)
        elif name in CALLS:
            body, _ = call_body(eqn)
            sub_tables = {body.invars[p]: t for p, t in hits}
            # A table the body returns unchanged (``nnx.jit`` and ``nnx.remat``
            # return the module's state) is the table itself outside.
            passthrough = set()
            for v, out in zip(body.outvars, eqn.outvars, strict=True):
                if _is_var(v) and v in sub_tables:
                    passthrough.add(v)
                    if type(out) is Var:
                        tables[out] = sub_tables[v]
            sub = self.scope(body, sub_tables, lead, inner, passthrough=frozenset(passthrough))
            self._add(scope, i, (sub,))
        elif name == "cond":
            subs = []
            for br in eqn.params["branches"]:
                body = br.jaxpr
                subs.append(self.scope(body, {body.invars[p - 1]: t for p, t in hits}, lead, inner))
            self._add(scope, i, tuple(subs))
        elif name == "scan":
            self._scan(i, eqn, hits, tables, scope, lead, inner)
        else:
            for p, t in hits:
                self._blocked_or_other(eqn, p, t, containers)

    def _scan(self, i, eqn, hits, tables, scope, lead, inner) -> None:
        params = eqn.params
        nc, ncarry = params["num_consts"], params["num_carry"]
        body = params["jaxpr"].jaxpr
        sub_tables, passthrough = {}, set()
        for p, t in hits:
            kept = nc <= p < nc + ncarry and body.outvars[p - nc] is body.invars[p]
            if p < nc or kept:
                sub_tables[body.invars[p]] = t
            if kept:
                passthrough.add(body.invars[p])
                out = eqn.outvars[p - nc]
                if _is_var(out) and type(out) is Var:
                    tables[out] = t  # the scan's output is the table itself
            if not (p < nc or kept):
                self._blocked_or_other(eqn, p, t, inner[:-1], scanned=True)
        sub = self.scope(
            body, sub_tables, (*lead, params["length"]), inner, passthrough=frozenset(passthrough)
        )
        self._add(scope, i, (sub,))

    def _blocked_or_other(self, eqn, p, t, containers, scanned=False) -> None:
        """A use by ``eqn`` that is not rewritten: a lookup blocked by it when
        a program nested in ``eqn`` looks rows of the table up, else another use."""
        name = eqn.primitive.name
        probe = Findings()
        for sub, pos in _nested(eqn):
            if p in pos and 0 <= pos[p] < len(sub.invars):
                _Walk(probe).scope(sub, {sub.invars[pos[p]]: t}, (), ())
        if probe.has_lookup(t):
            how = "scanned over or changed by" if scanned else "inside"
            reason = f"a row lookup {how} `{name}`{_where(containers)}, which is not rewritten"
            self.findings.blocked.setdefault(t, []).append(reason)
        else:
            self._other(t, f"`{name}`{_where(containers)}")


def find_lookups(jaxpr: Jaxpr, tables: dict[Var, int], n_loss_outputs: int = 1) -> Findings:
    """Sorts every use of the ``tables`` (input variable -> table number) in
    ``jaxpr``. Only the first ``n_loss_outputs`` outputs count as uses (an
    auxiliary output is not differentiated).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jaxsparse_rows import _lookups
      >>> def f(emb, proj, ids):
      ...     return jnp.sum(jnp.take(emb, ids, axis=0) @ proj) + jnp.sum(proj[ids])
      >>> closed = jax.make_jaxpr(f)(jnp.ones((9, 2)), jnp.ones((2, 9)), jnp.arange(3))
      >>> emb, proj, _ = closed.jaxpr.invars
      >>> found = _lookups.find_lookups(closed.jaxpr, {emb: 0, proj: 1})
      >>> [(s.table, s.n, s.n_rows) for s in found.sites]
      [(0, 3, 9), (1, 3, 2)]
      >>> found.other_uses
      {1: ['`dot_general`']}
    """
    findings = Findings()
    _Walk(findings).scope(jaxpr, tables, (), (), jaxpr.outvars[:n_loss_outputs])
    return findings


def plan(jaxpr: Jaxpr, tables: dict[Var, int]) -> Scope:
    """The scopes of the lookups of ``tables`` (all of them accepted: every use
    a lookup), their sites numbered from 0."""
    return _Walk(Findings()).scope(jaxpr, tables, (), (), ())
