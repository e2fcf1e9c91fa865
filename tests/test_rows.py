"""pull_rows, take and retain against dense numpy oracles, eager and jitted."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental import checkify

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt

DTYPES = [jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32]


def _table(rng, shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape) * 4).astype(dtype)


def _check_pulled(rows, table, ids):
    """The oracle: sorted unique ids, their table rows, padding (id V, zero data)."""
    table = np.asarray(table)
    v = table.shape[0]
    ids = np.asarray(ids).reshape(-1)
    uniq = np.unique(ids[(ids >= 0) & (ids < v)])
    idx = np.asarray(rows.indices)
    data = np.asarray(rows.data)
    assert rows.shape == table.shape
    assert idx.shape[0] == rows.capacity
    np.testing.assert_array_equal(idx[: len(uniq)], uniq)
    np.testing.assert_array_equal(idx[len(uniq) :], v)
    np.testing.assert_array_equal(data[: len(uniq)], table[uniq])
    assert not np.any(data[len(uniq) :])
    dense = np.zeros_like(table)
    dense[uniq] = table[uniq]
    np.testing.assert_array_equal(np.asarray(rows.todense()), dense)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "table_shape,ids_shape",
    [((10, 3), (7,)), ((10,), (4, 2)), ((6, 2, 3), (5,)), ((1, 4), (3,)), ((10, 3), (0,))],
)
def test_pull_rows_matches_oracle(jit_mode, rng, dtype, table_shape, ids_shape):
    table = _table(rng, table_shape, dtype)
    ids = jnp.asarray(rng.integers(0, table_shape[0], size=ids_shape), jnp.int32)
    rows = jit_mode(jsr.pull_rows)(table, ids)
    assert rows.dtype == dtype
    assert rows.capacity == int(np.prod(ids_shape))
    _check_pulled(rows, table, ids)


def test_pull_rows_explicit_size_pads(jit_mode, rng):
    table = _table(rng, (8, 2))
    ids = jnp.array([5, 1, 5, 5])
    rows = jit_mode(lambda t, i: jsr.pull_rows(t, i, size=6))(table, ids)
    assert rows.capacity == 6
    _check_pulled(rows, table, ids)


def test_pull_rows_zero_rows_table(jit_mode):
    table = jnp.zeros((0, 3))
    rows = jit_mode(jsr.pull_rows)(table, jnp.zeros((0,), jnp.int32))
    assert rows.shape == (0, 3) and rows.capacity == 0
    assert rows.todense().shape == (0, 3)


def test_pull_rows_ignores_padding_id(rng):
    """Padded CSR column ids equal V; pull_rows treats them as padding."""
    table = _table(rng, (5, 2))
    rows = jsr.pull_rows(table, jnp.array([2, 5, 5, 0]))
    _check_pulled(rows, table, np.array([2, 0]))
    assert int(rows.nnz_rows) == 2


@st.composite
def bucketed_ids(draw, buckets):
    """``(bucket, ids)``: a bucket ``(V, row shape, n, u)`` and a list of ``n``
    ids in ``[0, V]`` (``V``: the padding id) with exactly ``u`` distinct ids
    below ``V``, in any order. Fixed shapes and distinct counts per bucket let
    the programs under test compile once per bucket, not once per example."""
    v, _, n, u = bucket = draw(st.sampled_from(buckets))
    distinct = draw(st.lists(st.integers(0, max(v - 1, 0)), min_size=u, max_size=u, unique=True))
    rest = draw(st.lists(st.sampled_from([*distinct, v]), min_size=n - u, max_size=n - u))
    return bucket, draw(st.permutations(distinct + rest))


# V = 0, D = 0, n-d rows, no ids, few ids, ids beyond V.
PULL_BUCKETS = [
    (0, (3,), 4, 0),  # V = 0: every id is the padding id 0
    (1, (2,), 5, 1),
    (7, (0,), 6, 3),  # D = 0
    (9, (2, 3), 8, 5),  # n-d rows
    (5, (1,), 0, 0),  # no ids
    (40, (4,), 30, 12),
]


def _pull_and_take(table, ids, *, size):
    rows = jsr.pull_rows(table, ids, size=size)
    return rows, jsr.take(rows, ids)


@given(case=bucketed_ids(PULL_BUCKETS), tight=st.booleans())
def test_pull_rows_property(jit_mode, case, tight):
    """Capacity exactly the distinct ids, or ids.size; take reads the rows back."""
    (v, row, n, u), ids = case
    ids = np.array(ids, np.int32)
    table = jnp.asarray(np.arange(v * int(np.prod(row)), dtype=np.float32).reshape((v,) + row) + 1)
    size = u if tight else n
    fn = jit_mode(_pull_and_take, static_argnames="size")
    rows, taken = fn(table, jnp.asarray(ids), size=size)
    assert rows.capacity == size and rows.dtype == jnp.float32
    _check_pulled(rows, table, ids)
    padded = np.concatenate([np.asarray(table), np.zeros((1,) + row, np.float32)])
    np.testing.assert_array_equal(np.asarray(taken), padded[ids])


@pytest.mark.parametrize("table_shape", [(5, 0), (0, 3), (0,), (5, 2, 0)])
def test_pull_take_and_grad_on_empty_tables_and_rows(jit_mode, table_shape):
    """D = 0 and V = 0: pull_rows, take and the row-sparse gradient keep the shapes."""
    v = table_shape[0]
    table = jnp.ones(table_shape, jnp.float32)
    ids = jnp.array([0, v, 0] if v else [0, 0], jnp.int32)  # v == 0: only padding

    def f(table, ids):
        rows = jsr.pull_rows(table, ids)
        grad = jsr.grad(lambda r: jnp.sum(jsr.take(r, ids) ** 2))(rows)
        return rows, jsr.take(rows, ids), grad

    rows, taken, grad = jit_mode(f)(table, ids)
    _check_pulled(rows, table, ids)
    assert taken.shape == (ids.shape[0],) + table_shape[1:]
    np.testing.assert_array_equal(np.asarray(taken), np.zeros(taken.shape))  # no elements or ones
    assert isinstance(grad, jsr.RowSparse) and grad.shape == table_shape
    np.testing.assert_array_equal(np.asarray(grad.indices), np.asarray(rows.indices))
    np.testing.assert_array_equal(np.asarray(grad.todense()), np.zeros(table_shape))
    jsrt.assert_valid(grad)


def test_pull_rows_overflow_raises_when_concrete():
    with pytest.raises(ValueError, match="more distinct rows than `size` = 2"):
        jsr.pull_rows(jnp.ones((10, 2)), jnp.array([1, 2, 3]), size=2)


def test_pull_rows_overflow_reported_by_checkify_under_jit():
    f = jax.jit(lambda t, i: jsr.pull_rows(t, i, size=2))
    rows = f(jnp.ones((10, 2)), jnp.array([1, 2, 3]))  # unchecked: no error, 2 rows kept
    np.testing.assert_array_equal(np.asarray(rows.indices), [1, 2])
    checked = checkify.checkify(f, errors=checkify.user_checks)
    err, _ = checked(jnp.ones((10, 2)), jnp.array([1, 2, 3]))
    assert "more distinct rows than `size` = 2" in str(err.get())
    err, _ = checked(jnp.ones((10, 2)), jnp.array([1, 2, 1]))
    assert err.get() is None


@pytest.mark.parametrize(
    "make,can_overflow",
    [
        (lambda t, i: jsr.pull_rows(t, i), False),  # default size = ids.size
        (lambda t, i: jsr.pull_rows(t, i, size=6), False),  # size >= ids.size
        (lambda t, i: jsr.pull_rows(t[:3], i % 3, size=3), False),  # size >= V
        (lambda t, i: jsr.pull_rows(t, i, size=2), True),
        (lambda t, i: jsr.RowSparse.fromdense(t, max_rows=10), False),  # max_rows >= N
        (lambda t, i: jsr.RowSparse.fromdense(t, max_rows=4), True),
        (lambda t, i: jsr.CSR.fromdense(t, nse=20), False),  # nse >= M * K
        (lambda t, i: jsr.CSR.fromdense(t, nse=5), True),
    ],
)
def test_overflow_check_only_where_the_capacity_can_overflow(make, can_overflow):
    # A checkify check gives the jitted function an error effect, which sends
    # every call down JAX's slower dispatch path: emit it only when needed.
    jaxpr = jax.make_jaxpr(make)(jnp.ones((10, 2)), jnp.array([1, 2, 3, 1]))
    assert bool(jaxpr.effects) == can_overflow, jaxpr.effects


@pytest.mark.parametrize(
    "table,ids,size,exc,match",
    [
        (np.ones((4, 2)), [0, 7], None, ValueError, r"`ids` must lie in \[0, 4\).*got 7"),
        (np.ones((4, 2)), [-1, 2], None, ValueError, r"`ids` must lie in \[0, 4\).*got -1"),
        (np.ones((4, 2)), [0.5, 1.0], None, TypeError, "`ids` must have an integer dtype"),
        (np.ones((4, 2)), [0, 1], -1, ValueError, "`size` must be an int >= 0"),
        (np.ones((4, 2)), [0, 1], 1.5, TypeError, "`size` must be an int >= 0, got float 1.5"),
        (np.ones((4, 2)), [0, 1], 2.0, TypeError, "`size` must be an int >= 0, got float 2.0"),
        (np.ones((4, 2)), [0, 1], True, TypeError, "`size` must be an int >= 0, got bool True"),
        (np.float32(1.0), [0], None, ValueError, "`table` must be at least 1-D"),
    ],
)
def test_pull_rows_bad_input(table, ids, size, exc, match):
    with pytest.raises(exc, match=match):
        jsr.pull_rows(table, ids, size=size)


@pytest.mark.parametrize("size", [np.int64(3), np.int32(3), np.array(3), jnp.int32(3)])
def test_pull_rows_takes_any_whole_integer_size(size):
    """A NumPy int, a 0-d int array or a concrete JAX int fixes the capacity
    like the Python int 3 (the check takes what ``operator.index`` takes)."""
    table = np.arange(8.0).reshape(4, 2)
    view = jsr.pull_rows(table, np.array([2, 0]), size=size)
    assert view.capacity == 3
    np.testing.assert_array_equal(
        jsr.todense(view), jsr.todense(jsr.pull_rows(table, [2, 0], size=3))
    )


def test_pull_rows_refuses_a_sparse_table():
    """`optax.apply_updates(view, updates)` (a slip for `params`) gives a
    RowSparse table; pulling from it densified it on the host eagerly, zeroing
    every row it did not store, and failed obscurely under jit."""
    view = jsr.pull_rows(jnp.ones((6, 2)), jnp.array([1, 3]))
    for table in (view + view, jsr.cast_storage(jnp.eye(3), "csr")):
        for f in (jsr.pull_rows, jax.jit(jsr.pull_rows)):
            with pytest.raises(TypeError, match=r"`table` must be a dense.*apply_updates\(params"):
                f(table, jnp.array([0]))


def test_pull_rows_traced_size_is_an_error():
    with pytest.raises(TypeError, match="`size` must be a concrete Python int"):
        jax.jit(lambda t, i, s: jsr.pull_rows(t, i, size=s))(jnp.ones((3, 1)), jnp.array([0]), 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ids_shape", [(6,), (3, 4), (0,), (2, 0, 3)])
def test_take_matches_oracle(jit_mode, rng, dtype, ids_shape):
    v = 9
    table = _table(rng, (v, 2, 3), dtype)
    stored = jnp.array([1, 4, 6])
    rows = jsr.pull_rows(table, stored, size=5)  # two padding slots
    ids = jnp.asarray(rng.integers(0, v, size=ids_shape), jnp.int32)
    out = jit_mode(functools.partial(jsr.take, missing="zero"))(rows, ids)
    dense = np.asarray(rows.todense())
    expected = dense[np.asarray(ids)]
    assert out.shape == tuple(ids_shape) + (2, 3) and out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out), expected)


def test_take_unstored_rows_read_zero_and_empty_capacity(jit_mode):
    empty = jsr.zeros("row_sparse", (5, 2))
    out = jit_mode(functools.partial(jsr.take, missing="zero"))(empty, jnp.array([0, 4, 4]))
    np.testing.assert_array_equal(np.asarray(out), np.zeros((3, 2), np.float32))


def test_take_of_a_row_the_view_lacks_is_an_error():
    """A lookup of an id that the view was not pulled with read zeros and got
    no gradient, silently. Concrete: ``ValueError`` naming the ids (from
    ``take``, ``embedding_bag`` and ``check_ids``); padding ids and
    ``missing="zero"`` still read zeros."""
    table = jnp.arange(12.0).reshape(6, 2)
    view = jsr.pull_rows(table, jnp.array([1, 4, 4]))
    for call in (
        lambda: jsr.take(view, jnp.array([[4, 0], [5, 1]])),
        lambda: jsr.embedding_bag(view, jnp.array([[4, 0], [5, 1]]), mode="sum"),
        lambda: jsr.check_ids(jnp.array([[4, 0], [5, 1]]), view),
    ):
        with pytest.raises(
            ValueError, match=r"`ids` names rows that the RowSparse does not store: 0, 5\."
        ):
            call()
    np.testing.assert_array_equal(jsr.take(view, jnp.array([4, 6, 1])), [[8, 9], [0, 0], [2, 3]])
    jsr.check_ids(jnp.array([4, 6, 1]), view)  # stored rows and the padding id pass
    out = jsr.take(view, jnp.array([4, 0]), missing="zero")
    np.testing.assert_array_equal(out, [[8, 9], [0, 0]])
    with pytest.raises(ValueError, match='`missing` must be "error" or "zero"'):
        jsr.take(view, jnp.array([4]), missing="raise")


def test_take_of_a_row_the_view_lacks_is_reported_by_checkify_under_jit():
    """Under jit the values are unknown while tracing: the lookup reads zeros
    (as documented), and ``jsr.check_ids(ids, view)`` inside ``checkify``
    reports the unstored ids; with every id stored it reports nothing."""
    table = jnp.arange(12.0).reshape(6, 2)

    def lookup(pulled, ids):
        view = jsr.pull_rows(table, pulled)
        jsr.check_ids(ids, view)
        return jsr.take(view, ids)

    checked = checkify.checkify(jax.jit(lookup))
    err, out = checked(jnp.array([1, 4]), jnp.array([4, 0]))
    assert "does not store" in err.get()
    np.testing.assert_array_equal(out, [[8, 9], [0, 0]])
    err, out = checked(jnp.array([1, 4]), jnp.array([4, 1, 6]))
    assert err.get() is None
    np.testing.assert_array_equal(out, [[8, 9], [2, 3], [0, 0]])


def test_take_padding_id_reads_zero_not_padding_slot():
    rows = jsr.pull_rows(jnp.ones((4, 2)), jnp.array([1, 1]))  # capacity 2, one padding slot
    out = jsr.take(rows, jnp.array([4, 1]))  # 4 == N: the padding id
    np.testing.assert_array_equal(np.asarray(out), [[0, 0], [1, 1]])


def test_take_dense_table(jit_mode):
    table = jnp.arange(8.0).reshape(4, 2)
    out = jit_mode(jsr.take)(table, jnp.array([[3, 0]]))
    np.testing.assert_array_equal(np.asarray(out), [[[6, 7], [0, 1]]])


@pytest.mark.parametrize(
    "ids,exc,match",
    [
        ([9], ValueError, r"`ids` must lie in \[0, 6\)"),
        ([-2], ValueError, r"`ids` must lie in \[0, 6\)"),
        ([1.0], TypeError, "`ids` must have an integer dtype"),
    ],
)
def test_take_bad_input(ids, exc, match):
    rows = jsr.pull_rows(jnp.ones((6, 2)), jnp.array([1]))
    with pytest.raises(exc, match=match):
        jsr.take(rows, ids)


def test_take_csr_is_a_type_error():
    with pytest.raises(TypeError, match="`take` needs a RowSparse or dense `x`"):
        jsr.take(jsr.zeros("csr", (2, 2)), [0])


def test_retain_seed_example(jit_mode):
    """Seed 000/001 'Retain Row Slices': retain rows 0 and 1 of rows {0, 2, 3}."""
    rsp = jsr.row_sparse_array(([[1, 2], [3, 4], [5, 6]], [0, 2, 3]), shape=(5, 2))
    np.testing.assert_array_equal(
        rsp.asnumpy(), np.array([[1, 2], [0, 0], [3, 4], [5, 6], [0, 0]], np.float32)
    )
    kept = jit_mode(jsr.retain)(rsp, jnp.array([0, 1]))
    assert kept.stype == "row_sparse" and kept.shape == (5, 2)
    np.testing.assert_array_equal(
        kept.asnumpy(), np.array([[1, 2], [0, 0], [0, 0], [0, 0], [0, 0]], np.float32)
    )
    # Requested rows the input lacks come back as (zero) rows of the result.
    np.testing.assert_array_equal(np.asarray(kept.indices), [0, 1])


def _dense(rsp):
    """A RowSparse densified in numpy (padding slots, id N, dropped)."""
    idx, data = np.asarray(rsp.indices), np.asarray(rsp.data)
    dense = np.zeros(rsp.shape, data.dtype)
    dense[idx[idx < rsp.shape[0]]] = data[idx < rsp.shape[0]]
    return dense


def _check_retained(kept, rsp, wanted):
    """The oracle: the sorted unique wanted rows (capacity wanted.size), each
    holding its row of ``rsp`` or zeros where ``rsp`` lacks it; padding N."""
    dense = _dense(rsp)
    n = dense.shape[0]
    uniq = np.unique(np.asarray(wanted, np.int64).reshape(-1))
    idx, data = np.asarray(kept.indices), np.asarray(kept.data)
    assert kept.shape == rsp.shape and kept.dtype == rsp.dtype
    assert kept.capacity == np.asarray(wanted).size
    np.testing.assert_array_equal(idx[: len(uniq)], uniq)
    np.testing.assert_array_equal(idx[len(uniq) :], n)
    np.testing.assert_array_equal(data[: len(uniq)], dense[uniq])
    assert not np.any(data[len(uniq) :])
    jsrt.assert_valid(kept)


# (table shape, stored rows, wanted rows, padding slots of the input)
RETAIN_CASES = {
    "some_stored": ((7, 3), [1, 4, 6], [6, 2, 6, 1], 2),
    "nd_rows_2d_wanted": ((6, 2, 3), [0, 2, 5], [[5, 1], [1, 0]], 0),
    "scalar_rows": ((9,), [8, 3], [3, 0, 8], 1),
    "d0": ((5, 0), [1, 3], [3, 4], 1),
    "n0": ((0, 2), [], [], 0),
    "n0_padded": ((0, 2), [], [], 2),
    "capacity0": ((7, 3), [], [2, 6], 0),
    "nothing_wanted": ((7, 3), [1, 4], [], 1),
}


def modes_and_dtypes(cases, dtypes):
    """Parameters ``(jit_mode, dtype, *case)`` (``jit_mode`` indirect): under
    jit every case at every dtype; eagerly, where each op compiles on its own
    and a case costs ten times more, every case at one dtype, in turn."""
    params = []
    for i, (name, case) in enumerate(cases.items()):
        for dtype in dtypes:
            params.append(pytest.param("jit", dtype, *case, id=f"jit-{name}-{jnp.dtype(dtype)}"))
        dtype = dtypes[i % len(dtypes)]
        params.append(pytest.param("eager", dtype, *case, id=f"eager-{name}-{jnp.dtype(dtype)}"))
    return params


@pytest.mark.parametrize(
    "jit_mode,dtype,shape,stored,wanted,pad",
    modes_and_dtypes(RETAIN_CASES, DTYPES),
    indirect=["jit_mode"],
)
def test_retain_matches_oracle(jit_mode, rng, dtype, pad, shape, stored, wanted):
    table = _table(rng, shape, dtype)
    rsp = jsr.pull_rows(table, jnp.array(stored, jnp.int32), size=len(stored) + pad)
    assert rsp.capacity == len(stored) + pad
    kept = jit_mode(jsr.retain)(rsp, jnp.array(wanted, jnp.int32))
    _check_retained(kept, rsp, wanted)


# (shape, number of wanted ids): the input's capacity is N (stored rows, then
# padding), so each bucket compiles once.
RETAIN_BUCKETS = [((12, 2), 10), ((12, 0), 4), ((5, 2, 2), 6), ((0, 2), 0), ((9,), 12)]


@given(
    case=st.sampled_from(RETAIN_BUCKETS).flatmap(
        lambda b: st.tuples(
            st.just(b[0]),
            st.sets(st.integers(0, max(b[0][0] - 1, 0)), max_size=b[0][0]),
            st.lists(st.integers(0, max(b[0][0] - 1, 0)), min_size=b[1], max_size=b[1]),
        )
    ),
)
def test_retain_property(jit_mode, case):
    shape, stored, wanted = case
    n = shape[0]
    stored = sorted(stored)
    data = np.zeros(shape, np.float32)
    data[: len(stored)] = np.arange(1, 1 + len(stored) * np.prod(shape[1:])).reshape(
        (len(stored),) + shape[1:]
    )
    indices = np.array(stored + [n] * (n - len(stored)), np.int32)
    rsp = jsr.RowSparse(data, indices, shape=shape)
    kept = jit_mode(jsr.retain)(rsp, jnp.asarray(np.array(wanted, np.int32)))
    _check_retained(kept, rsp, wanted)


def test_retain_bad_input():
    with pytest.raises(TypeError, match="`x` must be a RowSparse"):
        jsr.retain(jnp.ones((3, 2)), [0])
    rsp = jsr.zeros("row_sparse", (3, 2))
    with pytest.raises(ValueError, match=r"`rows` must lie in \[0, 3\)"):
        jsr.retain(rsp, [5])


def test_pull_rows_vmap_over_batches():
    """vmap over a batch of id sets: each gets its own RowSparse view."""
    table = jnp.arange(20.0).reshape(10, 2)
    ids = jnp.array([[1, 3, 1], [9, 0, 0]])
    rows = jax.vmap(lambda i: jsr.pull_rows(table, i))(ids)
    assert rows.data.shape == (2, 3, 2)
    for b in range(2):
        one = jsr.RowSparse._make(rows.data[b], rows.indices[b], table.shape)
        _check_pulled(one, table, ids[b])


def test_take_dense_negative_id_under_jit_reads_zero_not_the_last_row():
    """Under jit, out-of-range ids (negative ones too) read zeros and get no gradient."""
    table = jnp.arange(6.0).reshape(3, 2)
    out = jax.jit(jsr.take)(table, jnp.array([-1, 1, 3]))
    np.testing.assert_array_equal(np.asarray(out), [[0, 0], [2, 3], [0, 0]])
    g = jax.jit(jax.grad(lambda t: jnp.sum(jsr.take(t, jnp.array([-1, 0])))))(table)
    np.testing.assert_array_equal(np.asarray(g), [[1, 1], [0, 0], [0, 0]])


@pytest.mark.parametrize("native", [True, False])
def test_64_bit_ids_beyond_int32_read_zero_and_get_no_gradient(native):
    """XLA's CPU gather and scatter keep only the low 32 bits of an int64 index;
    ids like 2**32 + 1 must still read zero rows and receive no gradient (not
    alias row 1), with the kernels on or off."""
    from kernel_switch import kernels_set

    big = [3, 2**32 + 1, -(2**32) + 2, 2**33 + 10]
    with jax.enable_x64(True), kernels_set(native):
        table = jnp.arange(20.0).reshape(10, 2)
        ids = jnp.array(big, jnp.int64)
        want = np.zeros((4, 2))
        want[0] = [6, 7]
        np.testing.assert_array_equal(jax.jit(jsr.take)(table, ids), want)
        grad = jax.jit(jax.grad(lambda t, i: jnp.sum(jsr.take(t, i))))(table, ids)
        np.testing.assert_array_equal(np.nonzero(np.asarray(grad).sum(1))[0], [3])
        view = jax.jit(jsr.pull_rows)(table, ids)
        np.testing.assert_array_equal(view.indices, [3, 10, 10, 10])
        np.testing.assert_array_equal(jax.jit(jsr.take)(view, ids), want)
        # A CSR built under jit (unchecked values) with a column id past int32.
        csr_dot = jax.jit(lambda c: jsr.dot(jsr.CSR(jnp.ones(2), c, [0, 2], shape=(1, 10)), table))
        np.testing.assert_array_equal(csr_dot(jnp.array([3, 2**32 + 1])), [[6, 7]])


@pytest.mark.parametrize(
    "call",
    [
        lambda: jsr.take(jnp.ones((10, 2)), [2**32 + 1]),
        lambda: jsr.pull_rows(jnp.ones((10, 2)), [2**32 + 1, 3]),
        lambda: jsr.retain(jsr.zeros("row_sparse", (10, 2)), np.array([2**40])),
        lambda: jsr.RowSparse(jnp.ones((1, 2)), [2**32 + 1], shape=(10, 2)),
        lambda: jsr.CSR(np.ones(1), [2**32 + 1], [0, 1], shape=(1, 10)),
    ],
)
def test_ids_that_int32_would_wrap_are_an_error_not_another_row(call):
    """With x64 off, a 64-bit id must not be wrapped into int32 (2**32 + 1 is 1)."""
    with pytest.raises(ValueError, match=r"must fit in int32 \(enable jax_enable_x64.*got \d{10}"):
        call()


def test_an_id_of_2_to_the_31_is_named_as_given():
    with pytest.raises(ValueError, match="got 2147483648"):
        jsr.take(jnp.ones((10, 2)), [2**31])
