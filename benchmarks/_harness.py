"""Shared machinery of the benchmark programs: argument parsing, timing with
warm-up and compile accounting, tables, target checks and ``--json`` records.

A benchmark builds a list of :class:`Contender` s. Each one has a ``setup``
function returning a zero-argument ``step`` callable that runs one iteration
(and keeps its own state, e.g. donated optimizer buffers) and returns something
to block on. :func:`measure` runs every contender in this process:

* the first call is timed on its own and reported as ``first call``; the JAX
  compile time inside it (tracing + lowering + XLA compilation, from
  ``jax.monitoring`` events) is reported as ``compile``;
* a few more warm-up calls follow, then ``runs`` timed calls, interleaved
  round-robin between contenders so that load from other processes on a shared
  machine hits them alike; a slow contender stops after ``budget_s`` seconds
  (but never before ``min_runs`` calls);
* every timed call blocks with ``jax.block_until_ready`` (torch and numpy calls
  are synchronous); compilations during the timed calls are counted, so a step
  that recompiles shows up.

Ratios are computed from medians. A contender whose package is missing (or
that the library does not provide yet) raises :class:`Skip` from ``setup`` and
is reported with a notice instead of failing the program.

Resources and devices (:func:`select_mode`, set once by :func:`parse`):

* on CPU every peer gets the cores JAX uses: torch runs with as many intra-op
  threads as XLA's CPU thread pool has (:func:`xla_cpu_threads`: the CPUs this
  process may run on, or ``PJRT_NPROC`` / ``NPROC`` where set), and a second,
  1-thread torch column is timed beside it for reference; scipy and
  scikit-learn run on one thread (they have no threaded path for these ops);
* where JAX's default backend is a GPU, JAX arrays live on it, torch's
  contenders run on CUDA (``torch.cuda.synchronize()`` before and after every
  timed call), host-only peers (scipy, scikit-learn) stay on the CPU, and each
  program takes its ``"gpu"`` sizes; a torch without CUDA is skipped with a
  notice. ``--gpu`` demands this mode and exits with :data:`EXIT_NO_GPU`
  where JAX has no GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib
import importlib.util
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

RESULTS_PATH = Path(__file__).resolve().parent / "results.jsonl"
DATA_DIR = Path(__file__).resolve().parent / "data"

_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"

# Packages the user asked to treat as absent (``--without``).
_WITHOUT: set[str] = set()

# Exit status of a program asked for ``--gpu`` where JAX has no GPU.
EXIT_NO_GPU = 3
# Size of the array of the device-copy bandwidth reference, by size table.
COPY_MB = {"smoke": 4, "cpu": 256, "gpu": 1024}
# Exceptions of a torch contender's setup, first call or warm-up that skip it
# with a notice (an op without a CUDA kernel, device memory exhausted...).
TORCH_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, NotImplementedError, MemoryError)


class Skip(Exception):
    """Raised by a contender's ``setup`` when it cannot run here (with the reason)."""


class NoGPU(Exception):
    """``--gpu`` was given where JAX's default backend is not a GPU."""


def xla_cpu_threads() -> int:
    """Threads of XLA's CPU intra-op pool, which XLA's CPU code and jsr's native
    kernels run on: ``PJRT_NPROC`` or ``NPROC`` where set to a positive number
    (XLA reads them), else the CPUs this process may run on
    (``os.sched_getaffinity``, ``os.cpu_count()`` where that is missing)."""
    for var in ("PJRT_NPROC", "NPROC"):
        try:
            n = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if n > 0:
            return n
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Mode:
    """Where the contenders of a run execute, and at which sizes.

    Attributes:
      platform: JAX's default backend (``"cpu"``, ``"gpu"``...).
      sizes: the key of each program's size table: ``"smoke"``, ``"cpu"`` or
        ``"gpu"``.
      torch_device: ``"cpu"`` or ``"cuda"``; None where torch cannot run here
        (``torch_note`` says why).
      torch_note: why torch is skipped, or where it runs.
      cpu_threads: threads of XLA's CPU pool (:func:`xla_cpu_threads`).
      torch_threads: torch's intra-op threads on CPU.
    """

    platform: str
    sizes: str
    torch_device: str | None
    torch_note: str
    cpu_threads: int
    torch_threads: int

    @property
    def gpu(self) -> bool:
        return self.platform == "gpu"

    @property
    def torch_one_thread_column(self) -> bool:
        """Whether a 1-thread torch column is timed beside the main one."""
        return self.torch_device == "cpu" and self.torch_threads > 1

    def describe(self) -> str:
        """One line: who gets which resources."""
        if self.gpu:
            return (
                f"JAX on {_device_kind()}; torch: {self.torch_note}; scipy and scikit-learn "
                "on the host, 1 thread"
            )
        torch = (
            f"torch {self.torch_threads} intra-op thread(s)"
            + (" (and a 1-thread column beside it)" if self.torch_one_thread_column else "")
            if self.torch_device
            else f"torch skipped ({self.torch_note})"
        )
        return (
            f"XLA's CPU pool (JAX, jsr's native kernels) {self.cpu_threads} thread(s); {torch}; "
            "scipy and scikit-learn 1 thread"
        )


def select_mode(
    platform: str,
    *,
    torch_installed: bool,
    torch_cuda: bool,
    gpu_requested: bool = False,
    smoke: bool = False,
    cpu_threads: int | None = None,
    torch_threads: int | None = None,
) -> Mode:
    """The mode of a run on ``platform`` (JAX's default backend).

    A GPU backend gives the ``"gpu"`` sizes and puts torch on CUDA where
    ``torch_cuda`` (``torch.cuda.is_available()``), else skips torch; any
    other backend gives the ``"cpu"`` sizes and torch on the CPU with
    ``torch_threads`` threads (default: ``cpu_threads``, itself by default
    :func:`xla_cpu_threads`). ``smoke`` picks the ``"smoke"`` sizes on either.
    ``gpu_requested`` (``--gpu``) raises :class:`NoGPU` unless ``platform``
    is ``"gpu"``.
    """
    if gpu_requested and platform != "gpu":
        raise NoGPU(
            f"--gpu: JAX's default backend is {platform!r}, not 'gpu' (no GPU here, or a "
            "jaxlib without CUDA: pip install 'jax[cuda12]'). Run without --gpu for the CPU "
            "benchmarks."
        )
    cpu_threads = cpu_threads or xla_cpu_threads()
    torch_threads = torch_threads or cpu_threads
    gpu = platform == "gpu"
    sizes = "smoke" if smoke else ("gpu" if gpu else "cpu")
    if not torch_installed:
        device, note = None, "`torch` is not installed or disabled with --without"
    elif gpu and not torch_cuda:
        device, note = None, "torch has no CUDA device here (a CPU-only build?)"
    elif gpu:
        device, note = "cuda", "on CUDA"
    else:
        device, note = "cpu", f"on the CPU, {torch_threads} intra-op thread(s)"
    return Mode(platform, sizes, device, note, cpu_threads, torch_threads)


def pick_sizes(table: dict[str, dict[str, Any]], mode: Mode) -> dict[str, Any]:
    """A program's sizes for ``mode``: ``table[mode.sizes]``."""
    return dict(table[mode.sizes])


def apply_sizes(args: argparse.Namespace, table: dict[str, dict[str, Any]]) -> None:
    """Sets ``args``' sizes from ``table`` for the run's mode: every size at
    ``--smoke``, else those the command line left unset (None)."""
    for key, value in pick_sizes(table, MODE[0]).items():
        if args.smoke or getattr(args, key) is None:
            setattr(args, key, value)


# The run's mode, set by :func:`parse` (CPU defaults until then).
MODE = [select_mode("cpu", torch_installed=True, torch_cuda=False)]


def mode() -> Mode:
    return MODE[0]


def _device_kind() -> str:
    try:
        return jax.devices()[0].device_kind
    except Exception:  # noqa: BLE001 - only a label
        return jax.default_backend()


def require(module: str) -> Any:
    """Imports ``module`` or raises :class:`Skip` saying it is not installed."""
    top = module.split(".")[0]
    if top in _WITHOUT or module in _WITHOUT:
        raise Skip(f"`{module}` disabled with --without")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise Skip(f"`{module}` is not installed ({e})") from None
    return mod


def require_torch() -> tuple[Any, Any]:
    """``(torch, device)`` for a torch contender in this run's mode, or
    :class:`Skip` where torch is missing or (on a GPU run) has no CUDA."""
    m = mode()
    torch = require("torch")
    if m.torch_device is None:
        raise Skip(m.torch_note)
    if m.torch_device == "cuda" and not torch.cuda.is_available():
        raise Skip("torch has no CUDA device here (a CPU-only build?)")
    return torch, torch.device(m.torch_device)


def _torch_sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and mode().torch_device == "cuda":
        torch.cuda.synchronize()


def torch_contender(
    name: str, build: Callable[[Any, Any], Callable[[], Any]], threads: int | None = None
) -> Contender:
    """A torch contender: ``build(torch, device)`` returns its step.

    On CPU torch runs with ``threads`` intra-op threads (default: the mode's,
    as many as XLA's pool), set before every call outside the timed region;
    on CUDA every timed call is synchronised. A missing torch, a torch without
    CUDA on a GPU run, or a torch error in setup, first call or warm-up skips
    the contender with a notice.
    """

    def n_threads() -> int:
        return threads or mode().torch_threads

    def set_threads() -> None:
        torch = sys.modules.get("torch")
        if torch is not None and mode().torch_device == "cpu":
            if torch.get_num_threads() != n_threads():
                torch.set_num_threads(n_threads())

    def setup() -> Callable[[], Any]:
        torch, device = require_torch()
        set_threads()
        return build(torch, device)

    return Contender(
        name, setup, jax=False, prepare=set_threads, sync=_torch_sync, guard=TORCH_ERRORS
    )


def torch_contenders(name: str, build: Callable[[Any, Any], Callable[[], Any]]) -> list[Contender]:
    """:func:`torch_contender` with the mode's threads, and on CPU (with more
    than one thread) a second one with one thread, named ``"<name>, 1 thread"``
    (for reference: no target uses it)."""
    cs = [torch_contender(name, build)]
    if mode().torch_one_thread_column:
        cs.append(torch_contender(one_thread(name), build, threads=1))
    return cs


def one_thread(name: str) -> str:
    """The name of the 1-thread column of torch contender ``name``."""
    return f"{name}, 1 thread"


def require_attr(obj: Any, dotted: str, what: str) -> Any:
    """``obj.a.b`` or :class:`Skip` saying the library does not provide it yet."""
    cur = obj
    for part in dotted.split("."):
        if not hasattr(cur, part):
            raise Skip(f"{what}: `{dotted}` not available yet in this jaxsparse_rows")
        cur = getattr(cur, part)
    return cur


class _CompileMonitor:
    """Sums JAX compile-related event durations and counts XLA compilations."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.compiles = 0

    def __call__(self, event: str, duration: float, **_: Any) -> None:
        if event in _COMPILE_EVENTS:
            self.seconds += duration
        if event == _BACKEND_COMPILE:
            self.compiles += 1

    def __enter__(self) -> _CompileMonitor:
        _start_listening()
        _ACTIVE_MONITORS.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE_MONITORS.remove(self)


# One process-wide listener that feeds the active monitors: registering once
# works on every jax version (``unregister_event_duration_listener`` is recent).
_ACTIVE_MONITORS: list[_CompileMonitor] = []
_LISTENING = [False]


def _dispatch(event: str, duration: float, **kwargs: Any) -> None:
    for monitor in _ACTIVE_MONITORS:
        monitor(event, duration, **kwargs)


def _start_listening() -> None:
    if not _LISTENING[0]:
        jax.monitoring.register_event_duration_secs_listener(_dispatch)
        _LISTENING[0] = True


def block(out: Any) -> Any:
    """Waits for every JAX array in ``out``; other values pass through."""
    return jax.block_until_ready(out)


@dataclass
class Contender:
    """One implementation of a workload.

    Attributes:
      name: row label in the table (and key in the JSON record).
      setup: builds state and returns ``step()``; raises :class:`Skip` when
        unavailable. Called once.
      jax: whether the step is JAX code (compile time is then reported).
      prepare: called before every call of the step, outside the timed
        region (e.g. torch's thread count, which is process-wide).
      sync: called right before and right after every timed call, inside the
        timed region (e.g. ``torch.cuda.synchronize``: the step's device work
        is then counted, and no earlier work is).
      guard: exceptions that, raised by ``setup``, the first call or the
        warm-up, skip the contender with a notice instead of failing.
    """

    name: str
    setup: Callable[[], Callable[[], Any]]
    jax: bool = True
    prepare: Callable[[], None] | None = None
    sync: Callable[[], None] | None = None
    guard: tuple[type[BaseException], ...] = ()


@dataclass
class Result:
    name: str
    times: list[float] = field(default_factory=list)
    first_s: float = math.nan
    compile_s: float = math.nan
    compiles_first: int = 0
    compiles_timed: int = 0  # XLA compilations after the first call (warm-up + timed)
    skipped: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan

    def as_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {
            "median_ms": self.median * 1e3,
            "min_ms": min(self.times) * 1e3,
            "max_ms": max(self.times) * 1e3,
            "runs": len(self.times),
            "first_call_ms": self.first_s * 1e3,
            "compile_s": None if math.isnan(self.compile_s) else self.compile_s,
            "compiles_in_first_call": self.compiles_first,
            "compiles_after_first_call": self.compiles_timed,
        }


def _call(step: Callable[[], Any], c: Contender) -> float:
    if c.prepare is not None:
        c.prepare()
    if c.sync is not None:
        c.sync()
    t0 = time.perf_counter()
    block(step())
    if c.sync is not None:
        c.sync()
    return time.perf_counter() - t0


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


def _release_device_memory() -> None:
    """Collects garbage and hands torch's cached CUDA memory back (JAX's
    arrays are freed when collected)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and mode().torch_device == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


def measure(
    contenders: Sequence[Contender],
    runs: int,
    *,
    warmup: int = 2,
    min_runs: int = 3,
    budget_s: float = 10.0,
    interleave: bool = True,
    rounds: int = 1,
) -> dict[str, Result]:
    """Times every contender; returns ``{name: Result}`` (skipped ones included).

    With ``interleave`` all contenders are set up first and timed round-robin;
    without it each is set up, timed and released before the next (for sizes
    where all states do not fit in memory together). There, ``rounds > 1``
    splits each contender's runs (and budget) over that many blocks, each with
    a fresh setup and its own warm-up, in a new (seeded) order of contenders
    every round: a burst of load on the host, or an unlucky placement of one
    setup's arrays, then skews one block of a contender's runs rather than all
    of them, and the median over all its runs stays put. The compile time and
    first call reported are those of the first round.
    """
    if rounds < 1 or (interleave and rounds != 1):
        raise ValueError(f"rounds must be 1 with interleave, else >= 1; got {rounds}")
    # in the contenders' order, whatever order the rounds time them in
    results: dict[str, Result] = {c.name: Result(c.name) for c in contenders}
    by_name = {c.name: c for c in contenders}
    started: set[str] = set()
    steps: dict[str, Callable[[], Any]] = {}

    def skip(res: Result, why: str) -> None:
        res.skipped = why
        print(f"  [skip] {res.name}: {why}", flush=True)

    def start(c: Contender) -> None:
        again = c.name in started  # a later round: set up afresh, reported once
        started.add(c.name)
        res = results[c.name]
        try:
            if c.prepare is not None:
                c.prepare()
            step = c.setup()
            with _CompileMonitor() as mon:
                first_s = _call(step, c)
            if not again:
                res.first_s = first_s
                if c.jax:
                    res.compile_s = mon.seconds
                res.compiles_first = mon.compiles
            with _CompileMonitor() as mon:
                for _ in range(warmup):
                    _call(step, c)
        except Skip as e:
            skip(res, str(e))
            return
        except c.guard as e:
            res.times.clear()
            skip(res, f"{type(e).__name__}: {_first_line(e)}")
            _release_device_memory()
            return
        res.compiles_timed += mon.compiles
        steps[c.name] = step

    def timed(name: str) -> None:
        res = results[name]
        with _CompileMonitor() as mon:
            res.times.append(_call(steps[name], by_name[name]))
        res.compiles_timed += mon.compiles

    def wants_more(name: str, part: int = rounds) -> bool:
        """Whether ``name`` is short of the first ``part`` rounds' share of its
        runs and budget (all of them by default)."""
        res = results[name]
        n, share = len(res.times), part / rounds
        return n < math.ceil(runs * share) and (
            n < math.ceil(min_runs * share) or sum(res.times) < budget_s * share
        )

    if interleave:
        for c in contenders:
            start(c)
        # A new order every round (seeded, so runs are comparable): a
        # contender's time can depend on which one ran just before it.
        order = random.Random(0)
        while any(wants_more(n) for n in steps):
            names = list(steps)
            order.shuffle(names)
            for name in names:
                if wants_more(name):
                    timed(name)
    else:
        order = random.Random(0)
        for part in range(1, rounds + 1):
            cs = list(contenders)
            if rounds > 1:
                order.shuffle(cs)
            for c in cs:
                if c.name in started and (results[c.name].skipped or not wants_more(c.name, part)):
                    continue
                start(c)
                if c.name in steps:
                    while wants_more(c.name, part):
                        timed(c.name)
                    del steps[c.name]
                    _release_device_memory()
    steps.clear()
    _release_device_memory()
    return results


@dataclass
class Target:
    """``median(slow) / median(fast) >= at_least``: "fast is at least Nx faster".

    ``within`` targets ("no slower than the floor by more than 1.25x") use
    ``at_least = 1 / 1.25`` with the floor as ``slow``; :meth:`describe` words
    it either way.
    """

    label: str
    fast: str
    slow: str | tuple[str, ...]
    at_least: float

    def reference(
        self, results: dict[str, Result], stat: Callable = statistics.median
    ) -> tuple[float, str] | None:
        """``(stat, name)`` of the contender the target compares with: ``slow``,
        or the fastest (by ``stat``) of the measured ones when ``slow`` names
        several (two implementations of one floor: the floor is the faster)."""
        names = (self.slow,) if isinstance(self.slow, str) else self.slow
        timed = [(stat(results[n].times), n) for n in names if n in results and results[n].times]
        return min(timed) if timed else None

    def ratio(self, results: dict[str, Result], stat: Callable = statistics.median):
        a, ref = results.get(self.fast), self.reference(results, stat)
        if not a or not a.times or ref is None:
            return None
        return ref[0] / stat(a.times)

    def check(self, results: dict[str, Result]) -> dict[str, Any]:
        r = self.ratio(results)
        if r is None:
            verdict = "n/a"
        else:
            verdict = "PASS" if r >= self.at_least else "MISS"
        ref = self.reference(results)
        return {
            "label": self.label,
            "fast": self.fast,
            "slow": ref[1] if ref else self.slow,
            "ratio": r,
            "ratio_of_mins": self.ratio(results, min),
            "at_least": self.at_least,
            "verdict": verdict,
        }


def _fmt_ms(s: float) -> str:
    ms = s * 1e3
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    return f"{ms:.2f}"


def print_table(title: str, results: dict[str, Result], reference: str | None = None) -> None:
    """Prints one table: median/min/max ms, runs, first call, compile, ratio."""
    print(f"\n## {title}")
    ref = results.get(reference) if reference else None
    ref_med = ref.median if ref and ref.times else math.nan
    head = (
        f"| {'contender':<40} | {'median ms':>9} | {'min':>8} | {'max':>8} | {'runs':>4} "
        f"| {'1st call ms':>11} | {'compile s':>9} | {'recompiles':>10} | "
        f"{'vs ref':>7} |"
    )
    if reference:
        print(f"(vs ref = median / median of `{reference}`)")
    print(head)
    print("|" + "|".join("-" * (len(p)) for p in head.split("|")[1:-1]) + "|")
    for name, r in results.items():
        if r.skipped:
            print(f"| {name:<40} | skipped: {r.skipped}")
            continue
        comp = "-" if math.isnan(r.compile_s) else f"{r.compile_s:.2f}"
        ratio = "" if math.isnan(ref_med) else f"{r.median / ref_med:.2f}x"
        recompiles = str(r.compiles_timed) if not math.isnan(r.compile_s) else "-"
        print(
            f"| {name:<40} | {_fmt_ms(r.median):>9} | {_fmt_ms(min(r.times)):>8} | "
            f"{_fmt_ms(max(r.times)):>8} | {len(r.times):>4} | {_fmt_ms(r.first_s):>11} | "
            f"{comp:>9} | {recompiles:>10} | {ratio:>7} |"
        )
    sys.stdout.flush()


def print_targets(checks: list[dict[str, Any]]) -> None:
    """Prints each target with its measured ratio and PASS / MISS."""
    if not checks:
        return
    print("\nTargets (ratios of medians):")
    for c in checks:
        bound, r = c["at_least"], c["ratio"]
        if r is None:
            got = "n/a (a contender was skipped)"
        elif bound >= 1:
            got = f"{r:.2f}x"
        else:
            got = f"{r:.2f}x speed = {1 / r:.2f}x the time of `{c['slow']}`"
        want = (
            f">= {bound:.2f}x"
            if bound >= 1
            else f">= {bound:.2f}x speed (time <= {1 / bound:.2f}x)"
        )
        mins = (
            "" if c.get("ratio_of_mins") is None else f" [ratio of mins {c['ratio_of_mins']:.2f}x]"
        )
        print(f"  {c['verdict']:<4}  {c['label']}: measured {got}; target {want}{mins}")
    sys.stdout.flush()


COPY = "device copy (x = x + 1, in place)"


def copy_contender(mb: float) -> Contender:
    """``x = x + 1`` on a float32 array of ``mb`` MB on JAX's default device,
    donated (in place): a stream that reads and writes every byte once, the
    reference of the memory-traffic figures. In place, because a fresh
    result of that size would be a fresh ``mmap`` on CPU, page-faulted in on
    every call."""

    def setup():
        n = int(mb * 2**20) // 4
        box = [block(jax.jit(lambda: jnp.arange(n, dtype=jnp.float32))())]
        f = jax.jit(lambda a: a + 1, donate_argnums=0)

        def step():
            box[0] = f(box[0])
            return box[0]

        return step

    return Contender(COPY, setup)


def copy_bandwidth(runs: int, budget_s: float) -> tuple[float, float]:
    """``(GB/s, MB)`` of :func:`copy_contender` at this mode's size
    (:data:`COPY_MB`): bytes read + written over the median time."""
    mb = COPY_MB[mode().sizes]
    res = measure([copy_contender(mb)], runs, budget_s=budget_s)[COPY]
    return 2 * mb * 2**20 / res.median / 1e9, mb


def gbps(nbytes: float, r: Result | None) -> float | None:
    """``nbytes`` over ``r``'s median time, in GB/s (None if not timed)."""
    if r is None or not r.times:
        return None
    return nbytes / r.median / 1e9


def print_bandwidth(
    rep: Report,
    title: str,
    results: dict[str, Result],
    nbytes: dict[str, float],
    what: str,
    summarise: Sequence[str] = (),
    show: bool = True,
) -> list[dict[str, Any]]:
    """Prints and records the memory traffic of a table's contenders: the
    bytes a call must move at least (``nbytes[name]``, ``what`` says which)
    over its median time, in GB/s and as a fraction of the device copy's
    bandwidth (:meth:`Report.copy`). The rows of ``summarise`` (the floors)
    also go to ``run_all.py``'s summary table. ``show=False`` records without printing. Returns the
    rows recorded."""
    copy = rep.record.get("copy")
    if show:
        print(f"\nmemory traffic, {title}: {what}")
    if copy and show:
        print(
            f"  {COPY} of {copy['mb']:g} MB: {copy['gbps']:.1f} GB/s "
            "(bytes read + written / median time)"
        )
    rows = []
    for name, b in nbytes.items():
        g = gbps(b, results.get(name))
        if g is None:
            continue
        share = g / copy["gbps"] if copy else None
        rows.append(
            {
                "table": title,
                "name": name,
                "mb": b / 2**20,
                "gbps": g,
                "of_copy": share,
                "summary": name in summarise,
            }
        )
        of = "" if share is None else f" = {share:.2f} of the copy's"
        if show:
            print(f"  {name:<46} {b / 2**20:9.2f} MB per call {g:8.2f} GB/s{of}")
    rep.record["bandwidth"].extend(rows)
    sys.stdout.flush()
    return rows


def git_state() -> dict[str, Any]:
    """HEAD commit of the checkout and whether the library has uncommitted edits."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "jaxsparse_rows"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head, "library_dirty": bool(dirty)}


def machine_info() -> dict[str, Any]:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": _device_kind(),
        "mode": asdict(mode()),
        "git": git_state(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
    return info


def parser(description: str) -> argparse.ArgumentParser:
    """The common command line of every benchmark program."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, few runs (for the tests)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer runs (10, budget 2 s, 1 round) and the programs' quick options (a smaller "
        "LibSVM file, fewer memory steps)",
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="require JAX's default backend to be a GPU (exit status 3 otherwise); a GPU "
        "backend is used, with GPU sizes and torch on CUDA, with or without this flag",
    )
    p.add_argument("--sweep", action="store_true", help="also run the scaling sweeps")
    p.add_argument("--runs", type=int, default=None, help="timed runs per contender")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of timed runs after which a slow contender stops (min 3 runs)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="blocks each contender's runs are split into, each with a fresh setup, in the "
        "V sweeps of lazy_update.py and embedding_step.py, whose flat-in-V verdicts rest on "
        "cells timed one contender at a time (default 3, 1 with --smoke or --quick)",
    )
    p.add_argument(
        "--json", action="store_true", help=f"append one JSON line per run to {RESULTS_PATH.name}"
    )
    p.add_argument("--json-path", type=Path, default=RESULTS_PATH, help=argparse.SUPPRESS)
    # where run_all.py collects every program's record for its summary table
    p.add_argument("--summary-path", type=Path, default=None, help=argparse.SUPPRESS)
    # for the tests: pick the mode (sizes, torch's device) as on this platform
    p.add_argument("--platform", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch intra-op threads on CPU (default: as many as XLA's CPU pool, i.e. the "
        "CPUs this process may use, or PJRT_NPROC where set; a 1-thread torch column is "
        "timed beside it)",
    )
    p.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PKG",
        help="treat a package (torch, scipy, sklearn, jax.experimental.sparse) as not installed",
    )
    return p


def _torch_state(platform: str) -> tuple[bool, bool]:
    """``(installed, cuda)`` of torch, importing it only on a GPU platform."""
    if "torch" in _WITHOUT or importlib.util.find_spec("torch") is None:
        return False, False
    if platform != "gpu":
        return True, False
    try:
        import torch

        return True, bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken torch is a missing one
        return False, False


def configure(args: argparse.Namespace) -> Mode:
    """Sets the run's ``--without`` packages and :class:`Mode` from ``args``
    (:class:`NoGPU` for ``--gpu`` without a GPU)."""
    _WITHOUT.update(args.without)
    # JAX allocates device memory as it goes instead of taking 75% up front,
    # so that torch's CUDA contenders in the same process find memory.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    plat = args.platform or jax.default_backend()
    installed, cuda = _torch_state(plat)
    MODE[0] = select_mode(
        plat,
        torch_installed=installed,
        torch_cuda=cuda,
        gpu_requested=args.gpu,
        smoke=args.smoke,
        torch_threads=args.torch_threads,
    )
    return MODE[0]


def parse(p: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line, sets the mode (:func:`configure`; ``--gpu``
    without a GPU exits with :data:`EXIT_NO_GPU`), fills in the run-count
    defaults and prints the run's header."""
    args = p.parse_args(argv)
    try:
        m = configure(args)
    except NoGPU as e:
        print(f"{Path(sys.argv[0]).name}: {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_NO_GPU)
    if args.runs is None:
        args.runs = 3 if args.smoke else (10 if args.quick else 20)
    if args.budget is None:
        args.budget = 1.0 if args.smoke else (2.0 if args.quick else 8.0)
    if args.rounds is None:
        args.rounds = 1 if args.smoke or args.quick else 3
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    shown = f"{m.sizes} sizes" + (", quick" if args.quick else "")
    print(
        f"# {Path(sys.argv[0]).name}: jax {jax.__version__} on {jax.default_backend()}, "
        f"{os.cpu_count()} CPUs, {platform.platform()} [{shown}]\n# resources: {m.describe()}",
        flush=True,
    )
    return args


class Report:
    """Collects the tables and target checks of one program run for ``--json``."""

    def __init__(self, benchmark: str, args: argparse.Namespace, config: dict[str, Any]):
        self.benchmark = benchmark
        self.args = args
        self.record: dict[str, Any] = {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "benchmark": benchmark,
            "machine": machine_info(),
            "smoke": bool(args.smoke),
            "quick": bool(getattr(args, "quick", False)),
            "config": dict(config, torch_threads=mode().torch_threads, sizes=mode().sizes),
            "tables": {},
            "targets": [],
            "bandwidth": [],
            "extra": {},
        }

    def copy(self) -> None:
        """Measures and records the device copy's bandwidth
        (:func:`copy_bandwidth`), the reference of :func:`print_bandwidth`."""
        g, mb = copy_bandwidth(self.args.runs, self.args.budget)
        self.record["copy"] = {"gbps": g, "mb": mb}
        print(f"\n{COPY}, {mb:g} MB float32 on {_device_kind()}: {g:.1f} GB/s", flush=True)

    def table(
        self,
        title: str,
        results: dict[str, Result],
        targets: Sequence[Target] = (),
        reference: str | None = None,
    ) -> list[dict[str, Any]]:
        print_table(title, results, reference)
        checks = [t.check(results) for t in targets]
        for c in checks:
            c["table"] = title
        print_targets(checks)
        self.record["tables"][title] = {k: r.as_dict() for k, r in results.items()}
        self.record["targets"].extend(checks)
        return checks

    def no_recompile(self, results: dict[str, Result], names: Sequence[str]) -> None:
        """Target 5: a step function compiles on its first call only."""
        for name in names:
            r = results.get(name)
            if r is None or not r.times:
                verdict, n = "n/a", None
            else:
                n = r.compiles_timed
                verdict = "PASS" if n == 0 else "MISS"
            shown = "n/a (skipped)" if n is None else f"{n} compilation(s) after the first call"
            comp = "" if r is None or math.isnan(r.compile_s) else f" (compile {r.compile_s:.2f} s)"
            print(f"  {verdict:<4}  {name}: {shown}{comp}, target 0")
            self.record["targets"].append(
                {
                    "label": f"{name} compiles nothing after its first step",
                    "ratio": n,
                    "at_least": None,
                    "verdict": verdict,
                    "table": "compile",
                }
            )

    def verdict(self, label: str, value: Any, ok: bool | None, text: str) -> None:
        """Prints and records a target that is not a ratio of two medians."""
        v = "n/a" if ok is None else ("PASS" if ok else "MISS")
        print(f"  {v:<4}  {label}: {text}")
        self.record["targets"].append(
            {"label": label, "ratio": value, "at_least": None, "verdict": v, "text": text}
        )
        sys.stdout.flush()

    def add(self, key: str, value: Any) -> None:
        self.record["extra"][key] = value

    def finish(self) -> None:
        misses = [c for c in self.record["targets"] if c["verdict"] == "MISS"]
        held = [c for c in self.record["targets"] if c["verdict"] == "PASS"]
        print(
            f"\n{self.benchmark}: {len(held)} target(s) PASS, {len(misses)} MISS, "
            f"{len(self.record['targets']) - len(held) - len(misses)} n/a"
        )
        line = json.dumps(self.record, default=_json_default) + "\n"
        if self.args.json:
            path = Path(self.args.json_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(line)
            print(f"appended a record to {path}")
        if getattr(self.args, "summary_path", None):
            with Path(self.args.summary_path).open("a") as f:
                f.write(line)


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def flat_in_v_verdict(rep: Report, sweep: dict, name: str, floor: str, span: int) -> None:
    """Records "``name`` flat in V": its growth over the sweep (from
    :func:`sweep_table`) at most 1.25x the floor's growth.

    The step does the same work at every V, but a bigger table misses the
    caches and the TLB more often; the floor (gathers and scatters of the
    touched rows only) shows that growth. A floor that reads faster at the
    largest V than at the smallest (growth below 1) is taken as measured:
    counting it as 1 would only ever favour ``name``.
    """
    g, gf = sweep["growth"].get(name), sweep["growth"].get(floor)
    if g is None or gf is None:
        rep.verdict(f"{name} flat in V", None, None, "skipped (no floor or jsr data)")
        return
    rep.verdict(
        f"{name} flat in V",
        g / gf,
        g <= 1.25 * gf,
        f"grows {g:.2f}x over a {span}x larger V; the floor grows {gf:.2f}x; "
        f"ratio {g / gf:.2f} (target: <= 1.25){_ends_vs_floor(sweep, name, floor)}",
    )


def _ends_vs_floor(sweep: dict, name: str, floor: str) -> str:
    """For the reader of a flat-in-V verdict: ``name``'s time as a multiple of
    the floor's at the smallest and the largest V, where both were timed. A
    step faster than its floor at the small end grows more than the floor
    without being slower at the large end; these two figures tell which."""
    ms, ms_floor = sweep["ms"].get(name, {}), sweep["ms"].get(floor, {})
    both = [v for v in ms if v in ms_floor]
    if len(both) < 2:
        return ""
    lo, hi = both[0], both[-1]
    return (
        f"; {ms[lo] / ms_floor[lo]:.2f}x the floor's time at V={lo}, "
        f"{ms[hi] / ms_floor[hi]:.2f}x at V={hi}"
    )


def sweep_table(title: str, column: str, rows: list[tuple[Any, dict[str, Result]]]) -> dict:
    """Prints a sweep: one row per size, one column (median ms) per contender,
    and the growth of each contender from the first to the last size."""
    names: list[str] = []
    for _, res in rows:
        for n in res:
            if n not in names:
                names.append(n)
    print(f"\n## {title}")
    print(f"| {column:>10} | " + " | ".join(f"{n:>22}" for n in names) + " |")
    print("|" + "-" * 12 + "|" + "|".join("-" * 24 for _ in names) + "|")
    out: dict[str, Any] = {}
    for size, res in rows:
        cells = []
        for n in names:
            r = res.get(n)
            cells.append("-" if r is None or not r.times else _fmt_ms(r.median) + " ms")
            if r is not None and r.times:
                out.setdefault(n, {})[str(size)] = r.median * 1e3
        print(f"| {size:>10} | " + " | ".join(f"{c:>22}" for c in cells) + " |")
    growth = {}
    spans = []
    for n, by_size in out.items():
        sizes = list(by_size)
        if len(sizes) >= 2:
            growth[n] = by_size[sizes[-1]] / by_size[sizes[0]]
            spans.append(f"{n} {growth[n]:.2f}x ({column} {sizes[0]} -> {sizes[-1]})")
    if spans:
        print("growth: " + "; ".join(spans))
    sys.stdout.flush()
    return {"ms": out, "growth": growth}
