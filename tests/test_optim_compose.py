"""Composition with optax.chain / multi_transform, the RowSparse-safe
transforms, mixed dense/RowSparse gradient trees and bad-input errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import (
    INT32_MAX,
    ORACLES,
    dense_step,
    grad_sequence,
    listed,
    numpy_adagrad,
    numpy_adam,
    numpy_rowwise_adagrad,
    numpy_sgd,
    random_rows,
    run_steps,
    state_arrays,
)

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


@pytest.mark.parametrize("jit", [False, True])
def test_mixed_tree_dense_leaves_follow_optax_adam(jit):
    params, grads = _model()
    ours = jsr.optim.lazy_adam(0.01)
    ref = optax.adam(0.01)
    grads = grads if jit else grads[:5]  # eager steps are slow
    p1, _ = run_steps(ours, params, [g for g, _ in grads], jit=jit)
    p2, _ = run_steps(ref, params, [d for _, d in grads], jit=jit, apply=optax.apply_updates)
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


def _is_eager(jit_mode) -> bool:
    fn = lambda: None  # noqa: E731
    return jit_mode(fn) is fn


@pytest.mark.parametrize("max_norm", [2.5, 100.0])
def test_clip_by_global_norm_ignores_padding_and_keeps_indices(jit_mode, max_norm):
    # Slot 1 is padding (id 5 == n_rows) holding non-zero values, which breaks
    # the RowSparse invariant: refused when concrete; under jit (unchecked)
    # they must not count in the norm.
    data = np.array([[3.0, 4.0], [7.0, 7.0]], np.float32)
    b = np.array([1.0, -2.0], np.float32)
    g = jsr.RowSparse._make(jnp.asarray(data), jnp.asarray([1, 5], jnp.int32), (5, 2))
    tx = jsr.optim.clip_by_global_norm(max_norm)
    if _is_eager(jit_mode):  # eager
        with pytest.raises(ValueError, match="non-zero padding rows"):
            tx.update({"a": g, "b": jnp.asarray(b)}, tx.init(None))
        return
    u, _ = jit_mode(tx.update)({"a": g, "b": jnp.asarray(b)}, tx.init(None))
    scale = min(1.0, max_norm / np.sqrt(np.sum(data[0] ** 2) + np.sum(b**2)))
    np.testing.assert_allclose(np.asarray(u["a"].data)[0], scale * data[0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u["b"]), scale * b, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(u["a"].indices), [1, 5])


@pytest.mark.parametrize("plain", [optax.scale(-1.0), optax.clip(0.5)])
def test_plain_optax_elementwise_transforms_are_refused_and_lifted_work(jit_mode, plain):
    """optax maps these over every leaf, row ids included (which would become
    float fractions); unflattening refuses non-integer ids, naming the fix."""
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
    u2, _ = jit_mode(ours.update)(g, ours.init(w), w)
    assert isinstance(u2, jsr.RowSparse) and u2.indices.tolist() == g.indices.tolist()
    np.testing.assert_allclose(u2.asnumpy(), expected, rtol=1e-6)
    dense_tx = jsr.optim.add_decayed_weights(0.5, lazy=False)  # every row decays
    u3, _ = jit_mode(dense_tx.update)(g, dense_tx.init(w), w)
    np.testing.assert_allclose(np.asarray(u3), dense + 0.5 * np.asarray(w), rtol=1e-6)


def test_lift_elementwise_rejects_stateful_transform():
    with pytest.raises(TypeError, match="lift_elementwise"):
        jsr.optim.lift_elementwise(optax.trace(0.9)).init(jnp.zeros((3, 2)))


def test_schedule_transform_lifted(jit_mode):
    sched = lambda c: 2.0 * (c + 1)  # noqa: E731
    tx = jsr.optim.lift_elementwise(optax.scale_by_schedule(sched))
    g, dense, _ = random_rows(np.random.default_rng(71), 4, (2,), capacity=3, k=2)
    s = tx.init(jnp.zeros((4, 2)))
    update = jit_mode(tx.update)
    for count in range(3):
        u, s = update(g, s)
        assert u.indices.tolist() == g.indices.tolist()
        np.testing.assert_allclose(u.asnumpy(), sched(count) * dense, rtol=1e-6)


@pytest.mark.parametrize(
    "plain",
    [
        optax.scale_by_schedule(lambda c: 0.5 + 0 * c),
        optax.scale_by_learning_rate(lambda c: 0.5 + 0 * c),
        optax.scale_by_schedule(lambda c: 3.0 + 0 * c),
        optax.scale_by_sign(),
    ],
    ids=["schedule 0.5", "learning-rate schedule", "schedule 3", "sign"],
)
def test_optax_transforms_that_keep_ids_integer_are_refused_by_apply_updates(plain):
    """These cast their factor to each leaf's dtype, so the row ids stay
    integer but become [0, 0], [6, 9] or [1, 1]: the sum would land in the
    wrong row or be dropped as padding, silently. ``apply_updates`` refuses
    such ids when they are concrete; lifted, the transform is right."""
    w = jnp.zeros((4, 1))
    g = jsr.RowSparse([[1.0], [1.0]], [2, 3], shape=(4, 1))
    u, _ = plain.update(g, plain.init(w), w)
    with pytest.raises(ValueError, match=r"`params` has invalid row ids.*lift_elementwise"):
        jsr.optim.apply_updates(w, u)
    lifted = jsr.optim.lift_elementwise(plain)
    u, _ = lifted.update(g, lifted.init(w), w)
    want, _ = plain.update(g.data, plain.init(g.data))
    expected = np.zeros((4, 1))
    expected[[2, 3]] = np.asarray(want)
    np.testing.assert_allclose(np.asarray(jsr.optim.apply_updates(w, u)), expected)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.uint8, jnp.int16, jnp.uint32, jnp.int32])
def test_apply_updates_checks_ids_of_any_int_dtype(dtype):
    """The check compares in the ids' own dtype, where the padding id (300
    here) may not fit: valid ids pass, repeated ones are refused."""
    w = jnp.zeros((300, 1))
    ok = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([3, 100], dtype), (300, 1))
    np.testing.assert_array_equal(np.flatnonzero(jsr.optim.apply_updates(w, ok)), [3, 100])
    bad = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([100, 100], dtype), (300, 1))
    with pytest.raises(ValueError, match="invalid row ids"):
        jsr.optim.apply_updates(w, bad)


def test_stacked_updates_are_refused_by_the_optimizers_and_apply_updates():
    """A RowSparse stacked by jax.vmap (a batch of updates) was summed into
    one parameter by ``apply_updates`` and taken by the lazy rules."""
    w = jnp.zeros((6, 2))
    stacked = jax.vmap(lambda i: jsr.RowSparse(jnp.ones((3, 2)), i, (6, 2)))(
        jnp.array([[0, 2, 4], [1, 5, 6]])
    )
    with pytest.raises(ValueError, match=r"the update of `params\['w'\]` needs one RowSparse"):
        jsr.optim.apply_updates({"w": w}, {"w": stacked})
    for opt in (jsr.optim.lazy_adam(0.1), jsr.optim.lazy_sgd(0.1)):
        with pytest.raises(ValueError, match=r"the update of `params\['w'\]` needs one RowSparse"):
            opt.update({"w": stacked}, opt.init({"w": w}), {"w": w})


def test_zero_nans_lifted_keeps_its_state_structure():
    """Plain ``optax.zero_nans`` maps its NaN test over the row ids too, so its
    state turned from a bool per parameter into a RowSparse of bools after one
    step (a jitted step compiled twice and ``lax.scan`` refused the carry).
    Lifted, the state keeps its structure and the NaN row is zeroed."""
    w = jnp.ones((4, 2))
    tx = optax.chain(jsr.optim.lift_elementwise(optax.zero_nans()), jsr.optim.lazy_sgd(0.5))
    state = tx.init(w)

    def step(w, state, data):
        u, state = tx.update(jsr.RowSparse(data, jnp.array([1, 3]), (4, 2)), state, w)
        return jsr.optim.apply_updates(w, u), state

    jitted = jax.jit(step)
    data = jnp.array([[1.0, jnp.nan], [2.0, 2.0]])
    for _ in range(3):
        new_w, new_state = jitted(w, state, data)
        assert jax.tree.structure(new_state) == jax.tree.structure(state)
        w, state = new_w, new_state
    assert jitted._cache_size() == 1
    expected = np.ones((4, 2))
    expected[1] -= 3 * 0.5 * np.array([1.0, 0.0])
    expected[3] -= 3 * 0.5 * 2.0
    np.testing.assert_allclose(np.asarray(w), expected)
    (w_s, _), _ = jax.lax.scan(
        lambda c, _: (step(*c, data), None), (jnp.ones((4, 2)), tx.init(w)), None, 3
    )
    np.testing.assert_allclose(np.asarray(w_s), expected)


@pytest.mark.parametrize("jit", [False, True])
def test_param_with_sometimes_dense_grads(jit):
    # Both paths update the same state arrays: a RowSparse step (row 0), then
    # a dense one (every row: all moments move), with the global count.
    rng = np.random.default_rng(72)
    grads = [listed(rng.normal(size=(1, 2)), [0], (3, 2)), dense_step(rng.normal(size=(3, 2)))]
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    w, s = run_steps(jsr.optim.lazy_adam(0.1), jnp.asarray(w0), [g for g, _, _ in grads], jit)
    want = numpy_adam(w0, grads, 0.1, 0.9, 0.999, 1e-8, 0.0, 0.0, lazy=True)
    assert int(s[0].count) == 2
    for got, exp in zip((w, s[0].mu, s[0].nu), want, strict=True):
        np.testing.assert_allclose(np.asarray(got), exp, rtol=1e-5, atol=1e-7)


OPTS = {name: make for name, (make, _, _) in ORACLES.items()}


# Unusual parameters: leaf -> (shape, dtype, tolerance). No rows, empty rows,
# [V, 2, 3] rows, and half precision (about 5 units of roundoff; at most 2.2
# seen), all in one params tree.
LEAVES = {
    "no_rows": ((0, 3), jnp.float32, 1e-5),
    "empty_rows": ((5, 0), jnp.float32, 1e-5),
    "rows_2x3": ((5, 2, 3), jnp.float32, 1e-5),
    "bfloat16": ((8, 3), jnp.bfloat16, 1e-2),
    "float16": ((8, 3), jnp.float16, 2e-3),
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", sorted(ORACLES))
def test_every_optimizer_on_empty_3d_and_half_precision_params(name, jit):
    """Two RowSparse steps (one listing no row) and a dense step, gradients in
    the params' dtype: params and state keep shape and dtype and follow the
    float64 oracle run on the same (rounded) values."""
    make, oracle, names = ORACLES[name]
    # Half precision under jit only: eagerly it adds ~6 s of per-op compiles,
    # for the same dtype rules.
    leaves = {k: v for k, v in LEAVES.items() if jit or v[1] == jnp.float32}
    rng = np.random.default_rng(83)
    w0, seqs = {}, {}
    for k, (shape, dtype, _) in leaves.items():
        w0[k] = jnp.asarray(rng.normal(size=shape), dtype)
        seq = grad_sequence(84, 2, shape[0], shape[1:], capacity=3, empty_steps=(1,))
        seq.append(dense_step(rng.normal(size=shape)))
        # The oracle sees the gradient values rounded to the dtype, as given.
        seqs[k] = [
            (g.astype(dtype), x.astype(np.float32).astype(dtype).astype(np.float64), r)
            for g, x, r in seq
        ]
    steps = [{k: seqs[k][t][0] for k in leaves} for t in range(3)]
    w, state = run_steps(make(), w0, steps, jit)
    got = [w, *state_arrays(state, names)]
    for k, (_, dtype, tol) in leaves.items():
        want = oracle(np.asarray(w0[k], np.float64), seqs[k])
        for i, (a, b) in enumerate(zip([x[k] for x in got], want, strict=True)):
            assert a.shape == b.shape and a.dtype == dtype, (k, i)
            scale = float(np.max(np.abs(b), initial=0.0)) or 1.0  # relative to the array
            np.testing.assert_allclose(
                np.asarray(a, np.float64), b, rtol=tol, atol=tol * scale, err_msg=f"{k}[{i}]"
            )


# The scale_by_* pieces (the direction, before the learning rate): with
# `w -= u` they follow the oracles at learning rate 1.
PIECES = {
    "sgd": (
        lambda: jsr.optim.scale_by_lazy_sgd(0.9, True, 0.1, rescale_grad=0.5, clip_gradient=0.8),
        lambda w, gs: numpy_sgd(w, gs, 1.0, 0.9, True, 0.1, 0.5, 0.8, lazy=True),
        ("trace",),
    ),
    "adam": (
        lambda: jsr.optim.scale_by_lazy_adam(b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-8),
        lambda w, gs: numpy_adam(w, gs, 1.0, 0.8, 0.95, 1e-6, 1e-8, 0.0, lazy=True),
        ("mu", "nu"),
    ),
    "adagrad": (
        lambda: jsr.optim.scale_by_lazy_adagrad(initial_accumulator_value=0.2, eps=1e-6),
        lambda w, gs: numpy_adagrad(w, gs, 1.0, 0.2, 1e-6),
        ("sum_of_squares",),
    ),
    "rowwise": (
        lambda: jsr.optim.scale_by_lazy_rowwise_adagrad(eps=1e-6, weight_decay=0.1),
        lambda w, gs: numpy_rowwise_adagrad(w, gs, 1.0, 1e-6, 0.1),
        ("sum_of_squares",),
    ),
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", sorted(PIECES))
def test_scale_by_pieces_match_numpy(name, jit):
    make, oracle, names = PIECES[name]
    rng = np.random.default_rng(87)
    w0 = rng.normal(size=(10, 3)).astype(np.float32)
    grads = grad_sequence(88, 3, 10, (3,), capacity=4, empty_steps=(1,))
    grads.append(dense_step(rng.normal(size=(10, 3))))
    descend = lambda p, u: jsr.optim.apply_updates(p, -u)  # noqa: E731
    w, state = run_steps(make(), jnp.asarray(w0), [g for g, _, _ in grads], jit, apply=descend)
    want_w, *want_states = oracle(w0, grads)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-5, atol=1e-5)
    for got, want in zip(state_arrays(state, names), want_states, strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lr,flip_sign", [(0.3, True), ("schedule", True), ("schedule", False)])
def test_scale_by_learning_rate_matches_numpy(jit_mode, lr, flip_sign):
    """`u = -lr(count) * g` on RowSparse data (ids kept) and dense leaves; the
    schedule's count advances on every call, a call listing no row included."""
    sched = (lambda c: 0.1 * (c + 1)) if lr == "schedule" else None
    tx = jsr.optim.scale_by_learning_rate(sched or lr, flip_sign=flip_sign)
    rng = np.random.default_rng(89)
    state = tx.init({"emb": jnp.zeros((6, 2)), "b": jnp.zeros(3)})
    update = jit_mode(tx.update)
    for count, (g, dense, _) in enumerate(grad_sequence(90, 3, 6, (2,), 3, empty_steps=(1,))):
        b = rng.normal(size=3).astype(np.float32)
        u, state = update({"emb": g, "b": jnp.asarray(b)}, state)
        step = (sched(count) if sched else lr) * (-1.0 if flip_sign else 1.0)
        assert u["emb"].indices.tolist() == g.indices.tolist()
        np.testing.assert_allclose(u["emb"].asnumpy(), step * dense, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(u["b"]), step * b, rtol=1e-6)


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


@pytest.mark.parametrize("name", sorted(OPTS))
def test_a_float0_gradient_of_an_integer_parameter_is_refused_naming_none_and_masked(name):
    """``jax.grad(..., allow_int=True)`` gives float0 for an integer input:
    there is nothing to apply, so the message says to pass None or mask it
    (casting it, as for an integer gradient, would not help)."""
    params = {"emb": jnp.ones((5, 2)), "step": jnp.zeros((), jnp.int32)}
    g = jax.grad(lambda p: jnp.sum(p["emb"] ** 2), allow_int=True)(params)
    assert g["step"].dtype == jax.dtypes.float0
    opt = OPTS[name]()
    with pytest.raises(TypeError, match=r"`params\['step'\]` is float0.*None.*optax\.masked"):
        opt.update(g, opt.init(params), params)


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


def test_skip_nonfinite_counts_saturate_at_the_int32_limit(jit_mode):
    """`skipped` and the inner count set to 2**31 - 2: both stop at 2**31 - 1
    and never wrap to -2**31; the steps taken equal optax.adam's from the
    same count."""
    w0 = jnp.asarray(np.random.default_rng(91).normal(size=(3, 2)), jnp.float32)
    start = INT32_MAX - 1
    opt = jsr.optim.skip_nonfinite(jsr.optim.lazy_adam(0.1))
    state = optax.tree_utils.tree_set(opt.init(w0), count=jnp.asarray(start, jnp.int32))
    state = state._replace(skipped=jnp.asarray(start, jnp.int32))
    ref = optax.adam(0.1)
    ref_state = optax.tree_utils.tree_set(ref.init(w0), count=jnp.asarray(start, jnp.int32))

    def step(w, s, g):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    step = jit_mode(step)
    good = [np.array([[1.0, -2.0], [0.5, 0.0], [3.0, 1.0]]), np.array([[2.0, 1], [0, 0], [1, -1]])]
    bad = jsr.RowSparse([[1.0, np.nan]], [1], shape=(3, 2))
    w, want = w0, w0
    for t in range(5):
        if t % 2:
            g = good[t // 2 % 2]
            w, state = step(w, state, jsr.RowSparse(g, np.arange(3), shape=(3, 2)))
            u, ref_state = ref.update(jnp.asarray(g, jnp.float32), ref_state, want)
            want = optax.apply_updates(want, u)
        else:
            w, state = step(w, state, bad)
        assert int(state.skipped) == min(start + t // 2 + 1, INT32_MAX)
    assert int(state.inner_state[0].count) == INT32_MAX == int(ref_state[0].count)
    assert np.all(np.isfinite(np.asarray(w)))
    np.testing.assert_allclose(np.asarray(w), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_skip_nonfinite_ignores_padding_slots():
    # A NaN in a padding slot is not a gradient value: refused when concrete
    # (the slot breaks the invariant); under jit nothing is skipped.
    g = jsr.RowSparse._make(jnp.asarray([[1.0], [np.nan]]), jnp.asarray([0, 3], jnp.int32), (3, 1))
    opt = jsr.optim.skip_nonfinite(jsr.optim.lazy_sgd(1.0))
    w = jnp.zeros((3, 1))
    with pytest.raises(ValueError, match="non-zero padding rows"):
        opt.update(g, opt.init(w), w)
    u, s = jax.jit(opt.update)(g, opt.init(w), w)
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


def test_injected_momentum_starting_at_zero_can_be_raised_later(jit_mode):
    """As optax.sgd's trace under inject_hyperparams: an injected momentum of 0
    keeps its buffer, so raising it later takes effect (it had no buffer, and
    the raised momentum was silently ignored)."""
    w = jnp.zeros((4, 1))
    opt = optax.inject_hyperparams(jsr.optim.lazy_sgd)(learning_rate=1.0, momentum=0.0)
    state = opt.init(w)
    g = jsr.RowSparse([[1.0]], [2], shape=(4, 1))
    u, state = jit_mode(opt.update)(g, state, w)  # m = g = 1
    state.hyperparams["momentum"] = jnp.asarray(0.5)
    u, state = jit_mode(opt.update)(g, state, w)  # m = 0.5 * 1 + 1
    np.testing.assert_array_equal(np.asarray(jsr.todense(u))[:, 0], [0.0, 0.0, -1.5, 0.0])
    ref = optax.inject_hyperparams(optax.sgd)(learning_rate=1.0, momentum=0.0)
    ref_state = ref.init(w)
    _, ref_state = ref.update(jsr.todense(g), ref_state, w)
    ref_state.hyperparams["momentum"] = jnp.asarray(0.5)
    ref_u, _ = ref.update(jsr.todense(g), ref_state, w)
    np.testing.assert_array_equal(np.asarray(jsr.todense(u)), np.asarray(ref_u))
    # A host 0 (or None), or a static momentum, still means no buffer at all.
    for off in (
        jsr.optim.lazy_sgd(1.0, momentum=0),
        jsr.optim.lazy_sgd(1.0, momentum=None),
        optax.inject_hyperparams(jsr.optim.lazy_sgd, static_args=("momentum",))(1.0, 0.0),
    ):
        assert not [x for x in jax.tree.leaves(off.init(w)) if x.shape == w.shape]


def test_exact_sgd_under_injected_traced_hyperparams_says_to_make_them_static():
    opt = optax.inject_hyperparams(jsr.optim.lazy_sgd, static_args=("lazy",))(
        learning_rate=0.1, momentum=0.5, lazy="exact"
    )
    w = jnp.ones((3, 1))
    g = jsr.RowSparse([[1.0]], [1], shape=(3, 1))
    # every traced one is named (only the first, learning_rate, was)
    match = r"got traced values for `learning_rate`, `momentum`, `weight_decay`.*static_args"
    with pytest.raises(TypeError, match=match):
        jax.jit(opt.update)(g, opt.init(w), w)


def test_global_norm_counts_real_rows_not_row_ids(jit_mode):
    g = {
        "emb": jsr.RowSparse._make(
            jnp.asarray([[3.0, 4.0], [7.0, 7.0]]), jnp.asarray([1, 5]), (5, 2)
        ),
        "b": jnp.asarray([0.0, 12.0]),
        "none": None,
    }
    if _is_eager(jit_mode):  # eager: the padding slot's values are refused
        with pytest.raises(ValueError, match="non-zero padding rows"):
            jsr.optim.global_norm(g)
    else:  # under jit (unchecked) they do not count
        assert float(jit_mode(jsr.optim.global_norm)(g)) == pytest.approx(13.0)
    with pytest.raises(TypeError, match="jsr.optim.global_norm"):  # why it exists
        optax.tree.norm(g)
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


def test_clip_by_global_norm_scales_float16_by_a_norm_past_its_range(jit_mode):
    """A global norm above 65504 is inf in float16: the clipped float16
    updates were all 0 (dense and RowSparse leaves)."""
    g = {
        "emb": jsr.RowSparse(jnp.full((1, 10000), 1000.0, jnp.float16), [0], shape=(2, 10000)),
        "b": jnp.full((3,), 1000.0, jnp.float16),
    }
    tx = jsr.optim.clip_by_global_norm(1.0)
    u, _ = jit_mode(tx.update)(g, tx.init(None))
    norm = 1000.0 * np.sqrt(10003)
    assert u["emb"].data.dtype == u["b"].dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(u["emb"].data, np.float32), 1000 / norm, rtol=1e-3)
    np.testing.assert_allclose(np.asarray(u["b"], np.float32), 1000 / norm, rtol=1e-3)


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
