"""lazy_adagrad, lazy_rowwise_adagrad and lazy_ftrl against numpy oracles;
lazy_adagrad against optax.adagrad exactly."""

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
    listed,
    numpy_adagrad,
    numpy_ftrl,
    numpy_rowwise_adagrad,
    run_optax_on_dense,
    run_steps,
)

import jaxsparse_rows as jsr


@pytest.mark.parametrize("jit", [False, True])
def test_lazy_adagrad_matches_numpy(jit):
    grads = grad_sequence(20, 50, 10, (3,), capacity=4)
    w0 = np.random.default_rng(21).normal(size=(10, 3)).astype(np.float32)
    opt = jsr.optim.lazy_adagrad(0.1, initial_accumulator_value=0.1, eps=1e-7)
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit)
    w_np, acc_np = numpy_adagrad(w0, grads, 0.1, 0.1, 1e-7)
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0].sum_of_squares), acc_np, rtol=1e-5)


@pytest.mark.parametrize("init", [0.1, 0.0])
@pytest.mark.parametrize("jit", [False, True])
def test_lazy_adagrad_equals_optax_exactly(init, jit):
    # Same arithmetic in the same order: bitwise equal op by op. Under jit XLA
    # fuses the two programs differently (e.g. contracts a*b+c into an FMA), so
    # results may differ in the last bit there.
    grads = grad_sequence(22, 30, 8, (2, 2), capacity=3)
    w0 = jnp.asarray(np.random.default_rng(23).normal(size=(8, 2, 2)), jnp.float32)
    ours = jsr.optim.lazy_adagrad(0.2, initial_accumulator_value=init)
    ref = optax.adagrad(0.2, initial_accumulator_value=init)
    w1, s1 = run_steps(ours, w0, [g for g, _, _ in grads], jit=jit)
    w2, s2 = run_optax_on_dense(ref, w0, grads, jit=jit)
    tol = dict(rtol=1e-6, atol=0) if jit else dict(rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), **tol)
    np.testing.assert_allclose(
        np.asarray(s1[0].sum_of_squares), np.asarray(s2[0].sum_of_squares), **tol
    )


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_lazy_rowwise_adagrad_matches_numpy(jit, wd):
    grads = grad_sequence(24, 50, 10, (3,), capacity=4)
    w0 = np.random.default_rng(25).normal(size=(10, 3)).astype(np.float32)
    opt = jsr.optim.lazy_rowwise_adagrad(0.1, eps=1e-8, weight_decay=wd)
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit)
    w_np, acc_np = numpy_rowwise_adagrad(w0, grads, 0.1, 1e-8, wd)
    assert state[0].sum_of_squares.shape == (10,)
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0].sum_of_squares), acc_np, rtol=1e-5)


def test_rowwise_adagrad_nd_rows_and_dense_grads():
    grads = grad_sequence(26, 10, 6, (2, 3), capacity=3)
    w0 = np.random.default_rng(27).normal(size=(6, 2, 3)).astype(np.float32)
    opt = jsr.optim.lazy_rowwise_adagrad(0.1)
    # Dense gradients: every row is processed (the all-rows numpy oracle).
    dense = [(jnp.asarray(d, jnp.float32), d, np.arange(6)) for _, d, _ in grads]
    w, _ = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in dense], jit=True)
    w_np, _ = numpy_rowwise_adagrad(w0, dense, 0.1, 1e-8, 0.0)
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)
    # Without weight decay lazy equals dense: zero rows change nothing.
    w_lazy, _ = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit=True)
    np.testing.assert_allclose(np.asarray(w_lazy), np.asarray(w), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lazy_ftrl_matches_numpy(jit, wd):
    grads = grad_sequence(28, 50, 10, (3,), capacity=4)
    w0 = np.random.default_rng(29).normal(size=(10, 3)).astype(np.float32)
    opt = jsr.optim.lazy_ftrl(0.1, lamda1=0.01, beta=1.0, weight_decay=wd)
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit)
    w_np, z_np, n_np = numpy_ftrl(w0, grads, 0.1, 0.01, 1.0, wd)
    np.testing.assert_allclose(np.asarray(w), w_np, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(state.z), z_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(state.n), n_np, rtol=1e-5)


def test_lazy_ftrl_from_zero_equals_dense():
    grads = grad_sequence(30, 30, 8, (2,), capacity=3)
    opt = jsr.optim.lazy_ftrl(0.2, lamda1=0.05, weight_decay=0.01)
    w0 = jnp.zeros((8, 2))
    w_lazy, _ = run_steps(opt, w0, [g for g, _, _ in grads], jit=True)
    w_dense, _ = run_steps(opt, w0, [jnp.asarray(d, jnp.float32) for _, d, _ in grads], jit=True)
    w_np, _, _ = numpy_ftrl(np.zeros((8, 2)), grads, 0.2, 0.05, 1.0, 0.01, lazy=False)
    np.testing.assert_allclose(np.asarray(w_lazy), np.asarray(w_dense), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(w_lazy), w_np, rtol=1e-5, atol=1e-6)


def test_lazy_ftrl_needs_params():
    opt = jsr.optim.lazy_ftrl()
    with pytest.raises(ValueError, match="params"):
        opt.update(jsr.RowSparse([[1.0]], [0], shape=(2, 1)), opt.init(jnp.zeros((2, 1))))


def test_rowwise_adagrad_eps_zero_gives_a_zero_row_a_zero_update(jit_mode):
    """A listed all-zero row with eps = 0 was 0/0 = NaN on its first touch."""
    w = np.ones((4, 2), np.float32)
    opt = jsr.optim.lazy_rowwise_adagrad(1.0, eps=0.0)
    grad = listed([[0.0, 0.0], [2.0, -3.0]], [0, 1], (4, 2))
    u, state = jit_mode(opt.update)(grad[0], opt.init(jnp.asarray(w)), jnp.asarray(w))
    w_np, acc_np = numpy_rowwise_adagrad(w, [grad], 1.0, 0.0, 0.0)
    assert u.indices.tolist() == [0, 1] and np.all(np.isfinite(np.asarray(u.data)))
    np.testing.assert_allclose(np.asarray(u.data), (w_np - w)[:2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state[0].sum_of_squares), acc_np, rtol=1e-6)


def test_rowwise_adagrad_nan_gradient_stays_visible():
    """The eps = 0 guard must not turn a NaN gradient into a silent zero update."""
    w = jnp.ones((4, 2))
    opt = jsr.optim.lazy_rowwise_adagrad(0.1)
    g = jsr.RowSparse(jnp.array([[jnp.nan, 1.0]]), [1], shape=(4, 2))
    u, _ = opt.update(g, opt.init(w), w)
    assert np.all(np.isnan(np.asarray(u.data)))


def test_complex_adagrad_accumulates_the_squared_modulus(jit_mode):
    """Complex gradients: the accumulators add |g|**2, as optax.adagrad does
    (they added g**2: 1j gave -1, and the update was 0)."""
    w = jnp.zeros((2, 1), jnp.complex64)
    g = jnp.array([[1j], [3 + 4j]], jnp.complex64)
    rsp = jsr.RowSparse(g, jnp.array([0, 1]), shape=(2, 1))
    ours = jsr.optim.lazy_adagrad(1.0)
    ref = optax.adagrad(1.0)
    u, s = jit_mode(ours.update)(rsp, ours.init(w), w)
    ur, sr = ref.update(g, ref.init(w), w)
    np.testing.assert_allclose(np.asarray(u.data), np.asarray(ur), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(s[0].sum_of_squares), np.asarray(sr[0].sum_of_squares))
    # row-wise: the mean of |g|**2 over the row, and the update g / |g|
    rowwise = jsr.optim.lazy_rowwise_adagrad(1.0)
    u, s = jit_mode(rowwise.update)(rsp, rowwise.init(w), w)
    np.testing.assert_allclose(np.asarray(s[0].sum_of_squares), [1.0, 25.0])
    np.testing.assert_allclose(np.asarray(u.data)[:, 0], [-1j, -0.6 - 0.8j], rtol=1e-6)


def test_rowwise_adagrad_squares_float16_gradients_in_its_float32_accumulator(jit_mode):
    """A float16 gradient above 256 squared to inf in float16: the float32
    accumulator became inf, the update 0, and the row never moved again."""
    w = jnp.zeros((2, 2), jnp.float16)
    g = np.array([[300.0, 1.0], [0.5, -400.0]])
    rsp = jsr.RowSparse(jnp.asarray(g, jnp.float16), jnp.array([0, 1]), shape=(2, 2))
    opt = jsr.optim.lazy_rowwise_adagrad(1.0)
    state = opt.init(jax.ShapeDtypeStruct((2, 2), jnp.float32))
    u, s = jit_mode(opt.update)(rsp, state, w)
    acc = np.mean(g**2, axis=1)
    np.testing.assert_allclose(np.asarray(s[0].sum_of_squares), acc, rtol=1e-6)
    assert u.data.dtype == jnp.float32  # computed in the wider dtype
    np.testing.assert_allclose(
        np.asarray(u.data, np.float64), -g / np.sqrt(acc)[:, None], rtol=2e-3
    )


@pytest.mark.parametrize("jit", [False, True])
def test_adagrad_schedule_count_saturates_at_the_int32_limit(jit):
    """The schedule's count set to 2**31 - 3 and five steps: it stops at
    2**31 - 1, as in optax.adagrad started from the same count."""
    grads = grad_sequence(31, 5, 6, (2,), capacity=3, empty_steps=(3,))
    w0 = jnp.asarray(np.random.default_rng(32).normal(size=(6, 2)), jnp.float32)
    ours, ref = jsr.optim.lazy_adagrad(limit_schedule), optax.adagrad(limit_schedule)
    start = INT32_MAX - 2
    w1, s1 = run_steps(ours, w0, [g for g, _, _ in grads], jit, count=start)
    w2, s2 = run_optax_on_dense(ref, w0, grads, jit, count=start)
    assert counts_of(s1) == [INT32_MAX] == counts_of(s2)
    assert np.all(np.isfinite(np.asarray(w1)))
    np.testing.assert_allclose(np.asarray(w1), np.asarray(w2), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", ["rowwise", "ftrl"])
def test_schedule_count_saturates_at_the_int32_limit(name, jit):
    """Row-wise AdaGrad (its learning rate folded into the row pass) and FTRL
    (the learning rate inside the rule) with their counts set to 2**31 - 3
    and five steps: the count stops at 2**31 - 1 and the schedule sees the
    saturated count (numpy oracles with the same counts)."""
    grads = grad_sequence(33, 5, 6, (2,), capacity=3, empty_steps=(3,))
    w0 = np.random.default_rng(34).normal(size=(6, 2)).astype(np.float32)
    start = INT32_MAX - 2
    if name == "rowwise":
        opt = jsr.optim.lazy_rowwise_adagrad(limit_schedule, eps=1e-8)
        want = numpy_rowwise_adagrad(w0, grads, limit_schedule, 1e-8, 0.0, start_count=start)[0]
    else:
        opt = jsr.optim.lazy_ftrl(limit_schedule, lamda1=0.01)
        want = numpy_ftrl(w0, grads, limit_schedule, 0.01, 1.0, 0.0, start_count=start)[0]
    w, state = run_steps(opt, jnp.asarray(w0), [g for g, _, _ in grads], jit, count=start)
    assert counts_of(state) == [INT32_MAX]
    assert np.all(np.isfinite(np.asarray(w)))
    np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-6)
