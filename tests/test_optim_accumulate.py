"""jsr.optim.MultiSteps: gradient accumulation with row-sparse accumulators,
against optax.MultiSteps on the dense gradients and against the lazy rule
applied to each window's summed gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr

V, D = 8, 2


def _grads(seed, steps, capacity=3):
    """RowSparse gradients with padding slots (fewer real rows than slots)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        k = int(rng.integers(0, capacity + 1))
        ids = np.sort(rng.choice(V, size=k, replace=False))
        data = np.zeros((capacity, D), np.float32)
        data[:k] = rng.normal(size=(k, D))
        ids = np.concatenate([ids, np.full(capacity - k, V)]).astype(np.int32)
        out.append(
            {
                "emb": jsr.RowSparse(data, ids, shape=(V, D)),
                "w": jnp.asarray(rng.normal(size=D), jnp.float32),
            }
        )
    return out


def _params():
    rng = np.random.default_rng(1)
    return {"emb": jnp.asarray(rng.normal(size=(V, D)), jnp.float32), "w": jnp.ones(D)}


def _run(opt, grads, jit, dense=False):
    params, state = _params(), opt.init(_params())
    update = jax.jit(opt.update) if jit else opt.update
    for g in grads:
        if dense:
            g = jax.tree.map(
                lambda x: x.todense() if jsr.is_sparse(x) else x, g, is_leaf=jsr.is_sparse
            )
        u, state = update(g, state, params)
        params = optax.apply_updates(params, u)
    return params, state, update


@pytest.mark.parametrize("use_grad_mean", [True, False])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_equals_optax_multisteps_on_dense_gradients(jit, use_grad_mean):
    grads = _grads(0, 9)
    ours = jsr.optim.MultiSteps(
        jsr.optim.lazy_adagrad(0.1), 3, use_grad_mean, capacity={"emb": 9, "w": None}
    )
    ref = optax.MultiSteps(optax.adagrad(0.1), 3, use_grad_mean=use_grad_mean)
    p, s, update = _run(ours, grads, jit)
    q, r, _ = _run(ref, grads, jit, dense=True)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert int(s.gradient_step) == int(r.gradient_step) == 3
    assert int(s.mini_step) == 0 and bool(ours.has_updated(s))
    if jit:
        assert update._cache_size() == 1


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lazy_adam_sees_each_window_summed_with_jsr_add(jit):
    """The documented lazy semantics: the window's gradient lists every row a
    micro-batch listed, repeats summed; rows listed in no micro-batch keep
    their weights and moments."""
    k, grads = 2, _grads(5, 6)
    ours = jsr.optim.MultiSteps(jsr.optim.lazy_adam(0.05), k, capacity={"emb": 6, "w": None})
    p, s, _ = _run(ours, grads, jit)
    ref_opt = jsr.optim.lazy_adam(0.05)
    q, r = _params(), ref_opt.init(_params())
    for i in range(0, len(grads), k):
        window = grads[i : i + k]
        total = jax.tree.map(jsr.add, *window, is_leaf=jsr.is_sparse)
        mean = jax.tree.map(lambda x: x / k, total, is_leaf=jsr.is_sparse)
        u, r = ref_opt.update(mean, r, q)
        q = jsr.optim.apply_updates(q, u)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(s.inner_opt_state[0].mu["emb"]), np.asarray(r[0].mu["emb"]), atol=1e-6
    )


def test_mid_window_updates_are_zero_and_list_no_row(jit_mode):
    opt = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(0.1), 3, capacity={"emb": 5, "w": None})
    g = _grads(2, 1)[0]
    u, state = jit_mode(opt.update)(g, opt.init(_params()), _params())
    assert isinstance(u["emb"], jsr.RowSparse) and u["emb"].capacity == 5
    assert int(u["emb"].nnz_rows) == 0 and np.all(np.asarray(u["emb"].data) == 0)
    assert np.all(np.asarray(u["w"]) == 0) and int(state.mini_step) == 1


def test_overflow_is_refused_eagerly_and_skipped_under_jit():
    g1 = {"emb": jsr.RowSparse(jnp.ones((2, D)), [0, 1], shape=(V, D)), "w": jnp.ones(D)}
    g2 = {"emb": jsr.RowSparse(jnp.ones((2, D)), [2, 3], shape=(V, D)), "w": jnp.ones(D)}
    opt = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(1.0), 2, capacity={"emb": 3, "w": None})
    params = _params()
    state = opt.init(params)
    _, state1 = opt.update(g1, state, params)
    with pytest.raises(ValueError, match=r"4 distinct rows of `params\['emb'\]`.*capacity` of 3"):
        opt.update(g2, state1, params)
    update = jax.jit(opt.update)
    _, s = update(g1, state, params)
    u, s = update(g2, s, params)
    assert int(s.skipped) == 1 and not bool(s.overflowed) and int(s.gradient_step) == 1
    assert int(u["emb"].nnz_rows) == 0 and np.all(np.asarray(u["w"]) == 0)
    # The next window starts empty and is applied.
    _, s = update(g1, s, params)
    u, s = update(g1, s, params)
    assert int(s.skipped) == 1
    np.testing.assert_array_equal(np.asarray(u["emb"].indices), [0, 1, V])
    np.testing.assert_allclose(np.asarray(u["emb"].data)[:2], -1.0)


def test_zero_capacity_and_empty_gradients(jit_mode):
    empty = {
        "emb": jsr.RowSparse(jnp.zeros((0, D)), jnp.zeros(0, jnp.int32), (V, D)),
        "w": jnp.ones(D),
    }
    opt = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(1.0), 2, capacity={"emb": 0, "w": None})
    params = _params()
    state = opt.init(params)
    for _ in range(2):
        u, state = jit_mode(opt.update)(empty, state, params)
    assert u["emb"].capacity == 0 and int(state.gradient_step) == 1
    np.testing.assert_allclose(np.asarray(u["w"]), -1.0)
    one = {"emb": jsr.RowSparse(jnp.ones((1, D)), [2], shape=(V, D)), "w": jnp.ones(D)}
    with pytest.raises(ValueError, match="capacity` of 0"):
        opt.update(one, state, params)


def test_every_k_schedule_as_a_function(jit_mode):
    """k = 1 for the first window, then 2: updates at calls 1, 3, 5."""
    opt = jsr.optim.MultiSteps(
        jsr.optim.lazy_sgd(1.0), lambda step: jnp.where(step < 1, 1, 2), capacity=6
    )
    g = {"emb": jsr.RowSparse(jnp.ones((1, D)), [4], shape=(V, D))}
    params = {"emb": jnp.zeros((V, D))}
    state = opt.init(params)
    emitted = []
    for _ in range(5):
        u, state = jit_mode(opt.update)(g, state, params)
        emitted.append(int(u["emb"].nnz_rows))
    assert emitted == [1, 0, 1, 0, 1]


def test_gradient_kind_must_match_the_accumulator():
    params = _params()
    sparse = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(0.1), 2, capacity={"emb": 4, "w": 4})
    g = _grads(3, 1)[0]
    with pytest.raises(TypeError, match=r"row-sparse accumulator.*`params\['w'\]`.*capacity=None"):
        sparse.update(g, sparse.init({"emb": params["emb"], "w": jnp.ones((D, 1))}), None)
    dense = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(0.1), 2)
    with pytest.raises(TypeError, match=r"dense accumulator for `params\['emb'\]`.*capacity"):
        jax.jit(dense.update)(g, dense.init(params), params)


def test_bad_arguments_are_named():
    sgd = jsr.optim.lazy_sgd(0.1)
    with pytest.raises(ValueError, match="every_k_schedule"):
        jsr.optim.MultiSteps(sgd, 0)
    with pytest.raises(TypeError, match="capacity"):
        jsr.optim.MultiSteps(sgd, 2, capacity=-1)
    with pytest.raises(TypeError, match="capacity"):
        jsr.optim.MultiSteps(sgd, 2, capacity={"emb": 2.5})
    with pytest.raises(ValueError, match="pytree prefix of `params`"):
        jsr.optim.MultiSteps(sgd, 2, capacity={"other": 3}).init(_params())
    with pytest.raises(TypeError, match="opt"):
        jsr.optim.MultiSteps("adam", 2)
    with pytest.raises(TypeError, match="MultiStepsState"):
        jsr.optim.MultiSteps(sgd, 2).update(_grads(0, 1)[0], sgd.init(_params()))


def test_works_in_scan_and_as_a_gradient_transformation():
    grads = _grads(7, 4)
    opt = jsr.optim.MultiSteps(jsr.optim.lazy_sgd(0.1), 2, capacity={"emb": 6, "w": None})
    tx = opt.gradient_transformation()
    xs = {
        "data": jnp.stack([g["emb"].data for g in grads]),
        "ids": jnp.stack([g["emb"].indices for g in grads]),
        "w": jnp.stack([g["w"] for g in grads]),
    }

    def body(carry, x):
        params, state = carry
        g = {"emb": jsr.RowSparse._make(x["data"], x["ids"], (V, D)), "w": x["w"]}
        u, state = tx.update(g, state, params)
        return (jsr.optim.apply_updates(params, u), state), None

    (p, _), _ = jax.lax.scan(body, (_params(), tx.init(_params())), xs)
    q, _, _ = _run(opt, grads, jit=True)
    np.testing.assert_allclose(np.asarray(p["emb"]), np.asarray(q["emb"]), rtol=1e-6)


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("grad_ids", [jnp.int32, "default"])
def test_the_accumulator_keeps_its_id_dtype_so_a_scan_carries_the_state(x64, grad_ids):
    """The accumulator's row ids are the library's index dtype (int64 with
    ``jax_enable_x64``, as ``jsr.grad`` and ``pull_rows`` give) and stay so
    whatever the gradient's ids are: the state is a valid ``lax.scan`` carry
    and a jitted step compiles once."""
    with jax.enable_x64(x64):
        p = jnp.ones((10, 2))
        ids = jnp.array([1, 2])
        g = jsr.grad(lambda v: jnp.sum(jsr.take(v, ids) ** 2))(jsr.pull_rows(p, ids))
        if grad_ids != "default":
            g = jsr.RowSparse._make(g.data, g.indices.astype(grad_ids), g.shape)
        ms = jsr.optim.MultiSteps(jsr.optim.lazy_adam(0.1), 2, capacity=8)
        s0 = ms.init(p)
        _, s1 = ms.update(g, s0, p)
        assert s1.acc_grads.indices.dtype == s0.acc_grads.indices.dtype
        assert s0.acc_grads.indices.dtype == (jnp.int64 if x64 else jnp.int32)

        def body(s, _):
            return ms.update(g, s, p)[1], None

        s3, _ = jax.lax.scan(body, s0, None, length=3)
        step = jax.jit(ms.update)
        for _ in range(3):
            s0 = step(g, s0, p)[1]
        assert step._cache_size() == 1
        np.testing.assert_array_equal(s3.acc_grads.data, s0.acc_grads.data)
