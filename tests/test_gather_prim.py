"""The row gather and its transpose, the sum of rows, as linear primitives:
equal to a numpy oracle with the native kernels on and off, eagerly and under
jit, for ids in any order (repeats, out of range, negative), n-d rows, empty
tables and empty ids; differentiable, transposable (``jax.linear_transpose``
through ``pull_rows`` and ``take`` included) and batchable."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxpr_walk import all_eqns
from kernel_switch import kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows._rowops import gather_rows, sum_rows

GATHER = _native.GATHER_ROWS.target
SUM = _native.SUM_ROWS.target


def _hlo(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


def _live(ids, n):
    ids = np.asarray(ids)
    return (ids >= 0) & (ids < n)


def _gather_oracle(table, ids):
    live = _live(ids, table.shape[0])
    out = np.zeros((len(ids),) + table.shape[1:], table.dtype)
    out[live] = table[np.asarray(ids)[live]]
    return out


def _sum_oracle(rows, ids, n):
    live = _live(ids, n)
    out = np.zeros((n,) + rows.shape[1:], np.float64)
    np.add.at(out, np.asarray(ids)[live], rows[live].astype(np.float64))
    return out.astype(rows.dtype)


def _values(rng, shape, dtype):
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@given(
    n=st.integers(0, 40),
    k=st.integers(0, 60),
    # (2,), (4,), (8,), (16,): every fixed row width of the kernels (1 to 32
    # bytes) and the first prefetched one (64), for 4- and 8-byte values
    row=st.sampled_from([(), (1,), (2,), (3,), (4,), (8,), (16,), (2, 3)]),
    dtype=st.sampled_from([np.float32, np.float64, np.int32]),
    idtype=st.sampled_from([np.int32, np.int64]),
    sorted_ids=st.booleans(),
    on=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gather_and_sum_match_numpy(n, k, row, dtype, idtype, sorted_ids, on, seed):
    """Any order, repeats, ids past the end and negative ids; kernels on and
    off; eagerly and under jit. Sums of float rows agree to rounding (the
    kernel adds in id order, XLA's scatter need not)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-2, n + 3, k).astype(idtype)
    if sorted_ids:
        ids = np.sort(ids)
    table = _values(rng, (n,) + row, dtype)
    rows = _values(rng, (k,) + row, dtype)
    with jax.enable_x64(True), kernels_set(on):
        jt, ji, jr = jnp.asarray(table), jnp.asarray(ids), jnp.asarray(rows)
        want_g = _gather_oracle(table, ids)
        want_s = _sum_oracle(rows, ids, n)
        gfn = lambda t, i: gather_rows(t, i, ids_sorted=sorted_ids)  # noqa: E731
        sfn = lambda r, i: sum_rows(r, i, n, ids_sorted=sorted_ids)  # noqa: E731
        for wrap in (lambda f: f, jax.jit):
            got = wrap(gfn)(jt, ji)
            assert got.dtype == table.dtype and got.shape == want_g.shape
            np.testing.assert_array_equal(got, want_g)
            got = wrap(sfn)(jr, ji)
            assert got.dtype == rows.dtype and got.shape == want_s.shape
            np.testing.assert_allclose(got, want_s, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 4, 8, 16, 24])
def test_sum_of_rows_at_every_kernel_row_width(rng, d, dtype):
    """The sum-of-rows kernel's fixed-width loops (rows of 4 to 32 bytes) and
    its run-time width, with repeats, ids in any order and dropped ids, into
    a result large enough for its zeroing to be split over the pool."""
    n, k = 40_000, 3000
    ids = rng.integers(-2, n + 3, k).astype(np.int32)
    ids[:50] = 7  # a long run of one id
    rows = rng.standard_normal((k, d)).astype(dtype)
    want = _sum_oracle(rows, ids, n)
    with jax.enable_x64(True), kernels_set(True):
        jr, ji = jnp.asarray(rows), jnp.asarray(ids)
        assert SUM in _hlo(lambda r, i: sum_rows(r, i, n), jr, ji)
        for wrap in (lambda f: f, jax.jit):
            got = wrap(lambda r, i: sum_rows(r, i, n))(jr, ji)
            assert got.dtype == rows.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_kernels_lower_where_they_apply():
    """Float tables and rows with non-empty ids run the kernels on CPU; sums of
    integer rows, empty ids and an empty result stay in XLA; turned-off
    kernels leave no custom call."""
    t, i = jnp.ones((5, 2)), jnp.array([3, 0, 3])
    with kernels_set(True):
        assert GATHER in _hlo(gather_rows, t, i)
        assert SUM in _hlo(lambda r, i: sum_rows(r, i, 5), t[:3], i)
        assert GATHER in _hlo(gather_rows, t.astype(jnp.int32), i)
        assert SUM not in _hlo(lambda r, i: sum_rows(r, i, 5), t[:3].astype(jnp.int32), i)
        assert GATHER not in _hlo(gather_rows, t, i[:0])
        assert SUM not in _hlo(lambda r, i: sum_rows(r, i, 0), t[:3], i)
    with kernels_set(False):
        assert GATHER not in _hlo(gather_rows, t, i)
        assert SUM not in _hlo(lambda r, i: sum_rows(r, i, 5), t[:3], i)


@pytest.mark.parametrize("on", [True, False])
def test_derivatives_of_both_primitives(rng, on):
    """grad and jvp (checked numerically to second order), vjp, and
    ``jax.linear_transpose``, which gives each primitive's transpose as the
    other one."""
    table = jnp.asarray(rng.standard_normal((6, 3)).astype(np.float32))
    rows = jnp.asarray(rng.standard_normal((7, 3)).astype(np.float32))
    ids = jnp.array([4, 1, 4, 9, -1, 0, 4], jnp.int32)
    with kernels_set(on):
        jax.test_util.check_grads(lambda t: jnp.sin(gather_rows(t, ids)), (table,), 2, eps=1e-2)
        jax.test_util.check_grads(lambda r: jnp.sin(sum_rows(r, ids, 6)), (rows,), 2, eps=1e-2)
        g_t = jax.linear_transpose(lambda t: gather_rows(t, ids), table)(rows)[0]
        np.testing.assert_allclose(g_t, _sum_oracle(np.asarray(rows), ids, 6), rtol=1e-6)
        s_t = jax.linear_transpose(lambda r: sum_rows(r, ids, 6), rows)(table)[0]
        np.testing.assert_array_equal(s_t, _gather_oracle(np.asarray(table), ids))
        # transposing twice gives the function back
        tt = jax.linear_transpose(
            lambda r: jax.linear_transpose(lambda t: gather_rows(t, ids), table)(r)[0], rows
        )
        np.testing.assert_array_equal(tt(table)[0], gather_rows(table, ids))
        _, vjp = jax.vjp(lambda t: gather_rows(t, ids), table)
        np.testing.assert_allclose(vjp(rows)[0], g_t, rtol=1e-6)


@pytest.mark.parametrize("on", [True, False])
def test_vmap_of_both_primitives(rng, on):
    """A batch of id lists into one table (one gather of all ids), a batch of
    tables, and batched sums, against a loop."""
    tables = jnp.asarray(rng.standard_normal((3, 6, 2)).astype(np.float32))
    ids = jnp.array([[5, 0, 9], [1, 1, -3], [4, 2, 2]], jnp.int32)
    rows = jnp.asarray(rng.standard_normal((3, 3, 2)).astype(np.float32))
    with kernels_set(on):
        for f, axes, args in [
            (gather_rows, (None, 0), (tables[0], ids)),
            (gather_rows, (0, 0), (tables, ids)),
            (gather_rows, (0, None), (tables, ids[0])),
            (lambda r, i: sum_rows(r, i, 6), (0, 0), (rows, ids)),
            (lambda r, i: sum_rows(r, i, 6), (None, 0), (rows[0], ids)),
            (lambda r, i: sum_rows(r, i, 6), (0, None), (rows, ids[0])),
        ]:
            got = jax.jit(jax.vmap(f, in_axes=axes))(*args)
            loop = [
                f(*(a if ax is None else a[b] for a, ax in zip(args, axes, strict=True)))
                for b in range(3)
            ]
            np.testing.assert_allclose(got, np.stack(loop), rtol=1e-6)


@needs_kernels
def test_lookup_gradient_is_the_native_sum_without_a_scatter(rng):
    """The embedding step's lookup, ``take`` on a ``pull_rows`` view, runs the
    gather kernel forward and the sum-of-rows kernel backward: no XLA scatter
    or gather is left in its compiled gradient, and it equals the XLA path's."""
    table = jnp.asarray(rng.standard_normal((1000, 8)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 1000, (64, 4)).astype(np.int32))
    w = jnp.asarray(rng.standard_normal(8).astype(np.float32))

    def loss(view):
        return jnp.sum(jnp.tanh(jsr.take(view, ids).sum(1) @ w))

    def grad_data(t):
        return jsr.grad(loss)(jsr.pull_rows(t, ids)).data

    with kernels_set(True):
        compiled = jax.jit(grad_data).lower(table).compile().as_text()
        native = jax.jit(grad_data)(table)
    assert SUM in compiled and GATHER in compiled
    assert " scatter(" not in compiled and " gather(" not in compiled
    with kernels_set(False):
        np.testing.assert_allclose(native, jax.jit(grad_data)(table), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("on", [True, False])
def test_linear_transpose_through_pull_rows_and_take(on):
    """``pull_rows`` and ``take`` (dense and RowSparse) are linear in the table,
    and ``jax.linear_transpose`` goes through them: the transpose of the
    lookup counts every id's uses in its row."""
    table = jnp.ones((10, 2))
    ids = jnp.array([3, 7, 3])
    counts = np.zeros((10, 2))
    np.add.at(counts, np.asarray(ids), 1.0)
    with kernels_set(on):
        for f in (
            lambda t: jsr.take(jsr.pull_rows(t, ids), ids),
            lambda t: jsr.take(t, ids),
        ):
            got = jax.linear_transpose(f, table)(jnp.ones((3, 2)))[0]
            np.testing.assert_array_equal(got, counts)
        got = jax.linear_transpose(lambda t: jsr.pull_rows(t, ids).data, table)(jnp.ones((3, 2)))[0]
        np.testing.assert_array_equal(got, np.isin(np.arange(10), ids)[:, None] * np.ones((1, 2)))


@needs_kernels
@pytest.mark.parametrize("d", [3, 64, 100])
def test_threaded_sum_is_exact(rng, d):
    """Enough rows that the sum once split its columns over XLA's pool (and
    row widths that were not a whole number of its blocks): equal to a serial
    float64 sum rounded once, for a few rows repeated many times."""
    k, n = 8192, 300
    ids = rng.integers(-5, n + 5, k).astype(np.int32)
    ids[:2000] = 7  # one row summed 2000 times
    rows = rng.integers(-8, 8, (k, d)).astype(np.float32)  # exact in float32
    with kernels_set(True):
        f = jax.jit(lambda r, i: sum_rows(r, i, n))
        assert SUM in f.lower(rows, ids).as_text()
        got = f(rows, ids)
    np.testing.assert_array_equal(got, _sum_oracle(rows, ids, n))


HALVES = [jnp.bfloat16, jnp.float16]


@pytest.mark.parametrize("on", [True, False])
@pytest.mark.parametrize("n", [5, 3000])  # a result smaller and larger than the 700 rows
@pytest.mark.parametrize("dtype", HALVES)
def test_sums_of_half_rows_run_in_float32_and_round_once(rng, dtype, n, on):
    """float16 and bfloat16 rows are summed in float32 and rounded once (as
    ``jnp.sum`` does), into a result smaller than the rows or larger (where
    repeated ids are summed into [k] rows first): 600 ones at one id sum to
    600, where a running sum in bfloat16 stops at 256. Integer values keep
    the float32 sums exact, so one rounding of the float64 oracle is exact."""
    k = 700
    ids = rng.integers(-2, n + 2, k).astype(np.int32)
    ids[ids == 3] = 4
    ids[rng.permutation(k)[:600]] = 3  # one id repeated 600 times, spread out
    rows = rng.integers(-3, 4, (k, 2)).astype(np.float32)
    rows[ids == 3] = 1.0
    rows = rows.astype(dtype)
    want = _sum_oracle(rows.astype(np.float64), ids, n).astype(dtype)
    assert float(want[3, 0]) == 600.0
    with kernels_set(on):
        for wrap in (lambda f: f, jax.jit):
            for sorted_ids in (False, True):
                order = np.argsort(ids, kind="stable") if sorted_ids else np.arange(k)
                fn = lambda r, i, s=sorted_ids: sum_rows(r, i, n, ids_sorted=s)  # noqa: E731
                got = wrap(fn)(jnp.asarray(rows[order]), jnp.asarray(ids[order]))
                assert got.dtype == dtype and got.shape == (n, 2)
                np.testing.assert_array_equal(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("dtype", HALVES)
def test_half_lookup_gradients_sum_repeated_ids_in_float32(dtype):
    """The gradient of a lookup that repeats an id, into a dense half-precision
    table and into a ``pull_rows`` view of it, is the rounded float32 sum; the
    dense table's gradient builds no float32 ``[V, ...]`` value (repeated ids
    are summed into one float32 row per looked-up id first)."""
    v = 5000
    ids = jnp.asarray(np.r_[np.full(600, 3), [7, 9, 7]].astype(np.int32))
    table = jnp.zeros((v, 4), dtype)
    counts = np.zeros((v, 4))
    np.add.at(counts, np.asarray(ids), 1.0)

    def loss(t):
        return jnp.sum(jsr.take(t, ids).astype(jnp.float32))

    for wrap in (lambda f: f, jax.jit):
        g = wrap(jax.grad(loss))(table)
        assert g.dtype == dtype
        np.testing.assert_array_equal(np.asarray(g, np.float64), counts)
        view = jsr.pull_rows(table, ids)
        gv = wrap(jsr.grad(loss))(view)
        np.testing.assert_array_equal(np.asarray(gv.todense(), np.float64), counts)
    jaxpr = jax.make_jaxpr(jax.grad(loss))(table)
    wide = [
        (e.primitive.name, v_.aval.shape)
        for e in all_eqns(jaxpr)
        for v_ in e.outvars
        if getattr(v_.aval, "dtype", None) == jnp.float32 and v in v_.aval.shape
    ]
    assert not wide, wide
