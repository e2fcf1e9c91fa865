"""Sparse x dense products: ``jsr.dot(csr, dense)`` and the transpose product
``jsr.dot(csr, dense, transpose_a=True)`` (row-sparse result), against scipy,
``jax.experimental.sparse`` BCSR and torch CSR.

Default workload on CPU: CSR [1024 x 1,000,000] with 32 entries per row
times dense [1,000,000 x 64]; and that CSR transposed times dense [1024 x 64].
On a GPU: CSR [16,384 x 1,000,000] (32 per row) times dense
[1,000,000 x 128], transposed times [16,384 x 128]; torch on CUDA, scipy on
the host.

scipy runs on one thread (its sparse products have no threaded path); jsr,
BCSR and torch use XLA's or torch's threads (torch with as many as XLA's CPU
pool, and a 1-thread column beside it). Each table is followed by its memory
traffic: the bytes the product must move at least (the CSR, each distinct
dense row it reads, the result), over the median time, in GB/s beside a
device copy's.

Every contender cycles through a pool of 8 matrices with different column
ids (as a training loop sees a new batch every step), so no timed call finds
the previous call's rows of the dense operand in the cache. The sweep over
rows M uses a pool of 2, to keep its largest matrices' setup short.

Targets: ``jsr.dot`` no slower than scipy and no slower than BCSR; the
transpose product at least 5x faster than scipy's ``csr.T @ dense`` (which
builds a dense [1,000,000 x 64] result).

Run ``python benchmarks/spmm.py --help`` for the options.
"""

from __future__ import annotations

import functools
import itertools
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

N_MATRICES = 8  # size of the pool of CSR matrices cycled through
# CSR rows M, columns N, entries per row, dense columns, by mode
SIZES = {
    "cpu": {"rows": 1024, "cols": 1_000_000, "nnz_per_row": 32, "width": 64},
    "gpu": {"rows": 16_384, "cols": 1_000_000, "nnz_per_row": 32, "width": 128},
    "smoke": {"rows": 64, "cols": 2000, "nnz_per_row": 8, "width": 8},
}
SCIPY = "scipy csr @ dense (1 thread)"
SCIPY_T = "scipy csr.T @ dense (1 thread)"
TORCH = "torch sparse_csr @ dense"


def make_csr_arrays(m: int, n: int, per_row: int, seed: int = 0):
    """``(data, indices, indptr)`` of an [m x n] CSR with ``per_row`` distinct sorted
    column ids in every row (float32 values)."""
    rng = np.random.default_rng(seed)
    per_row = min(per_row, n)
    cols = np.empty((m, per_row), np.int64)
    for r in range(m):
        cols[r] = np.sort(rng.choice(n, per_row, replace=False))
    data = rng.standard_normal(m * per_row).astype(np.float32)
    indptr = np.arange(0, m * per_row + 1, per_row, dtype=np.int64)
    return data, cols.reshape(-1), indptr


def make_csr_pool(m: int, n: int, per_row: int, count: int = N_MATRICES):
    """``count`` matrices of :func:`make_csr_arrays` with different column ids."""
    return [make_csr_arrays(m, n, per_row, seed=s) for s in range(count)]


def _cycling(fn, mats):
    """A no-argument call that applies ``fn`` to the next matrix of ``mats``."""
    pool = itertools.cycle(mats)
    return lambda: fn(next(pool))


def _jsr_product(pool, shape, dense_np: np.ndarray, **dot_kw):
    """Setup of ``jsr.dot(csr, dense, **dot_kw)`` cycling over the pool."""
    mats = [
        jsr.csr_matrix((dt, ix.astype(np.int32), ip.astype(np.int32)), shape) for dt, ix, ip in pool
    ]
    dense = jnp.asarray(dense_np)
    f = jax.jit(functools.partial(jsr.dot, **dot_kw))
    return _cycling(lambda a: f(a, dense), mats)


def _scipy_product(pool, shape, product):
    """Setup of ``product(scipy_csr)`` cycling over the pool."""
    sp = h.require("scipy.sparse")
    return _cycling(product, [sp.csr_matrix(a, shape=shape) for a in pool])


def forward_contenders(pool, shape, dense_np: np.ndarray) -> list[h.Contender]:
    def jsr_setup():
        return _jsr_product(pool, shape, dense_np)

    def scipy_setup():
        return _scipy_product(pool, shape, lambda a: a @ dense_np)

    def bcsr_setup():
        sparse = h.require("jax.experimental.sparse")
        mats = [
            sparse.BCSR(
                (jnp.asarray(dt), jnp.asarray(ix, jnp.int32), jnp.asarray(ip, jnp.int32)),
                shape=shape,
            )
            for dt, ix, ip in pool
        ]
        dense = jnp.asarray(dense_np)
        f = jax.jit(lambda a, b: a @ b)
        return _cycling(lambda a: f(a, dense), mats)

    def torch_build(torch, device):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
            mats = [
                torch.sparse_csr_tensor(
                    torch.from_numpy(ip), torch.from_numpy(ix), torch.from_numpy(dt), shape
                ).to(device)
                for dt, ix, ip in pool
            ]
        dense = torch.from_numpy(dense_np).to(device)
        return _cycling(lambda a: torch.sparse.mm(a, dense), mats)

    return [
        h.Contender("jsr.dot(csr, dense)", jsr_setup),
        h.Contender(SCIPY, scipy_setup, jax=False),
        h.Contender("jax.experimental.sparse BCSR", bcsr_setup),
        *h.torch_contenders(TORCH, torch_build),
    ]


def transpose_contenders(pool, shape, dense_np: np.ndarray) -> list[h.Contender]:
    def jsr_setup():
        return _jsr_product(pool, shape, dense_np, transpose_a=True)

    def scipy_setup():
        return _scipy_product(pool, shape, lambda a: a.T @ dense_np)

    return [
        h.Contender("jsr.dot(csr, dense, transpose_a)", jsr_setup),
        h.Contender(SCIPY_T, scipy_setup, jax=False),
    ]


def product_bytes(pool, shape, d: int, transpose: bool) -> float:
    """The bytes a product must move at least, averaged over the pool: the
    CSR (float32 values, int32 ids and offsets), each distinct dense row it
    reads (forward) or each distinct result row it writes, with its id
    (transposed), the [M, d] result (forward) or operand (transposed)."""
    m = shape[0]
    total = 0.0
    for dt, ix, _ in pool:
        csr = 8 * dt.size + 4 * (m + 1)
        touched = len(np.unique(ix))
        rows = touched * d * 4 + (touched * 4 if transpose else 0)
        total += csr + rows + m * d * 4
    return total / len(pool)


FWD_TARGETS = [
    h.Target("jsr.dot no slower than scipy", "jsr.dot(csr, dense)", SCIPY, 1.0),
    h.Target(
        "jsr.dot no slower than BCSR", "jsr.dot(csr, dense)", "jax.experimental.sparse BCSR", 1.0
    ),
]
T_TARGETS = [
    h.Target(
        "transpose product >= 5x faster than scipy (dense result)",
        "jsr.dot(csr, dense, transpose_a)",
        SCIPY_T,
        5.0,
    )
]


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--rows", type=int, help="CSR rows M (default 1024 on CPU, 16,384 on GPU)")
    p.add_argument("--cols", type=int, help="CSR columns N (default 1e6)")
    p.add_argument("--nnz-per-row", type=int, help="entries per CSR row (default 32)")
    p.add_argument("--width", type=int, help="dense columns (default 64 on CPU, 128 on GPU)")
    args = h.parse(p, argv)
    h.apply_sizes(args, SIZES)
    m, n, d = args.rows, args.cols, args.width
    rep = h.Report("spmm", args, {"rows": m, "cols": n, "nnz_per_row": args.nnz_per_row, "d": d})
    rng = np.random.default_rng(1)
    arrays = make_csr_pool(m, n, args.nnz_per_row)

    rep.copy()
    dense = rng.standard_normal((n, d), dtype=np.float32)
    res = h.measure(forward_contenders(arrays, (m, n), dense), args.runs, budget_s=args.budget)
    title = f"CSR [{m} x {n}] ({args.nnz_per_row} nnz/row) @ dense [{n} x {d}]"
    rep.table(title, res, FWD_TARGETS, reference="jsr.dot(csr, dense)")
    fwd = product_bytes(arrays, (m, n), d, transpose=False)
    h.print_bandwidth(
        rep,
        title,
        res,
        {name: fwd for name in res},
        "the bytes of the product (the CSR, each distinct dense row read, the result) / "
        "median time",
        summarise=["jsr.dot(csr, dense)"],
    )
    del dense, res

    dense_t = rng.standard_normal((m, d), dtype=np.float32)
    res = h.measure(transpose_contenders(arrays, (m, n), dense_t), args.runs, budget_s=args.budget)
    title = f"CSR [{m} x {n}].T @ dense [{m} x {d}] (row-sparse vs dense result)"
    rep.table(title, res, T_TARGETS, reference="jsr.dot(csr, dense, transpose_a)")
    tb = product_bytes(arrays, (m, n), d, transpose=True)
    h.print_bandwidth(
        rep,
        title,
        res,
        {"jsr.dot(csr, dense, transpose_a)": tb},
        "the bytes of the row-sparse product (the CSR, the dense operand, each distinct "
        "result row and its id) / median time",
        summarise=["jsr.dot(csr, dense, transpose_a)"],
    )
    del res

    if args.sweep:
        cols = [100, 1000, 10_000] if args.smoke else [10_000, 100_000, 1_000_000, 10_000_000]
        rows_fwd, rows_t = [], []
        for nc in cols:
            arr = make_csr_pool(m, nc, args.nnz_per_row)
            dn = rng.standard_normal((nc, d), dtype=np.float32)
            cs = forward_contenders(arr, (m, nc), dn)[:2]
            rows_fwd.append((nc, h.measure(cs, args.runs, budget_s=args.budget, interleave=False)))
            del dn
            ts = transpose_contenders(arr, (m, nc), dense_t)
            rows_t.append((nc, h.measure(ts, args.runs, budget_s=args.budget, interleave=False)))
        rep.add("sweep_cols_forward", h.sweep_table("sweep: CSR columns N, forward", "N", rows_fwd))
        rep.add(
            "sweep_cols_transpose", h.sweep_table("sweep: CSR columns N, transpose", "N", rows_t)
        )
        ms = [16, 64] if args.smoke else [256, 1024, 4096, 16_384, 65_536]
        rows_m = []
        for mm in ms:
            arr = make_csr_pool(mm, n, args.nnz_per_row, count=2)
            dt = rng.standard_normal((mm, d), dtype=np.float32)
            ts = transpose_contenders(arr, (mm, n), dt)
            rows_m.append((mm, h.measure(ts, args.runs, budget_s=args.budget, interleave=False)))
        rep.add(
            "sweep_rows_transpose",
            h.sweep_table("sweep: CSR rows M (K = 32 M touched rows), transpose", "M", rows_m),
        )
    rep.finish()


if __name__ == "__main__":
    main()
