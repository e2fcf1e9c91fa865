"""Runs every benchmark program in turn, each in its own process, forwarding
the options (``--smoke``, ``--sweep``, ``--json``, ``--runs``, ``--without``...).

``make bench`` runs this at the default sizes. Exit status is non-zero if a
program fails (a missed target is reported, not a failure).

Run ``python benchmarks/run_all.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = [
    "lazy_update.py",
    "embedding_step.py",
    "auto_sparse.py",
    "spmm.py",
    "libsvm_io.py",
    "row_kernels.py",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Unknown options are passed to every program (see each program's --help).",
    )
    p.add_argument(
        "--only", action="append", choices=[n[:-3] for n in PROGRAMS], help="run only these"
    )
    args, rest = p.parse_known_args(argv)
    failed = []
    for prog in PROGRAMS:
        if args.only and prog[:-3] not in args.only:
            continue
        print(f"\n{'=' * 20} {prog} {' '.join(rest)} {'=' * 20}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(HERE / prog), *rest])
        print(f"({prog} finished in {time.perf_counter() - t0:.0f} s, exit status {rc})")
        if rc != 0:
            failed.append(prog)
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
