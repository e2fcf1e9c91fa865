"""The fused GPU kernels of the lazy optimizers against the XLA path and the
memory floor, rule by rule.

On a GPU each lazy rule's row update runs as one Pallas kernel
(``jaxsparse_rows/optim/_fused_rows.py``) that reads every listed row of the
gradient, state and parameter once and writes the state and the update rows
once, in place. This program times, for each rule, the jitted and donated
step that runs it (``update`` of the optimizer's direction; ``apply_updates``
for the scatter-add) two ways, on the same operands:

* ``fused``: the kernel (the default on a GPU);
* ``xla``: the XLA ops (gather, arithmetic, scatter), with the kernels
  switched off (``jsr.set_native_kernels(False)``);

and the ``floor``: the bytes the step must move (the K rows it reads and
writes, the ids) over a device copy's bandwidth (a measured ``x + 1`` on a
large array, counted as read plus write). Each program is compiled ahead of
time, so both forms live side by side, and they are timed round-robin.

Default workload (a GPU): a float32 table of V = 10,000,000 rows of D = 64,
K = 262,144 sorted distinct row ids per step, cycled from a pool of 4.
``--sweep`` times the rules again for each rows-per-program and
warps-per-program in the sweep (``_fused_rows.tuned``), the measurement the
tuning table in ``_fused_rows.TUNING`` awaits.

``--smoke`` (CPU): tiny sizes, the kernels run in Pallas interpret mode; the
times mean nothing, the run checks that every step builds and agrees with
the XLA path. Without a GPU and without ``--smoke`` the program says so and
exits.

Run ``python benchmarks/fused_rows.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows.optim import _fused_rows as fused

POOL = 4  # gradients cycled through, so no step finds its rows in cache


@dataclass(frozen=True)
class Rule:
    """One lazy rule: its optimizer, and the [K, D] rows its step reads and
    writes (gradient, state, parameter, update; ``scalars`` the [K] per-row
    state entries)."""

    name: str
    make: Callable[[], object]
    n_states: int
    reads_param: bool
    rows_moved: int
    scalars_moved: int = 0


RULES = [
    Rule("sgd_momentum", lambda: jsr.optim.scale_by_lazy_sgd(momentum=0.9), 1, False, 4),
    Rule(
        "sgd_nesterov_wd",
        lambda: jsr.optim.scale_by_lazy_sgd(momentum=0.9, nesterov=True, weight_decay=1e-4),
        1,
        True,
        5,
    ),
    Rule("adam", lambda: jsr.optim.scale_by_lazy_adam(), 2, False, 6),
    # the decay inside Adam's kernel (7 rows), then the learning rate's scaling (2)
    Rule("adamw", lambda: jsr.optim.lazy_adamw(0.01, weight_decay=1e-4), 2, True, 9),
    Rule("adagrad", lambda: jsr.optim.scale_by_lazy_adagrad(), 1, False, 4),
    Rule("rowwise_adagrad", lambda: jsr.optim.lazy_rowwise_adagrad(0.01), 1, False, 2, 2),
    Rule("ftrl", lambda: jsr.optim.lazy_ftrl(0.1), 2, True, 7),
    Rule("apply_updates", lambda: None, 0, True, 3),
]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, interpret mode (CPU)")
    p.add_argument("--v", type=int, default=None, help="table rows (default 10**7)")
    p.add_argument("--d", type=int, default=None, help="row width (default 64)")
    p.add_argument("--k", type=int, default=None, help="rows per step (default 262144)")
    p.add_argument("--dtype", default="float32", help="table, state and gradient dtype")
    p.add_argument("--runs", type=int, default=None, help="timed calls per form (default 50)")
    p.add_argument(
        "--rules",
        default=None,
        help="comma-separated subset of: "
        + ", ".join(r.name for r in RULES)
        + " (default: all; adam,apply_updates with --smoke)",
    )
    p.add_argument("--sweep", action="store_true", help="also sweep rows and warps per program")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)
    small = args.smoke
    args.v = args.v or (64 if small else 10**7)
    args.d = args.d or (8 if small else 64)
    args.k = args.k or (12 if small else 262_144)
    args.runs = args.runs or (2 if small else 50)
    return args


# ------------------------------------------------------------------ operands


def gradients(v: int, d: int, k: int, dtype) -> list[tuple[jax.Array, jax.Array]]:
    """``POOL`` pairs of sorted distinct row ids [K] and gradient rows [K, D]."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(POOL):
        ids = np.sort(rng.choice(v, k, replace=False)).astype(np.int32)
        out.append((jnp.asarray(ids), jnp.asarray(rng.standard_normal((k, d)), dtype)))
    return out


def table(v: int, d: int, dtype, seed: int) -> jax.Array:
    """A [V, D] table built on the device."""
    fill = jax.jit(lambda key: jax.random.normal(key, (v, d), dtype) * 0.01)
    return fill(jax.random.key(seed))


def step_fn(rule: Rule, shape: tuple[int, int]) -> Callable:
    """``step(params, state, ids, data) -> (params, state, update data)``; the
    parameter is returned unchanged except by ``apply_updates``."""
    opt = rule.make()

    def step(params, state, ids, data):
        g = jsr.RowSparse._make(data, ids, shape)
        if opt is None:  # apply_updates: the rows are the update
            return jsr.optim.apply_updates(params, g), state, data
        u, state = opt.update(g, state, params)
        return params, state, u.data

    return step


@contextlib.contextmanager
def form(name: str, smoke: bool) -> Iterator[None]:
    """The kernels (``fused``) or the XLA ops (``xla``) inside the block."""
    if name == "fused":
        if smoke:  # the interpreter compiles one row per program fastest
            with fused.force(interpret=True), fused.tuned(rows_per_program=1):
                yield
        else:
            yield
    else:
        previous = _native.kernels_switched_on()
        jsr.set_native_kernels(False)
        try:
            yield
        finally:
            jsr.set_native_kernels(previous)


def compiled(rule: Rule, args: argparse.Namespace, name: str, operands: tuple) -> Callable:
    """The step compiled ahead of time under form ``name`` (so that later
    settings, which clear JAX's caches, do not change it)."""
    with form(name, args.smoke):
        fn = jax.jit(step_fn(rule, (args.v, args.d)), donate_argnums=(0, 1))
        lowered = fn.trace(*operands).lower()
        text = lowered.as_text()
        if name == "fused" and not args.smoke and "xla.gpu.triton" not in text:
            raise RuntimeError(f"{rule.name}: the fused step holds no Triton call")
        return lowered.compile()


# ------------------------------------------------------------------ timing


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def copy_gbps(nbytes: int, runs: int) -> float:
    """A device copy's bandwidth (``x + 1``, read and write) in GB/s."""
    n = max(nbytes // 4, 1)
    x = jnp.zeros((n,), jnp.float32)
    f = jax.jit(lambda a: a + 1, donate_argnums=0).lower(x).compile()
    box = [f(x)]

    def call():
        box[0] = f(box[0])
        return box[0]

    for _ in range(3):
        timed(call)
    t = statistics.median(timed(call) for _ in range(max(runs, 3)))
    return 2 * n * 4 / t / 1e9


def run_rule(rule: Rule, args: argparse.Namespace, grads, gbps: float) -> dict:
    dtype = jnp.dtype(args.dtype)
    params = table(args.v, args.d, dtype, 0)
    opt = rule.make()
    state = None if opt is None else opt.init(params)
    ops = (params, state, *grads[0])
    forms = {}
    for name in ("fused", "xla"):
        forms[name] = compiled(rule, args, name, ops)
    # one operand set per form, each carried through its own donated calls
    boxes = {
        name: [(table(args.v, args.d, dtype, 0), None if opt is None else opt.init(params))]
        for name in forms
    }
    del params, state, ops
    pools = {name: itertools.cycle(grads) for name in forms}
    outs = {}

    def call(name):
        p, s = boxes[name][0]
        ids, data = next(pools[name])
        p, s, u = forms[name](p, s, ids, data)
        boxes[name][0] = (p, s)
        outs[name] = u
        return u

    for name in forms:  # warm-up
        for _ in range(2 if not args.smoke else 1):
            timed(lambda n=name: call(n))
    times = {name: [] for name in forms}
    for _ in range(args.runs):
        for name in forms:
            times[name].append(timed(lambda n=name: call(n)))
    # the same gradients reached both forms in the same order: equal updates
    diff = float(
        jnp.max(jnp.abs(outs["fused"].astype(jnp.float32) - outs["xla"].astype(jnp.float32)))
    )
    item = dtype.itemsize
    nbytes = args.k * (args.d * item * rule.rows_moved + item * rule.scalars_moved + 4)
    floor_ms = nbytes / (gbps * 1e9) * 1e3
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {
        "rule": rule.name,
        "fused_ms": med["fused"],
        "xla_ms": med["xla"],
        "floor_ms": floor_ms,
        "fused_over_xla": med["fused"] / med["xla"],
        "fused_over_floor": med["fused"] / floor_ms,
        "bytes": nbytes,
        "max_abs_diff": diff,
    }


def sweep(rules: list[Rule], args: argparse.Namespace, grads, gbps: float) -> list[dict]:
    rows = []
    for per_program, warps in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8)):
        with fused.tuned(rows_per_program=per_program, num_warps=warps):
            for rule in rules:
                r = run_rule(rule, args, grads, gbps)
                rows.append({"rows_per_program": per_program, "num_warps": warps, **r})
                print(
                    f"{rule.name:>16}  rows/program {per_program:>2}  warps {warps}  "
                    f"fused {r['fused_ms']:8.3f} ms  ({r['fused_over_floor']:.2f}x floor)"
                )
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu and not args.smoke:
        print("fused_rows.py times GPU kernels: no GPU here (run with --smoke to check it).")
        return 0
    rules = RULES
    wanted = args.rules or ("adam,apply_updates" if args.smoke else None)
    if wanted:
        rules = [r for r in RULES if r.name in set(wanted.split(","))]
    grads = gradients(args.v, args.d, args.k, jnp.dtype(args.dtype))
    gbps = copy_gbps(256 * 2**20 if on_gpu else 2**20, args.runs)
    mode = "GPU" if on_gpu else "CPU, Pallas interpret mode (times mean nothing)"
    print(
        f"fused row kernels: V={args.v:,} D={args.d} K={args.k:,} {args.dtype}, {mode}; "
        f"device copy {gbps:.1f} GB/s; {fused.TUNING=}"
    )
    print(
        f"{'rule':>16} {'fused ms':>10} {'xla ms':>10} {'floor ms':>10} {'fused/xla':>10} "
        f"{'fused/floor':>12}"
    )
    results = []
    for rule in rules:
        r = run_rule(rule, args, grads, gbps)
        results.append(r)
        print(
            f"{r['rule']:>16} {r['fused_ms']:>10.3f} {r['xla_ms']:>10.3f} {r['floor_ms']:>10.3f} "
            f"{r['fused_over_xla']:>10.2f} {r['fused_over_floor']:>12.2f}"
        )
        tol = 1e-5 if jnp.dtype(args.dtype).itemsize >= 4 else 1e-2
        if not r["max_abs_diff"] <= tol:
            print(f"  {rule.name}: fused and XLA updates differ by {r['max_abs_diff']:.3g}")
            return 1
    record = {
        "benchmark": "fused_rows",
        "smoke": args.smoke,
        "device": str(jax.devices()[0].device_kind),
        "workload": {"v": args.v, "d": args.d, "k": args.k, "dtype": args.dtype},
        "copy_gbps": gbps,
        "tuning": [list(t) for t in fused.TUNING],
        "results": results,
    }
    if args.sweep:
        record["sweep"] = sweep(rules, args, grads, gbps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
