"""flax linen: ``model.apply`` with ``nn.Embed`` inside a
``flax.training.train_state.TrainState`` loop, trained with a lazy optimizer by
changing the gradient call, the optimizer and the jit's donation only (the
recipe of docs/models.md), against the same loop with ``jax.value_and_grad``
and the dense optax rule; no ``[V, ...]`` temporary at V = 10^8."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click_batches import B, D, L, V
from click_batches import batches as make_batches
from jaxpr_walk import big_values

import jaxsparse_rows as jsr

nn = pytest.importorskip(
    "flax.linen", reason="flax is not installed (it is in the test extra: pip install -e '.[test]')"
)
from flax.training import train_state  # noqa: E402


class ClickModel(nn.Module):
    num_items: int
    features: int

    @nn.compact
    def __call__(self, ids):
        pooled = nn.Embed(self.num_items, self.features)(ids).sum(axis=1)
        return nn.Dense(1)(pooled)[:, 0]


def _loss(state, params, ids, y):
    logits = state.apply_fn({"params": params}, ids)
    return optax.sigmoid_binary_cross_entropy(logits, y).mean()


def make_step(value_and_grad):
    def train_step(state, ids, y):
        loss, grads = value_and_grad(lambda params: _loss(state, params, ids, y))(state.params)
        return state.apply_gradients(grads=grads), loss

    return train_step


dense_step = jax.jit(make_step(jax.value_and_grad))
lazy_step = jax.jit(make_step(lambda f: jsr.value_and_grad(f, sparse="auto")), donate_argnums=0)


def _state(tx, num_items=V):
    model = ClickModel(num_items, D)
    params = model.init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def _train(step, tx, batches):
    state, losses = _state(tx), []
    for ids, y in batches:
        state, loss = step(state, ids, y)
        losses.append(float(loss))
    return jax.tree.map(np.asarray, state.params), losses, state


def _assert_close(a, b, rtol, atol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_the_gradient_is_rowsparse_for_the_embedding_only():
    state = _state(optax.sgd(0.1))
    ids, y = make_batches(1)[0]
    grads = jsr.grad(lambda p: _loss(state, p, ids, y), sparse="auto")(state.params)
    dense = jax.grad(lambda p: _loss(state, p, ids, y))(state.params)
    g = grads["Embed_0"]["embedding"]
    assert isinstance(g, jsr.RowSparse) and g.capacity == B * L
    np.testing.assert_allclose(g.todense(), dense["Embed_0"]["embedding"], rtol=1e-6, atol=1e-7)
    assert not isinstance(grads["Dense_0"]["kernel"], jsr.RowSparse)
    np.testing.assert_allclose(grads["Dense_0"]["kernel"], dense["Dense_0"]["kernel"], rtol=1e-6)


def test_lazy_sgd_trains_as_optax_sgd():
    batches = make_batches(4)
    lazy, lazy_losses, _ = _train(lazy_step, jsr.optim.lazy_sgd(0.1), batches)
    dense, dense_losses, _ = _train(dense_step, optax.sgd(0.1), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-6)
    _assert_close(lazy, dense, rtol=1e-6, atol=1e-7)


def test_lazy_adam_trains_as_optax_adam_on_rows_touched_every_step():
    every_step = [0, 3, 8, 21, 39]
    batches = make_batches(4, every_step)
    lazy, lazy_losses, state = _train(lazy_step, jsr.optim.lazy_adam(0.05), batches)
    dense, dense_losses, _ = _train(dense_step, optax.adam(0.05), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-5)
    _assert_close(lazy, dense, rtol=1e-5, atol=1e-6)
    start = np.asarray(_state(optax.sgd(0.1)).params["Embed_0"]["embedding"])
    moved = np.any(lazy["Embed_0"]["embedding"] != start, axis=1)
    np.testing.assert_array_equal(np.nonzero(moved)[0], every_step)
    assert int(state.step) == 4


def test_the_step_donates_the_state_and_compiles_once():
    state = _state(jsr.optim.lazy_adam(0.05))
    step = jax.jit(make_step(lambda f: jsr.value_and_grad(f, sparse="auto")), donate_argnums=0)
    compiled = []
    for ids, y in make_batches(3):
        table, moments = state.params["Embed_0"]["embedding"], jax.tree.leaves(state.opt_state)
        state, _ = step(state, ids, y)
        assert table.is_deleted() and all(m.is_deleted() for m in moments)
        compiled.append(step._cache_size())
    # TrainState.create starts `step` as a Python int, later steps hold an array:
    # the second call compiles once more, the third nothing.
    assert compiled[1:] == [2, 2]


def test_no_table_sized_temporary_at_a_hundred_million_rows():
    big = 10**8
    abstract = jax.eval_shape(lambda: _state(optax.sgd(0.1), num_items=big))
    ids = jax.ShapeDtypeStruct((B, L), jnp.int32)
    y = jax.ShapeDtypeStruct((B,), jnp.float32)

    def grads(params, ids, y):
        return jsr.grad(lambda p: _loss(abstract, p, ids, y), sparse="auto")(params)

    jaxpr = jax.make_jaxpr(grads)(abstract.params, ids, y)
    assert big_values(jaxpr, big) == []
    dense = jax.grad(lambda p, ids, y: _loss(abstract, p, ids, y))
    assert big_values(jax.make_jaxpr(dense)(abstract.params, ids, y), big)
