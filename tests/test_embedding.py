"""embedding_bag against a numpy oracle, eager and jitted, on dense tables and
pull_rows views; its gradient with respect to a view is row-sparse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental import checkify
from jaxpr_walk import all_eqns, big_values, primitive_names
from kernel_switch import kernels_set

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt

MODES = ["sum", "mean", "sqrtn", "max"]


def oracle(table, ids, mode, weights=None, padding_id=None):
    """Per bag, in float64: skip ids outside [0, V) and padding_id."""
    table = np.asarray(table, np.float64)
    ids = np.asarray(ids)
    v, row = table.shape[0], table.shape[1:]
    flat = ids.reshape(int(np.prod(ids.shape[:-1])), ids.shape[-1])
    w_flat = None if weights is None else np.asarray(weights, np.float64).reshape(flat.shape)
    out = np.zeros((flat.shape[0],) + row)
    for b, bag in enumerate(flat):
        kept = [j for j, i in enumerate(bag) if 0 <= i < v and i != padding_id]
        if not kept:
            continue
        rows = table[bag[kept]]
        w = np.ones(len(kept)) if w_flat is None else w_flat[b, kept]
        wr = w.reshape((-1,) + (1,) * len(row))
        if mode == "max":
            out[b] = rows.max(axis=0)
        elif mode == "sum":
            out[b] = (wr * rows).sum(axis=0)
        else:
            norm = w.sum() if mode == "mean" else np.sqrt((w * w).sum())
            out[b] = (wr * rows).sum(axis=0) / norm if norm != 0 else 0.0
    return out.reshape(ids.shape[:-1] + row)


def _table(rng, shape, dtype=jnp.float32):
    return jnp.asarray(rng.integers(-8, 8, size=shape) / 4).astype(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype,wrap",
    # Eager and jit in float32; the half-precision dtypes under jit only (the
    # same code path; eager dispatch of every case was a sixth of the file).
    [
        (jnp.float32, lambda f: f),
        (jnp.float32, jax.jit),
        (jnp.bfloat16, jax.jit),
        (jnp.float16, jax.jit),
    ],
    ids=["float32-eager", "float32-jit", "bfloat16-jit", "float16-jit"],
)
@pytest.mark.parametrize(
    "table_shape,ids_shape",
    [((10, 3), (4, 5)), ((10, 2, 3), (6,)), ((7,), (2, 3, 4)), ((5, 2), (3, 0)), ((5, 2), (0, 4))],
)
def test_matches_oracle_on_dense_tables_and_views(wrap, mode, dtype, table_shape, ids_shape):
    rng = np.random.default_rng(0)
    table = _table(rng, table_shape, dtype)
    v = table_shape[0]
    ids = jnp.asarray(rng.integers(0, v + 1, size=ids_shape), jnp.int32)  # v: padding
    want = oracle(table, ids, mode)
    view = jsr.pull_rows(table, ids)
    for t in (table, view):
        got = wrap(lambda t, i: jsr.embedding_bag(t, i, mode=mode))(t, ids)
        assert got.dtype == dtype and got.shape == want.shape
        jsrt.assert_allclose(got, want)


@pytest.mark.parametrize("mode", ["sum", "mean", "sqrtn"])
def test_weights_and_padding_id(jit_mode, mode):
    rng = np.random.default_rng(1)
    table = _table(rng, (9, 4))
    ids = (
        jnp.asarray(rng.integers(0, 9, size=(5, 6)), jnp.int32).at[0].set(2)
    )  # bag 0: padding only
    weights = (
        jnp.asarray(rng.uniform(-1, 2, size=(5, 6)), jnp.float32).at[3].set(0.0)
    )  # zero weight
    fn = jit_mode(lambda t, i, w: jsr.embedding_bag(t, i, mode=mode, weights=w, padding_id=2))
    got = fn(table, ids, weights)
    want = oracle(table, ids, mode, weights, padding_id=2)
    jsrt.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(got[0]), 0.0)  # nothing kept: zeros
    np.testing.assert_array_equal(np.asarray(got[3]), 0.0)


def _numpy_max_grad(table, ids, cot, padding_id=None):
    """PyTorch's rule: each output element's gradient goes to the first id of
    its bag that holds the maximum (strictly greater than those before)."""
    g = np.zeros_like(table)
    for b, bag in enumerate(ids):
        for d in range(table.shape[1]):
            kept = [i for i in bag if 0 <= i < table.shape[0] and i != padding_id]
            if kept:
                best = kept[0]
                for i in kept[1:]:
                    if table[i, d] > table[best, d]:
                        best = i
                g[best, d] += cot[b, d]
    return g


@pytest.mark.parametrize("view", [False, True])
def test_max_gradient_on_ties_goes_to_the_first_id(jit_mode, view):
    """On a tie the whole gradient goes to one id, as in PyTorch's
    embedding_bag; `jnp.max`'s rule split it evenly between the tied rows."""
    table = np.array([[1.0, 5.0], [1.0, 2.0], [0.0, 5.0], [3.0, 3.0]], np.float32)
    ids = np.array([[0, 1, 2, 4], [3, 3, 1, 0], [2, 0, 4, 4]])  # 4 == V: padding
    cot = np.array([[1.0, 10.0], [100.0, 1000.0], [7.0, 70.0]], np.float32)

    def loss(t):
        return jnp.sum(jsr.embedding_bag(t, ids, mode="max") * cot)

    if view:
        g = jit_mode(jsr.grad(loss))(jsr.pull_rows(jnp.asarray(table), ids)).todense()
    else:
        g = jit_mode(jax.grad(loss))(jnp.asarray(table))
    np.testing.assert_array_equal(np.asarray(g), _numpy_max_grad(table, ids, cot))


@pytest.mark.parametrize("view", [False, True])
def test_max_gradient_reaches_kept_rows_holding_minus_inf_after_a_skipped_id(jit_mode, view):
    """A skipped id is masked to -inf: when the kept rows hold -inf too, the
    tie went to the skipped slot and the gradient was lost (torch gives 1)."""
    inf = np.inf
    table = np.array([[1.0, -inf], [-inf, -inf], [-inf, 2.0]], np.float32)
    ids = np.array([[0, 1], [3, 1], [3, 0], [0, 2], [2, 1]])  # 0 is padding_id, 3 == V
    cot = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]], np.float32)

    def loss(t):
        return jnp.sum(jsr.embedding_bag(t, ids, mode="max", padding_id=0) * cot)

    if view:
        g = jit_mode(jsr.grad(loss))(jsr.pull_rows(jnp.asarray(table), ids)).todense()
    else:
        g = jit_mode(jax.grad(loss))(jnp.asarray(table))
    want = _numpy_max_grad(table, ids, cot, padding_id=0)
    np.testing.assert_array_equal(np.asarray(g), want)
    assert want[1].sum() > 0  # the case the test is about: a -inf row gets a gradient


def test_max_ignores_skipped_ids_even_when_their_rows_are_larger():
    table = jnp.array([[9.0, 9.0], [-1.0, -3.0], [-2.0, 5.0]])
    ids = jnp.array([[1, 2, 0], [0, 3, 3]])  # 0 is padding_id, 3 == V
    got = jsr.embedding_bag(table, ids, mode="max", padding_id=0)
    np.testing.assert_array_equal(np.asarray(got), [[-1.0, 5.0], [0.0, 0.0]])


@pytest.mark.parametrize("mode", MODES)
def test_gradient_wrt_a_view_is_row_sparse_and_equals_the_dense_gradient(mode):
    rng = np.random.default_rng(2)
    v = 12
    table = _table(rng, (v, 3)) + jnp.asarray(rng.normal(size=(v, 3)) * 1e-3, jnp.float32)
    ids = jnp.asarray(rng.integers(0, v, size=(4, 5)), jnp.int32).at[1, 2].set(v)
    ids = ids.at[2].set(5)  # a bag of padding only (padding_id 5)
    weights = None if mode == "max" else jnp.asarray(rng.uniform(0.5, 2, (4, 5)), jnp.float32)
    target = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)

    def loss(t):
        pooled = jsr.embedding_bag(t, ids, mode=mode, weights=weights, padding_id=5)
        return jnp.sum((pooled - target) ** 2)

    dense_grad = jax.grad(loss)(table)
    view = jsr.pull_rows(table, jnp.where(ids == 5, v, ids))  # no padding row listed
    grad = jax.jit(jsr.grad(loss))(view)
    assert isinstance(grad, jsr.RowSparse) and grad.capacity == view.capacity
    assert 5 not in np.asarray(grad.indices).tolist()
    jsrt.assert_allclose(grad, dense_grad, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(dense_grad[5]), 0.0)


@pytest.mark.parametrize("native", [True, False])
def test_no_dense_table_sized_intermediate_in_the_view_gradient(native):
    """Nothing anywhere in the program (nested calls and both forms of the
    library's kernels, native and XLA, included) is table-sized."""
    if native and not jsr.native_kernels_available():
        pytest.skip("native kernels not built here")
    v = 10**8
    view = jax.ShapeDtypeStruct((16, 8), jnp.float32), jax.ShapeDtypeStruct((16,), jnp.int32)

    def grad_of(data, indices):
        rsp = jsr.RowSparse(data, indices, shape=(v, 8))
        ids = jnp.arange(16).reshape(4, 4)
        return jsr.grad(lambda r: jnp.sum(jsr.embedding_bag(r, ids, mode="mean")))(rsp).data

    with kernels_set(native):
        jaxpr = jax.make_jaxpr(grad_of)(*view)
    assert big_values(jaxpr, v) == []
    sizes = [
        int(np.prod(a.aval.shape))
        for e in all_eqns(jaxpr)
        for a in e.outvars
        if hasattr(a.aval, "shape")
    ]
    assert max(sizes) < 10**4
    # The slots of the ids are found by a kernel (where on), whose forms were walked.
    assert ("jsr_kernel_call" in primitive_names(jaxpr)) == native


# Shape buckets for the property: (V, row shape, ids shape). Few, so that the
# jitted programs (and the eager ops) compile once each and are reused.
BUCKETS = [
    (1, (2,), (3, 4)),
    (8, (0,), (2, 5)),  # D = 0
    (8, (3,), (4, 1)),
    (6, (2, 2), (5,)),  # n-d rows, one bag
    (0, (2,), (2, 3)),  # V = 0: every id is the padding id
    (5, (1,), (2, 0)),  # empty bags
    (7, (2,), (0, 3)),  # no bags
]


def _pooled(table, ids, weights, *, view, mode):
    t = jsr.pull_rows(table, ids) if view else table
    return jsr.embedding_bag(t, ids, mode=mode, weights=weights)


@given(
    bucket=st.sampled_from(BUCKETS),
    mode=st.sampled_from(MODES),
    weighted=st.booleans(),
    view=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property(jit_mode, bucket, mode, weighted, view, seed):
    v, row, ids_shape = bucket
    rng = np.random.default_rng(seed)
    table = _table(rng, (v,) + row)
    ids = jnp.asarray(rng.integers(0, v + 1, size=ids_shape), jnp.int32)  # v: padding
    weights = None
    if weighted and mode != "max":
        weights = jnp.asarray(rng.integers(0, 3, size=ids_shape), jnp.float32)
    fn = jit_mode(_pooled, static_argnames=("view", "mode"))
    got = fn(table, ids, weights, view=view, mode=mode)
    want = oracle(table, ids, mode, weights)
    assert got.shape == want.shape and got.dtype == jnp.float32
    jsrt.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"mode": "avg"}, ValueError, r"`mode` must be one of \('sum', 'mean', 'sqrtn', 'max'\)"),
        ({"mode": "max", "weights": jnp.ones((2, 3))}, ValueError, "`weights` are not defined"),
        (
            {"weights": jnp.ones((3, 2))},
            ValueError,
            r"`weights` must have the shape of `ids` \(2, 3\)",
        ),
        ({"padding_id": 1.5}, TypeError, "`padding_id` must be a Python int"),
        ({"padding_id": "1"}, TypeError, "`padding_id` must be a Python int, got '1'"),
        ({"padding_id": True}, TypeError, "`padding_id` must be a Python int, got True"),
        (
            {"weights": jnp.ones((2, 3), jnp.complex64)},
            TypeError,
            r"`weights` are complex \(complex64\) but the table is real \(float32\)",
        ),
        ({"ids": jnp.array([[0.0, 1.0]])}, TypeError, "`ids` must have an integer dtype"),
        ({"ids": jnp.array(1)}, ValueError, "`ids` must have at least one axis"),
        ({"ids": jnp.array([[0, 7]])}, ValueError, r"`ids` must lie in \[0, 5\).*got 7"),
        ({"table": jnp.float32(1.0)}, ValueError, "`table` must be at least 1-D"),
        (  # was densified silently (take refuses a CSR)
            {"table": jsr.csr_matrix(np.ones((5, 2), np.float32))},
            TypeError,
            r"`table` must be a dense array or a RowSparse .*got a CSR.*table.todense\(\)",
        ),
    ],
)
def test_bad_input(kwargs, exc, match):
    args = {"table": jnp.ones((5, 2)), "ids": jnp.array([[0, 1, 2], [3, 4, 4]])}
    args.update(kwargs)
    table, ids = args.pop("table"), args.pop("ids")
    with pytest.raises(exc, match=match):
        jsr.embedding_bag(table, ids, **args)


def test_padding_id_skips_out_of_range_checks_only_for_itself():
    table = jnp.ones((5, 2))
    np.testing.assert_array_equal(
        np.asarray(jsr.embedding_bag(table, jnp.array([[0, 2, 2]]), mode="sum", padding_id=2)),
        [[1.0, 1.0]],
    )
    with pytest.raises(ValueError, match="got -1"):
        jsr.embedding_bag(table, jnp.array([[0, -1]]), padding_id=2)
    # Under jit out-of-range ids are skipped.
    out = jax.jit(lambda i: jsr.embedding_bag(table, i, mode="sum"))(jnp.array([[0, -1, 9]]))
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 1.0]])


@pytest.mark.parametrize("mode", MODES)
def test_skipped_ids_are_not_looked_up_so_their_rows_cannot_poison_the_pool(mode):
    """A padding row holding inf (or NaN) must not reach the result: 0 * inf is NaN."""
    table = jnp.array([[jnp.inf, jnp.nan], [1.0, 2.0], [3.0, 4.0]])
    ids = jnp.array([[0, 1, 2, 0]])
    got = jax.jit(lambda t: jsr.embedding_bag(t, ids, mode=mode, padding_id=0))(table)
    assert np.all(np.isfinite(np.asarray(got)))
    jsrt.assert_allclose(got, oracle(table, ids, mode, padding_id=0))


def test_integer_tables_are_refused_and_zero_weight_bags_have_finite_gradients():
    with pytest.raises(TypeError, match="`table` must have a floating dtype.*got int32"):
        jsr.embedding_bag(jnp.ones((5, 2), jnp.int32), jnp.array([[0, 1]]))
    table = jnp.arange(10.0).reshape(5, 2)
    ids = jnp.array([[0, 1, 2], [3, 4, 4]])
    for mode in ("mean", "sqrtn"):
        grad = jax.grad(
            lambda w: jnp.sum(jsr.embedding_bag(table, ids, mode=mode, weights=w))  # noqa: B023
        )(jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, 0.0]]))
        assert np.all(np.isfinite(np.asarray(grad))), (mode, grad)
        np.testing.assert_array_equal(np.asarray(grad[0]), 0.0)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8, jnp.int16, jnp.uint16])
def test_narrow_id_dtypes_do_not_wrap_the_row_count(dtype, jit_mode):
    """`ids < V` was compared in the ids' dtype: with int8 ids and V = 300, V
    wrapped to 44 and every id from 44 up was skipped as padding."""
    v = 300 if jnp.iinfo(dtype).max < 300 else 70000
    table = jnp.arange(v * 2, dtype=jnp.float32).reshape(v, 2)
    big = min(100, int(jnp.iinfo(dtype).max)) if v == 300 else 5000
    ids = np.array([[1, 2], [3, big]])
    got = jit_mode(lambda i: jsr.embedding_bag(table, i, mode="sum", padding_id=2))(
        jnp.asarray(ids, dtype)
    )
    want = np.asarray(table)[[1]].sum(0), np.asarray(table)[[3, big]].sum(0)
    np.testing.assert_array_equal(got, np.stack(want))
    err, _ = jax.jit(checkify.checkify(lambda i: jsr.check_ids(i, v)))(jnp.asarray(ids, dtype))
    err.throw()


@pytest.mark.parametrize("padding_id", [2**40, -(2**40), 2**31])
def test_a_padding_id_no_id_can_equal_skips_nothing(jit_mode, padding_id):
    """A padding_id outside the ids' dtype failed with an OverflowError naming
    neither the argument nor the library; no id can equal it, so it skips
    nothing."""
    table = jnp.arange(6.0).reshape(3, 2)
    ids = jnp.array([[0, 2], [1, 1]])
    got = jit_mode(lambda t, i: jsr.embedding_bag(t, i, mode="sum", padding_id=padding_id))(
        table, ids
    )
    np.testing.assert_array_equal(np.asarray(got), np.asarray(table)[np.asarray(ids)].sum(1))
