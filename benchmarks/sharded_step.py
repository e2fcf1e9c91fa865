"""A training step of a row-sharded embedding table on several devices: the
explicit all-to-all step against ``jit``'s own partitioning and a replicated
table.

Model: ids [B = 4096, 4] (the batch split over the devices) into a table
[V x D = 32] float32, sum-pool, a linear head [D], MSE, backward, lazy Adam;
one donated step. Contenders:

* ``explicit``: ``jax.shard_map`` over the devices, the table's rows split
  over them (``P("x", None)``): ``jsr.sharded_embedding_bag`` (ids to their
  owners and rows back, ``all_to_all``), ``jsr.value_and_grad(...,
  sparse=...)`` (the shard's gradient is a RowSparse of local rows, sent to
  its owner by the backward ``all_to_all``), ``jsr.optim.lazy_adam`` on each
  shard; ``capacity`` the default (the ids of a device, which never
  overflows);
* ``explicit, capacity 2x mean``: the same with ``capacity`` twice the mean
  number of a device's ids per shard (checked on the host to hold every
  batch);
* ``jit auto-sharded``: ``jax.jit`` of ``pull_rows`` + ``embedding_bag`` +
  ``value_and_grad`` + ``lazy_adam`` on the table placed as
  ``NamedSharding(mesh, P("x", None))`` and the batch split over the
  devices: XLA partitions the gathers and scatters itself;
* ``replicated``: the same ``jit`` step with the table and Adam's moments on
  every device (``P()``).

For each, at two table sizes: the median step time, the bytes each device
hands to collectives per step (the operands of every all-to-all, all-reduce,
all-gather, reduce-scatter and collective-permute of the compiled program),
and the per-device memory of the compiled program (its arguments, which
hold the parameters and optimizer state, and its temporaries, from
``compiled.memory_analysis()``). Ratios are against ``explicit``. No
target: the figures are for orientation.

On a CPU, ``--host-devices N`` splits it into N devices (XLA's
``--xla_force_host_platform_device_count``, set before JAX starts); on GPUs
the mesh is every device of ``jax.devices()``:

    python benchmarks/sharded_step.py --host-devices 8
    python benchmarks/sharded_step.py            # all GPUs

Run ``python benchmarks/sharded_step.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import sys
import time
from pathlib import Path


def _host_devices(argv) -> int | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--host-devices", type=int, default=None)
    return pre.parse_known_args(argv)[0].host_devices


if __name__ == "__main__":
    # The CPU platform's device count is fixed when JAX starts.
    _n = _host_devices(sys.argv[1:])
    if _n:
        _flag = f"--xla_force_host_platform_device_count={_n}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

LR = 1e-3
N_BATCHES = 4

EXPLICIT = "explicit all_to_all (shard_map)"
EXPLICIT_CAP = "explicit, capacity 2x mean"
JIT = "jit auto-sharded (P('x', None))"
REPLICATED = "replicated table (jit, P())"
COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "reduce-scatter", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2}
_BYTES |= {"s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


# ------------------------------------------------------------ compiled HLO


def _shape_bytes(text: str) -> int:
    """Bytes of every array shape in an HLO shape string (tuples summed)."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([0-9,]*)\]", text):
        size = math.prod(int(d) for d in dims.split(",") if d)
        total += size * _BYTES.get(dtype, 4)
    return total


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


def collective_bytes(hlo: str) -> dict[str, int]:
    """``{collective: bytes of its operands}`` over a compiled module (per
    device: an SPMD program is every device's)."""
    parsed = [i for i in map(parse_instruction, hlo.splitlines()) if i is not None]
    shapes = {name: shape for name, shape, _, _ in parsed}
    out: dict[str, int] = {}
    for _, _, op, operands in parsed:
        if op in COLLECTIVES:
            out[op] = out.get(op, 0) + sum(_shape_bytes(shapes.get(o, "")) for o in operands)
    return out


def memory(compiled) -> dict[str, float]:
    """Per-device MB of the compiled program's arguments and temporaries."""
    m = compiled.memory_analysis()
    if m is None:
        return {}
    return {
        "arguments_mb": m.argument_size_in_bytes / 1e6,
        "temporaries_mb": m.temp_size_in_bytes / 1e6,
    }


# ---------------------------------------------------------------- the steps


def make_batches(v: int, b: int, bag: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, v, (b, bag)).astype(np.int32), rng.standard_normal(b).astype(np.float32))
        for _ in range(N_BATCHES)
    ]


def needed_capacity(batches, n: int, v: int) -> int:
    """The most distinct ids one device sends one shard ("range" placement)."""
    most = 0
    for ids, _ in batches:
        for dev in np.split(ids.reshape(-1), n):
            per_shard = np.bincount(np.unique(dev) // (v // n), minlength=n)
            most = max(most, int(per_shard.max()))
    return most


def head_loss(pooled, w, y):
    return jnp.sum((pooled @ w - y) ** 2)


def init(mesh, v: int, d: int, table_spec):
    @jax.jit
    def make():
        k1, k2 = jax.random.split(jax.random.key(0))
        emb = jax.random.normal(k1, (v, d), jnp.float32) * 0.01
        emb = jax.lax.with_sharding_constraint(emb, NamedSharding(mesh, table_spec))
        return {"emb": emb, "w": jax.random.normal(k2, (d,), jnp.float32) * 0.1}

    return make()


def explicit_step(mesh, opt, b: int, capacity: int | None):
    """The shard_map step: every collective written out."""

    def loss(p, ids, y):
        pooled = jsr.sharded_embedding_bag(
            p["emb"], ids, axis_name="x", mode="sum", capacity=capacity
        )
        return jax.lax.psum(head_loss(pooled, p["w"], y), "x") / b

    def local(p, state, ids, y):
        _, g = jsr.value_and_grad(loss, sparse={"emb": True, "w": False})(p, ids, y)
        updates, state = opt.update(g, state, p)
        return jsr.optim.apply_updates(p, updates), state

    def build(params, state):
        pspec = {"emb": P("x", None), "w": P()}
        sspec = jax.tree.map(lambda a: P("x", None) if a.ndim == 2 else P(), state)
        return jax.shard_map(
            local, mesh=mesh, in_specs=(pspec, sspec, P("x"), P("x")), out_specs=(pspec, sspec)
        )

    return build


def jit_step(opt, b: int):
    """The plain jit step: XLA partitions it from the arrays' shardings."""

    def loss(view, ids, y):
        return head_loss(jsr.embedding_bag(view["emb"], ids, mode="sum"), view["w"], y) / b

    def step(p, state, ids, y):
        view = dict(p, emb=jsr.pull_rows(p["emb"], ids))
        _, g = jsr.value_and_grad(loss)(view, ids, y)
        updates, state = opt.update(g, state, p)
        return jsr.optim.apply_updates(p, updates), state

    return lambda params, state: step


def contender(name, mesh, v, d, b, batches, build, table_spec, stats):
    """A timed contender; its compiled program's bytes and memory go to ``stats``."""

    def setup():
        opt = jsr.optim.lazy_adam(LR)
        params = init(mesh, v, d, table_spec)
        state = opt.init(params)
        batch = NamedSharding(mesh, P("x"))
        pool = [tuple(jax.device_put(a, batch) for a in bt) for bt in batches]
        fn = build(opt)(params, state)
        start = time.perf_counter()
        compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(params, state, *pool[0]).compile()
        stats[name] = {
            "bytes": collective_bytes(compiled.as_text()),
            **memory(compiled),
            "compile_s": time.perf_counter() - start,
        }
        box = [h.block((params, state))]
        cycle = itertools.cycle(pool)

        def run():
            box[0] = compiled(*box[0], *next(cycle))
            return box[0]

        return run

    return h.Contender(name, setup)


def measure_size(args, mesh, v: int, rep) -> dict:
    n = mesh.size
    d, b, bag = args.dim, args.batch, args.bag
    batches = make_batches(v, b, bag)
    per_device = b * bag // n
    cap = max(math.ceil(2 * per_device / n), needed_capacity(batches, n, v))
    stats: dict = {}
    rows, replicated = P("x", None), P()
    contenders = [
        contender(
            EXPLICIT, mesh, v, d, b, batches,
            lambda opt: explicit_step(mesh, opt, b, None), rows, stats,
        ),
        contender(
            EXPLICIT_CAP, mesh, v, d, b, batches,
            lambda opt: explicit_step(mesh, opt, b, cap), rows, stats,
        ),
        contender(JIT, mesh, v, d, b, batches, lambda opt: jit_step(opt, b), rows, stats),
        contender(
            REPLICATED, mesh, v, d, b, batches, lambda opt: jit_step(opt, b), replicated, stats
        ),
    ]  # fmt: skip
    res = h.measure(contenders, args.runs, budget_s=args.budget)
    title = f"step: V={v} x D={d} on {n} {mesh.devices.flat[0].platform} devices, B={b} x {bag}"
    rep.table(title, res, reference=EXPLICIT)  # (compiled ahead of the first call: see below)
    print(f"(capacity 2x mean = {cap} ids per shard per device; default = {per_device})")
    ref = stats.get(EXPLICIT, {})
    ref_bytes = sum(ref.get("bytes", {}).values())
    ref_mem = ref.get("arguments_mb", math.nan) + ref.get("temporaries_mb", math.nan)
    print(
        f"\n| {'contender':<34} | {'KB/step/device':>14} | {'vs ref':>8} "
        f"| {'by collective (KB)':<40} | {'args MB':>8} | {'temp MB':>8} | {'vs ref':>7} "
        f"| {'compile s':>9} |"
    )
    print("|" + "|".join("-" * w for w in (36, 16, 10, 42, 10, 10, 9, 11)) + "|")
    for name, s in stats.items():
        total = sum(s["bytes"].values())
        kinds = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in sorted(s["bytes"].items())) or "none"
        args_mb, temp_mb = s.get("arguments_mb", math.nan), s.get("temporaries_mb", math.nan)
        print(
            f"| {name:<34} | {total / 1e3:>14.1f} | {total / max(ref_bytes, 1):>7.2f}x "
            f"| {kinds:<40} | {args_mb:>8.2f} | {temp_mb:>8.2f} "
            f"| {(args_mb + temp_mb) / ref_mem:>6.2f}x | {s['compile_s']:>9.2f} |"
        )
    sys.stdout.flush()
    return {"capacity": cap, "stats": stats}


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument(
        "--host-devices",
        type=int,
        default=None,
        metavar="N",
        help="on a CPU, run on N host devices (sets XLA_FLAGS before JAX starts; the run "
        "above uses 8)",
    )
    p.add_argument(
        "--vocab",
        type=int,
        nargs=2,
        default=[2**14, 2**20],
        metavar=("V1", "V2"),
        help="the two table sizes (default 2**14 and 2**20 rows)",
    )
    p.add_argument("--dim", type=int, default=32, help="row width D (default 32)")
    p.add_argument("--batch", type=int, default=4096, help="examples B, all devices")
    p.add_argument("--bag", type=int, default=4, help="ids per example (default 4)")
    args = h.parse(p, argv)
    devices = jax.devices()
    n = len(devices)
    if args.smoke:
        args.vocab, args.dim, args.batch, args.bag = [64 * n, 6400 * n], 8, 16 * n, 4
    if args.host_devices and devices[0].platform != "cpu":
        print(f"(--host-devices applies to the CPU platform; running on {n} {devices[0].platform})")
    for v in args.vocab:
        if v % n or args.batch % n:
            p.error(f"--vocab {v} and --batch {args.batch} must be multiples of the {n} devices")
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=devices)
    rep = h.Report(
        "sharded_step",
        args,
        {"V": args.vocab, "D": args.dim, "B": args.batch, "bag": args.bag, "devices": n},
    )
    sizes = {}
    for v in args.vocab:
        sizes[str(v)] = measure_size(args, mesh, v, rep)
    rep.add("sizes", sizes)
    lo, hi = (sizes[str(v)]["stats"] for v in args.vocab)
    print(f"\nbytes per step per device, V={args.vocab[0]} -> V={args.vocab[1]}:")
    for name in lo:
        a, b = sum(lo[name]["bytes"].values()), sum(hi[name]["bytes"].values())
        print(f"  {name:<34} {a / 1e3:>10.1f} KB -> {b / 1e3:>10.1f} KB ({b / max(a, 1):.2f}x)")
    rep.finish()


if __name__ == "__main__":
    main()
