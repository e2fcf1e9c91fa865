"""lazy_sgd: the MXNet seed step, a numpy oracle over 50 steps, lazy=False vs optax."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import (
    INT32_MAX,
    counts_of,
    grad_sequence,
    limit_schedule,
    listed,
    numpy_sgd,
    run_optax_on_dense,
    run_steps,
)

import jaxsparse_rows as jsr


def test_seed_mxnet_lazy_sgd(jit_mode):
    # Seed 000: weight ones(4, 2), grad rows [1, 2], lr 0.01, momentum 0.01.
    w = jnp.ones((4, 2))
    g = jsr.row_sparse_array(([[1, 2], [4, 5]], [1, 2]), shape=(4, 2))
    opt = jsr.optim.lazy_sgd(learning_rate=0.01, momentum=0.01)

    def step(w, s, g):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    w, state = jit_mode(step)(w, opt.init(w), g)
    np.testing.assert_allclose(
        np.asarray(w), [[1, 1], [0.99, 0.98], [0.96, 0.95], [1, 1]], rtol=1e-6
    )
    np.testing.assert_allclose(np.asarray(state[0].trace), [[0, 0], [1, 2], [4, 5], [0, 0]])
    # MXNet keeps its momentum as -lr * trace and prints it:
    # [[0, 0], [-0.01, -0.02], [-0.04, -0.05], [0, 0]]
    np.testing.assert_allclose(
        -0.01 * np.asarray(state[0].trace), [[0, 0], [-0.01, -0.02], [-0.04, -0.05], [0, 0]]
    )


CONFIGS = [
    dict(momentum=0.0, nesterov=False, weight_decay=0.0, rescale_grad=1.0, clip_gradient=None),
    dict(momentum=0.9, nesterov=False, weight_decay=0.0, rescale_grad=1.0, clip_gradient=None),
    dict(momentum=0.9, nesterov=True, weight_decay=0.01, rescale_grad=0.5, clip_gradient=0.3),
    dict(momentum=0.0, nesterov=False, weight_decay=0.05, rescale_grad=2.0, clip_gradient=1.0),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("jit", [False, True])
def test_lazy_sgd_matches_numpy(cfg, lazy, jit):
    grads = grad_sequence(0, 50, 12, (3,), capacity=5)
    w0 = np.random.default_rng(1).normal(size=(12, 3)).astype(np.float32)
    opt = jsr.optim.lazy_sgd(0.05, lazy=lazy, **cfg)
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit)
    w_np, m_np = numpy_sgd(
        w0,
        grads,
        0.05,
        lazy=lazy,
        **{
            k.replace("weight_decay", "wd")
            .replace("rescale_grad", "rescale")
            .replace("clip_gradient", "clip"): v
            for k, v in cfg.items()
        },
    )
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=2e-5, atol=2e-5)
    if cfg["momentum"]:
        np.testing.assert_allclose(np.asarray(state[0].trace), m_np, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("nesterov", [False, True])
def test_lazy_false_equals_optax_sgd(nesterov):
    grads = grad_sequence(2, 20, 10, (2, 3), capacity=4)
    w0 = jnp.asarray(np.random.default_rng(3).normal(size=(10, 2, 3)), jnp.float32)
    ours = jsr.optim.lazy_sgd(0.1, momentum=0.8, nesterov=nesterov, lazy=False)
    ref = optax.sgd(0.1, momentum=0.8, nesterov=nesterov)
    w1, _ = run_steps(ours, w0, [g for g, _, _ in grads], jit=True)
    w2, _ = run_optax_on_dense(ref, w0, grads, jit=True)
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-7)


def test_lazy_sgd_without_momentum_is_exactly_dense():
    grads = grad_sequence(4, 10, 8, (2,), capacity=3)
    w0 = jnp.asarray(np.random.default_rng(5).normal(size=(8, 2)), jnp.float32)
    w1, _ = run_steps(jsr.optim.lazy_sgd(0.3), w0, [g for g, _, _ in grads], jit=False)
    w2, _ = run_optax_on_dense(optax.sgd(0.3), w0, grads, jit=False)
    np.testing.assert_array_equal(np.asarray(w1), np.asarray(w2))


@pytest.mark.parametrize("jit", [False, True])
def test_lazy_sgd_untouched_rows_keep_momentum(jit):
    # Rows 0 and 1, then row 0 alone: row 1's momentum is frozen and does not
    # move its weight again (the dense rule would); row 2 is never touched.
    grads = [listed([[1.0], [1.0]], [0, 1], (3, 1)), listed([[1.0]], [0], (3, 1))]
    opt = jsr.optim.lazy_sgd(1.0, momentum=0.5)
    w, s = run_steps(opt, jnp.zeros((3, 1)), [g for g, _, _ in grads], jit)
    w_np, m_np = numpy_sgd(np.zeros((3, 1)), grads, 1.0, 0.5, False, 0.0, 1.0, None, lazy=True)
    w_dense, _ = numpy_sgd(np.zeros((3, 1)), grads, 1.0, 0.5, False, 0.0, 1.0, None, lazy=False)
    assert w_dense[1, 0] != w_np[1, 0]  # the case tells lazy from dense
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(s[0].trace), m_np, rtol=1e-6)
    u, _ = opt.update(grads[1][0], s, w)
    assert isinstance(u, jsr.RowSparse) and u.indices.tolist() == [0]


def test_weight_decay_needs_params():
    opt = jsr.optim.lazy_sgd(0.1, weight_decay=0.1)
    g = jsr.RowSparse([[1.0]], [0], shape=(2, 1))
    with pytest.raises(ValueError, match="params"):
        opt.update(g, opt.init(jnp.zeros((2, 1))))


@pytest.mark.parametrize("lazy", ["yes", "dense", 1, None])
def test_bad_lazy_value_lists_every_choice(lazy):
    with pytest.raises(ValueError, match=r"`lazy` must be one of \(True, False, 'exact'\)"):
        jsr.optim.lazy_sgd(0.1, lazy=lazy)


@pytest.mark.parametrize(
    "make, name",
    [
        (jsr.optim.lazy_sgd, "lazy_sgd"),
        (jsr.optim.lazy_adam, "lazy_adam"),
        (jsr.optim.lazy_adamw, "lazy_adamw"),
        (jsr.optim.scale_by_lazy_sgd, "scale_by_lazy_sgd"),
        (jsr.optim.scale_by_lazy_adam, "scale_by_lazy_adam"),
    ],
)
def test_lazy_takes_numpy_bools_and_errors_name_the_function_called(make, name):
    """``lazy=np.True_`` was refused by lazy_sgd (nesterov and
    add_decayed_weights take it), and lazy_adam's error named
    scale_by_lazy_adam."""
    args = () if name.startswith("scale_by") else (0.1,)
    w = jnp.zeros((3, 1))
    g = jsr.RowSparse([[1.0]], [1], shape=(3, 1))
    for flag, lazy in ((np.True_, True), (np.False_, False)):
        u, _ = make(*args, lazy=flag).update(g, make(*args, lazy=lazy).init(w), w)
        want, _ = make(*args, lazy=lazy).update(g, make(*args, lazy=lazy).init(w), w)
        np.testing.assert_array_equal(np.asarray(jsr.todense(u)), np.asarray(jsr.todense(want)))
        assert jsr.stype(u) == jsr.stype(want)
    with pytest.raises(ValueError, match=rf"`lazy` must be one of .* for `{name}`, got 1\."):
        make(*args, lazy=1)


@pytest.mark.parametrize("lazy", [True, "exact"])
@pytest.mark.parametrize("clip", [-1.0, 0, 0.0])
def test_clip_gradient_must_be_positive(lazy, clip):
    """MXNet's clip_gradient=-1 means off; here it clipped every element to -1."""
    with pytest.raises(ValueError, match=r"`clip_gradient` must be > 0, or None"):
        jsr.optim.lazy_sgd(0.1, clip_gradient=clip, lazy=lazy)


@pytest.mark.parametrize("lazy", [True, False, "exact"])
def test_momentum_and_weight_decay_none_mean_off_as_in_optax_sgd(lazy):
    w = jnp.ones((3, 2))
    g = jsr.RowSparse([[0.5, -2.0]], [1], shape=(3, 2))
    opt = jsr.optim.lazy_sgd(0.1, momentum=None, weight_decay=None, lazy=lazy)
    plain = jsr.optim.lazy_sgd(0.1, lazy=lazy)
    u, _ = opt.update(g, opt.init(w), w)
    want, _ = plain.update(g, plain.init(w), w)
    np.testing.assert_array_equal(np.asarray(jsr.todense(u)), np.asarray(jsr.todense(want)))


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("jit", [False, True])
def test_schedule_count_saturates_at_the_int32_limit_as_optax_sgd(lazy, jit):
    """The schedule's count set to 2**31 - 3 and five steps: it stops at
    2**31 - 1 and the schedule sees the saturated count, as in optax.sgd
    started from the same count (every row listed, so lazy equals dense)."""
    grads = grad_sequence(6, 5, 6, (2,), capacity=6, empty_steps=())
    grads = [listed(d, range(6), (6, 2)) for _, d, _ in grads]
    w0 = jnp.asarray(np.random.default_rng(7).normal(size=(6, 2)), jnp.float32)
    ours = jsr.optim.lazy_sgd(limit_schedule, momentum=0.9, lazy=lazy)
    ref = optax.sgd(limit_schedule, momentum=0.9)
    start = INT32_MAX - 2
    w1, s1 = run_steps(ours, w0, [g for g, _, _ in grads], jit, count=start)
    w2, s2 = run_optax_on_dense(ref, w0, grads, jit, count=start)
    assert counts_of(s1) == [INT32_MAX] == counts_of(s2)
    assert np.all(np.isfinite(np.asarray(w1)))
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-6)
