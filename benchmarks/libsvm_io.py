"""LibSVM parsing throughput: ``jsr.io.load_libsvm`` against
``sklearn.datasets.load_svmlight_file``.

A ~100 MB LibSVM file (one-based sorted feature ids below 1,000,000, 10 to 50
features per line, ``%.6g`` values, integer labels) is generated once into
``benchmarks/data/`` (git-ignored) and parsed by both readers into float32.
Throughput is the file size over the median parse time. Both readers parse
on one thread (on a GPU machine too: parsing is host work; ``jsr``'s result
is then copied to the device). ``--quick`` parses a 10 MB file.

Target: ``load_libsvm`` at least half of sklearn's throughput. ``--sweep`` adds
file sizes of 1, 10 and 100 MB.

Run ``python benchmarks/libsvm_io.py --help`` for the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

JSR = "jsr.io.load_libsvm (1 thread)"
SKL = "sklearn load_svmlight_file (1 thread)"
N_FEATURES = 1_000_000
# file size in MB, by mode (10 with --quick)
SIZES = {"cpu": {"size_mb": 100.0}, "gpu": {"size_mb": 100.0}, "smoke": {"size_mb": 0.5}}


def generate(path: Path, target_mb: float, seed: int = 0) -> Path:
    """Writes a LibSVM file of about ``target_mb`` MB (kept if already there)."""
    if path.exists() and abs(path.stat().st_size / 2**20 - target_mb) < 0.1 * target_mb + 0.1:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    target = int(target_mb * 2**20)
    written = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        while written < target:
            chunk = []
            for _ in range(max(1, min(2000, (target - written) // 400 + 1))):
                k = int(rng.integers(10, 51))
                ids = np.sort(rng.choice(N_FEATURES - 1, k, replace=False)) + 1
                vals = rng.standard_normal(k)
                feats = " ".join(
                    f"{i}:{v:.6g}" for i, v in zip(ids.tolist(), vals.tolist(), strict=True)
                )
                chunk.append(f"{int(rng.integers(0, 2)) * 2 - 1} {feats}\n")
            text = "".join(chunk)
            f.write(text)
            written += len(text)
    tmp.replace(path)
    return path


def contenders(path: Path) -> list[h.Contender]:
    def jsr_setup():
        load = h.require_attr(jsr, "io.load_libsvm", JSR)
        return lambda: load(path, num_features=N_FEATURES)

    def skl_setup():
        datasets = h.require("sklearn.datasets")
        return lambda: datasets.load_svmlight_file(
            str(path), n_features=N_FEATURES, dtype=np.float32
        )

    return [h.Contender(JSR, jsr_setup), h.Contender(SKL, skl_setup, jax=False)]


def throughput(res: dict[str, h.Result], mb: float) -> dict[str, float]:
    out = {}
    for name, r in res.items():
        if r.times:
            out[name] = mb / r.median
            print(f"  {name:<30} {out[name]:8.1f} MB/s")
    return out


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--size-mb", type=float, help="file size in MB (default 100, 10 with --quick)")
    args = h.parse(p, argv)
    if args.quick and args.size_mb is None:
        args.size_mb = 10.0
    h.apply_sizes(args, SIZES)
    rep = h.Report("libsvm_io", args, {"size_mb": args.size_mb})
    path = generate(h.DATA_DIR / f"synthetic_{args.size_mb:g}MB.svm", args.size_mb)
    mb = path.stat().st_size / 2**20
    print(f"file: {path} ({mb:.1f} MB)")
    res = h.measure(contenders(path), args.runs, warmup=1, budget_s=args.budget)
    rep.table(
        f"parse a {mb:.0f} MB LibSVM file into float32 CSR",
        res,
        [h.Target("load_libsvm >= half of sklearn's throughput", JSR, SKL, 0.5)],
        reference=JSR,
    )
    rep.add("mb_per_s", throughput(res, mb))
    if args.sweep:
        sizes = [0.1, 0.5] if args.smoke else [1.0, 10.0, 100.0]
        rows, mbps = [], {}
        for s in sizes:
            ps = generate(h.DATA_DIR / f"synthetic_{s:g}MB.svm", s)
            r = h.measure(contenders(ps), args.runs, warmup=1, budget_s=args.budget)
            rows.append((s, r))
            mbps[s] = {n: ps.stat().st_size / 2**20 / x.median for n, x in r.items() if x.times}
        rep.add("sweep_size", h.sweep_table("sweep: file size (MB), parse time", "MB", rows))
        print(
            "MB/s: "
            + "; ".join(
                f"{s:g} MB: " + ", ".join(f"{n} {v:.0f}" for n, v in d.items())
                for s, d in mbps.items()
            )
        )
        rep.add("sweep_mb_per_s", {str(k): v for k, v in mbps.items()})
    rep.finish()


if __name__ == "__main__":
    main()
