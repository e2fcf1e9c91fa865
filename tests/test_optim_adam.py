"""lazy_adam / lazy_adamw against a numpy oracle and against optax.adam(w)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import (
    INT32_MAX,
    counts_of,
    grad_sequence,
    limit_schedule,
    numpy_adam,
    random_rows,
    run_optax_on_dense,
    run_steps,
)

import jaxsparse_rows as jsr


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lazy_adam_matches_numpy(lazy, jit, wd):
    grads = grad_sequence(10, 50, 11, (3,), capacity=4)
    w0 = np.random.default_rng(11).normal(size=(11, 3)).astype(np.float32)
    kw = dict(b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-8)
    if wd:
        opt = jsr.optim.lazy_adamw(0.01, weight_decay=wd, lazy=lazy, **kw)
    else:
        opt = jsr.optim.lazy_adam(0.01, lazy=lazy, **kw)
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit)
    w_np, mu_np, nu_np = numpy_adam(w0, grads, 0.01, wd=wd, lazy=lazy, **kw)
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0].mu), mu_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].nu), nu_np, rtol=1e-5, atol=1e-7)
    assert int(state[0].count) == 50


def test_lazy_adam_schedule_and_nd_rows():
    sched = optax.linear_schedule(0.1, 0.01, 30)
    grads = grad_sequence(12, 30, 9, (2, 2), capacity=3)
    w0 = np.random.default_rng(13).normal(size=(9, 2, 2)).astype(np.float32)
    opt = jsr.optim.lazy_adam(sched)
    w, _ = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit=True)
    w_np, _, _ = numpy_adam(
        w0, grads, lambda c: float(sched(c)), 0.9, 0.999, 1e-8, 0.0, 0.0, lazy=True
    )
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_every_row_touched_equals_optax(wd):
    rng = np.random.default_rng(14)
    grads = [random_rows(rng, 6, (3,), capacity=6, k=6) for _ in range(20)]
    w0 = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)
    if wd:
        ours, ref = jsr.optim.lazy_adamw(0.05, weight_decay=wd), optax.adamw(0.05, weight_decay=wd)
    else:
        ours, ref = jsr.optim.lazy_adam(0.05), optax.adam(0.05)
    w1, s1 = run_steps(ours, w0, [g for g, _, _ in grads], jit=True)
    w2, s2 = run_optax_on_dense(ref, w0, grads, jit=True)
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s1[0].nu), np.asarray(s2[0].nu), rtol=1e-6)


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lazy_false_equals_optax_adam(wd):
    grads = grad_sequence(15, 25, 10, (4,), capacity=3)
    w0 = jnp.asarray(np.random.default_rng(16).normal(size=(10, 4)), jnp.float32)
    if wd:
        ours = jsr.optim.lazy_adamw(0.05, weight_decay=wd, lazy=False)
        ref = optax.adamw(0.05, weight_decay=wd)
    else:
        ours, ref = jsr.optim.lazy_adam(0.05, lazy=False), optax.adam(0.05)
    w1, _ = run_steps(ours, w0, [g for g, _, _ in grads], jit=True)
    w2, _ = run_optax_on_dense(ref, w0, grads, jit=True)
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-7)


def test_untouched_rows_unchanged_and_updates_rowsparse():
    w = jnp.asarray(np.random.default_rng(17).normal(size=(5, 2)), jnp.float32)
    opt = jsr.optim.lazy_adamw(0.1, weight_decay=0.1)
    state = opt.init(w)
    g = jsr.RowSparse._make(
        jnp.asarray([[1.0, 2.0], [0.0, 0.0]]), jnp.asarray([3, 5], jnp.int32), (5, 2)
    )
    u, state = opt.update(g, state, w)
    assert isinstance(u, jsr.RowSparse)
    np.testing.assert_array_equal(np.asarray(u.indices), [3, 5])
    np.testing.assert_array_equal(np.asarray(u.data[1]), [0.0, 0.0])  # padding slot
    w2 = jsr.optim.apply_updates(w, u)
    keep = [0, 1, 2, 4]
    np.testing.assert_array_equal(np.asarray(w2)[keep], np.asarray(w)[keep])
    np.testing.assert_array_equal(np.asarray(state[0].mu)[keep], 0.0)
    assert np.all(np.asarray(state[0].mu)[3] != 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_params_keep_dtype(dtype):
    rng = np.random.default_rng(18)
    g, dense, _ = random_rows(rng, 6, (2,), capacity=3, k=2)
    g = g.astype(dtype)
    w = jnp.ones((6, 2), dtype)
    opt = jsr.optim.lazy_adam(0.1)
    state = opt.init(w)
    u, state = opt.update(g, state, w)
    w2 = jsr.optim.apply_updates(w, u)
    assert w2.dtype == dtype and state[0].mu.dtype == dtype
    expected = 1 - 0.1 * np.sign(dense)
    np.testing.assert_allclose(np.asarray(w2, np.float32), expected, atol=2e-2)


@pytest.mark.parametrize("lazy", [True, False])
def test_complex_params_follow_optax_adam(lazy):
    """optax's second moment of a complex gradient is |g|**2, not g**2."""
    w = jnp.ones((2, 3), jnp.complex64)
    g = jnp.asarray([[1 + 1j, 2 - 1j, 0], [0j, 3j, 1]], jnp.complex64)
    ours, ref = jsr.optim.lazy_adam(0.1, lazy=lazy), optax.adam(0.1)
    s, rs = ours.init(w), ref.init(w)
    grad = jsr.RowSparse(g, [0, 1], shape=(2, 3)) if lazy else g
    for _ in range(3):
        u, s = ours.update(grad, s, w)
        v, rs = ref.update(g, rs, w)
    np.testing.assert_allclose(np.asarray(jsr.todense(u)), np.asarray(v), rtol=1e-5, atol=1e-6)


def _numpy_torch_sparse_adam(w0, grads, lr, b1, b2, eps_at):
    """torch.optim.SparseAdam's rule: ``eps_at(t)`` is added to the uncorrected
    ``sqrt(v)``, and the step size carries both bias corrections."""
    w, m, v = w0.astype(np.float64), np.zeros(w0.shape), np.zeros(w0.shape)
    for t, (_, dense, rows) in enumerate(grads, start=1):
        g = dense[rows]
        m[rows] = b1 * m[rows] + (1 - b1) * g
        v[rows] = b2 * v[rows] + (1 - b2) * g * g
        size = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        w[rows] -= size * m[rows] / (np.sqrt(v[rows]) + eps_at(t))
    return w


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_equals_sparse_adam_with_eps_moved_before_the_bias_correction(eps):
    """optimizers.md: the only difference from PyTorch's SparseAdam is where
    eps goes: SparseAdam run with eps * sqrt(1 - b2**t) at step t equals ours
    run with eps."""
    lr, b1, b2 = 0.01, 0.9, 0.999
    grads = grad_sequence(4, 12, 7, (2,), capacity=3)
    w0 = np.random.default_rng(4).normal(size=(7, 2)).astype(np.float32)
    opt = jsr.optim.lazy_adam(lr, b1=b1, b2=b2, eps=eps)
    w, _ = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit=True)
    want = _numpy_torch_sparse_adam(w0, grads, lr, b1, b2, lambda t: eps * np.sqrt(1 - b2**t))
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-6)
    if eps:  # with the same eps the two differ
        plain = _numpy_torch_sparse_adam(w0, grads, lr, b1, b2, lambda t: eps)
        assert np.max(np.abs(np.asarray(w) - plain)) > 1e-3


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_count_saturates_at_the_int32_limit_as_optax_adam(wd, jit):
    """Counts set to 2**31 - 3 and five steps: the count stops at 2**31 - 1,
    the bias corrections stay finite (1 - b**count is 1 there) and the
    schedule sees the saturated count, as in optax.adam(w) started from the
    same count."""
    rng = np.random.default_rng(19)
    grads = [random_rows(rng, 5, (2,), capacity=5, k=5) for _ in range(5)]
    w0 = jnp.asarray(rng.normal(size=(5, 2)), jnp.float32)
    if wd:
        ours = jsr.optim.lazy_adamw(limit_schedule, weight_decay=wd)
        ref = optax.adamw(limit_schedule, weight_decay=wd)
    else:
        ours, ref = jsr.optim.lazy_adam(limit_schedule), optax.adam(limit_schedule)
    start = INT32_MAX - 2
    w1, s1 = run_steps(ours, w0, [g for g, _, _ in grads], jit, count=start)
    w2, s2 = run_optax_on_dense(ref, w0, grads, jit, count=start)
    assert counts_of(s1) == [INT32_MAX, INT32_MAX] == counts_of(s2)
    assert np.all(np.isfinite(np.asarray(w1)))
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(s1[0].nu), np.asarray(s2[0].nu), rtol=1e-6)


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adamw_is_its_three_transform_chain_bit_for_bit(lazy, dtype, jit_mode):
    """lazy_adamw adds the decay inside Adam's row rule: the same numbers, to the
    bit, and the same state as chain(scale_by_lazy_adam, add_decayed_weights,
    scale_by_learning_rate), on RowSparse (with padding) and dense leaves."""
    rng = np.random.default_rng(5)
    params = {
        "emb": jnp.asarray(rng.normal(size=(7, 3)), dtype),
        "b": jnp.asarray(rng.normal(size=3), dtype),
    }
    ours = jsr.optim.lazy_adamw(0.1, weight_decay=0.3, lazy=lazy, mu_dtype=jnp.float32)
    chained = optax.chain(
        jsr.optim.scale_by_lazy_adam(lazy=lazy, mu_dtype=jnp.float32),
        jsr.optim.add_decayed_weights(0.3, lazy),
        jsr.optim.scale_by_learning_rate(0.1),
    )
    s1, s2 = ours.init(params), chained.init(params)
    p1 = p2 = params
    for ids in ([1, 4, 7], [0, 4, 6]):  # 7 is padding
        data = rng.normal(size=(3, 3)) * (np.array(ids) < 7)[:, None]
        grads = {
            "emb": jsr.RowSparse(jnp.asarray(data, dtype), ids, shape=(7, 3)),
            "b": jnp.asarray(rng.normal(size=3), dtype),
        }
        u1, s1 = jit_mode(ours.update)(grads, s1, p1)
        u2, s2 = jit_mode(chained.update)(grads, s2, p2)
        p1, p2 = jsr.optim.apply_updates(p1, u1), jsr.optim.apply_updates(p2, u2)
        assert jax.tree.structure(s1) == jax.tree.structure(s2)
        for a, b in zip(jax.tree.leaves((p1, s1, u1)), jax.tree.leaves((p2, s2, u2)), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
