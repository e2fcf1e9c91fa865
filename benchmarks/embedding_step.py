"""End-to-end training step of a sparse embedding model, its peak memory and
its compile behaviour.

Model: ids [B = 1024, 4] into a table [V = 1,000,000 x D = 64]
float32 (on a GPU: ids [16,384, 16] into [10,000,000 x 64]), sum-pool over
the ids of each example, a linear head [D -> 1], MSE against a target,
backward, Adam. Contenders, each one step function:

* ``jsr``: ``jsr.pull_rows`` + ``jsr.take`` + ``jsr.value_and_grad`` +
  ``jsr.optim.lazy_adam`` (dense Adam for the head), one jitted donated step;
* ``JAX dense``: ``jax.value_and_grad`` over the whole table + ``optax.adam``;
* ``torch``: ``nn.Embedding(sparse=True)`` + ``SparseAdam`` (dense ``Adam`` for
  the head), with as many threads as XLA's CPU pool (a 1-thread column
  beside it), or on CUDA on a GPU;
* ``hand-written JAX``: ``jnp.unique`` of the ids, gather, grad with respect
  to the unique rows, a hand-written lazy Adam (for orientation);
* ``floor``: a step that only gathers and scatters the batch's distinct rows
  of the table and of Adam's two moments (for orientation).

Two variants of ``jsr`` are measured beside it and judged by no target: its
step jitted with XLA:CPU's loop emitters (``jsr_lean``, timed and measured
for memory; CPU only), and its step compiled ahead of time from abstract shapes before
the table and state exist (``jsr_aot``, memory only). The memory table also
has the gather/scatter floor (``floor``): the same three [V, D] arrays in a
step that does nothing else, the least any JAX step needs. The step table is
followed by its memory traffic in GB/s (the bytes of the distinct rows of the
three arrays, read and written, over the median time) beside a device copy's.

Targets: the jsr step at least 30x faster than JAX dense and at least 1.8x
faster than torch; peak resident memory of 100 steps (each path in its own
subprocess; ``VmHWM`` where Linux has it, else ``ru_maxrss``; the first,
compiling step included, and also reported without it) no more than
(params + optimizer state) x 1.1 + 200 MB (a host measure: not taken on
GPU); compile time per step function reported, and no compilation after the
first step (each timed step uses a different batch of ids of the same shape).
``--sweep`` adds V from 1e4 to 1e7 at B = 1024 (with a gather/scatter floor:
the step must not grow more than 1.25x as fast as the floor) and B from 64 to 16,384 (up to
65,536 looked-up rows) at V = 1e6.

Run ``python benchmarks/embedding_step.py --help`` for the options.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

LR = 1e-3
N_BATCHES = 8
# table rows V, width D, examples per batch B, ids per example, by mode
SIZES = {
    "cpu": {"vocab": 1_000_000, "dim": 64, "batch": 1024, "bag": 4},
    "gpu": {"vocab": 10_000_000, "dim": 64, "batch": 16_384, "bag": 16},
    "smoke": {"vocab": 5000, "dim": 8, "batch": 32, "bag": 4},
}
B1, B2, EPS = 0.9, 0.999, 1e-8

JSR = "jsr (pull_rows + lazy_adam)"
DENSE = "JAX dense (value_and_grad + optax.adam)"
TORCH = "torch Embedding(sparse) + SparseAdam"
HAND = "hand-written JAX (jnp.unique)"
PATHS = {"jsr": JSR, "dense": DENSE, "torch": TORCH, "hand": HAND}
# Also measured, beside the targets (not used for any verdict): jsr's step
# jitted with XLA:CPU's loop emitters instead of its MLIR fusion emitters, a
# per-function compiler option that compiles with far less memory.
LEAN_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
JSR_LEAN = "jsr, compiler_options loop emitters"
# And for memory only: jsr's step compiled ahead of time from abstract shapes
# (``jax.eval_shape``) before the table and state exist, so the compiler's
# transient memory comes and goes while the process is small.
JSR_AOT = "jsr, compiled before the state exists"
# The floor of the V sweep, also measured for memory: a jitted, donated step
# that holds the same three [V, D] arrays and only gathers and scatters the
# batch's rows. Its peak is what any JAX process holding this state needs.
FLOOR = "floor (gather/scatter of the touched rows x 3)"
TIMED_PATHS = {**PATHS, "jsr_lean": JSR_LEAN}
ALL_PATHS = {**TIMED_PATHS, "jsr_aot": JSR_AOT, "floor": FLOOR}


def make_batches(v: int, b: int, bag: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(0, v, (b, bag)).astype(np.int32),
            rng.standard_normal(b).astype(np.float32),
        )
        for _ in range(N_BATCHES)
    ]


def init_params(v: int, d: int) -> dict:
    """``{"emb": [V, D], "w": [D, 1], "b": [1]}`` built on the device."""

    @jax.jit
    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "emb": jax.random.normal(k1, (v, d), jnp.float32) * 0.01,
            "w": jax.random.normal(k2, (d, 1), jnp.float32) * 0.1,
            "b": jnp.zeros((1,), jnp.float32),
        }

    return init(jax.random.key(0))


def head_loss(pooled: jax.Array, p: dict, y: jax.Array) -> jax.Array:
    pred = (pooled @ p["w"])[:, 0] + p["b"][0]
    return jnp.mean(jnp.square(pred - y))


def cycling(step_fn, state, batches):
    box = [h.block(state)]  # finish building the state before the first timed call
    pool = itertools.cycle([(jnp.asarray(i), jnp.asarray(y)) for i, y in batches])

    def step():
        box[0] = step_fn(*box[0], *next(pool))
        return box[0]

    return step


def jsr_setup(v: int, d: int, batches, compiler_options=None, ahead_of_time=False):
    if compiler_options and h.mode().gpu:
        raise h.Skip("XLA:CPU's loop emitters: a CPU compiler option")
    opt = h.require_attr(jsr, "optim.lazy_adam", JSR)(LR)
    apply = h.require_attr(jsr, "optim.apply_updates", JSR)

    def loss(view, ids, y):
        pooled = jsr.take(view["emb"], ids).sum(axis=1)
        return head_loss(pooled, view, y)

    def step(params, state, ids, y):
        view = dict(params, emb=jsr.pull_rows(params["emb"], ids))
        _, grads = jsr.value_and_grad(loss)(view, ids, y)
        updates, state = opt.update(grads, state, params)
        return apply(params, updates), state

    jitted = jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options)
    if ahead_of_time:
        params = jax.eval_shape(lambda: init_params(v, d))
        ids, y = (jax.ShapeDtypeStruct(a.shape, a.dtype) for a in batches[0])
        jitted = jitted.trace(params, jax.eval_shape(opt.init, params), ids, y).lower().compile()
    params = init_params(v, d)
    return jitted, (params, opt.init(params))


def dense_setup(v: int, d: int, batches):
    opt = optax.adam(LR)
    params = init_params(v, d)
    state = opt.init(params)

    def loss(params, ids, y):
        pooled = params["emb"][ids].sum(axis=1)
        return head_loss(pooled, params, y)

    def step(params, state, ids, y):
        _, grads = jax.value_and_grad(loss)(params, ids, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1)), (params, state)


def hand_setup(v: int, d: int, batches):
    head_opt = optax.adam(LR)
    params = init_params(v, d)
    head = {"w": params["w"], "b": params["b"]}
    state = {
        "m": jnp.zeros_like(params["emb"]),
        "v": jnp.zeros_like(params["emb"]),
        "t": jnp.zeros([], jnp.int32),
        "head": head_opt.init(head),
    }

    def loss(rows, head, inv, y):
        pooled = rows[inv].sum(axis=1)
        return head_loss(pooled, head, y)

    def step(params, state, ids, y):
        emb = params["emb"]
        n = ids.size
        uniq, inv = jnp.unique(ids.reshape(-1), size=n, fill_value=v, return_inverse=True)
        kw = dict(indices_are_sorted=True, unique_indices=True)
        rows = emb.at[uniq].get(mode="fill", fill_value=0, **kw)
        head = {"w": params["w"], "b": params["b"]}
        _, (g_rows, g_head) = jax.value_and_grad(loss, argnums=(0, 1))(
            rows, head, inv.reshape(ids.shape), y
        )
        t = state["t"] + 1
        tf = t.astype(jnp.float32)
        m = B1 * state["m"].at[uniq].get(mode="fill", fill_value=0, **kw) + (1 - B1) * g_rows
        vv = B2 * state["v"].at[uniq].get(mode="fill", fill_value=0, **kw) + (1 - B2) * g_rows**2
        upd = -LR * (m / (1 - B1**tf)) / (jnp.sqrt(vv / (1 - B2**tf)) + EPS)
        emb = emb.at[uniq].add(upd, mode="drop", **kw)
        hu, hs = head_opt.update(g_head, state["head"], head)
        head = optax.apply_updates(head, hu)
        state = {
            "m": state["m"].at[uniq].set(m, mode="drop", **kw),
            "v": state["v"].at[uniq].set(vv, mode="drop", **kw),
            "t": t,
            "head": hs,
        }
        return dict(head, emb=emb), state

    return jax.jit(step, donate_argnums=(0, 1)), (params, state)


def torch_build(v: int, d: int, batches):
    """``build(torch, device)`` of the torch step (see ``h.torch_contender``)."""
    return lambda torch, device: torch_setup(torch, device, v, d, batches)


def torch_setup(torch, device, v: int, d: int, batches):
    emb = torch.nn.Embedding(v, d, sparse=True, device=device)
    lin = torch.nn.Linear(d, 1, device=device)
    with torch.no_grad():
        emb.weight.mul_(0.01)
    opt_e = torch.optim.SparseAdam(list(emb.parameters()), lr=LR)
    opt_h = torch.optim.Adam(list(lin.parameters()), lr=LR)
    pool = itertools.cycle(
        [
            (torch.from_numpy(i.astype(np.int64)).to(device), torch.from_numpy(y).to(device))
            for i, y in batches
        ]
    )

    def step():
        ids, y = next(pool)
        opt_e.zero_grad(set_to_none=True)
        opt_h.zero_grad(set_to_none=True)
        pred = lin(emb(ids).sum(dim=1))[:, 0]
        loss = torch.mean((pred - y) ** 2)
        loss.backward()
        opt_e.step()
        opt_h.step()
        return None

    return step


def floor_setup(v: int, d: int, batches):
    """The memory-traffic floor of the step, for the V sweep: gathers and
    scatters the batch's distinct rows of the table and of Adam's two moments
    (3 x [V, D], in place, donated), nothing else. The distinct ids are found on
    the host beforehand, so the floor does no dedup."""
    arrays = (init_params(v, d)["emb"], jnp.zeros((v, d)), jnp.zeros((v, d)))
    flags = {"indices_are_sorted": True, "unique_indices": True}
    n_ids = batches[0][0].size
    pool = []
    for ids, _ in batches:
        uniq = np.unique(ids)
        pool.append(
            jnp.asarray(np.concatenate([uniq, np.full(n_ids - len(uniq), v)]).astype(np.int32))
        )

    def step(*args):
        *arrs, idx = args
        out = []
        for i, a in enumerate(arrs):
            rows = a.at[idx].get(mode="fill", fill_value=0, **flags)
            out.append(a.at[idx].set(rows * 0.999 + 0.001 * i, mode="drop", **flags))
        return tuple(out)

    f = jax.jit(step, donate_argnums=(0, 1, 2))
    box = [h.block(arrays)]
    it = itertools.cycle(pool)

    def call():
        box[0] = f(*box[0], next(it))
        return box[0]

    return call


SETUPS = {
    "jsr": jsr_setup,
    "jsr_lean": functools.partial(jsr_setup, compiler_options=LEAN_OPTIONS),
    "jsr_aot": functools.partial(jsr_setup, ahead_of_time=True),
    "dense": dense_setup,
    "hand": hand_setup,
}


def contender(key: str, v: int, d: int, batches) -> h.Contender:
    if key == "floor":
        return h.Contender(FLOOR, lambda: floor_setup(v, d, batches))
    if key == "torch":
        return h.torch_contender(TORCH, torch_build(v, d, batches))

    def setup():
        f, state = SETUPS[key](v, d, batches)
        return cycling(f, state, batches)

    return h.Contender(ALL_PATHS[key], setup)


def timed_contenders(v: int, d: int, batches) -> list[h.Contender]:
    """The step table: every timed path, the floor, and on CPU torch's
    1-thread column."""
    cs = [contender(k, v, d, batches) for k in TIMED_PATHS]
    cs.append(contender("floor", v, d, batches))
    if h.mode().torch_one_thread_column:
        cs.append(h.torch_contender(h.one_thread(TORCH), torch_build(v, d, batches), threads=1))
    return cs


def distinct_rows(batches) -> float:
    """The mean count of distinct ids in a batch of the pool."""
    return float(np.mean([len(np.unique(ids)) for ids, _ in batches]))


LOOKUP_JSR = "jsr.take(table, ids)"


def lookup_contenders(v: int, d: int, batches) -> list[h.Contender]:
    """The forward lookup alone (inference): ids [B, 4] into the dense table,
    giving [B, 4, D]. jsr runs its native row gather on CPU; jnp indexing is
    XLA's gather; torch is ``F.embedding``. For orientation, no target."""
    pool = [ids for ids, _ in batches]

    def jax_setup(fn):
        def setup():
            table = init_params(v, d)["emb"]
            f = jax.jit(fn)
            ids = itertools.cycle([jnp.asarray(i) for i in pool])
            h.block(table)
            return lambda: f(table, next(ids))

        return setup

    def torch_lookup(torch, device):
        weight = torch.randn(v, d, device=device) * 0.01
        ids = itertools.cycle([torch.from_numpy(i.astype(np.int64)).to(device) for i in pool])

        def call():
            with torch.no_grad():
                return torch.nn.functional.embedding(next(ids), weight)

        return call

    return [
        h.Contender(LOOKUP_JSR, jax_setup(lambda t, i: jsr.take(t, i))),
        h.Contender("jnp: table[ids] (XLA gather)", jax_setup(lambda t, i: t[i])),
        *h.torch_contenders("torch F.embedding", torch_lookup),
    ]


TARGETS = [
    h.Target("jsr step >= 30x faster than JAX dense", JSR, DENSE, 30),
    h.Target("jsr step >= 1.8x faster than torch sparse", JSR, TORCH, 1.8),
]


# ------------------------------------------------------------------ memory


def _proc_status_mb(field: str) -> float | None:
    """``VmHWM`` / ``VmRSS`` of this process from ``/proc/self/status`` (Linux), in MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    """Resets this process's VmHWM to its current RSS; False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _release_freed_heap() -> None:
    """Hands memory that is freed but still cached by the allocator back to the OS.

    glibc keeps freed blocks in its arenas, so after building the table the
    random-number temporaries of this benchmark's init (freed, but resident)
    would count towards the steps' peak. ``malloc_trim(0)`` returns them; on
    other C libraries this does nothing.
    """
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_mb() -> dict:
    """Peak resident memory of this process, two ways.

    ``ru_maxrss`` (``getrusage``) is what the issue names, but on Linux it keeps
    the high-water mark of the process that forked us (it survives fork and
    exec), so a child started from a big benchmark process reports at least the
    parent's size. ``VmHWM`` is the high-water mark of this process's own
    address space; it is the figure compared with the budget when available.
    """
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    hwm = _proc_status_mb("VmHWM")
    return {"ru_maxrss_mb": ru, "vmhwm_mb": hwm, "peak_mb": ru if hwm is None else hwm}


def memory_child(key: str, v: int, d: int, b: int, bag: int, steps: int) -> None:
    """Runs ``steps`` steps of one path and prints its peak RSS as JSON.

    Two peaks: ``peak_mb`` over all the steps, the first one (which compiles
    the step function) included, and ``steady_mb`` over steps 2 to ``steps``
    (the compiler's freed memory handed back first). Without
    ``/proc/self/clear_refs`` both fall back to the whole process's peak.
    """
    base = _proc_status_mb("VmRSS") or _peak_mb()["peak_mb"]
    batches = make_batches(v, b, bag)
    try:
        step = contender(key, v, d, batches).setup()
    except h.Skip as e:
        print(json.dumps({"skipped": str(e)}))
        return
    setup_peak = _peak_mb()
    # The peak while building the table and optimizer state (random-number
    # temporaries of this benchmark's init) is not part of the steps: hand the
    # freed memory back and reset the high-water mark (Linux: writing 5 to
    # clear_refs) before the first step.
    _release_freed_heap()
    before_steps = _proc_status_mb("VmRSS")
    reset = _reset_peak()
    h.block(step())  # compiles the step function
    first = _peak_mb()
    _release_freed_heap()
    reset = _reset_peak() and reset
    for _ in range(steps - 1):
        h.block(step())
    steady = _peak_mb()
    peak = dict(steady, peak_mb=max(first["peak_mb"], steady["peak_mb"]))
    if not reset:
        peak["peak_mb"] = max(peak["peak_mb"], setup_peak["peak_mb"])
    print(
        json.dumps(
            dict(
                peak,
                steady_mb=steady["peak_mb"] if reset else peak["peak_mb"],
                before_steps_mb=before_steps,
                after_imports_mb=base,
                setup_peak_mb=setup_peak["peak_mb"],
                reset=reset,
            )
        )
    )


def run_memory(rep: h.Report, v: int, d: int, b: int, bag: int, steps: int, keys, without) -> None:
    state_mb = 3 * v * d * 4 / 2**20  # params + Adam's two moments (the head is negligible)
    budget = state_mb * 1.1 + 200
    print(f"\n## peak resident memory over {steps} steps (each path in a subprocess, VmHWM)")
    print(
        "steps peak: high-water mark over all the steps, the first (compiling) one included;\n"
        "steady: over steps 2..N. Both start after setup's freed memory is handed back."
    )
    print(f"params + optimizer state = {state_mb:.0f} MB; budget x1.1 + 200 MB = {budget:.0f} MB")
    print(
        f"| {'path':<40} | {'steps peak MB':>13} | {'steady MB':>9} | {'setup peak':>10} "
        f"| {'ru_maxrss MB':>12} | {'after imports':>13} | {'/ budget':>8} |"
    )
    print(f"|{'-' * 42}|{'-' * 15}|{'-' * 11}|{'-' * 12}|{'-' * 14}|{'-' * 15}|{'-' * 10}|")
    table = {}
    for key in keys:
        cmd = [
            sys.executable,
            __file__,
            "--memory-child",
            key,
            "--vocab",
            str(v),
            "--dim",
            str(d),
            "--batch",
            str(b),
            "--bag",
            str(bag),
            "--steps",
            str(steps),
        ]
        for w in without:
            cmd += ["--without", w]
        cmd += ["--torch-threads", str(h.mode().torch_threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            raise RuntimeError(f"memory child {key} failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        table[ALL_PATHS[key]] = out
        if "skipped" in out:
            print(f"| {ALL_PATHS[key]:<40} | skipped: {out['skipped']}")
            continue
        print(
            f"| {ALL_PATHS[key]:<40} | {out['peak_mb']:>13.0f} | {out['steady_mb']:>9.0f} "
            f"| {out['setup_peak_mb']:>10.0f} "
            f"| {out['ru_maxrss_mb']:>12.0f} | {out['after_imports_mb']:>13.0f} "
            f"| {out['peak_mb'] / budget:>8.2f} |"
        )
    rep.add("memory", {"state_mb": state_mb, "budget_mb": budget, "paths": table})
    jsr_out = table.get(JSR, {})
    if "peak_mb" in jsr_out:
        rep.verdict(
            "jsr peak RSS <= (params + state) x 1.1 + 200 MB",
            jsr_out["peak_mb"],
            jsr_out["peak_mb"] <= budget,
            f"measured {jsr_out['peak_mb']:.0f} MB, budget {budget:.0f} MB "
            f"(first step's compilation included; steady state {jsr_out['steady_mb']:.0f} MB)",
        )
    else:
        rep.verdict("jsr peak RSS <= (params + state) x 1.1 + 200 MB", None, None, "skipped")


# -------------------------------------------------------------------- main


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--vocab", type=int, help="table rows V (default 1e6 on CPU, 1e7 on GPU)")
    p.add_argument("--dim", type=int, help="embedding width D (default 64)")
    p.add_argument(
        "--batch", type=int, help="examples per batch B (default 1024 on CPU, 16,384 on GPU)"
    )
    p.add_argument("--bag", type=int, help="ids per example (default 4 on CPU, 16 on GPU)")
    p.add_argument(
        "--steps", type=int, default=None, help="steps of the memory runs (default 100, 20 quick)"
    )
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument(
        "--memory-paths",
        default="jsr,jsr_lean,jsr_aot,floor,dense,torch,hand",
        help="comma-separated paths measured for memory (default all: jsr,jsr_lean,jsr_aot,"
        "floor,dense,torch,hand; jsr_lean is jsr's step with XLA:CPU's loop emitters, jsr_aot "
        "jsr's step compiled from abstract shapes before the state is built, floor a step "
        "that only gathers and scatters the touched rows of the same three [V, D] arrays)",
    )
    p.add_argument("--memory-child", choices=sorted(ALL_PATHS), help=h.argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        h.configure(args)
        memory_child(args.memory_child, args.vocab, args.dim, args.batch, args.bag, args.steps)
        return
    args = h.parse(p, argv)
    h.apply_sizes(args, SIZES)
    if args.steps is None:
        args.steps = 20 if args.quick else 100
    if args.smoke:
        args.steps = min(args.steps, 5)
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (the first step compiles), got {args.steps}")
    v, d, b, bag = args.vocab, args.dim, args.batch, args.bag
    rep = h.Report("embedding_step", args, {"V": v, "D": d, "B": b, "bag": bag, "lr": LR})
    batches = make_batches(v, b, bag)
    rep.copy()
    res = h.measure(timed_contenders(v, d, batches), args.runs, budget_s=args.budget)
    title = f"step: ids [{b}, {bag}] into [{v} x {d}], sum-pool, linear, MSE, Adam"
    rep.table(title, res, TARGETS, reference=JSR)
    print("\nCompilation (target 5: each step function compiles on its first call only):")
    rep.no_recompile(res, [JSR, JSR_LEAN, DENSE, HAND])
    u = distinct_rows(batches)
    step_bytes = 4 * (6 * u * d + b * bag + b)
    h.print_bandwidth(
        rep,
        title,
        res,
        {n: step_bytes for n in (JSR, JSR_LEAN, HAND, TORCH, h.one_thread(TORCH), FLOOR)},
        f"the bytes of the step's row moves (read + write the {u:.0f} distinct rows of the "
        "table and both moments, read the ids and targets) / median time",
        summarise=[FLOOR],
    )
    del res
    res = h.measure(lookup_contenders(v, d, batches), args.runs, budget_s=args.budget)
    title = f"lookup only (inference): ids [{b}, {bag}] into [{v} x {d}]"
    rep.table(title, res, reference=LOOKUP_JSR)
    h.print_bandwidth(
        rep,
        title,
        res,
        {n: 4 * b * bag * (2 * d + 1) for n in res},
        "the bytes of the lookup (read a row per id, write the result, read the ids) / median time",
    )
    del res
    if args.no_memory:
        pass
    elif h.mode().gpu:
        print("\npeak resident memory: a host measure, not taken on GPU")
    else:
        keys = [k.strip() for k in args.memory_paths.split(",") if k.strip() in ALL_PATHS]
        run_memory(rep, v, d, b, bag, args.steps, keys, args.without)

    if args.sweep:
        vs = [1000, 10_000, 100_000] if args.smoke else [10_000, 100_000, 1_000_000, 10_000_000]
        rows = []
        for vv in vs:
            bt = make_batches(vv, b, bag)
            keys = ["jsr", "floor", "torch", "hand"] + (["dense"] if vv <= max(v, 10_000) else [])
            cs = [contender(k, vv, d, bt) for k in keys]
            # One contender at a time in every cell, as the 10^7 cell must be
            # (see lazy_update.py).
            res = h.measure(
                cs, args.runs, budget_s=args.budget, interleave=False, rounds=args.rounds
            )
            rows.append((vv, res))
        sw = h.sweep_table(f"sweep: V at B={b}", "V", rows)
        rep.add("sweep_V", sw)
        h.flat_in_v_verdict(rep, sw, JSR, FLOOR, vs[-1] // vs[0])
        bs = [8, 32, 128] if args.smoke else [64, 256, 1024, 4096, 16_384]
        rows = []
        for bb in bs:
            bt = make_batches(v, bb, bag)
            cs = [contender(k, v, d, bt) for k in ("jsr", "torch", "hand")]
            rows.append((bb, h.measure(cs, args.runs, budget_s=args.budget)))
        rep.add("sweep_B", h.sweep_table(f"sweep: batch B (B x {bag} ids) at V={v}", "B", rows))
    rep.finish()


if __name__ == "__main__":
    main()
