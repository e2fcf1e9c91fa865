"""The native CPU row kernels behind the lazy optimizers, ``apply_updates`` and
``pull_rows``: a gather of the listed rows and an in-place scatter (set / add)
into them, equal to XLA's gather/scatter and to a numpy oracle, in place under
donation, with autodiff, vmap and malformed ids."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_switch import kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows._rowops import (
    _scatter_native,
    gather_rows,
    gather_rows_xla,
    scatter_rows,
    scatter_rows_xla,
    unique_rows,
)

GATHER = _native.GATHER_ROWS.target
SCATTER = _native.SCATTER_ROWS.target

pytestmark = needs_kernels


def gather_sorted_rows(table, ids):
    return gather_rows(table, ids, ids_sorted=True)


DTYPES = [np.float32, np.float64, np.float16, jnp.bfloat16, np.int32, np.bool_]


@pytest.fixture(autouse=True)
def kernels_on():
    with kernels_set(True):
        yield


def _values(rng, shape, dtype):
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _ids(rng, n, k, n_pad, idtype, past_end=False):
    """``k`` sorted unique ids in ``[0, n)``, then ``n_pad`` padding ids ``n``."""
    ids = np.sort(rng.choice(n, min(k, n), replace=False))
    tail = [n] * n_pad + ([n + 3] if past_end else [])
    return np.concatenate([ids, tail]).astype(idtype)


def _gather_oracle(table, ids):
    n = table.shape[0]
    live = (ids >= 0) & (ids < n)
    out = np.zeros((len(ids),) + table.shape[1:], table.dtype)
    out[live] = table[ids[live]]
    return out


def _scatter_oracle(table, ids, rows, add):
    out = table.copy()
    live = (ids >= 0) & (ids < table.shape[0])
    out[ids[live]] = rows[live] + (table[ids[live]] if add else 0)
    return out


def _assert_same(got, want):
    got = np.asarray(got)
    assert got.dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(got.view(np.uint8), np.asarray(want).view(np.uint8))


def _gather_native(table, ids):
    """The gather primitive (the kernel on CPU while the kernels are on)."""
    return gather_rows(table, ids, ids_sorted=True)


def _gather_xla(table, ids):
    """Its XLA reference lowering."""
    return gather_rows_xla(table, ids, ids_sorted=True)


def _hlo(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


@given(
    n=st.integers(1, 60),
    k=st.integers(0, 30),
    n_pad=st.integers(0, 3),
    # (2,), (4,), (8,), (16,): every fixed row width of the kernels (1 to 32
    # bytes) over the dtypes, and the first prefetched one (64 bytes)
    row=st.sampled_from([(), (1,), (2,), (4,), (5,), (8,), (16,), (2, 3)]),
    dtype=st.sampled_from(DTYPES),
    idtype=st.sampled_from([np.int32, np.int64]),
    past_end=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rows_match_oracle_and_xla(n, k, n_pad, row, dtype, idtype, past_end, seed):
    """Bit for bit equal to numpy and to XLA's gather/scatter, eagerly and under
    jit, for every dtype, id dtype, row shape, padding and an id past the end."""
    with jax.enable_x64(True):  # float64 and int64 operands stay what they are
        _check_rows(n, k, n_pad, row, dtype, idtype, past_end, seed)


def _check_rows(n, k, n_pad, row, dtype, idtype, past_end, seed, xla=True):
    """The kernels against numpy, eagerly and under jit, and (with ``xla``)
    XLA's own gather and scatter against numpy too."""
    rng = np.random.default_rng(seed)
    ids = _ids(rng, n, k, n_pad, idtype, past_end)
    if ids.size == 0:
        ids = np.array([n], idtype)
    table = _values(rng, (n,) + row, dtype)
    rows = _values(rng, (len(ids),) + row, dtype)
    jt, ji, jr = jnp.asarray(table), jnp.asarray(ids), jnp.asarray(rows)

    want = _gather_oracle(table, ids)
    assert GATHER in _hlo(gather_sorted_rows, jt, ji)
    for fn in (gather_sorted_rows, jax.jit(gather_sorted_rows)) + ((_gather_xla,) if xla else ()):
        _assert_same(fn(jt, ji), want)

    adds = [False, True] if np.dtype(dtype) in (np.float32, np.float64) else [False]
    for add in adds:
        want = _scatter_oracle(table, ids, rows, add)
        assert SCATTER in _hlo(lambda t, i, r, add=add: scatter_rows(t, i, r, add=add), jt, ji, jr)
        _assert_same(scatter_rows(jt, ji, jr, add=add), want)
        _assert_same(jax.jit(scatter_rows, static_argnames="add")(jt, ji, jr, add=add), want)
        if xla:
            _assert_same(scatter_rows_xla(jt, ji, jr, add), want)
    np.testing.assert_array_equal(np.asarray(jt), table)  # the operand was not written


@pytest.mark.parametrize(
    ("row_bytes", "dtype"),
    [
        (b, d)
        for b in (1, 2, 4, 8, 16, 32, 48, 64, 128)
        for d in (np.bool_, np.float16, np.float32, np.float64)
        if b % np.dtype(d).itemsize == 0
    ],
    ids=lambda p: p if isinstance(p, int) else np.dtype(p).name,
)
def test_every_row_width_matches_oracle(row_bytes, dtype):
    """Each fixed-width row loop of the kernels (1 to 32 bytes), a run-time
    width below a cache line (48) and the prefetching ones (64, 128), for
    every value size that divides the width. (XLA's own ops, which do not
    depend on the width, are checked against numpy by the property above.)"""
    itemsize = np.dtype(dtype).itemsize
    row = (row_bytes // itemsize,)
    with jax.enable_x64(True):
        _check_rows(50, 20, 2, row, dtype, np.int32, True, row_bytes, xla=False)
        _check_rows(50, 20, 0, row, dtype, np.int64, False, row_bytes + 1, xla=False)


@pytest.mark.parametrize("idtype", [np.int32, np.int64])
@pytest.mark.parametrize("d", [1, 8, 32])
def test_threaded_path_is_exact_and_repeatable(rng, idtype, d):
    """Enough rows for the kernels to split the ids over XLA's pool (512 kB),
    with a fixed-width row loop (d = 1, 8) and the prefetching one (d = 32)."""
    n, k = 150_000, 131_072 // d
    table = rng.standard_normal((n, d)).astype(np.float32)
    ids = _ids(rng, n, k, 100, jax.dtypes.canonicalize_dtype(idtype))
    rows = rng.standard_normal((len(ids), d)).astype(np.float32)
    jt, ji, jr = jnp.asarray(table), jnp.asarray(ids), jnp.asarray(rows)
    g = jax.jit(_gather_native)
    _assert_same(g(jt, ji), _gather_oracle(table, ids))
    _assert_same(g(jt, ji), g(jt, ji))
    for add in (False, True):
        s = jax.jit(lambda t, i, r, add=add: _scatter_native(t, i, r, add))
        want = _scatter_oracle(table, np.asarray(ids), rows, add)
        _assert_same(s(jt, ji, jr), want)
        _assert_same(s(jt, ji, jr), want)


@pytest.mark.parametrize("add", [False, True])
def test_donated_table_is_updated_in_place(add):
    """The scatter's result is the donated table's own buffer: no copy of it."""
    table = jnp.zeros((10_000, 16))
    ids = jnp.arange(0, 10_000, 7, dtype=jnp.int32)
    rows = jnp.ones((ids.shape[0], 16))
    f = jax.jit(lambda t, i, r: scatter_rows(t, i, r, add=add), donate_argnums=0)
    compiled = f.lower(table, ids, rows).compile().as_text()
    assert SCATTER in compiled
    assert not [ln for ln in compiled.splitlines() if " copy(" in ln and "[10000,16]" in ln]
    before = table.unsafe_buffer_pointer()
    out = f(table, ids, rows)
    assert out.unsafe_buffer_pointer() == before
    assert table.is_deleted()
    np.testing.assert_array_equal(out[::7], np.ones((ids.shape[0], 16)))
    assert float(out.sum()) == ids.shape[0] * 16


def test_undonated_table_is_left_alone():
    table = jnp.zeros((50, 2))
    out = jax.jit(lambda t: scatter_rows(t, jnp.array([3, 50]), 1.0, add=True))(table)
    assert float(out.sum()) == 2.0 and float(table.sum()) == 0.0


@pytest.mark.parametrize(
    "ids",
    [
        [-1, 2, 5],  # negative
        [1, 1, 1, 4],  # repeated
        [9, 2, 2**30, 0],  # unsorted and huge
        [2**31 - 1, -(2**31)],  # extremes
    ],
)
def test_malformed_ids_are_memory_safe(ids):
    """Under jit ids are not checked; the kernels range-check every id: ids
    outside the table read zero rows and write nothing, never out of bounds."""
    table = jnp.arange(30.0).reshape(10, 3)
    i = jnp.asarray(ids, jnp.int32)
    out = jax.jit(_gather_native)(table, i)
    valid = (np.asarray(ids) >= 0) & (np.asarray(ids) < 10)
    np.testing.assert_array_equal(np.asarray(out)[~valid], 0)
    np.testing.assert_array_equal(np.asarray(out)[valid], np.asarray(table)[np.asarray(ids)[valid]])
    for add in (False, True):
        got = jax.jit(lambda t, i, add=add: _scatter_native(t, i, -jnp.ones((i.shape[0], 3)), add))(
            table, i
        )
        untouched = np.setdiff1d(np.arange(10), np.asarray(ids)[valid])
        np.testing.assert_array_equal(np.asarray(got)[untouched], np.asarray(table)[untouched])


@pytest.mark.parametrize(
    "ids",
    [
        [0] + [5] * 3999,  # one run covering every thread's share
        [0, 1, 2] + [7] * 3997,
        "random",  # runs of about 80 of 50 ids
    ],
)
def test_repeated_ids_on_the_threaded_path_are_added_once(rng, ids):
    """Sorted repeated ids (malformed) never make two threads add into one row:
    each repeat is added exactly once, as a serial loop would."""
    n, d = 1000, 64
    if ids == "random":
        ids = np.sort(rng.integers(0, 50, 4000))
    ids = np.asarray(ids, np.int32)
    rows = np.ones((len(ids), d), np.float32)
    got = jax.jit(lambda t, i, r: _scatter_native(t, i, r, True))(
        jnp.zeros((n, d)), jnp.asarray(ids), jnp.asarray(rows)
    )
    want = np.bincount(ids, minlength=n).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got), np.broadcast_to(want[:, None], (n, d)))


@pytest.mark.parametrize("pattern", ["alternating", "shuffled", "padding_between"])
def test_unsorted_repeats_on_the_threaded_path_are_added_once(rng, pattern):
    """Ids traced into a RowSparse under jit are not validated. Repeats that
    are not adjacent (0, 1, 0, 1, ...) must not be split over threads, which
    would add into one row at once and lose updates (about half of the runs
    with 2 threads). Such ids run on one thread, in order, like XLA's
    scatter: every repeat is added exactly once, every run."""
    n, k, d = 4, 2000, 4096  # long enough pieces that the pool's thread joins in
    ids = np.arange(k) % 2
    if pattern == "shuffled":
        ids = rng.permutation(np.arange(k) % n)
    elif pattern == "padding_between":
        ids = np.where(np.arange(k) % 2 == 0, 1, n)  # 1, N, 1, N, ...: not adjacent
    ids = ids.astype(np.int32)
    want = np.broadcast_to(np.bincount(ids[ids < n], minlength=n)[:, None], (n, d))
    f = jax.jit(lambda t, r, i: t + jsr.RowSparse(r, i, (n, d)))
    rows = jnp.ones((k, d), jnp.float32)
    for _ in range(8):  # a lost update shows in some runs only
        np.testing.assert_array_equal(np.asarray(f(jnp.zeros((n, d)), rows, ids)), want)
    set_rows = jnp.asarray(np.repeat(np.arange(k, dtype=np.float32)[:, None], d, 1))
    got = np.asarray(
        jax.jit(lambda t, i, r: _scatter_native(t, i, r, False))(
            jnp.zeros((n, d)), jnp.asarray(ids), set_rows
        )
    )
    # Set: the last write of each row wins, whole (never a mix of two rows).
    for row in np.unique(ids[ids < n]):
        np.testing.assert_array_equal(got[row], np.float32(np.nonzero(ids == row)[0][-1]))


@pytest.mark.parametrize("n_live", [0, 1, 2048, 4000])
def test_threaded_path_with_a_long_padding_tail(rng, n_live):
    """Half or more of the slots padding (the id N repeated): the padding is
    split over the threads like any ids, and reads zeros and writes nothing."""
    n, k, d = 10_000, 4096, 64
    ids = np.concatenate([np.sort(rng.choice(n, n_live, replace=False)), [n] * (k - n_live)])
    ids = ids.astype(np.int32)
    table = rng.standard_normal((n, d)).astype(np.float32)
    rows = rng.standard_normal((k, d)).astype(np.float32)
    jt, ji, jr = jnp.asarray(table), jnp.asarray(ids), jnp.asarray(rows)
    _assert_same(jax.jit(_gather_native)(jt, ji), _gather_oracle(table, ids))
    for add in (False, True):
        got = jax.jit(lambda t, i, r, add=add: _scatter_native(t, i, r, add))(jt, ji, jr)
        _assert_same(got, _scatter_oracle(table, ids, rows, add))


def test_weakly_typed_tables_stay_weakly_typed():
    """A weakly typed table (``jnp.full(shape, 1.0)``) gives weakly typed
    results, as XLA's ops do: the gather primitive keeps the weak type (and
    runs the kernel); the scatter keeps XLA's path."""
    w = jnp.full((4, 2), 1.0)
    ids = jnp.array([1, 4])
    assert jax.typeof(w).weak_type
    assert jax.typeof(gather_sorted_rows(w, ids)).weak_type
    assert jax.typeof(jax.jit(gather_sorted_rows)(w, ids)).weak_type
    assert jax.typeof(scatter_rows(w, ids, 2.0, add=True)).weak_type
    assert GATHER in _hlo(lambda t: gather_sorted_rows(t, ids), w)
    assert SCATTER not in _hlo(lambda t: scatter_rows(t, ids, 2.0, add=True), w)
    strong = jnp.ones((4, 2))
    assert not jax.typeof(gather_sorted_rows(strong, ids)).weak_type
    assert GATHER in _hlo(lambda t: gather_sorted_rows(t, ids), strong)


def test_gradients_match_the_xla_path(rng):
    table = jnp.asarray(rng.standard_normal((9, 3)).astype(np.float32))
    ids = jnp.array([0, 4, 8, 9], jnp.int32)
    rows = jnp.asarray(rng.standard_normal((4, 3)).astype(np.float32))
    jax.test_util.check_grads(lambda t: _gather_native(t, ids), (table,), 2, eps=1e-2)
    for add in (False, True):

        def native(t, r, add=add):
            return jnp.sin(_scatter_native(t, ids, r, add)).sum()

        def xla(t, r, add=add):
            return jnp.sin(scatter_rows_xla(t, ids, r, add)).sum()

        jax.test_util.check_grads(native, (table, rows), 2, eps=1e-2)
        for a, b in zip(
            jax.grad(native, (0, 1))(table, rows), jax.grad(xla, (0, 1))(table, rows), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_vmap_matches_the_xla_path(rng):
    tables = jnp.asarray(rng.standard_normal((3, 8, 2)).astype(np.float32))
    ids = jnp.array([[0, 5, 8], [1, 2, 3], [7, 8, 8]], jnp.int32)
    rows = jnp.asarray(rng.standard_normal((3, 3, 2)).astype(np.float32))
    _assert_same(jax.vmap(_gather_native)(tables, ids), jax.vmap(_gather_xla)(tables, ids))
    _assert_same(
        jax.vmap(_gather_native, (None, 0))(tables[0], ids),
        jax.vmap(_gather_xla, (None, 0))(tables[0], ids),
    )
    for add in (False, True):
        _assert_same(
            jax.jit(jax.vmap(lambda t, i, r, add=add: _scatter_native(t, i, r, add)))(
                tables, ids, rows
            ),
            jax.vmap(lambda t, i, r, add=add: scatter_rows_xla(t, i, r, add))(tables, ids, rows),
        )
        # one table, a batch of ids: every batch element scatters into its own copy
        _assert_same(
            jax.jit(jax.vmap(lambda t, i, r, add=add: _scatter_native(t, i, r, add), (None, 0, 0)))(
                tables[0], ids, rows
            ),
            jax.vmap(lambda t, i, r, add=add: scatter_rows_xla(t, i, r, add), (None, 0, 0))(
                tables[0], ids, rows
            ),
        )


def test_cases_the_kernels_do_not_take_run_in_xla():
    """No ids, an empty table, addition in a dtype other than float32/64, and
    turned-off kernels all use XLA's ops, with the same results."""
    t = jnp.arange(6.0).reshape(3, 2)
    none = jnp.zeros((0,), jnp.int32)
    assert GATHER not in _hlo(gather_sorted_rows, t, none)
    assert gather_sorted_rows(t, none).shape == (0, 2)
    empty = jnp.zeros((0, 2))
    assert gather_sorted_rows(empty, jnp.array([0])).tolist() == [[0.0, 0.0]]
    bf = t.astype(jnp.bfloat16)
    text = _hlo(lambda a: scatter_rows(a, jnp.array([1]), 1.0, add=True), bf)
    assert SCATTER not in text
    assert scatter_rows(bf, jnp.array([1]), 1.0, add=True)[1].tolist() == [3.0, 4.0]
    jsr.set_native_kernels(False)
    assert GATHER not in _hlo(gather_sorted_rows, t, jnp.array([1]))


@pytest.mark.parametrize(
    "make",
    [
        lambda: jsr.optim.lazy_adam(0.1),
        lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, nesterov=True),
        lambda: jsr.optim.lazy_adagrad(0.1),
        lambda: jsr.optim.lazy_rowwise_adagrad(0.1, weight_decay=1e-2),
        lambda: jsr.optim.lazy_ftrl(0.1),
        lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, lazy="exact"),
    ],
)
@pytest.mark.parametrize("apply", ["jsr", "optax"])
def test_optimizer_steps_equal_with_kernels_on_and_off(rng, make, apply):
    """Jitted, donated lazy steps give the same parameters and state with the
    native row kernels as with XLA's gathers and scatters."""
    v, d, k = 300, 4, 40
    ap = jsr.optim.apply_updates if apply == "jsr" else optax.apply_updates
    grads = []
    for _ in range(4):
        ids = np.sort(rng.choice(v, k, replace=False)).astype(np.int32)
        ids[-3:] = v  # padding slots
        data = rng.standard_normal((k, d)).astype(np.float32)
        data[-3:] = 0
        grads.append(jsr.RowSparse._make(jnp.asarray(data), jnp.asarray(ids), (v, d)))
    results = {}
    for on in (True, False):
        jsr.set_native_kernels(on)
        opt = make()

        def step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return ap(p, u), s

        f = jax.jit(step, donate_argnums=(0, 1))
        p = jnp.asarray(np.linspace(-1, 1, v * d, dtype=np.float32).reshape(v, d))
        s = opt.init(p)
        assert (SCATTER in f.lower(p, s, grads[0]).as_text()) == on
        for g in grads:
            p, s = f(p, s, g)
        results[on] = jax.tree.map(np.asarray, (p, s))
    for a, b in zip(jax.tree.leaves(results[True]), jax.tree.leaves(results[False]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_pull_rows_and_dense_plus_rowsparse_use_the_kernels():
    table = jnp.arange(12.0).reshape(6, 2)
    ids = jnp.array([[4, 1], [4, 4]])
    assert GATHER in _hlo(lambda t: jsr.pull_rows(t, ids).data, table)
    rsp = jsr.RowSparse([[1.0, 1.0]], [2], shape=(6, 2))
    assert SCATTER in _hlo(lambda t: t + rsp, table)
    np.testing.assert_array_equal(table + rsp, np.asarray(table) + np.asarray(rsp.todense()))


def test_self_test_catches_wrong_row_kernels(monkeypatch):
    assert _native._selftest.self_test() == "ok"
    real = _native.gather_rows_call
    monkeypatch.setattr(_native._registry, "gather_rows_call", lambda t, i: real(t, i)[::-1])
    assert _native._selftest.self_test() == "the self-test row gather differed from numpy"
    monkeypatch.setattr(_native._registry, "gather_rows_call", real)
    real_s = _native.scatter_rows_call

    def no_add(table, ids, rows, add=False):
        return real_s(table, ids, rows, False)

    monkeypatch.setattr(_native._registry, "scatter_rows_call", no_add)
    assert _native._selftest.self_test() == "the self-test row scatter-add differed from numpy"
    monkeypatch.setattr(_native._registry, "scatter_rows_call", real_s)
    real_sum = _native.sum_rows_call

    def first_id_only(rows, ids, n):  # repeats not summed
        return real_sum(rows, jnp.where(jnp.arange(ids.shape[0]) % 2 == 0, ids, n), n)

    monkeypatch.setattr(_native._registry, "sum_rows_call", first_id_only)
    assert _native._selftest.self_test() == "the self-test sum of rows differed from numpy"


def _adam_step_case(pull=False):
    """``(step, (params, state, grad))``: one lazy Adam step on a [10, 2] table,
    also returning a ``pull_rows`` view's data with ``pull``."""
    opt = jsr.optim.lazy_adam(0.1)
    p = jnp.zeros((10, 2))
    g = jsr.RowSparse([[1.0, 1.0]], [3], shape=(10, 2))

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        out = (jsr.optim.apply_updates(p, u),)
        if pull:
            out += (jsr.pull_rows(p, jnp.array([1, 3])).data,)
        return out + (s,)

    return step, (p, opt.init(p), g)


def _kernel_targets_in(text: str) -> list[str]:
    return [t for t in _native.TARGETS if t in text]


def _rowwise_step_case():
    """A jsr row-wise AdaGrad step (its fused accumulator kernel)."""
    opt = jsr.optim.lazy_rowwise_adagrad(0.1)
    p = jnp.zeros((10, 3))
    g = jsr.RowSparse([[1.0, 2.0, 2.0]], [3], shape=(10, 3))

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return jsr.optim.apply_updates(p, u), s

    return step, (p, opt.init(p), g)


def _export_cases():
    """``(fn, args)``: a lazy Adam step with a pulled view (row gather and
    scatter), a row-wise AdaGrad step, a CSR product, its transpose (csr
    kernels, id search) and ``unique_rows`` (id kernel) - every kernel's call
    site."""
    step, args = _adam_step_case(pull=True)
    x = jsr.csr_matrix(([7.0, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    ids = jnp.array([4, 1, 4, 9, -1], jnp.int32)
    return [
        (step, args),
        _rowwise_step_case(),
        (jsr.dot, (x, jnp.ones((5, 2)))),
        (lambda a, b: jsr.dot(a, b, transpose_a=True), (x, jnp.ones((3, 2)))),
        (lambda i: unique_rows(i, 8, 4), (ids,)),
        (jsr.take, (jnp.ones((8, 3)), ids)),
        (jax.grad(lambda t, i: jsr.take(t, i).sum()), (jnp.ones((8, 3)), ids)),
    ]


def test_jax_export_gets_the_xla_ops():
    """A program lowered for ``jax.export`` names none of the kernels' custom
    calls (a process that deserializes it may not have them), even with the
    kernels on; it computes what the kernels compute under ``jax.jit``, and a
    CPU + CUDA export is portable too."""
    from jax import export

    for fn, args in _export_cases():
        jitted = jax.jit(fn)
        assert _kernel_targets_in(jitted.lower(*args).as_text()), fn  # jit: kernels
        exported = export.export(jitted)(*args)
        assert not _kernel_targets_in(exported.mlir_module()), fn
        for a, b in zip(
            jax.tree.leaves(exported.call(*args)), jax.tree.leaves(jitted(*args)), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        both = export.export(jitted, platforms=["cpu", "cuda"])(*args)
        assert not _kernel_targets_in(both.mlir_module()), fn
    step, (p, s, g) = _adam_step_case()
    new_p = export.export(jax.jit(step))(p, s, g).call(p, s, g)[0]
    assert float(new_p[3, 0]) == pytest.approx(-0.1, rel=1e-4)  # Adam's first step: -lr
    assert not np.asarray(new_p).sum(axis=1)[np.arange(10) != 3].any()


def test_gpu_lowering_has_no_cpu_kernels():
    """Lowered for CUDA (no GPU needed), a training step, CSR products and the
    id and row ops contain XLA ops only, while the same functions lowered for
    CPU call the kernels: a GPU never sees a CPU target."""
    for fn, args in _export_cases():
        traced = jax.jit(fn).trace(*args)
        assert _kernel_targets_in(traced.lower(lowering_platforms=("cpu",)).as_text()), fn
        assert not _kernel_targets_in(traced.lower(lowering_platforms=("cuda",)).as_text()), fn


def test_take_from_a_dense_table(rng):
    """``jsr.take`` on a dense table gathers with the kernel for ids of any shape
    and order (repeats, the padding id, and under jit negative or too-large
    ids, which read zeros); its gradient is the XLA path's."""
    table = jnp.asarray(rng.standard_normal((7, 3)).astype(np.float32))
    ids = jnp.array([[5, 1, 1, 7], [0, -2, 6, 40]], jnp.int32)
    assert GATHER in _hlo(jsr.take, table, ids)
    got = jax.jit(jsr.take)(table, ids)
    flat = np.asarray(ids).reshape(-1)
    want = _gather_oracle(np.asarray(table), flat).reshape(2, 4, 3)
    _assert_same(got, want)
    concrete = jnp.array([[6, 0], [7, 6]], jnp.int32)
    _assert_same(
        jsr.take(table, concrete),
        _gather_oracle(np.asarray(table), np.array([6, 0, 7, 6])).reshape(2, 2, 3),
    )

    gids = jnp.array([[5, 1, 1, 7], [0, 2, 6, 6]], jnp.int32)  # concrete: checked, valid

    def loss(t):
        return jnp.sum(jnp.sin(jsr.take(t, gids)) * jnp.arange(3.0)[None, None])

    native = jax.grad(loss)(table)
    jax.test_util.check_grads(loss, (table,), 2, eps=1e-2)
    jsr.set_native_kernels(False)
    assert GATHER not in _hlo(jsr.take, table, ids)
    np.testing.assert_allclose(native, jax.grad(loss)(table), rtol=1e-6)
    _assert_same(jax.jit(jsr.take)(table, ids), want)


def test_several_cpu_devices_kernels_per_device_program():
    """With several CPU devices the kernels stay on, per program: a ``jit``
    program that XLA partitions (a table sharded by rows) lowers to XLA's
    ops and keeps its sharding through a lazy step with no all-gather; a
    program for one device, and a ``shard_map`` body on each device's shard,
    run the kernels, with the XLA path's results (in a subprocess with 2 host
    devices)."""
    code = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np, jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jax.sharding import NamedSharding, PartitionSpec as P
targets = (_native.SCATTER_ROWS.target, _native.GATHER_ROWS.target)
mesh = jax.make_mesh((2,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
p = jax.device_put(jnp.zeros((1000, 8)), NamedSharding(mesh, P("x")))
opt = jsr.optim.lazy_adam(0.1)
g = jsr.RowSparse(jnp.ones((3, 8)), jnp.array([1, 600, 999]), shape=(1000, 8))
def step(p, s, g):
    u, s = opt.update(g, s, p)
    return jsr.optim.apply_updates(p, u), s
f = jax.jit(step, donate_argnums=(0, 1))
s = opt.init(p)
text = f.lower(p, s, g).compile().as_text()
out, _ = f(p, s, g)
print(jsr.native_kernels_status(), jsr.native_kernels_enabled(), "all-gather" in text,
      any(t in text for t in targets))
vals = np.asarray(out)[[1, 600, 999, 0], 0]
print(out.sharding.spec == P("x"), [round(float(x), 4) for x in vals])
# one device's program in the same process: the kernels
one = jnp.zeros((1000, 8))
text = jax.jit(step).lower(one, opt.init(one), g).as_text()
print("one_device", any(t in text for t in targets))
# a shard_map body: each device's half of the table, its own ids
ids = jnp.array([[3, 7, 3, 499], [0, 2, 2, 100]])
table = jnp.arange(8000.0).reshape(1000, 8)
def body(t, i):
    def loss(t):
        return jnp.sum(jnp.sin(jsr.take(t, i[0])))
    return jax.grad(loss)(t)
sm = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
text = sm.lower(table, ids).as_text()
got = sm(table, ids)
jsr.set_native_kernels(False)
want = sm(table, ids)
print("shard_map", _native.GATHER_ROWS.target in text, "all-gather" in text,
      np.array_equal(np.asarray(got), np.asarray(want)), float(np.abs(np.asarray(got)).sum()) > 0)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("JAXSPARSE_ROWS_NATIVE", "XLA_FLAGS")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    available = jsr.native_kernels_available()
    assert out[0] == f"{_native.native_kernels_status()} {available} False False"
    assert out[1] == "True [-0.1, -0.1, -0.1, 0.0]"
    assert out[2] == f"one_device {available}"
    assert out[3] == f"shard_map {available} False True True"


def _spec(a) -> tuple:
    spec = tuple(jax.typeof(a).sharding.spec)
    return spec + (None,) * (a.ndim - len(spec))


def test_one_device_explicit_mesh_keeps_the_sharding_in_types():
    """On a one-device mesh with an explicit axis the kernels could run, but a
    kernel's result carries no sharding: operands sharded over explicit axes
    take the XLA ops, so the table and its optimizer state keep their
    sharding types, and every value (a CSR product too) equals the unsharded
    run's."""
    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P
    from sharded_training import train

    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    want = train()
    with jax.set_mesh(mesh):
        got = train(mesh, P("x", None))
    p, s = got[:2]
    for a in (p["emb"], s[0].mu["emb"], s[0].nu["emb"]):
        assert _spec(a) == ("x", None), jax.typeof(a)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_explicitly_sharded_table_trains_with_xla_ops():
    """A table sharded over explicit mesh axes (sharding in types), by rows
    and by columns (then the row-sparse gradient's data is sharded too):
    ``pull_rows``, ``take``, the row-sparse gradient, a lazy Adam step and
    ``apply_updates`` resolve their shardings (the table keeps its own, the
    optimizer state is sharded like it) and give the single-device result;
    so do the ops that scatter rows into fresh zeros (``op_cases``), and a
    replicated table trained on batches of ids sharded over the mesh (data
    parallel: the ids are gathered whole before they are sorted, and a
    ``take`` from the view keeps their sharding), with or without a
    ``jax.set_mesh`` context around the jitted steps, and every op of a CSR
    whose entries are sharded over the devices. In a subprocess with 2 host
    devices."""
    code = f"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import jax, numpy as np
from jax.sharding import PartitionSpec as P, AxisType
from jax.sharding import NamedSharding
from sharded_training import initial_table, op_cases, train
from test_native_rows import _spec
mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,))
ref = train()
table, dense = initial_table(), jax.numpy.linspace(0.0, 1.0, 24).reshape(3, 8)
for spec, ids_spec in ((P("x", None), None), (P(None, "x"), None), (P(), P("x", None))):
    with jax.set_mesh(mesh):
        got = train(mesh, spec, ids_spec)
        p, s, g, _ = got
        if ids_spec is None:
            t = jax.device_put(table, NamedSharding(mesh, spec))
            d = jax.device_put(dense, NamedSharding(mesh, P(None, spec[1])))
            ops = {{name: jax.jit(f)(t, d) for name, f in op_cases().items()}}
    want = tuple(spec) + (None,) * (2 - len(spec))
    print(_spec(p["emb"]) == _spec(s[0].mu["emb"]) == want,
          _spec(g)[1] == want[1],
          all(np.allclose(a, b, rtol=1e-6, atol=1e-6)
              for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref))),
          float(np.abs(np.asarray(p["emb"]) - np.asarray(table)).max()) > 0)
    if ids_spec is None:
        for name, f in op_cases().items():
            print(name, np.allclose(ops[name], jax.jit(f)(table, dense), rtol=1e-6))
# Jitted steps need no `jax.set_mesh` context: the shardings the ops give
# their results are built on the mesh in the operands' types.
for spec, ids_spec in ((P("x", None), None), (P(), P("x", None))):
    got = train(mesh, spec, ids_spec)
    print("no_context", _spec(got[0]["emb"]) == tuple(spec) + (None,) * (2 - len(spec)),
          all(np.allclose(a, b, rtol=1e-6, atol=1e-6)
              for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref))))
from sharded_training import IDS
import jaxsparse_rows as jsr
with jax.set_mesh(mesh):
    ids = jax.device_put(jax.numpy.array(IDS), NamedSharding(mesh, P("x", None)))
    rows = jax.jit(lambda t, i: jsr.take(jsr.pull_rows(t, i), i))(table, ids)
print("take_of_view", _spec(rows) == ("x", None, None),
      np.array_equal(np.asarray(rows), np.asarray(table)[np.asarray(IDS)]))
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
from draw import random_csr
from tests.test_csr import SHARDED_OPS, oracle
x = random_csr(np.random.default_rng(3), (4, 6), density=0.4, nse=12)
w = np.random.default_rng(4).standard_normal((4, 6)).astype(np.float32)
with jax.set_mesh(mesh):
    on = NamedSharding(mesh, P("x"))
    xs = jsr.CSR(jax.device_put(x.data, on), jax.device_put(x.indices, on), x.indptr, x.shape)
    got = {{op: jax.jit(f)(xs, w) for op, (f, _) in SHARDED_OPS.items()}}
    jsr.check(xs)
    same_rows = np.array_equal(np.asarray(xs.row_ids()), np.asarray(x.row_ids()))
print("sharded_csr", _spec(xs.data) == ("x",), same_rows, all(
    np.allclose(np.asarray(got[op], np.float64), want(oracle(x), w), rtol=2e-3, atol=1e-6)
    for op, (_, want) in SHARDED_OPS.items()))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("JAXSPARSE_ROWS_NATIVE", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.split("\n") if ln]
    runs = [ln.split() for ln in lines if ln.split()[0] in ("True", "False")]
    assert runs == [["True"] * 4] * 3, proc.stdout
    # A take from a pull_rows view with batch-sharded ids keeps the ids'
    # sharding (its search was gathered whole and came back replicated).
    assert "take_of_view True True" in lines, proc.stdout
    # A CSR whose entries are sharded over the two devices: `check`, its row
    # ids and every op of test_csr.SHARDED_OPS against its oracle.
    assert "sharded_csr True True True" in lines, proc.stdout
    assert lines.count("no_context True True") == 2, proc.stdout
    skip = ("True", "False", "take_of_view", "sharded_csr", "no_context")
    ops = [ln for ln in lines if ln.split()[0] not in skip]
    assert len(ops) == 2 * 10 and all(ln.endswith(" True") for ln in ops), proc.stdout


@pytest.mark.parametrize("on", [True, False])
def test_int64_ids_past_2_32_are_dropped_by_both_scatters(on):
    """XLA:CPU's scatter keeps the low 32 bits of an int64 index, so a plain
    XLA twin would write id 2**32 + 1 into row 1 where the kernel drops it;
    both (and the JVP's tangent, which always runs the twin) drop it."""
    with jax.enable_x64(True), kernels_set(on):
        idx = jnp.array([0, 2**32 + 1], jnp.int64)
        f = jax.jit(lambda dense, i: dense + jsr.RowSparse(jnp.ones((2, 2)), i, (4, 2)))
        want = np.array([[1, 1], [0, 0], [0, 0], [0, 0]], np.float64)
        np.testing.assert_array_equal(np.asarray(f(jnp.zeros((4, 2)), idx)), want)
        batched = jax.vmap(f, in_axes=(0, None))(jnp.zeros((2, 4, 2)), idx)
        np.testing.assert_array_equal(np.asarray(batched), np.stack([want, want]))
        primal, tangent = jax.jvp(
            lambda d: _scatter_native(jnp.zeros((4, 2)), idx, d, True),
            (jnp.ones((2, 2)),),
            (jnp.ones((2, 2)),),
        )
        np.testing.assert_array_equal(np.asarray(primal), want)
        np.testing.assert_array_equal(np.asarray(tangent), want)


def test_csr_indptr_past_2_32_gives_the_same_rows_with_kernels_on_and_off():
    """A malformed int64 indptr past nse: the kernel clamps it to nse; the XLA
    twin's row ids must not wrap it to 1 and put the other entries in row 1."""
    with jax.enable_x64(True):
        x = jsr.CSR._make(
            jnp.ones(3), jnp.arange(3, dtype=jnp.int64), jnp.array([0, 2**32 + 1]), (1, 3)
        )
        outs = []
        for on in (True, False):
            with kernels_set(on):
                outs.append(np.asarray(jax.jit(jsr.dot)(x, jnp.eye(3))))
        np.testing.assert_array_equal(outs[0], [[1, 1, 1]])
        np.testing.assert_array_equal(outs[1], outs[0])


def _prefetches_by_function(lib) -> dict[str, int]:
    """Prefetch instructions in each function of the disassembled library."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", str(lib)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    name = None
    for line in out.splitlines():
        if line and not line[0].isspace() and line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
            counts[name] = 0
        elif name is not None and re.search(r"\t(prefetch\w*|prfm)\s", line):
            counts[name] += 1
    return counts


def test_scatter_loops_keep_their_prefetches():
    """The scatters prefetch the rows a few ids ahead, as the gather does.
    GCC 12 at -O3 compiles every scatter loop without them unless
    ``Rows::Row`` is inlined (the gather keeps its own), which makes the
    in-place ``+=`` of ``apply_updates`` about 1.7x slower than XLA's scatter
    on a 1M-row table; ``Rows::Row`` is always inlined, which keeps them.
    This reads the built library's machine code: the functions that hold the
    scatter loops must contain prefetches."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    if platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        pytest.skip(f"no prefetch mnemonic known for {platform.machine()}")
    counts = _prefetches_by_function(_native.library_path())

    def total(*words):
        return sum(n for f, n in counts.items() if any(w in f for w in words))

    assert total("GatherT", "Gather(") > 0  # the probe itself sees prefetches
    assert total("AddRows") > 0, "the scatter-add loop has no prefetch"
    assert total("ScatterT", "Scatter(") > 0, "the scatter-set loop has no prefetch"
