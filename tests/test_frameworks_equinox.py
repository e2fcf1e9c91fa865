"""equinox: a model with ``eqx.nn.Embedding`` trained as in equinox's
tutorials (``eqx.filter_jit``, an optax optimizer) with a lazy optimizer:
``eqx.partition`` the model, ``jsr.value_and_grad(..., sparse="auto")`` on its
parameters, ``eqx.combine`` after the update (the recipe of docs/models.md),
against the same loop with ``eqx.filter_value_and_grad`` and the dense optax
rule; no ``[V, ...]`` temporary at V = 10^8."""

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

eqx = pytest.importorskip(
    "equinox", reason="equinox is not installed (it is in the test extra: pip install -e '.[test]')"
)


class ClickModel(eqx.Module):
    embed: eqx.nn.Embedding
    head: eqx.nn.MLP

    def __init__(self, num_items, features, key):
        k_embed, k_head = jax.random.split(key)
        self.embed = eqx.nn.Embedding(num_items, features, key=k_embed)
        self.head = eqx.nn.MLP(features, "scalar", width_size=8, depth=1, key=k_head)

    def __call__(self, ids):  # one example's ids [L]
        return self.head(jax.vmap(self.embed)(ids).sum(axis=0))


def loss(model, ids, y):
    logits = jax.vmap(model)(ids)
    return optax.sigmoid_binary_cross_entropy(logits, y).mean()


def make_dense_step(optim):
    @eqx.filter_jit
    def make_step(model, opt_state, ids, y):
        loss_value, grads = eqx.filter_value_and_grad(loss)(model, ids, y)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return model, opt_state, loss_value

    return make_step


def make_lazy_step(optim):
    @eqx.filter_jit(donate="all")
    def make_step(model, opt_state, ids, y):
        params, static = eqx.partition(model, eqx.is_inexact_array)
        param_loss = lambda params, ids, y: loss(eqx.combine(params, static), ids, y)
        loss_value, grads = jsr.value_and_grad(param_loss, sparse="auto")(params, ids, y)
        updates, opt_state = optim.update(grads, opt_state, params)
        model = eqx.combine(optax.apply_updates(params, updates), static)
        return model, opt_state, loss_value

    return make_step


def _train(make, optim, batches):
    model = ClickModel(V, D, jax.random.key(0))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    step, losses = make(optim), []
    for ids, y in batches:
        model, opt_state, loss_value = step(model, opt_state, ids, y)
        losses.append(float(loss_value))
    return model, losses


def _arrays(model):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(model, eqx.is_array))]


def _assert_close(a, b, rtol, atol):
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def test_the_gradient_is_rowsparse_for_the_embedding_only():
    model = ClickModel(V, D, jax.random.key(0))
    ids, y = make_batches(1)[0]
    params, static = eqx.partition(model, eqx.is_inexact_array)
    grads = jsr.grad(lambda p: loss(eqx.combine(p, static), ids, y), sparse="auto")(params)
    dense = eqx.filter_grad(loss)(model, ids, y)
    g = grads.embed.weight
    assert isinstance(g, jsr.RowSparse) and g.capacity == B * L
    np.testing.assert_allclose(g.todense(), dense.embed.weight, rtol=1e-6, atol=1e-7)
    for got, want in zip(jax.tree.leaves(grads.head), jax.tree.leaves(dense.head), strict=True):
        assert not isinstance(got, jsr.RowSparse)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_lazy_sgd_trains_as_optax_sgd():
    batches = make_batches(4)
    lazy, lazy_losses = _train(make_lazy_step, jsr.optim.lazy_sgd(0.1), batches)
    dense, dense_losses = _train(make_dense_step, optax.sgd(0.1), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-6)
    _assert_close(lazy, dense, rtol=1e-6, atol=1e-7)


def test_lazy_adam_trains_as_optax_adam_on_rows_touched_every_step():
    every_step = [2, 4, 9, 10, 33]
    batches = make_batches(4, every_step)
    lazy, lazy_losses = _train(make_lazy_step, jsr.optim.lazy_adam(0.05), batches)
    dense, dense_losses = _train(make_dense_step, optax.adam(0.05), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-5)
    _assert_close(lazy, dense, rtol=1e-5, atol=1e-6)
    start = ClickModel(V, D, jax.random.key(0)).embed.weight
    moved = np.any(np.asarray(lazy.embed.weight != start), axis=1)
    np.testing.assert_array_equal(np.nonzero(moved)[0], every_step)


def test_the_step_donates_the_model_and_state():
    optim = jsr.optim.lazy_adam(0.05)
    model = ClickModel(V, D, jax.random.key(0))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    step = make_lazy_step(optim)
    for ids, y in make_batches(2):
        table, moments = model.embed.weight, jax.tree.leaves(opt_state)
        model, opt_state, _ = step(model, opt_state, ids, y)
        assert table.is_deleted() and all(m.is_deleted() for m in moments)


def test_no_table_sized_temporary_at_a_hundred_million_rows():
    big = 10**8
    abstract = eqx.filter_eval_shape(ClickModel, big, 16, jax.random.key(0))
    params, static = eqx.partition(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    ids = jax.ShapeDtypeStruct((B, L), jnp.int32)
    y = jax.ShapeDtypeStruct((B,), jnp.float32)

    def grads(params, ids, y):
        return jsr.grad(lambda p: loss(eqx.combine(p, static), ids, y), sparse="auto")(params)

    assert big_values(jax.make_jaxpr(grads)(params, ids, y), big) == []
    dense = jax.grad(lambda p, ids, y: loss(eqx.combine(p, static), ids, y))
    assert big_values(jax.make_jaxpr(dense)(params, ids, y), big)
