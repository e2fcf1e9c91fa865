"""Row-sparse autodiff: jsr.value_and_grad / jsr.grad against dense jax.grad."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_no_dense_temporaries import _big_values

import jaxsparse_rows as jsr


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
    val_ref, g_ref = jax.value_and_grad(lambda w: jnp.sum((jnp.asarray(dense_x) @ w - y) ** 2))(w)
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


@given(
    v=st.integers(1, 30),
    ids=st.lists(st.integers(0, 29), min_size=1, max_size=12),
    extra=st.integers(0, 4),
    seed=st.integers(0, 1000),
)
def test_gradient_property(v, ids, extra, seed):
    rng = np.random.default_rng(seed)
    ids = jnp.asarray(np.array([i % v for i in ids], np.int32))
    table = jnp.asarray(rng.standard_normal((v, 2)).astype(np.float32))
    size = len(np.unique(np.asarray(ids))) + extra
    weights = jnp.asarray(rng.standard_normal(ids.shape[0]).astype(np.float32))
    loss = lambda t: jnp.sum(jsr.take(t, ids) ** 2 * weights[:, None])

    g = jax.jit(lambda t: jsr.grad(loss)(jsr.pull_rows(t, ids, size=size)))(table)
    g_ref = jax.grad(loss)(table)
    np.testing.assert_allclose(np.asarray(g.todense()), np.asarray(g_ref), rtol=1e-5, atol=1e-6)
    jsr.check(g)


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
    # At V = 10**6 nothing in the gradient's program has V rows.
    table = jax.ShapeDtypeStruct((v, d), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda t, w: jax.tree.leaves(grads_of(t, w)))(table, w)
    assert _big_values(jaxpr, n_rows=v) == []


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
