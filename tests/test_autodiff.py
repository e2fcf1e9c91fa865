"""Row-sparse autodiff: jsr.value_and_grad / jsr.grad against dense jax.grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jaxpr_walk import big_values, primitive_names
from kernel_switch import kernels_set
from test_rows import bucketed_ids, modes_and_dtypes

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt


def _restrict(dense_grad, indices, n):
    """The oracle: dense gradient rows at `indices`, zero for padding slots."""
    idx = np.asarray(indices)
    out = np.zeros((len(idx),) + dense_grad.shape[1:], dense_grad.dtype)
    real = idx < n
    out[real] = np.asarray(dense_grad)[idx[real]]
    return out


def _embed_loss(table_or_rows, w, ids, y):
    emb = jsr.take(table_or_rows, ids)  # [B, L, D]
    pooled = jnp.sum(emb, axis=1)
    return jnp.mean((pooled @ w - y) ** 2)


@pytest.mark.parametrize("size_extra", [0, 3])
def test_embedding_grad_equals_dense_restricted(jit_mode, rng, size_extra):
    v, d = 50, 4
    table = jnp.asarray(rng.standard_normal((v, d)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((d,)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 8, size=(6, 3)).astype(np.int32))  # many duplicates
    y = jnp.asarray(rng.standard_normal(6).astype(np.float32))
    n_unique = len(np.unique(np.asarray(ids)))

    def sparse_step(table, w, ids, y):
        rows = jsr.pull_rows(table, ids, size=n_unique + size_extra)
        return jsr.value_and_grad(_embed_loss, argnums=(0, 1))(rows, w, ids, y)

    (loss, (g_rows, g_w)) = jit_mode(sparse_step)(table, w, ids, y)
    loss_ref, (g_table, g_w_ref) = jax.value_and_grad(_embed_loss, argnums=(0, 1))(table, w, ids, y)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-6)
    np.testing.assert_allclose(g_w, g_w_ref, rtol=1e-5, atol=1e-6)
    assert isinstance(g_rows, jsr.RowSparse) and g_rows.shape == (v, d)
    assert g_rows.capacity == n_unique + size_extra
    pulled = jsr.pull_rows(table, ids, size=g_rows.capacity)
    np.testing.assert_array_equal(np.asarray(g_rows.indices), np.asarray(pulled.indices))
    np.testing.assert_allclose(
        np.asarray(g_rows.data), _restrict(g_table, g_rows.indices, v), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        np.asarray(g_rows.todense()), np.asarray(g_table), rtol=1e-5, atol=1e-6
    )


def test_padding_rows_get_zero_gradient_even_if_read():
    """A function that reads padding data directly still gets zero padding grads."""
    rows = jsr.pull_rows(jnp.ones((5, 2)), jnp.array([3]), size=3)
    g = jsr.grad(lambda r: jnp.sum(r.data * 2.0))(rows)
    np.testing.assert_array_equal(np.asarray(g.data), [[2, 2], [0, 0], [0, 0]])
    np.testing.assert_array_equal(np.asarray(g.indices), [3, 5, 5])


def test_csr_batch_gradient(jit_mode, rng):
    """The CSR form of the training step: dot(csr, pull_rows(W, csr.indices))."""
    m, v, p = 4, 30, 3
    dense_x = (rng.standard_normal((m, v)) * (rng.random((m, v)) < 0.15)).astype(np.float32)
    x = jsr.CSR.fromdense(jnp.asarray(dense_x))
    x = jsr.CSR._make(
        jnp.concatenate([x.data, jnp.zeros(2)]),
        jnp.concatenate([x.indices, jnp.full(2, v, x.indices.dtype)]),
        x.indptr,
        x.shape,
    )  # padded capacity, as fixed-shape batches have
    w = jnp.asarray(rng.standard_normal((v, p)).astype(np.float32))
    y = jnp.asarray(rng.standard_normal((m, p)).astype(np.float32))

    def loss(wr, x, y):
        return jnp.sum((jsr.dot(x, wr) - y) ** 2)

    def step(w, x, y):
        return jsr.value_and_grad(loss)(jsr.pull_rows(w, x.indices), x, y)

    val, g = jit_mode(step)(w, x, y)

    def ref_loss(w):  # full precision on every device (a GPU matmul defaults to TF32)
        return jnp.sum((jnp.matmul(jnp.asarray(dense_x), w, precision="highest") - y) ** 2)

    val_ref, g_ref = jax.value_and_grad(ref_loss)(w)
    np.testing.assert_allclose(val, val_ref, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g.todense()), np.asarray(g_ref), rtol=1e-4, atol=1e-5)
    stored = set(np.asarray(g.indices)[np.asarray(g.indices) < v].tolist())
    assert stored == set(np.nonzero(dense_x.any(axis=0))[0].tolist())


def test_two_layer_model_and_pytree_args(jit_mode, rng):
    """A RowSparse nested in a dict, dense layers beside it, has_aux."""
    v, d, h = 40, 5, 3
    params = {
        "emb": jnp.asarray(rng.standard_normal((v, d)).astype(np.float32)),
        "w1": jnp.asarray(rng.standard_normal((d, h)).astype(np.float32)),
        "w2": jnp.asarray(rng.standard_normal((h,)).astype(np.float32)),
    }
    ids = jnp.asarray(rng.integers(0, v, size=(7, 2)).astype(np.int32))
    y = jnp.asarray(rng.standard_normal(7).astype(np.float32))

    def model(p, ids, y):
        hidden = jnp.tanh(jnp.sum(jsr.take(p["emb"], ids), axis=1) @ p["w1"])
        pred = hidden @ p["w2"]
        return jnp.mean((pred - y) ** 2), pred

    def step(params, ids, y):
        sparse_params = dict(params, emb=jsr.pull_rows(params["emb"], ids))
        return jsr.value_and_grad(model, has_aux=True)(sparse_params, ids, y)

    (loss, pred), g = jit_mode(step)(params, ids, y)
    (loss_ref, pred_ref), g_ref = jax.value_and_grad(model, has_aux=True)(params, ids, y)
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-5)
    np.testing.assert_allclose(pred, pred_ref, rtol=1e-5, atol=1e-6)
    assert set(g) == {"emb", "w1", "w2"} and isinstance(g["emb"], jsr.RowSparse)
    for name in ("w1", "w2"):
        np.testing.assert_allclose(g[name], g_ref[name], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g["emb"].todense()), g_ref["emb"], rtol=1e-4, atol=1e-6)


def test_grad_wrapper_and_has_aux(jit_mode):
    rows = jsr.pull_rows(jnp.arange(12.0).reshape(6, 2), jnp.array([1, 4]))
    f = lambda r, s: (jnp.sum(jsr.take(r, jnp.array([4])) * s), "aux")
    g, aux = jsr.grad(f, has_aux=True)(rows, 2.0)
    assert aux == "aux"
    np.testing.assert_array_equal(np.asarray(g.data), [[0, 0], [2, 2]])
    g_both = jit_mode(jsr.grad(lambda r, s: f(r, s)[0], argnums=(0, 1)))(rows, 2.0)
    np.testing.assert_allclose(g_both[1], 8.0 + 9.0)


def test_dense_only_matches_jax(rng):
    f = lambda a, b: jnp.sum(jnp.sin(a) * b)
    a, b = jnp.asarray(rng.standard_normal(3)), jnp.asarray(rng.standard_normal(3))
    for argnums in (0, 1, (0, 1)):
        got = jsr.value_and_grad(f, argnums=argnums)(a, b)
        ref = jax.value_and_grad(f, argnums=argnums)(a, b)
        jax.tree.map(np.testing.assert_array_equal, got, ref)


def test_numeric_gradient_check(rng):
    """Finite differences on the RowSparse data agree with the row-sparse gradient."""
    rows = jsr.pull_rows(jnp.asarray(rng.standard_normal((20, 3))), jnp.array([2, 9, 9, 17]))
    ids = jnp.array([[9, 2], [17, 9]])

    def on_data(data):
        # Finite differences perturb every slot; padding slots must stay zero
        # for the RowSparse to be valid (take refuses it otherwise).
        data = jnp.where(rows.row_mask[:, None], data, 0)
        r = jsr.RowSparse._make(data, rows.indices, rows.shape)
        return jnp.sum(jnp.tanh(jsr.take(r, ids)) ** 2)

    jax.test_util.check_grads(on_data, (rows.data,), order=2, modes=["rev"], atol=1e-2, rtol=1e-2)
    g = jsr.grad(lambda r: on_data(r.data))(rows)
    np.testing.assert_allclose(
        np.asarray(g.data)[:3], np.asarray(jax.grad(on_data)(rows.data))[:3], rtol=1e-6
    )


def test_bad_argnums():
    with pytest.raises(ValueError, match="`argnums` 3 is out of range"):
        jsr.grad(lambda a: jnp.sum(a), argnums=3)(jnp.ones(2))


def _weighted_sq(rows, ids, weights):
    """sum_i weights[i] * rows[ids[i]] ** 2 (over every element of the row)."""
    emb = jsr.take(rows, ids)
    return jnp.sum(emb**2 * weights.reshape(weights.shape + (1,) * (emb.ndim - 1)))


def _weighted_sq_oracle(table, ids, weights):
    """``(value, dense gradient)`` of :func:`_weighted_sq` in float64; ids
    outside ``[0, V)`` read zero rows."""
    table = np.asarray(table, np.float64)
    ids, weights = np.asarray(ids).reshape(-1), np.asarray(weights, np.float64).reshape(-1)
    keep = (ids >= 0) & (ids < table.shape[0])
    ids, w = ids[keep], weights[keep].reshape((-1,) + (1,) * (table.ndim - 1))
    grad = np.zeros_like(table)
    np.add.at(grad, ids, 2 * w * table[ids])
    return np.sum(w * table[ids] ** 2), grad


def _pull_value_and_grad(table, ids, weights, *, size):
    rows = jsr.pull_rows(table, ids, size=size)
    return rows, jsr.value_and_grad(_weighted_sq)(rows, ids, weights)


# V = 0, D = 0, n-d rows, no ids (a capacity-0 view).
GRAD_BUCKETS = [
    (1, (2,), 3, 1),
    (7, (0,), 5, 3),  # D = 0
    (30, (2,), 12, 7),
    (6, (2, 3), 8, 4),  # n-d rows
    (5, (2,), 0, 0),  # no ids: a capacity-0 view
    (0, (2,), 4, 0),  # V = 0: every id is the padding id 0
]


@given(case=bucketed_ids(GRAD_BUCKETS), tight=st.booleans(), seed=st.integers(0, 1000))
def test_gradient_property(jit_mode, case, tight, seed):
    """Ids in [0, V] (V: padding), a view of exactly the distinct ids or of
    ids.size + 2 slots: the value and the row-sparse gradient match numpy."""
    (v, row, n, u), ids = case
    rng = np.random.default_rng(seed)
    ids = np.array(ids, np.int32)
    table = jnp.asarray(rng.standard_normal((v,) + row).astype(np.float32))
    weights = jnp.asarray(rng.standard_normal(n).astype(np.float32))
    size = u if tight else n + 2
    fn = jit_mode(_pull_value_and_grad, static_argnames="size")
    rows, (value, g) = fn(table, jnp.asarray(ids), weights, size=size)
    want_value, want_grad = _weighted_sq_oracle(table, ids, weights)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-5, atol=1e-5)
    assert isinstance(g, jsr.RowSparse) and g.shape == table.shape and g.capacity == size
    np.testing.assert_array_equal(np.asarray(g.indices), np.asarray(rows.indices))
    jsrt.assert_allclose(g, want_grad, rtol=1e-5, atol=1e-5)  # (and g is canonical)


# (table shape, the view's ids, the loss's ids)
EDGES = {
    "unstored_and_padding_reads": ((9, 3), [4, 1, 4, 7], [[1, 4], [7, 4], [9, 2]]),
    "nd_rows": ((9, 2, 3), [0, 8, 0], [0, 8, 5]),
    "scalar_rows": ((9,), [3, 5], [5, 3, 5]),
    "empty_view": ((9, 3), [], [1, 2]),  # capacity 0: every read is zero
    "padding_only_view": ((9, 3), [9, 9], [9, 0]),
    "n0": ((0, 3), [], []),
    "n0_padding_ids": ((0, 3), [0, 0], [0]),  # id N = 0 is the padding id
    "d0": ((9, 0), [2, 5], [2, 2, 5]),
}


@pytest.mark.parametrize(
    "jit_mode,dtype,table_shape,view_ids,loss_ids",
    modes_and_dtypes(EDGES, [jnp.float32, jnp.bfloat16, jnp.float16]),
    indirect=["jit_mode"],
)
def test_value_and_grad_edges_and_dtypes(jit_mode, dtype, table_shape, view_ids, loss_ids):
    """value_and_grad over a view and a dense argument, against numpy in
    float64: the loss reads the view (zero where it stores nothing), so the
    oracle differentiates the table with its unstored rows zeroed."""
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.integers(-8, 8, size=table_shape) / 4, dtype)
    scale = jnp.asarray(rng.integers(1, 4, size=table_shape[1:]) / 2, dtype)
    view_ids = jnp.asarray(view_ids, jnp.int32)
    ids = jnp.asarray(loss_ids, jnp.int32)

    def loss(rows, scale, ids):
        emb = jsr.take(rows, ids, missing="zero")
        return jnp.sum(emb**2 * jnp.broadcast_to(scale, emb.shape))

    def step(table, scale, view_ids, ids):
        rows = jsr.pull_rows(table, view_ids)
        return (
            rows,
            jsr.value_and_grad(loss, argnums=(0, 1))(rows, scale, ids),
            jsr.grad(loss)(rows, scale, ids),
        )

    rows, (value, (g_rows, g_scale)), g_only = jit_mode(step)(table, scale, view_ids, ids)
    seen = np.zeros(table_shape)  # the table as the view holds it
    stored = np.unique(np.asarray(view_ids)[np.asarray(view_ids) < table_shape[0]])
    seen[stored] = np.asarray(table, np.float64)[stored]
    s = np.asarray(scale, np.float64)
    flat = np.asarray(ids).reshape(-1)
    read = np.concatenate([seen, np.zeros((1,) + seen.shape[1:])])[np.minimum(flat, len(seen))]
    want_g_table = np.zeros_like(seen)
    np.add.at(want_g_table, flat[flat < len(seen)], 2 * read[flat < len(seen)] * s)
    rtol, atol = jsrt.tolerance(dtype)
    assert value.dtype == dtype and g_scale.dtype == dtype and g_rows.dtype == dtype
    np.testing.assert_allclose(float(value), np.sum(read**2 * s), rtol=rtol, atol=atol)
    np.testing.assert_allclose(
        np.asarray(g_scale, np.float64), np.sum(read**2, axis=0), rtol=rtol, atol=atol
    )
    assert isinstance(g_rows, jsr.RowSparse) and g_rows.shape == table_shape
    assert g_rows.capacity == rows.capacity == view_ids.size
    np.testing.assert_array_equal(np.asarray(g_rows.indices), np.asarray(rows.indices))
    jsrt.assert_allclose(g_rows, want_g_table)
    # grad (first argument only) agrees with value_and_grad.
    assert isinstance(g_only, jsr.RowSparse) and g_only.dtype == dtype
    np.testing.assert_array_equal(np.asarray(g_only.indices), np.asarray(rows.indices))
    np.testing.assert_array_equal(np.asarray(g_only.data), np.asarray(g_rows.data))


def test_vmap_per_example_row_sparse_gradients(rng):
    """Per-example gradients: vmap over a batch of id sets."""
    table = jnp.asarray(rng.standard_normal((12, 2)).astype(np.float32))
    ids = jnp.array([[1, 5, 1], [7, 7, 0]])

    def per_example(i):
        rows = jsr.pull_rows(table, i)
        return jsr.grad(lambda r: jnp.sum(jsr.take(r, i) ** 2))(rows)

    g = jax.vmap(per_example)(ids)
    for b in range(2):
        g_ref = jax.grad(lambda t, i: jnp.sum(jsr.take(t, i) ** 2))(table, ids[b])
        one = jsr.RowSparse._make(g.data[b], g.indices[b], table.shape)
        np.testing.assert_allclose(np.asarray(one.todense()), np.asarray(g_ref), rtol=1e-6)


@pytest.mark.parametrize("remat", [True, False])
def test_micro_batch_accumulation_through_scan_is_row_sparse_and_exact(remat):
    """The training.md recipe: pull the union of the micro-batches' ids once and
    differentiate the mean loss of a lax.scan over them. The gradient equals
    the dense one, keeps the view's capacity, and builds nothing [V, D]."""
    v, d, m, b = 10**6, 4, 3, 8
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 50, size=(m, b, 2)), jnp.int32)
    ys = jnp.asarray(rng.normal(size=(m, b)), jnp.float32)

    def loss_fn(p, ids, y):
        return jnp.mean((jsr.take(p["emb"], ids).sum(axis=1) @ p["w"] - y) ** 2)

    def mean_loss(view, ids, ys):
        def body(total, batch):
            return total + loss_fn(view, *batch), None

        total, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, 0.0, (ids, ys))
        return total / ids.shape[0]

    def grads_of(table, w):
        view = {"emb": jsr.pull_rows(table, ids), "w": w}
        return jsr.grad(mean_loss)(view, ids, ys)

    small = jnp.asarray(rng.normal(size=(50, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d,)), jnp.float32)
    got = jax.jit(grads_of)(small, w)
    dense = jax.grad(lambda p: sum(loss_fn(p, ids[i], ys[i]) for i in range(m)) / m)(
        {"emb": small, "w": w}
    )
    assert isinstance(got["emb"], jsr.RowSparse) and got["emb"].capacity == ids.size
    np.testing.assert_allclose(np.asarray(got["emb"].todense()), dense["emb"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got["w"]), dense["w"], rtol=1e-5, atol=1e-6)
    # At V = 10**6 nothing in the gradient's program has V rows: nowhere in a
    # nested program (the scan, remat, both forms of the library's kernels).
    table = jax.ShapeDtypeStruct((v, d), jnp.float32)
    settings = [True, False] if jsr.native_kernels_available() else [False]
    for native in settings:
        with kernels_set(native):
            jaxpr = jax.make_jaxpr(lambda t, w: jax.tree.leaves(grads_of(t, w)))(table, w)
        assert big_values(jaxpr, v) == []
        names = primitive_names(jaxpr)
        assert "scan" in names and ("jsr_kernel_call" in names) == native


def test_holomorphic_and_allow_int_pass_through_like_jax_grad():
    table = jnp.ones((10, 2), jnp.complex64) * (1 + 2j)
    ids = jnp.array([5, 5, 2])
    rows = jsr.pull_rows(table, ids)
    f = lambda r: jnp.sum(jsr.take(r, ids) ** 2)  # noqa: E731
    got = jsr.grad(f, holomorphic=True)(rows)
    want = jax.grad(f, holomorphic=True)(table)
    np.testing.assert_allclose(np.asarray(got.todense()), np.asarray(want), rtol=1e-6)
    h = lambda r, n: jnp.sum(jsr.take(r, ids)).real * n  # noqa: E731
    g_rows, g_n = jsr.grad(h, argnums=(0, 1), allow_int=True)(rows, 3)
    assert g_n.dtype == jax.dtypes.float0 and isinstance(g_rows, jsr.RowSparse)
    with pytest.raises(TypeError, match="integer"):
        jsr.grad(h, argnums=1)(rows, 3)


def test_argnums_accepts_numpy_ints_and_refuses_repeats():
    rows = jsr.pull_rows(jnp.ones((6, 2)), jnp.array([1, 4]))
    f = lambda r, w: jnp.sum(jsr.take(r, jnp.array([4])) * w)  # noqa: E731
    g = jsr.grad(f, argnums=np.int64(0))(rows, 2.0)
    assert isinstance(g, jsr.RowSparse)
    np.testing.assert_array_equal(np.asarray(g.data), [[0, 0], [2, 2]])
    with pytest.raises(ValueError, match=r"`argnums` \(0, 0\) names an argument twice"):
        jsr.grad(f, argnums=(0, 0))(rows, 2.0)
    with pytest.raises(ValueError, match="`argnums` must be an int or a sequence of ints"):
        jsr.grad(f, argnums=True)(rows, 2.0)
    with pytest.raises(ValueError, match="out of range"):
        jsr.grad(f, argnums=(0, 2))(rows, 2.0)
