"""Run by ``test_native_asan.py`` in a subprocess, under AddressSanitizer: loads
the kernels built with ``-fsanitize=address,undefined`` (the path in argv[1])
in place of the installed ones, then drives every kernel through the public
ops with edge cases and malformed input (the kind only possible under jit,
where values are unchecked). Any out-of-bounds access or undefined behaviour
aborts the process with a sanitizer report; results are also compared with
the XLA path where the input is well formed."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsparse_rows as jsr
from jaxsparse_rows import _native, _rowops
from jaxsparse_rows._rowops import gather_rows, scatter_rows, sum_rows

rng = np.random.default_rng(0)


def ids_kernels(x64: bool) -> None:
    dt = np.int64 if x64 else np.int32
    info = np.iinfo(dt)
    # Every case in one program (each compile is slow under the sanitizers'
    # allocator): the kernels and the XLA path side by side.
    cases, inputs = [], []
    for n in (1, 9, 257, 3000):
        for n_rows in (7, int(info.max)):
            ids = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
            ids[::2] = rng.integers(0, n_rows, len(ids[::2]), dtype=dt)
            for cap in (1, 2 * n):
                cases.append((n_rows, cap))
                inputs.append(ids)

    def uniques(all_ids):
        return [
            (_rowops.unique_with_slots(i, r, c), _rowops._unique_with_slots_xla(i, r, c))
            for i, (r, c) in zip(all_ids, cases, strict=True)
        ]

    for got, want in jax.jit(uniques)(inputs):
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    pairs = []
    for k in (1, 9, 1000):
        for m in (5, 17, 70_001):
            s = rng.integers(info.min, info.max, k, dtype=dt, endpoint=True)
            if k % 2:
                s = np.sort(s)  # the other half stays unsorted (malformed)
            q = rng.integers(info.min, info.max, m, dtype=dt, endpoint=True)
            q[::2] = s[rng.integers(0, k, len(q[::2]))]
            pairs.append((s, q))
    searches = jax.jit(lambda ps: [_rowops.slots_in(a, b, int(info.max)) for a, b in ps])(pairs)
    for (s, _), got in zip(pairs, searches, strict=True):
        got = np.asarray(got)
        assert got.min() >= 0 and got.max() <= len(s), (got.min(), got.max(), len(s))


def row_kernels() -> None:
    for n, k, d in ((5, 3, 2), (3000, 4000, 64)):
        table = jnp.asarray(rng.standard_normal((n, d)).astype(np.float32))
        ids = rng.integers(-(2**31), 2**31 - 1, k).astype(np.int32)
        ids[::3] = rng.integers(0, n, len(ids[::3]))
        rows = jnp.asarray(rng.standard_normal((k, d)).astype(np.float32))
        jax.block_until_ready(jax.jit(gather_rows)(table, ids))
        for add in (False, True):
            for order in (ids, np.sort(ids)):  # malformed: unsorted, repeated, out of range
                fn = jax.jit(lambda t, i, r, a=add: scatter_rows(t, i, r, add=a))
                jax.block_until_ready(fn(table, order, rows))
    # the sum of rows (the gather's transpose): any order, extreme ids, row
    # widths that are not whole cache lines, the column-split threaded path
    for n, k, d in ((1, 2, 1), (7, 9, 5), (300, 8000, 17), (3000, 4000, 64)):
        ids = rng.integers(-(2**31), 2**31 - 1, k).astype(np.int32)
        ids[::2] = rng.integers(0, n, len(ids[::2]))
        rows = jnp.asarray(rng.standard_normal((k, d)).astype(np.float32))
        got = jax.jit(lambda r, i, n=n: sum_rows(r, i, n))(rows, ids)
        live = (ids >= 0) & (ids < n)
        want = np.zeros((n, d))
        np.add.at(want, ids[live], np.asarray(rows)[live])
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-3)


def csr_kernels() -> None:
    for m, k, per_row in ((4, 6, 3), (300, 500, 40)):
        nse = m * per_row
        cols = rng.integers(-5, k + 5, nse).astype(np.int32)  # out of range both ways
        sorted_ptr = np.concatenate([[0], np.sort(rng.integers(0, nse + 1, m))])
        bad_ptr = rng.integers(-nse, 2 * nse, m + 1)  # decreasing and past the end
        vals = rng.standard_normal(nse).astype(np.float32)
        rhs = jnp.asarray(rng.standard_normal((k, 8)).astype(np.float32))
        lhs_t = jnp.asarray(rng.standard_normal((m, 8)).astype(np.float32))
        for indptr in (sorted_ptr, bad_ptr):
            x = jsr.CSR._make(vals, cols, indptr.astype(np.int32), (m, k))
            jax.block_until_ready(jax.jit(jsr.dot)(x, rhs))
            fn = jax.jit(lambda a, b: jsr.dot(a, b, transpose_a=True))
            jax.block_until_ready(fn(x, lhs_t))


def main(library: str) -> None:
    # Before anything loads the kernels: load the sanitized build instead.
    assert _native._status is None, "the kernels were loaded before the probe"
    _native.library_path = lambda: Path(library)
    assert jsr.native_kernels_status() == "ok", jsr.native_kernels_status()
    for x64 in (False, True):
        with jax.enable_x64(x64):
            ids_kernels(x64)
    row_kernels()
    csr_kernels()
    print("asan probe ok")


if __name__ == "__main__":  # only as a script: pytest's doctest collection imports it
    main(sys.argv[1])
