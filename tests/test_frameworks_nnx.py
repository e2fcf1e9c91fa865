"""flax nnx: a model written as in flax's nnx tutorials (``nnx.Embed``,
``nnx.Linear``, ``nnx.Optimizer``, ``nnx.jit``) trained with a lazy optimizer
by changing the gradient call, the optimizer and the jit's donation only (the
recipe of docs/models.md), against the same model trained with
``nnx.value_and_grad`` and the dense optax rule; the recipe for models that
update state in their forward pass (``nnx.Dropout``, ``nnx.BatchNorm``); no
``[V, ...]`` temporary at V = 10^8; an orbax checkpoint round trip."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from click_batches import B, D, L, V
from click_batches import batches as make_batches
from jaxpr_walk import all_eqns, big_values

import jaxsparse_rows as jsr

nnx = pytest.importorskip(
    "flax.nnx", reason="flax is not installed (it is in the test extra: pip install -e '.[test]')"
)


class ClickModel(nnx.Module):
    """A bag of item ids per example, sum-pooled, a linear head: a click logit."""

    def __init__(self, num_items: int, features: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(num_items, features, rngs=rngs)
        self.linear = nnx.Linear(features, 1, rngs=rngs)

    def __call__(self, ids):
        return self.linear(self.embed(ids).sum(axis=1))[:, 0]


class StatefulModel(nnx.Module):
    """The same with state updated by the forward pass: batch statistics and
    the dropout random stream."""

    def __init__(self, num_items: int, features: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(num_items, features, rngs=rngs)
        self.norm = nnx.BatchNorm(features, rngs=rngs)
        self.dropout = nnx.Dropout(0.5, rngs=rngs)
        self.linear = nnx.Linear(features, 1, rngs=rngs)

    def __call__(self, ids):
        return self.linear(self.dropout(self.norm(self.embed(ids).sum(axis=1))))[:, 0]


def loss_fn(model, ids, y):
    logits = model(ids)
    return optax.sigmoid_binary_cross_entropy(logits, y).mean(), logits


@nnx.jit
def dense_step(model, optimizer, ids, y):
    (loss, _), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, ids, y)
    optimizer.update(model, grads)
    return loss


@nnx.jit(donate_argnums=(0, 1))
def lazy_step(model, optimizer, ids, y):
    (loss, _), grads = jsr.value_and_grad(loss_fn, has_aux=True, sparse="auto")(model, ids, y)
    optimizer.update(model, grads)
    return loss


@nnx.jit(donate_argnums=(0, 1))
def lazy_stateful_step(model, optimizer, ids, y):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def param_loss(params):
        model = nnx.merge(graphdef, params, rest, copy=True)
        loss, _ = loss_fn(model, ids, y)
        return loss, nnx.state(model, nnx.Not(nnx.Param))

    (loss, rest), grads = jsr.value_and_grad(param_loss, has_aux=True, sparse="auto")(params)
    nnx.update(model, rest)
    optimizer.update(model, grads)
    return loss


def _params(model):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _train(model_cls, step, tx, batches):
    model = model_cls(V, D, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    losses = [float(step(model, optimizer, ids, y)) for ids, y in batches]
    return model, optimizer, losses


def _assert_params_close(a, b, rtol=1e-6, atol=1e-7):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def test_the_gradient_is_rowsparse_for_the_table_and_dense_for_the_head():
    model = ClickModel(V, D, rngs=nnx.Rngs(0))
    ids, y = make_batches(1)[0]
    (loss, _), grads = jsr.value_and_grad(loss_fn, has_aux=True, sparse="auto")(model, ids, y)
    (dense_loss, _), dense = nnx.value_and_grad(loss_fn, has_aux=True)(model, ids, y)
    g = grads.embed.embedding.get_value()
    assert isinstance(g, jsr.RowSparse) and g.shape == (V, D) and g.capacity == B * L
    np.testing.assert_array_equal(
        np.asarray(g.indices)[: len(np.unique(ids))], np.unique(np.asarray(ids))
    )
    np.testing.assert_allclose(g.todense(), dense["embed"]["embedding"][...], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads.linear.kernel[...], dense["linear"]["kernel"][...], rtol=1e-6)
    np.testing.assert_allclose(loss, dense_loss, rtol=1e-6)


class TransformedForward(ClickModel):
    """The forward pass inside an nnx transform, which returns the module's
    state (the table among it) from its program."""

    def __init__(self, *args, transform, **kwargs):
        super().__init__(*args, **kwargs)
        self.transform = transform

    def __call__(self, ids):
        forward = self.transform(lambda m, x: m.linear(m.embed(x).sum(axis=1))[:, 0])
        return forward(self, ids)


@pytest.mark.parametrize("transform", ["remat", "jit"])
def test_a_forward_pass_inside_an_nnx_transform_keeps_the_rowsparse_gradient(transform):
    model = TransformedForward(V, D, rngs=nnx.Rngs(0), transform=getattr(nnx, transform))
    ids, y = make_batches(1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grads, _ = jsr.grad(loss_fn, has_aux=True, sparse="auto")(model, ids, y)
    dense, _ = nnx.grad(loss_fn, has_aux=True)(model, ids, y)
    g = grads.embed.embedding.get_value()
    assert isinstance(g, jsr.RowSparse) and g.capacity == B * L
    np.testing.assert_allclose(g.todense(), dense["embed"]["embedding"][...], rtol=1e-6, atol=1e-7)


def test_lazy_sgd_trains_as_optax_sgd():
    batches = make_batches(4)
    lazy, _, lazy_losses = _train(ClickModel, lazy_step, jsr.optim.lazy_sgd(0.1), batches)
    dense, _, dense_losses = _train(ClickModel, dense_step, optax.sgd(0.1), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-6)
    _assert_params_close(_params(lazy), _params(dense))


def test_lazy_adam_trains_as_optax_adam_on_rows_touched_every_step():
    every_step = [1, 5, 6, 17, 30]  # every batch holds these rows and no other
    batches = make_batches(4, every_step)
    lazy, _, lazy_losses = _train(ClickModel, lazy_step, jsr.optim.lazy_adam(0.05), batches)
    dense, _, dense_losses = _train(ClickModel, dense_step, optax.adam(0.05), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-5)
    _assert_params_close(_params(lazy), _params(dense), rtol=1e-5, atol=1e-6)
    start = _params(ClickModel(V, D, rngs=nnx.Rngs(0)))["embed"]["embedding"]
    moved = np.any(_params(lazy)["embed"]["embedding"] != start, axis=1)
    np.testing.assert_array_equal(np.nonzero(moved)[0], every_step)


def test_the_step_donates_the_model_and_optimizer_and_compiles_once():
    model = ClickModel(V, D, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, jsr.optim.lazy_adam(0.05), wrt=nnx.Param)
    step = nnx.jit(lazy_step.fun, donate_argnums=(0, 1))  # a fresh cache for this test
    for ids, y in make_batches(3):
        table = model.embed.embedding.get_value()
        moment = jax.tree.leaves(optimizer.opt_state)[1]
        step(model, optimizer, ids, y)
        assert table.is_deleted(), "the table's buffer was not donated"
        assert moment.is_deleted(), "the optimizer state was not donated"
    assert int(optimizer.step[...]) == 3
    assert step.jitted_fn._cache_size() == 1  # new ids of the same shape compile nothing


def test_a_model_that_updates_state_in_its_forward_pass():
    """Batch statistics and the dropout stream advance as with nnx.value_and_grad."""
    batches = make_batches(3)
    tx = jsr.optim.lazy_sgd(0.1)
    lazy, _, lazy_losses = _train(StatefulModel, lazy_stateful_step, tx, batches)
    dense, _, dense_losses = _train(StatefulModel, dense_step, optax.sgd(0.1), batches)
    np.testing.assert_allclose(lazy_losses, dense_losses, rtol=1e-5)
    for kind in (nnx.Param, nnx.BatchStat, nnx.RngCount):
        _assert_params_close(
            nnx.to_pure_dict(nnx.state(lazy, kind)),
            nnx.to_pure_dict(nnx.state(dense, kind)),
            rtol=1e-5,
            atol=1e-6,
        )


def test_without_the_split_such_a_model_is_refused_not_silently_wrong():
    model = StatefulModel(V, D, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, jsr.optim.lazy_sgd(0.1), wrt=nnx.Param)
    with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
        lazy_step(model, optimizer, *make_batches(1)[0])  # the dropout stream's integer key


# Elementwise work over a whole table: what a dense step does to every row.
WHOLE_TABLE_OPS = {
    "add",
    "add_any",
    "sub",
    "mul",
    "div",
    "sqrt",
    "rsqrt",
    "square",
    "integer_pow",
    "broadcast_in_dim",
    "select_n",
    "copy",
    "copy_p",
}


def _big_writers(step, tx, big):
    abstract = nnx.eval_shape(lambda: ClickModel(big, 16, rngs=nnx.Rngs(0)))
    abstract_opt = nnx.eval_shape(lambda: nnx.Optimizer(abstract, tx, wrt=nnx.Param))
    graphdef, state = nnx.split(abstract)
    opt_graphdef, opt_state = nnx.split(abstract_opt)

    def traced(state, opt_state, ids, y):
        model, optimizer = nnx.merge(graphdef, state), nnx.merge(opt_graphdef, opt_state)
        step.fun(model, optimizer, ids, y)
        return nnx.state(model), nnx.state(optimizer)

    ids = jax.ShapeDtypeStruct((B, L), jnp.int32)
    y = jax.ShapeDtypeStruct((B,), jnp.float32)
    return {name for name, _ in big_values(jax.make_jaxpr(traced)(state, opt_state, ids, y), big)}


def test_no_table_sized_temporary_at_a_hundred_million_rows():
    """Traced at V = 10^8 (never allocated): the gradient holds nothing of V
    rows, and the step writes V rows only where the update scatters rows into
    the (donated) table and moments; the dense step works on every row."""
    big = 10**8
    abstract = nnx.eval_shape(lambda: ClickModel(big, 16, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)

    def grads(state, ids, y):
        model = nnx.merge(graphdef, state)
        return jsr.grad(loss_fn, has_aux=True, sparse="auto")(model, ids, y)[0]

    ids = jax.ShapeDtypeStruct((B, L), jnp.int32)
    y = jax.ShapeDtypeStruct((B,), jnp.float32)
    assert big_values(jax.make_jaxpr(grads)(state, ids, y), big) == []
    assert not _big_writers(lazy_step, jsr.optim.lazy_adam(1e-3), big) & WHOLE_TABLE_OPS
    assert _big_writers(dense_step, optax.adam(1e-3), big) & WHOLE_TABLE_OPS


def test_orbax_round_trip_of_the_model_and_its_lazy_optimizer(tmp_path):
    ocp = pytest.importorskip(
        "orbax.checkpoint",
        reason="orbax-checkpoint is not installed (it is in the test extra)",
    )
    batches = make_batches(4)
    model = ClickModel(V, D, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, jsr.optim.lazy_adam(0.05), wrt=nnx.Param)
    for ids, y in batches[:2]:
        lazy_step(model, optimizer, ids, y)

    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"model": nnx.state(model), "opt": nnx.state(optimizer)})
    checkpointer.wait_until_finished()

    abstract_model = nnx.eval_shape(lambda: ClickModel(V, D, rngs=nnx.Rngs(1)))
    abstract_opt = nnx.eval_shape(
        lambda: nnx.Optimizer(abstract_model, jsr.optim.lazy_adam(0.05), wrt=nnx.Param)
    )
    target = {"model": nnx.state(abstract_model), "opt": nnx.state(abstract_opt)}
    restored = checkpointer.restore(tmp_path / "ckpt", target)
    checkpointer.close()
    model2 = ClickModel(V, D, rngs=nnx.Rngs(1))
    optimizer2 = nnx.Optimizer(model2, jsr.optim.lazy_adam(0.05), wrt=nnx.Param)
    nnx.update(model2, restored["model"])
    nnx.update(optimizer2, restored["opt"])
    _assert_params_close(_params(model2), _params(model), rtol=0, atol=0)

    for ids, y in batches[2:]:  # training goes on as if never interrupted
        lazy_step(model, optimizer, ids, y)
        lazy_step(model2, optimizer2, ids, y)
    _assert_params_close(_params(model2), _params(model), rtol=0, atol=0)
    assert int(optimizer2.step[...]) == 4


def test_a_gradient_model_prints():
    """flax's repr of a module replaces array leaves with placeholders that
    have a shape and a dtype but no ``ndim``; a RowSparse among them prints."""
    model = nnx.Embed(5, 2, rngs=nnx.Rngs(0))
    grads = jsr.grad(lambda m: jnp.sum(m(jnp.array([1, 3]))), sparse="auto")(model)
    assert "RowSparse(float32[5, 2]," in repr(grads)


class MixedPrecisionModel(nnx.Module):
    """A float32 table computed in bfloat16 (``Embed(dtype=...)`` casts the
    table, then looks rows up)."""

    def __init__(self, num_items: int, features: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(
            num_items, features, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=rngs
        )
        self.linear = nnx.Linear(features, 1, rngs=rngs)

    def __call__(self, ids):
        return self.linear(self.embed(ids).astype(jnp.float32).sum(axis=1))[:, 0]


def test_a_bfloat16_embed_over_a_float32_table_gets_a_float32_rowsparse_gradient():
    model = MixedPrecisionModel(V, D, rngs=nnx.Rngs(0))
    ids, y = make_batches(1)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no dense fallback
        grads = jsr.grad(lambda m: loss_fn(m, ids, y)[0], sparse="auto")(model)
    dense = nnx.grad(lambda m: loss_fn(m, ids, y)[0])(model)
    g = grads.embed.embedding.get_value()
    assert isinstance(g, jsr.RowSparse) and g.dtype == jnp.float32 and g.capacity == B * L
    want = dense["embed"]["embedding"][...]
    np.testing.assert_allclose(g.todense(), want, rtol=2e-2, atol=1e-2 * float(abs(want).max()))

    def table_sized(grad):
        jaxpr = jax.make_jaxpr(lambda m: grad(lambda m: loss_fn(m, ids, y)[0])(m))(model)
        return {
            e.primitive.name for e in all_eqns(jaxpr) for o in e.outvars if o.aval.shape == (V, D)
        }

    assert "convert_element_type" in table_sized(nnx.grad)  # the dense path casts the table
    assert table_sized(lambda f: jsr.grad(f, sparse="auto")) == set()
