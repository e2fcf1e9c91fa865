"""The self-test the kernels pass before any program uses them: every kernel
runs once, in one small program compiled once, on cases that reach its
threaded path, padding and out-of-range ids, against numpy.

It runs when the library loads (the first :func:`native_kernels_status`, on
first use of a kernel), not when the package is imported.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import _registry


def _run_on_cpu(fn, *args) -> Any:
    """``fn(*args)`` compiled ahead of time and run on the CPU device; ``args``
    are pytrees of numpy arrays, the result comes back as numpy arrays.

    The first use of a kernel is often inside a jit trace: compiling and running
    on concrete arrays here keeps the self-test out of the caller's computation.
    ``fn`` is wrapped in a fresh closure so that JAX's trace and compilation
    caches let go of the program once it has run.
    """
    cpu = jax.devices("cpu")[0]
    with jax.transfer_guard("allow"), jax.ensure_compile_time_eval():
        put = jax.tree.map(lambda a: jax.device_put(a, cpu), args)
        compiled = jax.jit(lambda *a: fn(*a)).lower(*put).compile()
        return jax.tree.map(np.asarray, jax.block_until_ready(compiled(*put)))


def _csr_case(rng: np.random.Generator):
    """A small CSR with an empty row, a column id with no row and padding
    slots, big enough for the threaded path; the expected products."""
    m, k, d, per_row = 64, 50, 48, 24
    cols = np.stack([np.sort(rng.choice(k, per_row, replace=False)) for _ in range(m)])
    cols[3, -1] = k  # an id with no row reads zero
    cols = cols.reshape(-1).astype(np.int32)
    indptr = np.arange(0, (m + 1) * per_row, per_row, dtype=np.int32)
    indptr[5:] -= per_row  # row 4 is empty, and the last per_row slots are padding
    vals = rng.standard_normal(m * per_row).astype(np.float32)
    rows = np.repeat(np.arange(m), np.diff(indptr)).astype(np.int32)  # of the used slots
    used, valid = slice(0, len(rows)), cols[: len(rows)] < k
    table = rng.standard_normal((k, d)).astype(np.float32)
    expected = np.zeros((m, d))
    np.add.at(expected, rows[valid], vals[used][valid, None] * table[cols[used][valid]])
    t_table = rng.standard_normal((m, 5)).astype(np.float32)
    t_expected = np.zeros((k, 5))
    np.add.at(t_expected, cols[used][valid], vals[used][valid, None] * t_table[rows[valid]])
    present = np.unique(cols[used][valid])
    args = ((vals, cols, indptr, table), (vals[used], cols[used], rows, t_table))
    return args, k, expected, (present, t_expected[present])


def _rows_cases(rng: np.random.Generator):
    """Row gathers and scatters at sorted ids with a padding id and an id past
    the table, on the one-thread and the threaded path (the second case just
    over the threshold, to keep the test's memory small); the expected results."""
    cases = []
    for n, k, d in ((40, 7, 3), (600, 520, 64)):
        table = rng.standard_normal((n, d)).astype(np.float32)
        ids = np.sort(rng.choice(n, k - 2, replace=False))
        ids = np.concatenate([ids, [n, n + 5]]).astype(np.int32)
        rows = rng.standard_normal((k, d)).astype(np.float32)
        live = ids < n
        gathered = np.where(live[:, None], table[np.minimum(ids, n - 1)], 0)
        scattered = []
        for add in (False, True):
            out = table.copy()
            out[ids[live]] = rows[live] + (table[ids[live]] if add else 0)
            scattered.append(out)
        cases.append(((table, ids, rows), (gathered, *scattered)))
    return cases


def _sum_case(rng: np.random.Generator):
    """Rows summed at unsorted, repeated, negative and too-large ids, with a row
    width that is not a whole number of cache lines and enough rows for the
    threaded path; small integers, so any summation order is exact."""
    n, k, d = 50, 1500, 24
    ids = rng.integers(-2, n + 2, k).astype(np.int32)
    rows = rng.integers(-4, 5, (k, d)).astype(np.float32)
    live = (ids >= 0) & (ids < n)
    expected = np.zeros((n, d), np.float32)
    np.add.at(expected, ids[live], rows[live])
    return (rows, ids), n, expected


def _rowwise_case(rng: np.random.Generator):
    """Row-wise AdaGrad's accumulator update at sorted ids with a padding id and
    an id past the table, rows wide enough for the threaded path, and one row
    whose accumulator stays 0 with eps = 0; the expected (acc, direction)."""
    n, k, d = 600, 520, 64
    alpha = -0.5
    acc = rng.random(n).astype(np.float32)
    ids = np.sort(rng.choice(n, k - 2, replace=False))
    ids = np.concatenate([ids, [n, n + 5]]).astype(np.int32)
    acc[ids[0]] = 0.0
    grad = rng.standard_normal((k, d)).astype(np.float32)
    grad[0] = 0.0
    live = ids < n
    want = acc.astype(np.float64)
    want[ids[live]] += (grad[live].astype(np.float64) ** 2).mean(axis=1)
    denom = np.sqrt(want[ids[live]])
    scale = np.zeros(k)
    scale[live] = np.where(denom == 0, 0.0, 1.0 / np.where(denom == 0, 1.0, denom))
    args = (acc, ids, grad, np.float32(0.0), np.float32(alpha))
    return args, (want, grad * scale[:, None] * alpha)


def _ids_case(rng: np.random.Generator):
    """Ids with repeats, padding and out-of-range ids, big enough for the radix
    sort, unique-d into a capacity that leaves the largest out; queries of a
    sorted padded list. The expected (uniq, count, slots) and search slots."""
    n_rows, cap = 500, 300
    ids = rng.integers(-3, n_rows + 3, 1000).astype(np.int32)
    valid = ids[(ids >= 0) & (ids < n_rows)]
    present = np.unique(valid)
    uniq = np.full(cap, n_rows, np.int32)
    uniq[: min(cap, len(present))] = present[:cap]

    def slots_of(sorted_ids, queries):
        pos = np.searchsorted(sorted_ids, queries)
        pos = np.minimum(pos, len(sorted_ids) - 1)
        hit = (sorted_ids[pos] == queries) & (queries >= 0) & (queries < n_rows)
        return np.where(hit, pos, len(sorted_ids)).astype(np.int32)

    expected = (uniq, np.int32(len(present)), slots_of(uniq, ids))
    return (ids, uniq), n_rows, cap, expected


def self_test() -> str:
    """Runs every kernel once, in one small program compiled once, against
    numpy; returns "ok" or which kernel went wrong."""
    rng = np.random.default_rng(0)
    (csr_args, t_args), k, expected, (present, t_expected) = _csr_case(rng)
    rows_cases = _rows_cases(rng)
    sum_args, sum_n, sum_expected = _sum_case(rng)
    (ids, uniq_in), n_rows, cap, ids_expected = _ids_case(rng)
    rowwise_args, rowwise_expected = _rowwise_case(rng)

    def probe(csr_args, t_args, rows_args, sum_args, ids_args, rowwise_args):
        return (
            _registry.csr_dense_call(*csr_args),
            _registry.csr_t_dense_call(*t_args, k),
            [
                (
                    _registry.gather_rows_call(t, i),
                    _registry.scatter_rows_call(t, i, r, False),
                    _registry.scatter_rows_call(t, i, r, True),
                )
                for t, i, r in rows_args
            ],
            _registry.sum_rows_call(*sum_args, sum_n),
            _registry.unique_ids_call(ids_args[0], n_rows, cap),
            _registry.search_ids_call(ids_args[1], ids_args[0], n_rows),
            _registry.rowwise_adagrad_call(*rowwise_args),
        )

    got, (idx, data), rows_got, sum_got, unique_got, search_got, rowwise_got = _run_on_cpu(
        probe,
        csr_args,
        t_args,
        [args for args, _ in rows_cases],
        sum_args,
        (ids, uniq_in),
        rowwise_args,
    )
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        return "the self-test product differed from numpy"
    n = len(present)
    if not (
        np.array_equal(idx[:n], present)
        and (idx[n:] == k).all()
        and np.allclose(data[:n], t_expected, rtol=1e-4, atol=1e-4)
        and not data[n:].any()
    ):
        return "the self-test transposed product differed from numpy"
    for (_, want), results in zip(rows_cases, rows_got, strict=True):
        for what, w, r in zip(("gather", "scatter", "scatter-add"), want, results, strict=True):
            if not np.array_equal(r, w):
                return f"the self-test row {what} differed from numpy"
    if not np.array_equal(sum_got, sum_expected):
        return "the self-test sum of rows differed from numpy"
    if not all(np.array_equal(g, w) for g, w in zip(unique_got, ids_expected, strict=True)):
        return "the self-test unique ids differed from numpy"
    if not np.array_equal(search_got, ids_expected[2]):
        return "the self-test id search differed from numpy"
    pairs = zip(rowwise_got, rowwise_expected, strict=True)
    if not all(np.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in pairs):
        return "the self-test row-wise AdaGrad update differed from numpy"
    return "ok"
