"""Composition with optax.chain / multi_transform, the RowSparse-safe
transforms, mixed dense/RowSparse gradient trees and bad-input errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import grad_sequence, random_rows, run_steps

import jaxsparse_rows as jsr


def _model(seed=40):
    rng = np.random.default_rng(seed)
    params = {
        "emb": jnp.asarray(rng.normal(size=(12, 4)), jnp.float32),
        "dense": {
            "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            "b": jnp.zeros(3, jnp.float32),
        },
    }
    grads = []
    for g, dense, _ in grad_sequence(seed + 1, 15, 12, (4,), capacity=4):
        dg = {
            "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=3), jnp.float32),
        }
        grads.append(
            ({"emb": g, "dense": dg}, {"emb": jnp.asarray(dense, jnp.float32), "dense": dg})
        )
    return params, grads


def test_mixed_tree_dense_leaves_follow_optax_adam(jit_mode):
    params, grads = _model()
    ours = jsr.optim.lazy_adam(0.01)
    ref = optax.adam(0.01)
    p1, _ = run_steps(ours, params, [g for g, _ in grads], jit=True)
    p2, _ = run_steps(ref, params, [d for _, d in grads], jit=True, apply=optax.apply_updates)
    np.testing.assert_allclose(
        np.asarray(p1["dense"]["w"]), np.asarray(p2["dense"]["w"]), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(
        np.asarray(p1["dense"]["b"]), np.asarray(p2["dense"]["b"]), rtol=1e-6, atol=1e-7
    )


def test_multi_transform_lazy_adam_for_embedding():
    params, grads = _model(50)
    labels = {"emb": "sparse", "dense": {"w": "dense", "b": "dense"}}
    opt = optax.multi_transform(
        {"sparse": jsr.optim.lazy_adam(0.02), "dense": optax.adam(0.01)}, labels
    )
    p1, _ = run_steps(opt, params, [g for g, _ in grads], jit=True)
    # Reference: the two optimizers run separately on their own subtrees.
    pe, _ = run_steps(
        jsr.optim.lazy_adam(0.02), params["emb"], [g["emb"] for g, _ in grads], jit=True
    )
    pd, _ = run_steps(
        optax.adam(0.01),
        params["dense"],
        [g["dense"] for g, _ in grads],
        jit=True,
        apply=optax.apply_updates,
    )
    np.testing.assert_array_equal(np.asarray(p1["emb"]), np.asarray(pe))
    np.testing.assert_allclose(np.asarray(p1["dense"]["w"]), np.asarray(pd["w"]), rtol=1e-6)


def test_chain_clip_then_lazy_sgd_matches_dense_clip():
    params, grads = _model(60)
    opt = optax.chain(jsr.optim.clip_by_global_norm(1.0), jsr.optim.lazy_sgd(0.1))
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
    p1, _ = run_steps(opt, params, [g for g, _ in grads], jit=True)
    p2, _ = run_steps(ref, params, [d for _, d in grads], jit=True, apply=optax.apply_updates)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_clip_by_global_norm_ignores_padding_and_keeps_indices(jit_mode):
    g = jsr.RowSparse._make(
        jnp.asarray([[3.0, 4.0], [0.0, 0.0]]), jnp.asarray([1, 5], jnp.int32), (5, 2)
    )
    tx = jsr.optim.clip_by_global_norm(2.5)
    u, _ = jit_mode(tx.update)({"a": g, "b": jnp.zeros(2)}, tx.init(None))
    np.testing.assert_allclose(np.asarray(u["a"].data), [[1.5, 2.0], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(u["a"].indices), [1, 5])


@pytest.mark.parametrize("plain", [optax.scale(-1.0), optax.clip(0.5)])
def test_plain_optax_elementwise_transforms_are_refused_and_lifted_work(jit_mode, plain):
    """optax maps these over every leaf, row ids included (which became float
    fractions before); unflattening now refuses non-integer ids, naming the fix."""
    g = jsr.RowSparse([[1.0, 2.0]], [2], shape=(4, 2))
    with pytest.raises(TypeError, match="RowSparse `indices` must stay integer.*lift_elementwise"):
        jit_mode(plain.update)(g, plain.init(None))
    tx = jsr.optim.lift_elementwise(plain)
    u, _ = jit_mode(tx.update)(g, tx.init(jnp.zeros((4, 2))))
    assert u.indices.tolist() == [2]
    np.testing.assert_array_equal(np.asarray(u.data), plain.update(g.data, None)[0])


def test_lift_elementwise_decayed_weights_is_lazy(jit_mode):
    rng = np.random.default_rng(70)
    g, dense, rows = random_rows(rng, 6, (2,), capacity=4, k=2)
    w = jnp.asarray(rng.normal(size=(6, 2)), jnp.float32)
    tx = jsr.optim.lift_elementwise(optax.add_decayed_weights(0.5))
    u, _ = jit_mode(tx.update)(g, tx.init(w), w)
    expected = np.zeros((6, 2))
    expected[rows] = dense[rows] + 0.5 * np.asarray(w)[rows]
    np.testing.assert_allclose(u.asnumpy(), expected, rtol=1e-6)
    assert np.all(np.asarray(u.data)[2:] == 0)  # padding stays zero
    ours = jsr.optim.add_decayed_weights(0.5)
    u2, _ = ours.update(g, ours.init(w), w)
    np.testing.assert_allclose(u2.asnumpy(), expected, rtol=1e-6)


def test_lift_elementwise_rejects_stateful_transform():
    with pytest.raises(TypeError, match="lift_elementwise"):
        jsr.optim.lift_elementwise(optax.trace(0.9)).init(jnp.zeros((3, 2)))


def test_schedule_transform_lifted():
    tx = jsr.optim.lift_elementwise(optax.scale_by_schedule(lambda c: 2.0 * (c + 1)))
    g = jsr.RowSparse([[1.0]], [0], shape=(2, 1))
    s = tx.init(jnp.zeros((2, 1)))
    u, s = tx.update(g, s)
    u, s = tx.update(g, s)
    np.testing.assert_array_equal(np.asarray(u.data), [[4.0]])


def test_param_with_sometimes_dense_grads():
    # Both paths update the same state arrays.
    w = jnp.zeros((3, 2))
    opt = jsr.optim.lazy_adam(0.1)
    s = opt.init(w)
    u, s = opt.update(jsr.RowSparse([[1.0, 1.0]], [0], shape=(3, 2)), s, w)
    w = jsr.optim.apply_updates(w, u)
    u, s = opt.update(jnp.ones((3, 2)), s, w)
    w = jsr.optim.apply_updates(w, u)
    assert int(s[0].count) == 2
    mu = np.asarray(s[0].mu)[:, 0]
    np.testing.assert_allclose(mu, [0.19, 0.1, 0.1], rtol=1e-6)


OPTS = {
    "sgd": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, weight_decay=0.1),
    "adam": lambda: jsr.optim.lazy_adam(0.1),
    "adamw": lambda: jsr.optim.lazy_adamw(0.1),
    "adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "rowwise": lambda: jsr.optim.lazy_rowwise_adagrad(0.1),
    "ftrl": lambda: jsr.optim.lazy_ftrl(0.1),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_rowsparse_shape_mismatch_names_path(name):
    opt = OPTS[name]()
    params = {"layers": [{"emb": jnp.zeros((5, 3))}]}
    grads = {"layers": [{"emb": jsr.RowSparse([[1.0, 1.0, 1.0]], [0], shape=(6, 3))}]}
    with pytest.raises(ValueError, match=r"params\['layers'\]\[0\]\['emb'\].*\(6, 3\).*\(5, 3\)"):
        opt.update(grads, opt.init(params), params)


@pytest.mark.parametrize("name", sorted(OPTS))
def test_dense_shape_mismatch_names_path(name):
    opt = OPTS[name]()
    params = {"w": jnp.zeros((4, 2)), "b": jnp.zeros(2)}
    grads = {"w": jnp.zeros((4, 2)), "b": jnp.zeros(3)}
    with pytest.raises(ValueError, match=r"params\['b'\].*dense.*\(3,\).*\(2,\)"):
        opt.update(grads, opt.init(params), params)


def test_rowsparse_params_rejected():
    p = jsr.RowSparse([[1.0]], [0], shape=(2, 1))
    with pytest.raises(TypeError, match="RowSparse parameter"):
        jsr.optim.lazy_adam(0.1).init({"emb": p})


@pytest.mark.parametrize("jit", [False, True])
def test_rowsparse_params_rejected_by_update_and_apply_updates(jit):
    """Updates applied to a `pull_rows` view leave a RowSparse parameter;
    `apply_updates` then mapped over its data *and row ids* (doubling the ids)."""
    w = jnp.ones((5, 2))
    view = jsr.pull_rows(w, jnp.array([1, 3]))
    u = jsr.RowSparse([[1.0, 1.0]], [1], shape=(5, 2))
    apply = jax.jit(jsr.optim.apply_updates) if jit else jsr.optim.apply_updates
    with pytest.raises(TypeError, match=r"`params\['emb'\]` is a RowSparse.*pull_rows. view"):
        apply({"emb": view}, {"emb": u})
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.9, weight_decay=0.1)
    update = jax.jit(opt.update) if jit else opt.update
    with pytest.raises(TypeError, match=r"`params\['emb'\]` is a RowSparse"):
        update({"emb": u}, opt.init({"emb": w}), {"emb": view})


@pytest.mark.parametrize("name", sorted(OPTS))
def test_float0_row_ids_from_jax_grad_are_refused(name):
    """`jax.grad(..., allow_int=True)` of a view gives a RowSparse whose row
    ids are float0; the optimizers failed on it with an indexing error."""
    w = jnp.ones((5, 2))
    ids = jnp.array([1, 3])
    g = jax.grad(lambda v: jnp.sum(jsr.take(v, ids) ** 2), allow_int=True)(jsr.pull_rows(w, ids))
    assert g.indices.dtype == jax.dtypes.float0
    opt = OPTS[name]()
    with pytest.raises(TypeError, match=r"`params\['emb'\]`.*float0.*jsr\.grad"):
        opt.update({"emb": g}, opt.init({"emb": w}), {"emb": w})


def test_nonfinite_gradient_rows_stay_local():
    # Documented behaviour: NaN in a listed row poisons that row (weights and
    # state) only; other rows are untouched.
    w = jnp.ones((4, 2))
    opt = jsr.optim.lazy_adam(0.1)
    g = jsr.RowSparse([[np.nan, 1.0], [1.0, 1.0]], [1, 2], shape=(4, 2))
    u, s = opt.update(g, opt.init(w), w)
    w2 = np.asarray(jsr.optim.apply_updates(w, u))
    assert np.isnan(w2[1, 0]) and np.all(np.isfinite(w2[[0, 2, 3]]))
    assert np.all(np.isfinite(np.asarray(s[0].mu)[[0, 2, 3]]))


def test_skip_nonfinite_skips_whole_step(jit_mode):
    w = jnp.ones((4, 2))
    opt = jsr.optim.skip_nonfinite(jsr.optim.lazy_adam(0.1))
    state = opt.init(w)
    good = jsr.RowSparse([[1.0, 1.0]], [0], shape=(4, 2))
    bad = jsr.RowSparse([[1.0, np.inf]], [2], shape=(4, 2))

    def step(w, s, g):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    step = jit_mode(step)
    w1, s1 = step(w, state, good)
    w2, s2 = step(w1, s1, bad)
    np.testing.assert_array_equal(np.asarray(w2), np.asarray(w1))
    assert int(s2.skipped) == 1 and int(s2.inner_state[0].count) == 1
    for a, b in zip(jax.tree.leaves(s1.inner_state), jax.tree.leaves(s2.inner_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    w3, s3 = step(w2, s2, good)
    assert int(s3.inner_state[0].count) == 2 and int(s3.skipped) == 1
    assert not np.array_equal(np.asarray(w3), np.asarray(w2))


def test_skip_nonfinite_ignores_padding_slots():
    # A NaN in a padding slot is not a gradient value: nothing is skipped.
    g = jsr.RowSparse._make(jnp.asarray([[1.0], [np.nan]]), jnp.asarray([0, 3], jnp.int32), (3, 1))
    opt = jsr.optim.skip_nonfinite(jsr.optim.lazy_sgd(1.0))
    w = jnp.zeros((3, 1))
    u, s = opt.update(g, opt.init(w), w)
    assert int(s.skipped) == 0
    np.testing.assert_array_equal(np.asarray(jsr.optim.apply_updates(w, u))[:, 0], [-1, 0, 0])


@pytest.mark.parametrize("name", sorted(OPTS))
def test_zero_capacity_gradient_changes_no_row(name, jit_mode):
    opt = OPTS[name]()
    w = jnp.asarray(np.random.default_rng(90).normal(size=(5, 2)), jnp.float32)
    g = jsr.RowSparse(jnp.zeros((0, 2)), jnp.zeros((0,), jnp.int32), shape=(5, 2))
    u, _ = jit_mode(opt.update)(g, opt.init(w), w)
    assert isinstance(u, jsr.RowSparse) and u.capacity == 0
    np.testing.assert_array_equal(np.asarray(jsr.optim.apply_updates(w, u)), np.asarray(w))


@pytest.mark.parametrize(
    "factory,kwargs",
    [
        (jsr.optim.lazy_sgd, {"momentum": 0.9}),
        (jsr.optim.lazy_sgd, {"momentum": 0.0}),
        (jsr.optim.lazy_sgd, {"momentum": 0.5, "nesterov": True, "weight_decay": 0.1}),
        (jsr.optim.lazy_sgd, {"rescale_grad": 0.5, "clip_gradient": 0.3}),
        (jsr.optim.lazy_adam, {}),
        (jsr.optim.lazy_adamw, {"weight_decay": 0.1}),
        (jsr.optim.lazy_adagrad, {}),
        (jsr.optim.lazy_rowwise_adagrad, {"weight_decay": 0.1}),
        (jsr.optim.lazy_ftrl, {}),
    ],
)
def test_inject_hyperparams_under_jit_matches_the_plain_optimizer(factory, kwargs):
    """optax.inject_hyperparams makes float arguments traced arrays under jit;
    rules that branched on `x != 0` raised TracerBoolConversionError."""
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.normal(size=(6, 2)), jnp.float32)
    injected = optax.inject_hyperparams(factory)(learning_rate=0.1, **kwargs)
    plain = factory(0.1, **kwargs)
    wi, si, wp, sp = w, injected.init(w), w, plain.init(w)
    step_i, step_p = jax.jit(injected.update), jax.jit(plain.update)
    for g, _, _ in grad_sequence(4, 3, 6, (2,), capacity=3):
        ui, si = step_i(g, si, wi)
        up, sp = step_p(g, sp, wp)
        wi, wp = jsr.optim.apply_updates(wi, ui), jsr.optim.apply_updates(wp, up)
    np.testing.assert_allclose(np.asarray(wi), np.asarray(wp), rtol=1e-5, atol=1e-6)


def test_exact_sgd_under_injected_traced_hyperparams_says_to_make_them_static():
    opt = optax.inject_hyperparams(jsr.optim.lazy_sgd, static_args=("lazy",))(
        learning_rate=0.1, momentum=0.5, lazy="exact"
    )
    w = jnp.ones((3, 1))
    g = jsr.RowSparse([[1.0]], [1], shape=(3, 1))
    with pytest.raises(TypeError, match="needs a static `learning_rate`.*static_args"):
        jax.jit(opt.update)(g, opt.init(w), w)


def test_global_norm_counts_real_rows_not_row_ids(jit_mode):
    g = {
        "emb": jsr.RowSparse._make(
            jnp.asarray([[3.0, 4.0], [7.0, 7.0]]), jnp.asarray([1, 5]), (5, 2)
        ),
        "b": jnp.asarray([0.0, 12.0]),
        "none": None,
    }
    assert float(jit_mode(jsr.optim.global_norm)(g)) == pytest.approx(13.0)
    assert float(optax.tree.norm(g)) != pytest.approx(13.0)  # why it exists
    with jax.enable_x64(True):
        mixed = {"a": jnp.ones(2, jnp.float64), "c": jnp.asarray([3 + 4j], jnp.complex64)}
        norm = jit_mode(jsr.optim.global_norm)(mixed)
        assert norm.dtype == jnp.float64 and float(norm) == pytest.approx(np.sqrt(27.0))
    assert float(jsr.optim.global_norm({})) == 0.0


@pytest.mark.parametrize("kind", ["masked", "multi_transform"])
def test_callable_masks_and_labels_written_with_is_leaf_is_sparse(kind, jit_mode):
    """optax calls a callable mask or label fn on the updates too: with
    `is_leaf=jsr.is_sparse` it sees one leaf per RowSparse, as documented."""
    w = {"emb": jnp.ones((4, 2)), "b": jnp.ones(2)}
    g = {"emb": jsr.RowSparse([[1.0, 1.0]], [1], shape=(4, 2)), "b": jnp.ones(2)}
    is_table = lambda t: jax.tree.map(lambda x: x.ndim > 1, t, is_leaf=jsr.is_sparse)  # noqa: E731
    if kind == "masked":
        opt = optax.masked(jsr.optim.lazy_sgd(0.5), is_table)
    else:
        labels = lambda t: jax.tree.map(lambda m: "t" if m else "d", is_table(t))  # noqa: E731
        opt = optax.multi_transform({"t": jsr.optim.lazy_sgd(0.5), "d": optax.sgd(0.25)}, labels)
    u, _ = jit_mode(opt.update)(g, opt.init(w), w)
    np.testing.assert_array_equal(np.asarray(jsr.todense(u["emb"]))[1], [-0.5, -0.5])
    np.testing.assert_array_equal(np.asarray(u["b"]), [1.0, 1.0] if kind == "masked" else -0.25)


def test_global_norm_and_clip_widen_before_squaring():
    """float16 squares overflow at 256 and int32's at 46341: the norm was inf
    and clip_by_global_norm zeroed the update."""
    half = {"a": jnp.array([300.0, 4.0], jnp.float16)}
    assert float(jsr.optim.global_norm(half)) == pytest.approx(np.hypot(300, 4), rel=1e-6)
    assert float(jsr.optim.global_norm({"a": jnp.array([100000], jnp.int32)})) == 100000.0
    tx = jsr.optim.clip_by_global_norm(1000.0)
    u, _ = tx.update(half, tx.init(None))
    np.testing.assert_array_equal(np.asarray(u["a"]), [300.0, 4.0])


def test_exact_sgd_under_inject_hyperparams_with_the_documented_static_args():
    """optimizers.md: list learning_rate, momentum and weight_decay (and lazy) as
    static; rescale_grad, injected too, may stay an array."""
    w = jnp.asarray(np.random.default_rng(5).normal(size=(6, 2)), jnp.float32)
    static = ("lazy", "learning_rate", "momentum", "weight_decay")
    kwargs = {"learning_rate": 0.1, "momentum": 0.5, "weight_decay": 0.01, "lazy": "exact"}
    injected = optax.inject_hyperparams(jsr.optim.lazy_sgd, static_args=static)(**kwargs)
    plain = jsr.optim.lazy_sgd(**kwargs)
    wi, si, wp, sp = w, injected.init(w), w, plain.init(w)
    for g, _, _ in grad_sequence(6, 4, 6, (2,), capacity=3):
        ui, si = jax.jit(injected.update)(g, si, wi)
        up, sp = jax.jit(plain.update)(g, sp, wp)
        wi, wp = jsr.optim.apply_updates(wi, ui), jsr.optim.apply_updates(wp, up)
    np.testing.assert_allclose(np.asarray(wi), np.asarray(wp), rtol=1e-6, atol=1e-7)


def test_verbose_mode_says_which_update_each_parameter_got(caplog):
    """A dense gradient for a table (no pull_rows view) is the usual silent slow
    path; verbose mode names it at trace time."""
    import logging

    w = {"emb": jnp.ones((5, 2)), "b": jnp.ones(2)}
    sparse = {"emb": jsr.RowSparse([[1.0, 1.0]], [1], shape=(5, 2)), "b": jnp.ones(2)}
    dense = {"emb": jnp.ones((5, 2)), "b": jnp.ones(2)}
    opt = jsr.optim.lazy_adam(0.1)
    caplog.set_level(logging.INFO, logger="jaxsparse_rows")
    with jsr.verbose():
        jax.jit(opt.update)(sparse, opt.init(w), w)
        jax.jit(opt.update)(dense, opt.init(w), w)
    messages = [r.getMessage() for r in caplog.records]
    assert "lazy update params['emb'](row_sparse) -> row_sparse" in messages
    assert "dense update params['emb'](default) -> default" in messages
    assert "dense update params['b'](default) -> default" in messages


def test_global_norm_bad_input():
    csr = jsr.csr_matrix(([3.0], [1], [0, 1]), shape=(1, 3))
    with pytest.raises(TypeError, match=r"`updates\['c'\]` is a CSR"):
        jsr.optim.global_norm({"c": csr})
    with pytest.raises(TypeError, match="not a valid JAX array type"):
        jsr.optim.global_norm({"a": "x"})
