"""Row-sparse gradients of dense tables that a function only looks rows up
from: the ``sparse=`` option of :func:`jsr.value_and_grad
<jaxsparse_rows.value_and_grad>` and :func:`jsr.grad <jaxsparse_rows.grad>`.

The function is traced once to a jaxpr; ``_lookups`` finds the tables whose
every use is a lookup of whole rows. The jaxpr is then evaluated again with
each lookup ``y = lookup(T, ids)`` replaced by ``y + z``, where ``y`` holds
the same rows, read from ``T`` with the library's row gather (``T`` is not
differentiated), and ``z`` is a zero input of ``y``'s shape that is
differentiated instead. The gradient of ``T`` is the
RowSparse of the rows the lookups read (the effective row ids, as the
lookup's ``mode`` defines them) holding the cotangents of the ``z`` s, sorted,
repeats summed and padded with the id ``V`` to the number of ids looked up.
Nothing of shape ``[V, ...]`` is built for ``T``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Literal, Var

from . import _dtypes, _lookups, _rowops
from ._config import StorageFallbackWarning
from ._rowsparse import RowSparse
from ._vma import vary_over

_LOOKUPS = "`x[ids]`, `jnp.take(x, ids, axis=0)` or `x.at[ids].get()`"


# ------------------------------------------------------------ which leaves


def _arg_names(fun: Callable[..., Any], nums: Sequence[int]) -> list[str]:
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return [positional[i] if i < len(positional) else f"args[{i}]" for i in nums]


def leaf_marks(
    sparse: Any,
    fun: Callable[..., Any],
    diff: tuple[Any, ...],
    nums: Sequence[int],
    single: bool,
    is_leaf: Callable[[Any], bool],
) -> tuple[list[bool | None], list[str]]:
    """Per leaf of the differentiated arguments ``diff`` (flattened with
    ``is_leaf``): True (marked), False (dense) or None (``"auto"`` decides),
    and its name for messages (``params['emb']``)."""
    with_paths = jax.tree_util.tree_flatten_with_path(diff, is_leaf=is_leaf)[0]
    names_of_args = _arg_names(fun, nums)
    names = [names_of_args[path[0].idx] + jax.tree_util.keystr(path[1:]) for path, _ in with_paths]
    if isinstance(sparse, str):
        if sparse != "auto":
            raise ValueError(
                f'`sparse` must be None, "auto", a pytree prefix of bools or a callable '
                f"`(path, leaf) -> bool`, got the string {sparse!r}."
            )
        return [None] * len(with_paths), names
    if callable(sparse):
        marks = []
        for path, leaf in with_paths:
            mark = sparse(path[1:] if single else path, leaf)
            if not isinstance(mark, bool | np.bool_):
                raise TypeError(
                    f"`sparse` (a callable) must return a bool for every leaf, got {mark!r} "
                    f"for `{names[len(marks)]}`."
                )
            marks.append(bool(mark))
        return marks, names
    target = diff[0] if single else diff
    prefix = jax.tree.structure(sparse)
    try:
        subtrees = prefix.flatten_up_to(target)
    except (ValueError, TypeError) as e:
        raise ValueError(
            "`sparse` must be a pytree prefix of the differentiated argument(s) with a bool at "
            f"each of its leaves (e.g. `{{'emb': True, 'w': False}}`, or one bool), got "
            f"{sparse!r}, whose structure does not match: {e}"
        ) from None
    marks = []
    for mark, sub in zip(jax.tree.leaves(sparse), subtrees, strict=True):
        if not isinstance(mark, bool | np.bool_):
            raise TypeError(
                f"`sparse` must hold a bool at each of its leaves, got {mark!r}; write True "
                "for a table that should get a row-sparse gradient, False otherwise."
            )
        marks.extend([bool(mark)] * len(jax.tree.leaves(sub, is_leaf=is_leaf)))
    return marks, names


def _is_table(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return (
        isinstance(leaf, jax.Array | np.ndarray)
        and np.ndim(leaf) >= 1
        and dtype is not None
        and jnp.issubdtype(dtype, jnp.floating)
    )


def _not_a_table_message(name: str, leaf: Any) -> str:
    what = (
        f"a {leaf.dtype}[{', '.join(map(str, leaf.shape))}] array"
        if hasattr(leaf, "dtype") and hasattr(leaf, "shape")
        else f"{type(leaf).__name__} {leaf!r}"
    )
    return (
        f"`sparse` marks `{name}` for a row-sparse gradient, but it is {what}; only floating-"
        "point arrays of at least one dimension (tables [V, ...]) can have one. Leave it "
        "unmarked (False) to get its gradient as `jax.grad` gives it."
    )


def _misuse_message(name: str, uses: list[str]) -> str:
    shown = "; ".join(dict.fromkeys(uses))
    return (
        f"`sparse` marks `{name}` for a row-sparse gradient, which needs every use of it in "
        f"`fun` to be a lookup of whole rows along axis 0 ({_LOOKUPS}), but `fun` also uses "
        f'it in {shown}. Leave it unmarked to get its dense gradient (`sparse="auto"` does '
        "this for such a leaf), or keep that use out of the differentiated function."
    )


def _fallback_message(name: str, reasons: list[str]) -> str:
    shown = "; ".join(dict.fromkeys(reasons))
    return (
        f'sparse="auto": `{name}` gets a dense gradient: {shown}. Look its rows up outside '
        "that construct (or pass a `jsr.pull_rows` view and use `jsr.take`) for a row-sparse "
        "gradient."
    )


# ------------------------------------------------------------ the rewrite


def _bind(eqn: Any, invals: list[Any]) -> list[Any]:
    bound = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _row_ids(eqn: Any, invals: list[Any]) -> tuple[jax.Array, jax.Array]:
    """``(read, grad)``: the row each looked-up id reads (``V`` where it reads the
    fill value), and the row its gradient goes to as ``jax.grad`` sends it
    (``V``, dropped, where it gets none). One id per looked-up row."""
    n_rows = eqn.invars[0].aval.shape[0]
    idt = _dtypes.index_dtype()
    if _lookups.is_row_gather_call(eqn):  # ids out of range read zeros, get no gradient
        row = jnp.asarray(invals[1]).reshape(-1)
        valid = (row >= 0) & (row < n_rows)
        dropped = jnp.where(valid, row, n_rows).astype(idt)
        return dropped, dropped
    if eqn.primitive.name == "dynamic_slice":
        # starts are clamped into [0, V - 1], for the read and for the gradient
        row = jnp.clip(jnp.asarray(invals[1]).reshape(1), 0, n_rows - 1).astype(idt)
        return row, row
    idx = jnp.asarray(invals[1])
    dn, mode = eqn.params["dimension_numbers"], eqn.params["mode"]
    idx = idx.reshape(-1, idx.shape[-1])
    if jnp.iinfo(idx.dtype).max < n_rows:
        idx = idx.astype(idt)
    row = idx[:, dn.start_index_map.index(0)]
    clamped = jnp.clip(row, 0, n_rows - 1).astype(idt)
    if mode == lax.GatherScatterMode.CLIP:
        return clamped, clamped
    # A whole dimension other than the rows: any start but 0 is out of range.
    valid = (row >= 0) & (row < n_rows)
    for k, d in enumerate(dn.start_index_map):
        if d != 0:
            valid &= idx[:, k] == 0
    dropped = jnp.where(valid, row.astype(idt), jnp.asarray(n_rows, idt))
    if mode == lax.GatherScatterMode.FILL_OR_DROP:
        return dropped, dropped  # out-of-range rows read the fill value
    # promise_in_bounds: XLA clamps the read, and the scatter-add of the
    # gradient drops an out-of-range row.
    return clamped, dropped


@jax.tree_util.register_pytree_node_class
class _CastTable:
    """A table cast to other floating dtypes (``dtypes``, in order) that only
    row lookups read: the rewrite reads the rows of ``table`` and casts them,
    never the whole table. A pytree, so it passes through ``cond``, ``scan``
    and ``checkpoint`` as the table would."""

    def __init__(self, table: jax.Array, dtypes: tuple[Any, ...]):
        self.table, self.dtypes = table, dtypes

    def cast(self, x: jax.Array) -> jax.Array:
        for dtype in self.dtypes:
            x = x.astype(dtype)
        return x

    def tree_flatten(self):
        return (self.table,), self.dtypes

    @classmethod
    def tree_unflatten(cls, dtypes, children):
        return cls(children[0], dtypes)


def _cast_table(x: Any, dtype: Any) -> _CastTable:
    """``x`` (a table or a :class:`_CastTable`) cast to ``dtype`` as a view."""
    if isinstance(x, _CastTable):
        return _CastTable(x.table, (*x.dtypes, dtype))
    return _CastTable(x, (dtype,))


def _materialized(x: Any) -> Any:
    """``x`` with a cast view evaluated (an auxiliary output may return it)."""
    return x.cast(x.table) if isinstance(x, _CastTable) else x


def _read_rows(eqn: Any, table: Any, read: jax.Array, z: jax.Array) -> jax.Array:
    """The looked-up rows ``[n, D1..Dn]`` plus ``z`` (the library's row gather:
    the native kernel on CPU), the fill value where ``read`` is ``V``. ``z``
    is added in the table's own dtype, before the casts of a cast table, so
    its cotangent goes back through them as ``jax.grad``'s does."""
    view = table if isinstance(table, _CastTable) else _CastTable(table, ())
    rows = _rowops.gather_rows(view.table, read)
    rows = view.cast(rows + z.astype(rows.dtype))
    if eqn.primitive.name == "gather" and eqn.params["mode"] == lax.GatherScatterMode.FILL_OR_DROP:
        fill = eqn.params["fill_value"]
        if fill is None:
            fill = np.nan
        if fill != 0:
            missing = (read >= view.table.shape[0]).reshape((-1,) + (1,) * (rows.ndim - 1))
            rows = jnp.where(missing, jnp.asarray(fill, rows.dtype), rows)
    return rows


def _to_output(eqn: Any, z: jax.Array) -> jax.Array:
    """``z`` (``[n, D1..Dn]``, one row per looked-up id) laid out as the lookup's output."""
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if eqn.primitive.name != "gather":
        return z.reshape(out_shape)
    dn = eqn.params["dimension_numbers"]
    slice_sizes = eqn.params["slice_sizes"]
    batch = tuple(eqn.invars[1].aval.shape[:-1])
    kept = tuple(s for d, s in enumerate(slice_sizes) if d not in dn.collapsed_slice_dims)
    y = z.reshape(batch + kept)
    batch_positions = [p for p in range(len(out_shape)) if p not in dn.offset_dims]
    src = [0] * len(out_shape)
    for j, p in enumerate(batch_positions):
        src[p] = j
    for k, p in enumerate(dn.offset_dims):
        src[p] = len(batch) + k
    return y if src == sorted(src) else jnp.transpose(y, src)


def _ids_shape(site: _lookups.Site, depth: int) -> tuple[int, ...]:
    return (*site.lead[depth:], site.n)


def _evaluate(jaxpr, consts, args, scope, zs: dict, ids: dict) -> list[Any]:
    """Evaluates ``jaxpr`` with the lookups of ``scope`` rewritten; records
    each site's row ids in ``ids``."""
    env: dict[Var, Any] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts, strict=True):
        env[v] = x
    for v, x in zip(jaxpr.invars, args, strict=True):
        env[v] = x
    for i, eqn in enumerate(jaxpr.eqns):
        invals = [read(v) for v in eqn.invars]
        if i in scope.lookups:
            site = scope.lookups[i]
            rows_read, ids[site.number] = _row_ids(eqn, invals)
            rows = _read_rows(eqn, invals[0], rows_read, zs[site.number])
            outs = [_to_output(eqn, rows)]
        elif i in scope.casts:  # looked up only: the rows read are cast, not the table
            outs = [_cast_table(invals[0], eqn.params["new_dtype"])]
        elif i in scope.calls:
            outs = _nested(eqn, invals, scope.calls[i], zs, ids)
        else:
            outs = _bind(eqn, invals)
        for v, x in zip(eqn.outvars, outs, strict=True):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _typed(values: list[Any], like: list[Any]) -> list[Any]:
    """Values (literals among them) as arrays of their variables' dtypes."""
    return [
        x if isinstance(x, jax.Array | _CastTable) else jnp.asarray(x, v.aval.dtype)
        for x, v in zip(values, like, strict=True)
    ]


def _nested(eqn, invals, subs, zs, ids) -> list[Any]:
    name, params = eqn.primitive.name, eqn.params
    mine = {s.number: zs[s.number] for sub in subs for s in sub.sites}
    if name in _lookups.REMATS:
        body, consts = _lookups.call_body(eqn)

        def remat_body(invals, zsub):
            found: dict = {}
            return _evaluate(body, consts, invals, subs[0], zsub, found), found

        remat = jax.checkpoint(
            remat_body, prevent_cse=params["prevent_cse"], policy=params["policy"]
        )
        outs, found = remat(invals, mine)
        ids.update(found)
        return outs
    if name in _lookups.CALLS:
        body, consts = _lookups.call_body(eqn)
        return _evaluate(body, consts, invals, subs[0], mine, ids)
    if name == "cond":
        everything = [s for sub in subs for s in sub.sites]
        depth = subs[0].depth

        def branch(br, sub):
            def run(ops, zsub):
                found: dict = {}
                outs = _evaluate(br.jaxpr, br.consts, ops, sub, zsub, found)
                for s in everything:
                    if s.number not in found:  # a lookup of another branch: no rows
                        found[s.number] = jnp.full(_ids_shape(s, depth), s.n_rows, idt)
                return _typed(outs, eqn.outvars), found

            return run

        idt = _dtypes.index_dtype()
        branches = [branch(br, sub) for br, sub in zip(params["branches"], subs, strict=True)]
        outs, found = lax.switch(invals[0], branches, invals[1:], mine)
        ids.update(found)
        return outs
    if name == "scan":
        nc, ncarry = params["num_consts"], params["num_carry"]
        closed = params["jaxpr"]
        body, body_consts = closed.jaxpr, list(closed.consts)
        consts = invals[:nc]
        carry_vars = body.invars[nc : nc + ncarry]
        carry0 = _typed(invals[nc : nc + ncarry], carry_vars)
        xs = invals[nc + ncarry :]

        def scan_body(carry, x):
            xs_i, zsub = x
            found: dict = {}
            outs = _evaluate(body, body_consts, [*consts, *carry, *xs_i], subs[0], zsub, found)
            return _typed(outs[:ncarry], carry_vars), (outs[ncarry:], found)

        carry, (ys, found) = lax.scan(
            scan_body,
            carry0,
            (xs, mine),
            length=params["length"],
            reverse=params["reverse"],
            unroll=params["unroll"],
        )
        ids.update(found)
        return [*carry, *ys]
    raise NotImplementedError(name)  # _lookups.plan makes scopes only for the above


# ------------------------------------------------------------ the gradient


def value_and_grad_flat(
    inner: Callable[[list[Any]], Any],
    primals: list[Any],
    marks: list[bool | None],
    names: list[str],
    *,
    has_aux: bool,
    holomorphic: bool,
    allow_int: bool,
) -> tuple[Any, list[Any]]:
    """``jax.value_and_grad(inner, has_aux=...)(primals)`` with a RowSparse
    gradient for each table among ``primals`` that ``marks`` select (True) or
    that ``"auto"`` accepts (None): every use a row lookup. ``False`` leaves,
    and the rest, get the gradient jax gives."""
    for leaf, mark, name in zip(primals, marks, names, strict=True):
        if mark and not _is_table(leaf):
            raise TypeError(_not_a_table_message(name, leaf))
    out_tree: list[Any] = []

    def flat(ps):
        out, tree = jax.tree.flatten(inner(ps))
        out_tree.append(tree)
        return out

    closed = jax.make_jaxpr(flat)(primals)
    invars = closed.jaxpr.invars
    candidates = [
        i
        for i, (leaf, mark) in enumerate(zip(primals, marks, strict=True))
        if mark is not False and not holomorphic and _is_table(leaf)
    ]
    findings = _lookups.find_lookups(closed.jaxpr, {invars[i]: i for i in candidates})
    accepted = []
    for i in candidates:
        other, blocked = findings.other_uses.get(i), findings.blocked.get(i)
        if marks[i]:
            if other or blocked:
                raise ValueError(_misuse_message(names[i], (other or []) + (blocked or [])))
            accepted.append(i)
        elif blocked and not other:
            warnings.warn(_fallback_message(names[i], blocked), StorageFallbackWarning, 4)
        elif not other and any(s.table == i for s in findings.sites):
            accepted.append(i)
    scope = _lookups.plan(closed.jaxpr, {invars[i]: i for i in accepted})
    dense_at = [i for i in range(len(primals)) if i not in accepted]
    tables = {i: jnp.asarray(primals[i]) for i in accepted}
    # Inside `shard_map` each z varies as its lookup's rows do: an invariant z
    # added to varying rows would be cast to varying, and the transpose of that
    # cast sums the cotangents of every device into each one.
    # Each z has its table's dtype: it is added to the rows before any cast.
    zs = {
        s.number: vary_over(
            jnp.zeros((*s.lead, s.n, *s.row_shape), tables[s.table].dtype), s.varying
        )
        for s in scope.sites
    }

    def rewritten(dense, zs):
        args = list(primals)
        for i, x in zip(dense_at, dense, strict=True):
            args[i] = x
        for i, table in tables.items():
            args[i] = table
        ids: dict = {}
        outs = _evaluate(closed.jaxpr, closed.consts, args, scope, zs, ids)
        out = jax.tree.unflatten(out_tree[0], [_materialized(x) for x in outs])
        if has_aux:
            return out[0], (out[1], ids)
        return out, (None, ids)

    (value, (aux, ids)), (g_dense, g_z) = jax.value_and_grad(
        rewritten, argnums=(0, 1), has_aux=True, holomorphic=holomorphic, allow_int=allow_int
    )([primals[i] for i in dense_at], zs)
    grads: list[Any] = [None] * len(primals)
    for i, g in zip(dense_at, g_dense, strict=True):
        grads[i] = g
    for i, table in tables.items():
        grads[i] = _assemble(table, [s for s in scope.sites if s.table == i], ids, g_z)
    return ((value, aux) if has_aux else value), grads


def _assemble(table: jax.Array, sites: list[_lookups.Site], ids: dict, g_z: dict) -> RowSparse:
    """The RowSparse gradient of ``table`` from its sites' row ids and cotangents."""
    n_rows, row_shape = table.shape[0], table.shape[1:]
    idt = _dtypes.index_dtype()
    capacity = sum(s.total for s in sites)
    if sites:
        flat_ids = jnp.concatenate([ids[s.number].reshape(-1) for s in sites])
        rows = jnp.concatenate([g_z[s.number].reshape(-1, *row_shape) for s in sites])
    else:
        flat_ids = jnp.zeros((0,), idt)
        rows = jnp.zeros((0, *row_shape), table.dtype)
    uniq, data, _ = _rowops.coalesce_rows(flat_ids, rows.astype(table.dtype), n_rows, capacity)
    return RowSparse._make(data, uniq, table.shape)
