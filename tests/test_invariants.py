"""A RowSparse whose leaves a generic pytree map rebuilt (repeated, unsorted
or shifted row ids; non-zero padding rows) is refused by every entry point
that consumes one when it is concrete, with the reason ``jsr.check`` gives;
under jit ``jsr.check`` inside ``checkify`` reports it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import checkify

import jaxsparse_rows as jsr

V, D = 5, 2
ORDER = "sorted ascending without duplicates"


def _grads():
    g1 = {"w": jsr.RowSparse(jnp.full((2, D), 0.1), jnp.array([1, 3]), (V, D))}
    g2 = {"w": jsr.RowSparse(jnp.full((2, D), 0.2), jnp.array([0, 3]), (V, D))}
    return g1, g2


def _invalid():
    """What generic maps make of two gradients, with the reason each breaks."""
    g1, g2 = _grads()
    lone = jsr.RowSparse(jnp.full((2, D), 0.1), jnp.array([1, 2]), (V, D))
    return {
        # ids [1, 3, 0, 3]: unsorted and repeated
        "concatenate": (jax.tree.map(lambda a, b: jnp.concatenate([a, b]), g1, g2), ORDER),
        # ids [1, 6]: past the padding id
        "add": (jax.tree.map(jnp.add, g1, g2), "must be <= N = 5"),
        # ids [1, 5]: a padding slot holding 0.2s
        "add_to_padding": (
            jax.tree.map(
                jnp.add,
                {"w": lone},
                {"w": jsr.RowSparse(jnp.full((2, D), 0.1), jnp.array([0, 3]), (V, D))},
            ),
            "padding slots must hold zero",
        ),
        # ids [0, 0]: `optax.tree.zeros_like`
        "zeros_like": (optax.tree.zeros_like(g1), ORDER),
    }


CASES = sorted(_invalid())
OPTIMIZERS = {
    "lazy_sgd": lambda: jsr.optim.lazy_sgd(0.1),
    "lazy_sgd_momentum": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9),
    "lazy_sgd_exact": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, lazy="exact"),
    "lazy_adam": lambda: jsr.optim.lazy_adam(0.1),
    "lazy_adamw": lambda: jsr.optim.lazy_adamw(0.1),
    "lazy_adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "lazy_rowwise_adagrad": lambda: jsr.optim.lazy_rowwise_adagrad(0.1),
    "lazy_ftrl": lambda: jsr.optim.lazy_ftrl(0.1),
    "clip_by_global_norm": lambda: jsr.optim.clip_by_global_norm(1.0),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_refuse_invalid_rowsparse_gradients(name, case):
    g, reason = _invalid()[case]
    params = {"w": jnp.ones((V, D))}
    opt = OPTIMIZERS[name]()
    with pytest.raises(ValueError, match=rf"the update of `params\['w'\]` has .*{reason}"):
        opt.update(g, opt.init(params), params)


@pytest.mark.parametrize("case", CASES)
def test_apply_updates_and_plus_refuse_invalid_rowsparse(case):
    g, reason = _invalid()[case]
    params = {"w": jnp.ones((V, D))}
    with pytest.raises(ValueError, match=rf"the update of `params\['w'\]` has .*{reason}"):
        jsr.optim.apply_updates(params, g)
    for call in (
        lambda: optax.apply_updates(params, g),
        lambda: params["w"] + g["w"],
        lambda: g["w"] + g["w"],
        lambda: jsr.add(g["w"], params["w"]),
        lambda: g["w"].todense(),
        lambda: jsr.sum(g["w"]),
        lambda: jsr.dot(g["w"], jnp.ones((D, 3))),
    ):
        with pytest.raises(ValueError, match=f"has .*{reason}.*jsr.add"):
            call()
    with pytest.raises(ValueError, match=reason):
        jsr.check(g["w"])


def test_the_message_names_the_fix_and_the_ids():
    g, _ = _invalid()["concatenate"]
    with pytest.raises(ValueError) as info:
        jsr.optim.lazy_adam(0.1).update(g, jsr.optim.lazy_adam(0.1).init({"w": jnp.ones((V, D))}))
    text = str(info.value)
    for part in (
        "[1, 3, 0, 3]",
        "unsorted ids 3, 0",
        "jsr.add(g1, g2)",
        "jsr.row_sparse_array",
        "lift_elementwise",
        "checkify",
    ):
        assert part in text, (part, text)


@pytest.mark.parametrize("case", CASES)
def test_under_jit_jsr_check_reports_them_through_checkify(case):
    """Under jit the ids are unknown while tracing; ``jsr.check`` in the
    step, wrapped with ``checkify``, reports what the eager check refuses."""
    g, reason = _invalid()[case]
    params = {"w": jnp.ones((V, D))}
    opt = jsr.optim.lazy_adam(0.1)

    def step(params, state, g):
        jsr.check(g["w"])
        u, state = opt.update(g, state, params)
        return jsr.optim.apply_updates(params, u), state

    err, _ = checkify.checkify(jax.jit(step))(params, opt.init(params), g)
    assert reason.split(" = ")[0] in err.get()
    good = jsr.add(*[x["w"] for x in _grads()])
    err, _ = checkify.checkify(jax.jit(step))(params, opt.init(params), {"w": good})
    assert err.get() is None


def test_jsr_add_is_the_sum_of_two_gradients():
    """The supported way to add two row-sparse gradients: the union of their
    rows, repeats summed, eagerly and under jit, and a valid RowSparse that
    every optimizer takes."""
    g1, g2 = _grads()
    want = np.asarray(g1["w"].todense()) + np.asarray(g2["w"].todense())
    for fn in (jsr.add, jax.jit(jsr.add)):
        total = fn(g1["w"], g2["w"])
        assert isinstance(total, jsr.RowSparse)
        jsr.check(total)
        np.testing.assert_allclose(np.asarray(total.todense()), want, rtol=1e-6)
    summed = jax.tree.map(jsr.add, g1, g2, is_leaf=jsr.is_sparse)
    params = {"w": jnp.ones((V, D))}
    opt = jsr.optim.lazy_adam(0.1)
    u, _ = opt.update(summed, opt.init(params), params)
    ref = optax.adam(0.1)
    du, _ = ref.update({"w": jnp.asarray(want)}, ref.init(params), params)
    touched = np.any(want != 0, axis=1)
    np.testing.assert_allclose(
        np.asarray(u["w"].todense())[touched], np.asarray(du["w"])[touched], rtol=1e-5
    )


def test_optax_schedule_scaling_of_the_ids_is_refused_when_consumed():
    """``optax.scale_by_learning_rate`` with a schedule casts the step size to
    each leaf's dtype, so the int row ids are multiplied by int(-0.5) = 0:
    integer arithmetic on the ids that no type check can see. Eagerly the
    optimizer or ``apply_updates`` that consumes the result refuses the
    repeated ids; ``jsr.optim.scale_by_learning_rate`` keeps them."""
    g = jsr.RowSparse(jnp.ones((2, D)), jnp.array([1, 3]), (V, D))
    p = jnp.zeros((V, D))
    tx = optax.scale_by_learning_rate(optax.constant_schedule(0.5))
    u, _ = tx.update(g, tx.init(p))
    assert u.indices.tolist() == [0, 0]  # what optax's map does to them
    with pytest.raises(ValueError, match="has invalid row ids.*scale_by_learning_rate|lift"):
        jsr.optim.apply_updates(p, u)
    good = jsr.optim.scale_by_learning_rate(optax.constant_schedule(0.5))
    for fn in (good.update, jax.jit(good.update)):
        u, _ = fn(g, good.init(p))
        assert u.indices.tolist() == [1, 3]
        np.testing.assert_allclose(np.asarray(u.data), -0.5)


def test_float_ids_from_a_generic_map_are_refused_at_unflatten():
    """A map that turns the ids into floats (``optax.scale``, a dtype cast of
    the whole tree) cannot build a RowSparse: TypeError naming the
    replacements, eagerly and under jit."""
    g = jsr.RowSparse(jnp.ones((2, D)), jnp.array([1, 3]), (V, D))
    for fn in (lambda t: t, jax.jit):
        with pytest.raises(TypeError, match="must stay integer.*scale_by_learning_rate"):
            fn(lambda g: jax.tree.map(lambda x: x * 0.5, g))(g)
        with pytest.raises(TypeError, match="must stay integer.*lift_elementwise"):
            fn(lambda g: jax.tree.map(lambda x: x.astype(jnp.float32), g))(g)


def test_global_norm_of_jsr_counts_values_not_ids():
    """``optax.tree.norm`` (``optax.global_norm``) would sum the squares of
    every leaf, the row ids included, so it is refused; ``jsr.optim.global_norm``
    counts the stored values only."""
    g = {"emb": jsr.RowSparse(jnp.full((2, D), 1.0), jnp.array([100, 300]), (400, D))}
    assert float(jsr.optim.global_norm(g)) == pytest.approx(2.0)
    assert float(jax.jit(jsr.optim.global_norm)(g)) == pytest.approx(2.0)
    for norm in (optax.tree.norm, jax.jit(optax.tree.norm)):
        with pytest.raises(TypeError, match="jsr.optim.global_norm"):
            norm(g)
