"""Runs every benchmark program in turn, each in its own process, forwarding
the options (``--smoke``, ``--quick``, ``--gpu``, ``--sweep``, ``--json``,
``--runs``, ``--without``...), then prints one summary table of every
program's targets and memory-traffic floors.

``make bench`` runs this at the default sizes; ``make bench-gpu`` runs
``run_all.py --gpu --quick`` (GPU sizes, fewer runs, torch on CUDA). With
``--gpu`` on a machine where JAX has no GPU the first program exits with
status 3 and nothing else is run. Exit status is non-zero if a program fails
(a missed target is reported, not a failure).

Run ``python benchmarks/run_all.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROGRAMS = [
    "lazy_update.py",
    "embedding_step.py",
    "auto_sparse.py",
    "spmm.py",
    "libsvm_io.py",
    "row_kernels.py",
]
# Programs with options of their own (no summary records), run after the
# others: their arguments on CPU and on a GPU (None: not run there).
OWN_OPTIONS = {
    "sharded_step.py": (["--host-devices", "8"], []),
    "fused_rows.py": (None, []),  # the lazy rules' Pallas kernels: GPU only
}
EXIT_NO_GPU = 3  # as _harness.EXIT_NO_GPU (not imported: this process keeps off the GPU)


def _measured(target: dict[str, Any]) -> str:
    r = target.get("ratio")
    if r is None or (isinstance(r, float) and math.isnan(r)):
        return "n/a"
    if target.get("table") == "compile":
        return f"{r} compilation(s)"
    if target.get("at_least") is None:
        return target.get("text", f"{r}").split(";")[0].split(" (")[0][:60]
    if target["at_least"] < 1:
        return f"{1 / r:.2f}x the time"
    return f"{r:.2f}x"


def _wanted(target: dict[str, Any]) -> str:
    bound = target.get("at_least")
    if bound is None:
        return "-"
    return f"<= {1 / bound:.2f}x the time" if bound < 1 else f">= {bound:.2f}x"


def summary_rows(record: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(check, measured, target, verdict)`` rows of one program's record: its
    targets, the device copy's bandwidth, and the memory traffic of its floors
    (and of the products in ``spmm.py``)."""
    rows = [(t["label"], _measured(t), _wanted(t), t["verdict"]) for t in record["targets"]]
    copy = record.get("copy")
    if copy:
        rows.append(
            (f"device copy bandwidth ({copy['mb']:g} MB)", f"{copy['gbps']:.1f} GB/s", "-", "-")
        )
    for b in record.get("bandwidth", []):
        if b.get("summary"):
            share = "" if b.get("of_copy") is None else f" ({b['of_copy']:.2f} of copy)"
            rows.append((f"{b['name']}: memory traffic", f"{b['gbps']:.2f} GB/s{share}", "-", "-"))
    return rows


def print_summary(runs: list[tuple[str, int, float, list[dict[str, Any]]]]) -> None:
    """One table: every program's rows (:func:`summary_rows`), its exit status
    and wall time, and the verdict counts."""
    table: list[tuple[str, str, str, str, str]] = []
    counts = {"PASS": 0, "MISS": 0, "n/a": 0}
    header = ""
    for prog, rc, seconds, records in runs:
        name = prog[:-3]
        for rec in records:
            m = rec["machine"]
            if not header:
                mode = m.get("mode", {})
                header = (
                    f"{m.get('device_kind', m['backend'])} ({m['backend']}), "
                    f"{mode.get('sizes', '?')} sizes; torch: {mode.get('torch_note', '?')}; "
                    f"XLA CPU threads {mode.get('cpu_threads', '?')}"
                )
            for row in summary_rows(rec):
                table.append((name, *row))
                if row[3] in counts:
                    counts[row[3]] += 1
        status = "ok" if rc == 0 else f"exit status {rc}"
        table.append((name, "program", f"{seconds:.0f} s", "-", status))
    print(f"\n## Summary: {header}" if header else "\n## Summary")
    widths = [
        max(len(r[i]) for r in table + [("program", "check", "measured", "target", "verdict")])
        for i in range(5)
    ]
    widths[1] = min(widths[1], 72)
    head = ("program", "check", "measured", "target", "verdict")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table:
        cells = [row[0], row[1][: widths[1]], row[2], row[3], row[4]]
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |")
    print(f"{counts['PASS']} PASS, {counts['MISS']} MISS, {counts['n/a']} n/a")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Unknown options are passed to every program (see each program's --help).",
    )
    p.add_argument(
        "--only",
        action="append",
        choices=[n[:-3] for n in [*PROGRAMS, *OWN_OPTIONS]],
        help="run only these",
    )
    p.add_argument(
        "--gpu",
        action="store_true",
        help="run on the GPU (JAX's default backend must be a GPU; stops at once otherwise)",
    )
    args, rest = p.parse_known_args(argv)
    if args.gpu:
        rest = ["--gpu", *rest]
    failed = []
    runs = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for prog in PROGRAMS:
            if args.only and prog[:-3] not in args.only:
                continue
            summary = Path(tmp) / f"{prog}.jsonl"
            print(f"\n{'=' * 20} {prog} {' '.join(rest)} {'=' * 20}", flush=True)
            t0 = time.perf_counter()
            rc = subprocess.call(
                [sys.executable, str(HERE / prog), *rest, "--summary-path", str(summary)]
            )
            seconds = time.perf_counter() - t0
            print(f"({prog} finished in {seconds:.0f} s, exit status {rc})", flush=True)
            if rc == EXIT_NO_GPU and args.gpu:
                print("--gpu: JAX has no GPU here; no program was run (see the message above)")
                return EXIT_NO_GPU
            records = (
                [json.loads(line) for line in summary.read_text().splitlines()]
                if summary.exists()
                else []
            )
            runs.append((prog, rc, seconds, records))
            if rc != 0:
                failed.append(prog)
        for prog, (cpu_args, gpu_args) in OWN_OPTIONS.items():
            own = gpu_args if args.gpu else cpu_args
            if own is None or (args.only and prog[:-3] not in args.only):
                continue
            print(f"\n{'=' * 20} {prog} {' '.join(own)} {'=' * 20}", flush=True)
            t0 = time.perf_counter()
            rc = subprocess.call([sys.executable, str(HERE / prog), *own])
            seconds = time.perf_counter() - t0
            print(f"({prog} finished in {seconds:.0f} s, exit status {rc})", flush=True)
            runs.append((prog, rc, seconds, []))
            if rc != 0:
                failed.append(prog)
    print_summary(runs)
    print(f"all programs: {time.perf_counter() - t_all:.0f} s")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
