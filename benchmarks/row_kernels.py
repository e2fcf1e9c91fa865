"""The native CPU row kernels against the library's XLA path, by row width.

Every lazy optimizer step, ``apply_updates``, ``pull_rows`` and ``take``
reduce to four row moves on a dense table: a gather of the rows at sorted ids,
an in-place scatter-set and scatter-add at those ids, and the sum of rows by
id in any order (the gather's transpose, into a fresh ``[N, D]`` result). On
CPU the library runs them with its native kernels; elsewhere, or with
``JAXSPARSE_ROWS_NATIVE=0``, with XLA's gather and scatter. This program times
both on the same operands, for rows from 4 to 256 bytes (float32, D = 1 to
64), so a change to the kernels shows where it helps or hurts.

Default workload: a table of V = 1,000,000 rows, K = 65,536 ids (sorted,
distinct, different ones every call from a pool of 8; random with repeats for
the sum of rows), every step jitted and, for the scatters, the table donated.
On a GPU, where the native kernels do not exist (the library runs XLA's ops
there), only XLA's ops are timed, on V = 10,000,000 rows with K = 262,144
ids.

Each op's table is followed by its memory traffic at every D: the bytes the
op must move (the K rows read and written, the ids; the sum of rows also
writes its whole [V, D] result) over the median time, in GB/s beside a
device copy's.

No targets: the targets are on whole steps (``lazy_update.py``,
``embedding_step.py``); this table is for the kernels' maintainers. The
column ``native / XLA`` is the ratio of medians (below 1: the kernel is
faster).

Run ``python benchmarks/row_kernels.py --help`` for the options.
"""

from __future__ import annotations

import functools
import itertools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

from jaxsparse_rows import _native  # noqa: E402
from jaxsparse_rows._rowops import (  # noqa: E402
    gather_rows,
    gather_rows_xla,
    scatter_rows,
    scatter_rows_xla,
    sum_rows,
    sum_rows_xla,
)

N_POOL = 8  # id sets cycled through, so no call finds the last call's rows in cache
OPS = ("gather", "scatter-set", "scatter-add", "sum of rows")
# table rows V, ids K per call, row widths D, by mode
SIZES = {
    "cpu": {"vocab": 1_000_000, "touched": 65_536, "dims": "1,2,4,8,16,64"},
    "gpu": {"vocab": 10_000_000, "touched": 262_144, "dims": "1,2,4,8,16,64"},
    "smoke": {"vocab": 2000, "touched": 256, "dims": "1,4,16"},
}


def random_table(v: int, d: int, seed: int) -> jax.Array:
    """A [v, d] float32 table built on the device (no host copy)."""
    return jax.jit(lambda k: jax.random.normal(k, (v, d), jnp.float32))(jax.random.key(seed))


def op_bytes(op: str, v: int, d: int, k: int) -> int:
    """The bytes ``op`` must move at least: the K rows read (gather: from the
    table; scatters: the new rows, and for scatter-add the table's rows too;
    sum of rows: the rows), the rows written, the int32 ids; the sum of rows
    also writes its whole [V, D] result."""
    rows = 4 * k * d
    moved = {"gather": 2 * rows, "scatter-set": 2 * rows, "scatter-add": 3 * rows}
    return moved.get(op, rows + 4 * v * d) + 4 * k


def _id_pool(v: int, k: int, sorted_unique: bool, seed: int = 0) -> list[jax.Array]:
    rng = np.random.default_rng(seed)
    k = min(k, v)
    if sorted_unique:
        sets = [np.sort(rng.choice(v, k, replace=False)) for _ in range(N_POOL)]
    else:
        sets = [rng.integers(0, v, k) for _ in range(N_POOL)]
    return [jnp.asarray(s.astype(np.int32)) for s in sets]


def contenders(op: str, v: int, d: int, k: int) -> list[h.Contender]:
    """The native and the XLA version of ``op`` on a [v, d] float32 table."""
    rng = np.random.default_rng(1)

    def setup(native: bool):
        if native and h.mode().gpu:
            raise h.Skip("the native kernels are CPU-only: on GPU the library runs XLA's ops")
        if native and not _native.native_kernels_enabled():
            raise h.Skip(f"native kernels unavailable: {_native.native_kernels_status()}")
        rows = jnp.asarray(rng.standard_normal((k, d), dtype=np.float32))
        if op == "gather":
            table = random_table(v, d, 2)
            f = jax.jit(
                functools.partial(gather_rows if native else gather_rows_xla, ids_sorted=True)
            )
            pool = itertools.cycle(_id_pool(v, k, True))
            return lambda: f(table, next(pool))
        if op == "sum of rows":
            f = jax.jit(
                functools.partial(sum_rows if native else sum_rows_xla, n=v, ids_sorted=False)
            )
            pool = itertools.cycle(_id_pool(v, k, False))
            return lambda: f(rows, next(pool))
        add = op == "scatter-add"
        state = [random_table(v, d, 3)]
        if native:
            scatter = functools.partial(scatter_rows, add=add)
        else:
            scatter = lambda t, i, r: scatter_rows_xla(t, i, r, add)  # noqa: E731
        f = jax.jit(scatter, donate_argnums=0)
        pool = itertools.cycle(_id_pool(v, k, True))

        def step():
            state[0] = f(state[0], next(pool), rows)
            return state[0]

        return step

    return [
        h.Contender(f"native {op}", lambda: setup(True)),
        h.Contender(f"XLA {op}", lambda: setup(False)),
    ]


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--vocab", type=int, help="table rows V (default 1e6 on CPU, 1e7 on GPU)")
    p.add_argument(
        "--touched", type=int, help="ids K per call (default 65,536 on CPU, 262,144 on GPU)"
    )
    p.add_argument(
        "--dims", help="comma-separated row widths D (float32 values; default 1,2,4,8,16,64)"
    )
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {OPS}")
    args = h.parse(p, argv)
    h.apply_sizes(args, SIZES)
    dims = [int(x) for x in args.dims.split(",") if x.strip()]
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            p.error(f"--ops: unknown op {o!r}; expected a subset of {OPS}")
    v, k = args.vocab, args.touched
    rep = h.Report("row_kernels", args, {"vocab": v, "touched": k, "dims": dims, "ops": ops})
    rep.copy()
    print(f"\ntable [{v} x D] float32, K = {k} ids per call; times in ms (median)")
    for op in ops:
        rows = []
        for d in dims:
            rows.append((d, h.measure(contenders(op, v, d, k), args.runs, budget_s=args.budget)))
        table = h.sweep_table(f"{op}: native kernel and XLA by row width D", "D", rows)
        for d, res in rows:
            nat, xla = res[f"native {op}"], res[f"XLA {op}"]
            if nat.times and xla.times:
                table.setdefault("native_over_xla", {})[str(d)] = nat.median / xla.median
        ratios = table.get("native_over_xla", {})
        if ratios:
            shown = ", ".join(f"D={d}: {r:.2f}x" for d, r in ratios.items())
            print(f"native / XLA time: {shown}")
        shown = []
        for d, res in rows:
            got = h.print_bandwidth(
                rep,
                f"{op}, D={d}",
                res,
                {n: op_bytes(op, v, d, k) for n in res},
                "the bytes of the op / median time",
                summarise=[f"XLA {op}"] if d == dims[-1] else (),
                show=False,
            )
            cells = ", ".join(f"{r['name'].split()[0]} {r['gbps']:.1f}" for r in got)
            shown.append(f"D={d}: {cells}")
        copy = rep.record["copy"]["gbps"]
        print(f"GB/s (the op's bytes / median time; device copy {copy:.1f}): " + "; ".join(shown))
        rep.add(op, table)
    rep.finish()


if __name__ == "__main__":
    main()
