"""The native CPU kernels for the id bookkeeping of ``pull_rows``, ``take``,
lookup gradients and coalescing: the sorted unique ids of a batch with every
id's slot, and the slots of ids in a sorted list. Equal to a numpy oracle and
to the XLA implementations in ``_rowops.py``, eagerly, under jit and vmap, for
int32 and int64 ids, with padding, ids out of range and a capacity that
leaves ids out."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_switch import kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native, _rowops

UNIQUE = _native.UNIQUE_IDS.target
SEARCH = _native.SEARCH_IDS.target

pytestmark = needs_kernels


@pytest.fixture(autouse=True)
def kernels_on():
    with kernels_set(True):
        yield


def _hlo(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


def _slots_oracle(sorted_ids, queries, n_rows):
    sorted_ids, queries = np.asarray(sorted_ids), np.asarray(queries)
    out = np.full(queries.shape, len(sorted_ids), np.int64)
    where = {int(v): i for i, v in reversed(list(enumerate(sorted_ids)))}  # first position
    for idx, q in np.ndenumerate(queries):
        if 0 <= q < n_rows and int(q) in where:
            out[idx] = where[int(q)]
    return out


def _unique_oracle(ids, n_rows, capacity):
    ids = np.asarray(ids)
    present = np.unique(ids[(ids >= 0) & (ids < n_rows)])
    uniq = np.full(capacity, n_rows, np.int64)
    uniq[: min(capacity, len(present))] = present[:capacity]
    return uniq, len(present), _slots_oracle(uniq, ids, n_rows)


def _spread(a):
    """Maps ids ``>= 0`` increasingly onto int64 values with many different high
    bits (``i * 2^28 + i``); negative ids stay. Order, equality and the range
    ``[0, N)`` (mapped with N) are kept, so the answers map one to one."""
    a = np.asarray(a, np.int64)
    return np.where(a >= 0, a * 2**28 + a, a)


def _draw_ids(rng, n, n_rows, distinct):
    """``n`` ids drawn from ``distinct`` values in range plus a few outside it."""
    pool = rng.integers(0, n_rows, max(distinct, 1))
    ids = pool[rng.integers(0, len(pool), n)]
    bad = rng.random(n) < 0.05
    ids[bad] = rng.choice([-1, -7, n_rows, n_rows + 3], bad.sum())
    return ids


@given(
    n=st.integers(1, 1500),
    n_rows=st.one_of(st.integers(1, 3000), st.integers(2**20, 2**31 - 1)),
    distinct=st.integers(1, 1500),
    capacity=st.integers(1, 1600),
    x64=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_unique_matches_oracle_and_xla(n, n_rows, distinct, capacity, x64, seed):
    """``(uniq, count, slots)`` equal numpy's and the XLA path's, for the
    comparison sort (under 256 valid ids) and the radix sort (1 to 6 passes),
    int32 and int64 ids, a capacity below and above the distinct count."""
    rng = np.random.default_rng(seed)
    ids_np = _draw_ids(rng, n, n_rows, distinct)
    with jax.enable_x64(x64):
        if x64 and seed % 2:  # int64 ids beyond int32: up to six radix passes
            ids_np, n_rows = _spread(ids_np), int(_spread(n_rows))
        ids = jnp.asarray(ids_np)
        want = _unique_oracle(ids_np, n_rows, capacity)

        def fn(i):
            return _rowops.unique_with_slots(i, n_rows, capacity)

        assert UNIQUE in _hlo(fn, ids)
        # the XLA path jitted: eagerly, each of its ops would compile on its own
        xla = jax.jit(_rowops._unique_with_slots_xla, static_argnums=(1, 2))(
            ids.astype(_rowops.index_dtype()), n_rows, capacity
        )
        for got in (fn(ids), jax.jit(fn)(ids), xla):
            for g, w in zip(got, want, strict=True):
                assert g.dtype == _rowops.index_dtype()
                np.testing.assert_array_equal(g, w)
        uniq, count = jax.jit(lambda i: _rowops.unique_rows(i, n_rows, capacity))(ids)
        np.testing.assert_array_equal(uniq, want[0])
        assert int(count) == want[1]


@given(
    k=st.integers(1, 700),
    n_rows=st.integers(1, 5000),
    shape=st.sampled_from([(1,), (7,), (300,), (3, 5), (2, 0), (1200, 6)]),
    big=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_search_matches_oracle_and_xla(k, n_rows, shape, big, seed):
    """Slots of queries of any shape (several thousand on the threaded path)
    in a sorted list padded with ``n_rows``: found, absent, negative and past
    the end; with ``big``, int64 ids beyond 2^31 (x64)."""
    rng = np.random.default_rng(seed)
    live = np.unique(rng.integers(0, n_rows, k))
    sorted_np = np.concatenate([live, np.full(k - len(live), n_rows)])
    queries_np = _draw_ids(rng, int(np.prod(shape)), n_rows, k).reshape(shape)
    if big:  # every id >= 0 moves past int32, padding included
        sorted_np, queries_np = _spread(sorted_np), _spread(queries_np)
        n_rows = int(_spread(n_rows))
    _check_search(sorted_np, queries_np, n_rows, x64=big)


@given(
    k=st.integers(1, 300),
    n_rows=st.integers(1, 3000),
    shape=st.sampled_from([(1,), (2,), (9,), (40, 3), (2, 0)]),
    big=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_search_of_ids_sharded_over_an_explicit_axis(k, n_rows, shape, big, seed):
    """Queries sharded over an explicit mesh axis (a data-parallel batch; here
    a one-device mesh) take a binary search of their own, whose gathers keep
    the queries' sharding: the slots come back sharded like the queries
    (they were gathered whole and came back replicated) and equal the
    oracle's, eagerly and under jit."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(seed)
    live = np.unique(rng.integers(0, n_rows, k))
    sorted_np = np.concatenate([live, np.full(k - len(live), n_rows)])
    queries_np = _draw_ids(rng, int(np.prod(shape)), n_rows, k).reshape(shape)
    if big:
        sorted_np, queries_np = _spread(sorted_np), _spread(queries_np)
        n_rows = int(_spread(n_rows))
    want = _slots_oracle(sorted_np, queries_np, n_rows)
    mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    with jax.enable_x64(big), jax.set_mesh(mesh):
        idt = np.int64 if big else np.int32
        sorted_ids = jnp.asarray(sorted_np.astype(idt))
        queries = jax.device_put(queries_np.astype(idt), NamedSharding(mesh, P("x")))

        def fn(s, q):
            return _rowops.slots_in(s, q, n_rows)

        assert SEARCH not in _hlo(fn, sorted_ids, queries)
        for got in (fn(sorted_ids, queries), jax.jit(fn)(sorted_ids, queries)):
            assert jax.typeof(got).sharding.spec[0] == "x", jax.typeof(got)
            assert got.shape == queries_np.shape and got.dtype == idt
            np.testing.assert_array_equal(got, want)


def _check_search(sorted_np, queries_np, n_rows, x64):
    with jax.enable_x64(x64):
        idt = np.int64 if x64 else np.int32
        sorted_ids, queries = (
            jnp.asarray(sorted_np.astype(idt)),
            jnp.asarray(queries_np.astype(idt)),
        )
        want = _slots_oracle(sorted_np, queries_np, n_rows)

        def fn(s, q):
            return _rowops.slots_in(s, q, n_rows)

        if queries.size:
            assert SEARCH in _hlo(fn, sorted_ids, queries)
        for got in (fn(sorted_ids, queries), jax.jit(fn)(sorted_ids, queries)):
            assert got.shape == queries_np.shape and got.dtype == idt
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(_rowops._slots_xla(sorted_ids, queries, n_rows), want)


@pytest.mark.parametrize("x64", [False, True])
def test_threaded_search_with_partial_groups(rng, x64):
    """4096 sorted ids and 10,001 queries: the search is split over threads, and
    the ranges end in groups of fewer than eight queries."""
    n_rows = 100_000
    live = np.sort(rng.choice(n_rows, 4000, replace=False))
    sorted_np = np.concatenate([live, np.full(96, n_rows)])
    queries_np = rng.integers(-3, n_rows + 3, 10_001)
    queries_np[::3] = live[rng.integers(0, len(live), len(queries_np[::3]))]
    if x64:
        sorted_np, queries_np = _spread(sorted_np), _spread(queries_np)
        n_rows = int(_spread(n_rows))
    _check_search(sorted_np, queries_np, n_rows, x64)


def test_take_on_a_rowsparse_view_stays_linear_transposable(rng):
    """``take`` on a RowSparse reads its small ``[K, D]`` data with XLA's gather
    (only the slot search is a kernel), so ``jax.linear_transpose`` works."""
    table = jnp.asarray(rng.standard_normal((30, 2)).astype(np.float32))
    ids = jnp.array([[3, 7], [7, 29]], jnp.int32)
    view = jsr.pull_rows(table, ids)

    def f(data):
        return jsr.take(jsr.RowSparse._make(data, view.indices, view.shape), ids)

    ct = jnp.ones((2, 2, 2), jnp.float32)
    (got,) = jax.linear_transpose(f, view.data)(ct)
    want = jax.vjp(f, view.data)[1](ct)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[: len(np.unique(ids))].sum(axis=1), [2.0, 4.0, 2.0])


def test_empty_inputs_and_zero_capacity_stay_in_xla():
    """No ids, a capacity of zero and an empty list run XLA, with the same
    answers as the oracle."""
    empty = jnp.zeros((0,), jnp.int32)
    ids = jnp.array([3, 1, 3], jnp.int32)
    assert UNIQUE not in _hlo(lambda i: _rowops.unique_with_slots(i, 5, 4), empty)
    uniq, count, slots = _rowops.unique_with_slots(empty, 5, 4)
    np.testing.assert_array_equal(uniq, [5, 5, 5, 5])
    assert int(count) == 0 and slots.shape == (0,)
    uniq, count, slots = jax.jit(lambda i: _rowops.unique_with_slots(i, 5, 0))(ids)
    assert uniq.shape == (0,) and int(count) == 2
    np.testing.assert_array_equal(slots, [0, 0, 0])  # as the XLA path: nowhere to point
    assert SEARCH not in _hlo(lambda s, q: _rowops.slots_in(s, q, 5), empty, ids)
    np.testing.assert_array_equal(_rowops.slots_in(empty, ids, 5), [0, 0, 0])


def test_malformed_sorted_list_is_memory_safe():
    """An unsorted list (possible only under jit, where values are unchecked)
    gives unspecified slots, but every slot is in ``[0, k]``; ids found are
    still found where the binary search meets them."""
    rng = np.random.default_rng(3)
    sorted_ids = jnp.asarray(rng.integers(-50, 2**31 - 1, 999).astype(np.int32))
    queries = jnp.asarray(rng.integers(-(2**31), 2**31 - 1, 5000).astype(np.int32))
    slots = np.asarray(jax.jit(lambda s, q: _rowops.slots_in(s, q, 2**31 - 1))(sorted_ids, queries))
    assert slots.min() >= 0 and slots.max() <= 999
    hit = slots < 999
    np.testing.assert_array_equal(np.asarray(sorted_ids)[slots[hit]], np.asarray(queries)[hit])


def test_vmap_matches_the_xla_path():
    ids = jnp.array([[4, 1, 4, 9], [0, 0, 2, -1], [7, 7, 7, 7]], jnp.int32)
    native = jax.jit(jax.vmap(lambda i: _rowops.unique_with_slots(i, 8, 3)))(ids)
    xla = jax.vmap(lambda i: _rowops._unique_with_slots_xla(i, 8, 3))(ids)
    for a, b in zip(native, xla, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        jax.vmap(lambda u, i: _rowops.slots_in(u, i, 8))(native[0], ids),
        jax.vmap(lambda u, i: _rowops._slots_xla(u, i, 8))(native[0], ids),
    )


def test_embedding_step_uses_the_kernels_and_matches_xla(rng):
    """``pull_rows`` + ``take`` + ``value_and_grad`` + lazy Adam: the id kernels
    replace every sort and binary search of the step, and the step equals the
    XLA path's; its gradient with respect to the pulled rows is exact."""
    v, d = 50, 3
    table = jnp.asarray(rng.standard_normal((v, d)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, v, (16, 4)).astype(np.int32))
    opt = jsr.optim.lazy_adam(0.1)

    def loss(view, ids):
        return jnp.sum(jnp.sin(jsr.take(view, ids).sum(axis=1)))

    def step(table, state, ids):
        view = jsr.pull_rows(table, ids)
        g = jsr.grad(loss)(view, ids)
        u, state = opt.update(g, state, table)
        return jsr.optim.apply_updates(table, u), state, g

    hlo = jax.jit(step).lower(table, opt.init(table), ids).compile().as_text()
    assert UNIQUE in hlo and SEARCH in hlo
    assert " sort(" not in hlo and "while(" not in hlo
    native = jax.jit(step)(table, opt.init(table), ids)
    with kernels_set(False):
        xla = jax.jit(step)(table, opt.init(table), ids)
    for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(xla), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    dense = jax.grad(lambda t: loss(t, ids))(table)  # take on a dense table
    g = native[2]
    np.testing.assert_allclose(g.todense(), dense, rtol=1e-6, atol=1e-6)


def test_self_test_catches_wrong_id_kernels(monkeypatch):
    real_u, real_s = _native.unique_ids_call, _native.search_ids_call

    def miscounted(ids, n_rows, capacity):
        uniq, count, slots = real_u(ids, n_rows, capacity)
        return uniq, count + 1, slots

    monkeypatch.setattr(_native._registry, "unique_ids_call", miscounted)
    assert _native._selftest.self_test() == "the self-test unique ids differed from numpy"
    monkeypatch.setattr(_native._registry, "unique_ids_call", real_u)
    monkeypatch.setattr(_native._registry, "search_ids_call", lambda s, q, n: real_s(s, q, n)[::-1])
    assert _native._selftest.self_test() == "the self-test id search differed from numpy"
