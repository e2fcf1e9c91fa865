"""``jsr.sharded_take`` / ``jsr.sharded_embedding_bag`` inside ``jax.shard_map``
on N host devices against the same computation on the whole table written
with ``jnp`` (``jsr.embedding_bag`` for the ``sqrtn`` and ``max`` pools), and
a lazy training step inside ``shard_map`` against the same step on one
device, for both placements.

Run as a script with the number of host devices as its argument (the device
count is fixed when JAX starts, so ``test_sharded_lookup.py`` runs it in a
subprocess); ``--hlo`` adds the compiled-HLO facts of the cost tests. It
prints one JSON object: ``{"errors": {case: largest absolute error or
"ErrorType: message"}, "hlo": {...}}``. Every case of a device count runs in
a few compiled programs, to keep the suite fast.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxsparse_rows as jsr

LOCAL_ROWS = 4  # rows of the table on each device
D = 3
B, L = 4, 3  # bags per device, ids per bag
PLACEMENTS = ("range", "mod")


def to_layout(table, n, placement):
    """The global table in the row order that ``P("x", None)`` splits into
    shards: as it is for ``"range"``; for ``"mod"`` the rows 0, n, 2n, ... of
    shard 0 first, then those of shard 1, and so on."""
    if placement == "range":
        return table
    v = table.shape[0]
    return table.reshape(v // n, n, *table.shape[1:]).swapaxes(0, 1).reshape(table.shape)


def from_layout(table, n, placement):
    if placement == "range":
        return table
    v = table.shape[0]
    return table.reshape(n, v // n, *table.shape[1:]).swapaxes(0, 1).reshape(table.shape)


def max_err(got, want) -> float:
    errs = [
        float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
        if np.size(a)
        else 0.0
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    ]
    return max(errs, default=0.0)


def record(results, name, fn):
    """``results[name] = fn()``, or the error it raised (failed by the test)."""
    try:
        results[name] = fn()
    except Exception as e:
        results[name] = f"{type(e).__name__}: {str(e)[:600]}"


def mixed_ids(n, v, rng, shape=(B, L)):
    """Ids ``[n * B, L]`` (B bags per device): repeats, the first and last
    rows, the padding id ``v`` and out-of-range ids (which read zeros)."""
    ids = rng.integers(0, v, (n * shape[0], shape[1]))
    ids[0] = [0, 0, v - 1]
    ids[1] = [v, -1, v + 3]
    ids[2] = [5 % v, 5 % v, 5 % v]
    return ids.astype(np.int32)


def one_shard_ids(n, v, placement, rng):
    """Ids that all belong to shard 0 (repeats among them)."""
    rows = rng.integers(0, v // n, (n * B, L))
    return (rows if placement == "range" else rows * n).astype(np.int32)


def owners(ids, n, v, placement):
    return ids // (v // n) if placement == "range" else ids % n


def needed_capacity(ids, n, v, placement) -> int:
    """The most distinct valid ids one device sends one shard (host side)."""
    most = 0
    for dev in np.asarray(ids).reshape(n, -1):
        dev = np.unique(dev[(dev >= 0) & (dev < v)])
        if dev.size:
            most = max(most, int(np.bincount(owners(dev, n, v, placement), minlength=n).max()))
    return most


def smap(fn, mesh, in_specs, out_specs):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


# ------------------------------------------------------------- the lookups


def sharded_lookups(t, ids, one, w, *, placement, capacity, v):
    """Every lookup of one device: ``ids`` (mixed) and ``one`` (all on shard 0)."""
    kw = dict(axis_name="x", placement=placement)
    return {
        "take": jsr.sharded_take(t, ids, **kw),
        "take_one_shard": jsr.sharded_take(t, one, **kw),
        "take_capacity": jsr.sharded_take(t, ids, capacity=capacity, **kw),
        "take_num_rows": jsr.sharded_take(t, ids, num_rows=v - 1, **kw),
        "take_empty": jsr.sharded_take(t, ids[:0, 0], **kw),
        "sum": jsr.sharded_embedding_bag(t, ids, mode="sum", **kw),
        "sum_one_shard": jsr.sharded_embedding_bag(t, one, mode="sum", **kw),
        "mean_padding_id": jsr.sharded_embedding_bag(t, ids, mode="mean", padding_id=0, **kw),
        "sqrtn_weighted": jsr.sharded_embedding_bag(t, ids, mode="sqrtn", weights=w, **kw),
        "max": jsr.sharded_embedding_bag(t, ids, mode="max", **kw),
        "mean_all_padding": jsr.sharded_embedding_bag(t, jnp.full_like(ids, v), **kw),
    }


def oracle_lookups(table, ids, one, w, *, v):
    """The same on the whole table, with ``jnp`` (``ids`` of one device)."""
    keep = (ids >= 0) & (ids < v)
    rows = jnp.take(table, jnp.where(keep, ids, v), axis=0, mode="fill", fill_value=0)
    real = (keep & (ids != 0))[..., None].astype(table.dtype)
    below = keep & (ids < v - 1)
    return {
        "take": rows,
        "take_one_shard": table[one],
        "take_capacity": rows,
        "take_num_rows": jnp.where(below[..., None], rows, 0),
        "take_empty": jnp.zeros((0, D), table.dtype),
        "sum": jnp.sum(rows, axis=1),
        "sum_one_shard": jnp.sum(table[one], axis=1),
        "mean_padding_id": jnp.sum(rows * real, 1) / jnp.maximum(jnp.sum(real, 1), 1),
        "sqrtn_weighted": jsr.embedding_bag(
            table, jnp.where(keep, ids, v), mode="sqrtn", weights=w
        ),
        "max": jsr.embedding_bag(table, jnp.where(keep, ids, v), mode="max"),
        "mean_all_padding": jnp.zeros((ids.shape[0], D), table.dtype),
    }


def weighted_total(outs):
    """A loss reading every output with distinct weights."""
    return sum(
        jnp.sum(o * jnp.linspace(-1.0, 1.0, o.size, dtype=o.dtype).reshape(o.shape))
        for o in outs.values()
    )


# The lookups differentiated (the others are checked for their values).
DIFFERENTIATED = ("take_capacity", "sum_one_shard", "mean_padding_id", "take_empty")


def lookup_cases(n, mesh, rng, results):
    """Values of every lookup, and the dense (``jax.grad``) and row-sparse
    (``jsr.grad(..., sparse=True)``) gradients of a loss over some of them,
    both placements, in one compiled program; against the ``jnp`` oracle."""
    v = n * LOCAL_ROWS
    table = jnp.asarray(rng.standard_normal((v, D)), jnp.float32)
    ids = mixed_ids(n, v, rng)
    w = jnp.asarray(rng.uniform(0.5, 2.0, ids.shape), jnp.float32)
    ones = {p: one_shard_ids(n, v, p, rng) for p in PLACEMENTS}
    caps = {p: needed_capacity(ids, n, v, p) for p in PLACEMENTS}
    traced = {}

    def body(tables, ids, ones, w):
        out = {}
        for p in PLACEMENTS:
            kw = dict(placement=p, capacity=caps[p], v=v)
            outs = sharded_lookups(tables[p], ids, ones[p], w, **kw)

            def loss(t, p=p, kw=kw):
                outs = sharded_lookups(t, ids, ones[p], w, **kw)
                total = weighted_total({k: outs[k] for k in DIFFERENTIATED})
                return jax.lax.psum(total, "x")

            sparse = jsr.grad(loss, sparse=True)(tables[p])
            traced[p] = (type(sparse).__name__, tuple(sparse.shape))
            out[p] = (outs, jax.grad(loss)(tables[p]), sparse.todense(), sparse.indices[None])
        return out

    def oracle(table, ids, ones, w):
        def per_device(table, p):
            return [
                oracle_lookups(table, ids[s], ones[p][s], w[s], v=v)
                for s in (slice(d * B, (d + 1) * B) for d in range(n))
            ]

        def loss(table, p):
            parts = per_device(table, p)
            return sum(weighted_total({k: o[k] for k in DIFFERENTIATED}) for o in parts)

        def stacked(p):
            return jax.tree.map(lambda *xs: jnp.concatenate(xs), *per_device(table, p))

        return {p: (stacked(p), jax.grad(loss)(table, p)) for p in PLACEMENTS}

    tables = {p: to_layout(table, n, p) for p in PLACEMENTS}
    f = smap(body, mesh, (P("x", None), P("x"), P("x"), P("x")), P("x"))
    got = f(tables, ids, ones, w)
    want = jax.jit(oracle)(table, ids, ones, w)
    for p in PLACEMENTS:
        outs, dense, sparse, indices = got[p]
        want_outs, want_grad = want[p]
        for k in want_outs:
            results[f"{p}_{k}"] = max_err(outs[k], want_outs[k])
        results[f"{p}_grad_dense"] = max_err(from_layout(dense, n, p), want_grad)
        results[f"{p}_grad_sparse"] = max_err(from_layout(sparse, n, p), want_grad)
        # Local row ids of the shard: sorted, in [0, V / n], V / n the padding.
        idx = np.asarray(indices)
        ok = all(np.all(np.diff(r) >= 0) and r.min() >= 0 and r.max() <= LOCAL_ROWS for r in idx)
        results[f"{p}_grad_sparse_local_ids"] = 0.0 if ok else f"{idx.tolist()}"
        good = traced[p] == ("RowSparse", (LOCAL_ROWS, D))
        results[f"{p}_grad_sparse_type"] = 0.0 if good else f"{traced[p]}"


def overflow_cases(n, mesh, rng, results):
    """A capacity below what the ids need: ``checkify`` reports it, and only
    the ids past the capacity (the largest of a shard's) read zeros; the
    exact capacity reports nothing."""
    v = n * LOCAL_ROWS
    table = jnp.asarray(rng.standard_normal((v, D)), jnp.float32)
    ids = np.tile(np.arange(3, dtype=np.int32), (n, 1)) * n  # rows 0, n, 2n: all on shard 0
    need = needed_capacity(ids, n, v, "mod")

    def lookups(capacity):
        def body(t, i):
            return jsr.sharded_take(t, i, axis_name="x", capacity=capacity, placement="mod")

        return checkify.checkify(
            smap(body, mesh, (P("x", None), P("x")), P("x")), errors=checkify.user_checks
        )

    t = to_layout(table, n, "mod")
    err, out = lookups(need - 1)(t, ids)
    message = err.get() or ""
    results["overflow_reported"] = 0.0 if "`capacity` = " in message else f"message: {message!r}"
    expected = np.asarray(table)[ids]
    expected[:, -1] = 0  # the largest id of each device's (full) bucket
    results["overflow_reads_zeros"] = max_err(out, expected)
    err, out = lookups(need)(t, ids)
    results["exact_capacity_reports_nothing"] = 0.0 if err.get() is None else err.get()
    results["exact_capacity"] = max_err(out, np.asarray(table)[ids])


def tuple_axes_cases(n, mesh, rng, results):
    """A table split over two mesh axes at once (``axis_name=("a", "b")``, the
    order of ``P(("a", "b"), None)``, and the reverse): values and the
    row-sparse gradient."""
    if n % 2:
        return
    mesh2 = jax.make_mesh((2, n // 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    v = n * LOCAL_ROWS
    table = jnp.asarray(rng.standard_normal((v, D)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, v, (n * B, L)), jnp.int32)
    want = jax.grad(lambda t: jnp.sum(t[ids] ** 2))(table)
    for axes in (("a", "b"), ("b", "a")):

        def body(t, i, axes=axes):
            def loss(t):
                return jax.lax.psum(jnp.sum(jsr.sharded_take(t, i, axis_name=axes) ** 2), axes)

            return jsr.sharded_take(t, i, axis_name=axes), jsr.grad(loss, sparse=True)(t).todense()

        f = smap(body, mesh2, (P(axes, None), P(axes)), (P(axes), P(axes)))
        rows, grad = f(table, ids)
        name = "tuple_axes_" + "_".join(axes)
        results[name] = max_err(rows, table[ids])
        results[name + "_grad_sparse"] = max_err(grad, want)


# ---------------------------------------------------------------- training

LR = 0.05


def model_loss(lookup, params, ids_sum, ids_mean, y):
    """Sum-pooled and mean-pooled features of one table, a linear head, MSE."""
    pooled = lookup(params["emb"], ids_sum, "sum") + lookup(params["emb"], ids_mean, "mean")
    return jnp.sum((pooled @ params["w"] - y) ** 2)


def training_batches(n, v, rng):
    """Three batches ``(ids_sum by placement, ids_mean, y)``: mixed ids
    (repeats, out-of-range ids, the padding id 0 in the mean-pooled bags),
    every id on shard 0 (the mean-pooled bags all padding), and an empty batch
    (every id a padding id)."""
    y = [jnp.asarray(rng.standard_normal(n * B), jnp.float32) for _ in range(3)]
    mixed = mixed_ids(n, v, rng)
    mixed = {p: mixed for p in PLACEMENTS}
    one = {p: one_shard_ids(n, v, p, rng) for p in PLACEMENTS}
    empty = {p: np.full((n * B, L), v, np.int32) for p in PLACEMENTS}
    padding = np.zeros((n * B, L), np.int32)
    return [(mixed, mixed_ids(n, v, rng), y[0]), (one, padding, y[1]), (empty, padding, y[2])]


def training_cases(n, mesh, rng, results):
    """Three lazy Adam steps inside ``shard_map`` (the shard's row-sparse
    gradient from ``jsr.value_and_grad(..., sparse=...)``) equal the same
    steps on one device with ``pull_rows`` + ``embedding_bag`` on the whole
    table, for both placements."""
    v = n * LOCAL_ROWS
    opt = jsr.optim.lazy_adam(LR)
    table = jnp.asarray(rng.standard_normal((v, D)), jnp.float32)
    w0 = jnp.asarray(rng.standard_normal(D), jnp.float32)

    def sharded_step(params, state, ids_sum, ids_mean, y):
        out = {}
        for p in PLACEMENTS:

            def lookup(t, ids, mode, p=p):
                pad = {"padding_id": 0} if mode == "mean" else {}
                return jsr.sharded_embedding_bag(
                    t, ids, axis_name="x", mode=mode, placement=p, **pad
                )

            def loss(prm, lookup=lookup, ids=ids_sum[p]):
                return jax.lax.psum(model_loss(lookup, prm, ids, ids_mean, y), "x")

            value, g = jsr.value_and_grad(loss, sparse={"emb": True, "w": False})(params[p])
            if not isinstance(g["emb"], jsr.RowSparse):
                raise TypeError(f"the shard's gradient is a {type(g['emb']).__name__}")
            updates, new_state = opt.update(g, state[p], params[p])
            out[p] = (jsr.optim.apply_updates(params[p], updates), new_state, value)
        return out

    def oracle_step(params, state, ids_sum, ids_mean, y):
        def lookup(t, ids, mode):
            pad = {"padding_id": 0} if mode == "mean" else {}
            ids = jnp.where((ids >= 0) & (ids < v), ids, v)
            return jsr.embedding_bag(t, ids, mode=mode, **pad)

        pulled = jnp.concatenate([ids_sum, jnp.where(ids_mean == 0, v, ids_mean)])
        view = dict(params, emb=jsr.pull_rows(params["emb"], pulled))
        value, g = jsr.value_and_grad(lambda prm: model_loss(lookup, prm, ids_sum, ids_mean, y))(
            view
        )
        updates, state = opt.update(g, state, params)
        return jsr.optim.apply_updates(params, updates), state, value

    params = {p: {"emb": to_layout(table, n, p), "w": w0} for p in PLACEMENTS}
    state = {p: opt.init(params[p]) for p in PLACEMENTS}
    state_specs = jax.tree.map(lambda a: P("x", None) if a.ndim == 2 else P(), state)
    param_specs = {p: {"emb": P("x", None), "w": P()} for p in PLACEMENTS}
    out_specs = {p: (param_specs[p], state_specs[p], P()) for p in PLACEMENTS}
    step = smap(sharded_step, mesh, (param_specs, state_specs, P("x"), P("x"), P("x")), out_specs)
    ref_step = jax.jit(oracle_step)
    ref = {p: {"emb": table, "w": w0} for p in PLACEMENTS}
    ref_state = {p: opt.init(ref[p]) for p in PLACEMENTS}
    loss_err = {p: 0.0 for p in PLACEMENTS}
    for ids_sum, ids_mean, y in training_batches(n, v, rng):
        out = step(params, state, ids_sum, ids_mean, y)
        for p in PLACEMENTS:
            params[p], state[p], value = out[p]
            ref[p], ref_state[p], ref_value = ref_step(
                ref[p], ref_state[p], ids_sum[p], ids_mean, y
            )
            relative = max_err(value, ref_value) / max(1.0, abs(float(ref_value)))
            loss_err[p] = max(loss_err[p], relative)
    for p in PLACEMENTS:
        results[f"train_{p}_emb"] = max_err(from_layout(params[p]["emb"], n, p), ref[p]["emb"])
        results[f"train_{p}_w"] = max_err(params[p]["w"], ref[p]["w"])
        results[f"train_{p}_loss_relative"] = loss_err[p]
        moved = np.any(np.asarray(ref[p]["emb"]) != np.asarray(table))
        results[f"train_{p}_moved"] = 0.0 if moved else "the table did not change"


# ------------------------------------------------------- compiled programs

COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
_SHAPE = re.compile(r"[a-z]\w*\[([0-9,]*)\]")


def parse_instruction(line: str):
    """``(name, shape, opcode, operand names)`` of one HLO instruction line,
    or None. A tuple shape may hold ``/*index=5*/`` comments."""
    m = re.match(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", line)
    if not m:
        return None
    name, rest = m.groups()
    if rest.startswith("("):  # a tuple shape: up to its closing parenthesis
        depths = itertools.accumulate({"(": 1, ")": -1}.get(ch, 0) for ch in rest)
        end = next(i for i, depth in enumerate(depths) if depth == 0) + 1
        shape, rest = rest[:end], rest[end:].lstrip()
    else:
        shape, _, rest = rest.partition(" ")
    op = re.match(r"([\w\-]+)\((.*)$", rest)
    if not op:
        return None
    operands = re.findall(r"%([\w.\-]+)", op.group(2).split("), ")[0])
    return name, shape, op.group(1), operands


def hlo_instructions(text):
    """``(computation, name, opcode, [shapes], [operand names])`` of every
    instruction of a compiled module outside fusion bodies (whose values are
    never materialized)."""
    out, computation = [], ""
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head and " = " not in line:
            computation = head.group(1)
            continue
        parsed = parse_instruction(line)
        if parsed is None or computation.startswith(("fused_", "wrapped_", "region_")):
            continue
        name, shape, opcode, operands = parsed
        shapes = [tuple(int(d) for d in dims.split(",") if d) for dims in _SHAPE.findall(shape)]
        out.append((computation, name, opcode, shapes, operands))
    return out


def collectives(text):
    """``[(opcode, [shapes])]`` of the collectives of a compiled module."""
    return [(op, shapes) for _, _, op, shapes, _ in hlo_instructions(text) if op in COLLECTIVES]


def table_sized(text, rows):
    """Instructions with an axis of ``rows`` that are neither parameters nor
    in-place updates of one (an update whose first operand is a parameter or
    such an update): ``[(opcode, shapes)]``."""
    found, inplace = [], set()
    for _, name, op, shapes, operands in hlo_instructions(text):
        if not any(rows in s for s in shapes):
            continue
        if op == "parameter" or (op in ("tuple", "get-tuple-element", "bitcast")):
            inplace.add(name)
        elif (
            op in ("scatter", "fusion", "custom-call", "dynamic-update-slice")
            and operands[:1]
            and operands[0] in inplace
        ):
            inplace.add(name)
        else:
            found.append((op, shapes))
    return found


def explicit_step_hlo(n, mesh, local_rows, n_ids):
    """The compiled text of a donated lazy Adam step on a row-sharded table of
    ``n * local_rows`` rows, ``n_ids`` ids per device, inside ``shard_map``."""
    opt = jsr.optim.lazy_adam(LR)

    def loss(prm, ids, y):
        pooled = jsr.sharded_embedding_bag(prm["emb"], ids, axis_name="x", mode="sum")
        return jax.lax.psum(jnp.sum((pooled @ prm["w"] - y) ** 2), "x")

    def step(prm, st, ids, y):
        _, g = jsr.value_and_grad(loss, sparse={"emb": True, "w": False})(prm, ids, y)
        updates, st = opt.update(g, st, prm)
        return jsr.optim.apply_updates(prm, updates), st

    v = n * local_rows
    prm = {
        "emb": jax.ShapeDtypeStruct((v, 4), jnp.float32),
        "w": jax.ShapeDtypeStruct((4,), jnp.float32),
    }
    st = jax.eval_shape(opt.init, prm)
    pspec = {"emb": P("x", None), "w": P()}
    sspec = jax.tree.map(lambda a: P("x", None) if a.ndim == 2 else P(), st)
    f = jax.shard_map(
        step, mesh=mesh, in_specs=(pspec, sspec, P("x"), P("x")), out_specs=(pspec, sspec)
    )
    ids = jax.ShapeDtypeStruct((n * (n_ids // L), L), jnp.int32)
    y = jax.ShapeDtypeStruct((n * (n_ids // L),), jnp.float32)
    return jax.jit(f, donate_argnums=(0, 1)).lower(prm, st, ids, y).compile().as_text()


def jit_step_hlo(n, mesh, v, n_ids):
    """The compiled text of a donated lazy Adam step under plain ``jit`` on a
    table placed as ``NamedSharding(mesh, P("x", None))``: ``pull_rows`` +
    ``embedding_bag`` + ``value_and_grad``, ids replicated."""
    opt = jsr.optim.lazy_adam(LR)
    sharded = NamedSharding(mesh, P("x", None))

    def loss(view, ids, y):
        return jnp.sum((jsr.embedding_bag(view["emb"], ids, mode="sum") @ view["w"] - y) ** 2)

    def step(prm, st, ids, y):
        view = dict(prm, emb=jsr.pull_rows(prm["emb"], ids))
        _, g = jsr.value_and_grad(loss)(view, ids, y)
        updates, st = opt.update(g, st, prm)
        return jsr.optim.apply_updates(prm, updates), st

    prm = {
        "emb": jax.ShapeDtypeStruct((v, 4), jnp.float32, sharding=sharded),
        "w": jax.ShapeDtypeStruct((4,), jnp.float32),
    }
    st = jax.eval_shape(opt.init, prm)
    st = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharded if a.ndim == 2 else None),
        st,
    )
    ids = jax.ShapeDtypeStruct((n_ids // L, L), jnp.int32)
    y = jax.ShapeDtypeStruct((n_ids // L,), jnp.float32)
    return jax.jit(step, donate_argnums=(0, 1)).lower(prm, st, ids, y).compile().as_text()


def hlo_cases(n, mesh):
    """The facts the cost tests assert, at two table sizes 100x apart."""
    n_ids = 8 * L  # ids per device
    out = {"n_ids": n_ids, "explicit": {}, "jit": {}}
    for local_rows in (2**10, 2**10 * 100):
        text = explicit_step_hlo(n, mesh, local_rows, n_ids)
        out["explicit"][local_rows] = {
            "collectives": collectives(text),
            "table_sized": table_sized(text, local_rows) + table_sized(text, n * local_rows),
        }
        text = jit_step_hlo(n, mesh, n * local_rows, n_ids)
        out["jit"][local_rows] = {
            "collectives": collectives(text),
            "table_sized": table_sized(text, local_rows) + table_sized(text, n * local_rows),
        }
    return out


def main(n: int, hlo: bool) -> dict:
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(n)
    results: dict = {}
    cases = (overflow_cases, training_cases)
    if hlo:
        cases = (lookup_cases, tuple_axes_cases, *cases)
    for case in cases:
        record(results, case.__name__, lambda case=case: case(n, mesh, rng, results) or 0.0)
    return {"errors": results, "hlo": hlo_cases(n, mesh) if hlo else None}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), "--hlo" in sys.argv[2:])))
