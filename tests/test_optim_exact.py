"""lazy_sgd(lazy="exact") and flush: equal to dense (lazy=False) SGD."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import grad_sequence, run_steps

import jaxsparse_rows as jsr

CONFIGS = [
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True),
    dict(weight_decay=0.05),
    dict(momentum=0.8, weight_decay=0.02, rescale_grad=0.5, clip_gradient=0.4),
    dict(momentum=0.7, nesterov=True, weight_decay=0.03),
]


CASES = [(cfg, True, 50) for cfg in CONFIGS] + [(CONFIGS[3], False, 6)]


@pytest.mark.parametrize(("cfg", "jit", "n_steps"), CASES)
def test_exact_equals_dense_sgd(cfg, jit, n_steps):
    grads = grad_sequence(80, n_steps, 12, (3,), capacity=4)
    w0 = jnp.asarray(np.random.default_rng(81).normal(size=(12, 3)), jnp.float32)
    exact = jsr.optim.lazy_sgd(0.05, lazy="exact", **cfg)
    dense = jsr.optim.lazy_sgd(0.05, lazy=False, **cfg)

    def step_fn(opt):
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return jsr.optim.apply_updates(p, u), s

        return jax.jit(step) if jit else step

    se, sd = step_fn(exact), step_fn(dense)
    pe, ste = w0, exact.init(w0)
    pd, std = w0, dense.init(w0)
    for g, _, rows in grads:
        pe, ste = se(pe, ste, g)
        pd, std = sd(pd, std, g)
        # Rows just touched are current: equal to the dense run now.
        np.testing.assert_allclose(np.asarray(pe)[rows], np.asarray(pd)[rows], rtol=2e-5, atol=2e-6)
    pf, stf = jsr.optim.flush(pe, ste)
    np.testing.assert_allclose(np.asarray(pf), np.asarray(pd), rtol=2e-5, atol=2e-6)
    if cfg.get("momentum"):
        np.testing.assert_allclose(
            np.asarray(stf.trace), np.asarray(std[0].trace), rtol=2e-5, atol=2e-6
        )
    assert np.all(np.asarray(stf.last_step) == n_steps)
    # Flushing twice changes nothing; training continues correctly after it.
    pf2, _ = jsr.optim.flush(pf, stf)
    np.testing.assert_array_equal(np.asarray(pf2), np.asarray(pf))


def test_exact_with_dense_grads_and_mixed_tree():
    rng = np.random.default_rng(82)
    params = {
        "emb": jnp.asarray(rng.normal(size=(10, 2)), jnp.float32),
        "b": jnp.zeros(2, jnp.float32),
    }
    seq = grad_sequence(83, 20, 10, (2,), capacity=3)
    grads = [{"emb": g, "b": jnp.asarray(rng.normal(size=2), jnp.float32)} for g, _, _ in seq]
    # A dense gradient for the table half-way: every row is caught up first.
    grads[10] = {
        "emb": jnp.asarray(rng.normal(size=(10, 2)), jnp.float32),
        "b": jnp.zeros(2, jnp.float32),
    }
    cfg = dict(momentum=0.9, weight_decay=0.01)
    pe, se = run_steps(jsr.optim.lazy_sgd(0.1, lazy="exact", **cfg), params, grads, jit=True)
    pd, _ = run_steps(jsr.optim.lazy_sgd(0.1, lazy=False, **cfg), params, grads, jit=True)
    pe, _ = jsr.optim.flush(pe, se)
    for k in params:
        np.testing.assert_allclose(np.asarray(pe[k]), np.asarray(pd[k]), rtol=2e-5, atol=2e-6)


def test_flush_finds_state_inside_chain():
    opt = optax.chain(
        jsr.optim.clip_by_global_norm(10.0), jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")
    )
    w = jnp.zeros((3, 1))
    grads = [jsr.RowSparse([[1.0]], [0], shape=(3, 1)), jsr.RowSparse([[1.0]], [2], shape=(3, 1))]
    w, s = run_steps(opt, w, grads, jit=True)
    w, s = jsr.optim.flush(w, s)
    np.testing.assert_allclose(np.asarray(w)[:, 0], [-0.15, 0.0, -0.1], rtol=1e-6)
    assert isinstance(s[1], jsr.optim.ExactLazySgdState)


def test_exact_rejects_schedule_and_bad_mode():
    with pytest.raises(ValueError, match="constant float"):
        jsr.optim.lazy_sgd(optax.constant_schedule(0.1), momentum=0.9, lazy="exact")
    with pytest.raises(ValueError, match="`lazy`"):
        jsr.optim.lazy_sgd(0.1, lazy="Exact")


def test_exact_state_fields_are_found_by_optax_tree_utils():
    """A NamedTuple like the other states: tree_get / tree_set see its fields."""
    import optax.tree_utils as otu

    w = jnp.ones((4, 2))
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.9, lazy="exact")
    state = opt.init(w)
    assert int(otu.tree_get(state, "count")) == 0
    assert otu.tree_get(state, "last_step").shape == (4,)
    moved = otu.tree_set(state, count=jnp.asarray(7, jnp.int32))
    assert int(moved.count) == 7 and moved.hparams == state.hparams
    assert len(jax.tree.leaves(state)) == 3  # the hyperparameters are not leaves
    u, after = jax.jit(opt.update)(jsr.RowSparse([[1.0, 1.0]], [1], shape=(4, 2)), state, w)
    assert after.hparams == (0.1, 0.9, False, 0.0)
