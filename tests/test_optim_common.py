"""Shared helpers for the optimizer tests (random row sets, a training-loop
driver) and the tests of `jsr.optim.apply_updates`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows._dtypes import index_dtype


def random_rows(rng, n_rows, trailing, capacity, k=None, dtype=np.float32):
    """A RowSparse gradient with ``k`` (random if None) real sorted rows, padded
    to ``capacity``, and its dense numpy form."""
    if k is None:
        k = int(rng.integers(0, min(capacity, n_rows) + 1))
    rows = np.sort(rng.choice(n_rows, size=k, replace=False))
    idx = np.full((capacity,), n_rows, index_dtype())
    idx[:k] = rows
    data = np.zeros((capacity,) + tuple(trailing), np.float64)
    data[:k] = rng.normal(size=(k,) + tuple(trailing))
    data = data.astype(dtype)
    dense = np.zeros((n_rows,) + tuple(trailing), np.float64)
    dense[rows] = data[:k]
    g = jsr.RowSparse._make(jnp.asarray(data), jnp.asarray(idx), (n_rows,) + tuple(trailing))
    return g, dense, rows


def grad_sequence(seed, n_steps, n_rows, trailing, capacity, empty_steps=(3, 7)):
    """``n_steps`` random gradients; the ``empty_steps`` have no real row."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n_steps):
        k = 0 if t in empty_steps else None
        out.append(random_rows(rng, n_rows, trailing, capacity, k=k))
    return out


def listed(data, rows, shape):
    """A hand-written gradient ``(RowSparse, dense numpy form, rows)`` listing ``rows``."""
    data = np.asarray(data, np.float64).reshape((len(rows),) + tuple(shape[1:]))
    dense = np.zeros(shape)
    dense[list(rows)] = data
    g = jsr.RowSparse(jnp.asarray(data, jnp.float32), jnp.asarray(rows, index_dtype()), shape=shape)
    return g, dense, np.asarray(rows, int)


def dense_step(dense):
    """A dense gradient ``(array, dense numpy form, every row)`` for the oracles."""
    dense = np.asarray(dense, np.float64)
    return jnp.asarray(dense, jnp.float32), dense, np.arange(dense.shape[0])


def run_steps(opt, params, grads, jit, *, apply=jsr.optim.apply_updates, count=None):
    """Runs ``opt`` over the list ``grads`` (each a pytree like params); with
    ``count``, every ``count`` field of the initial state is set to it."""

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return apply(p, u), s

    if jit:
        step = jax.jit(step)
    state = opt.init(params)
    if count is not None:
        state = otu.tree_set(state, count=jnp.asarray(count, jnp.int32))
    for g in grads:
        params, state = step(params, state, g)
    return params, state


def run_optax_on_dense(ref, params, grads, jit, count=None):
    """The reference: an optax optimizer fed the densified gradients of
    ``grad_sequence`` (float32), applied with ``optax.apply_updates``."""
    dense = [jnp.asarray(d, jnp.float32) for _, d, _ in grads]
    return run_steps(ref, params, dense, jit=jit, apply=optax.apply_updates, count=count)


INT32_MAX = 2**31 - 1


def step_count(start_count, t):
    """The count step ``t`` (from 0) sees in a run whose count starts at
    ``start_count``: it stays at int32's maximum once it gets there."""
    return min(start_count + t, INT32_MAX)


def limit_schedule(count):
    """A learning rate that changes at the last two counts below the int32
    limit (integer comparisons: float32 cannot tell counts near 2**31 apart)."""
    count = jnp.asarray(count)
    return jnp.where(count == INT32_MAX, 0.05, jnp.where(count == INT32_MAX - 1, 0.2, 0.1))


def step_lr(lr, start_count, t):
    """The learning rate of step ``t``: ``lr`` itself, or the schedule ``lr``
    at that step's count."""
    return float(lr(step_count(start_count, t))) if callable(lr) else lr


def counts_of(state):
    """Every ``count`` field of an optimizer state, as Python ints."""
    return [int(c) for _, c in otu.tree_get_all_with_path(state, "count")]


# Numpy oracles of the rules in docs/optimizers.md, in float64. ``grads`` is a
# list of ``(gradient, dense numpy gradient, processed rows)`` as `grad_sequence`
# gives (pass ``np.arange(V)`` as the rows of a dense gradient). Each returns
# the final weights and the state arrays.


def numpy_sgd(w, grads, lr, momentum, nesterov, wd, rescale, clip, lazy):
    w = np.array(w, np.float64)
    m = np.zeros_like(w)
    for _, dense, rows in grads:
        rr = rows if lazy else np.arange(w.shape[0])
        g = rescale * dense[rr]
        if clip is not None:
            g = np.clip(g, -clip, clip)
        g = g + wd * w[rr]
        m[rr] = momentum * m[rr] + g
        u = g + momentum * m[rr] if nesterov else m[rr]
        w[rr] -= lr * u
    return w, m


def numpy_adam(w, grads, lr, b1, b2, eps, eps_root, wd, lazy):
    """(Lazy) Adam/AdamW with the global step count; ``lr`` may be a callable."""
    w = np.array(w, np.float64)
    mu = np.zeros_like(w)
    nu = np.zeros_like(w)
    for t, (_, dense, rows) in enumerate(grads, start=1):
        rr = rows if lazy else np.arange(w.shape[0])
        g = dense[rr]
        mu[rr] = b1 * mu[rr] + (1 - b1) * g
        nu[rr] = b2 * nu[rr] + (1 - b2) * g**2
        u = (mu[rr] / (1 - b1**t)) / (np.sqrt(nu[rr] / (1 - b2**t) + eps_root) + eps)
        u = u + wd * w[rr]
        step = lr(t - 1) if callable(lr) else lr
        w[rr] -= step * u
    return w, mu, nu


def numpy_adagrad(w, grads, lr, init, eps):
    w = np.array(w, np.float64)
    acc = np.full_like(w, init)
    for _, dense, rows in grads:
        g = dense[rows]
        acc[rows] += g**2
        scale = np.where(acc[rows] > 0, 1 / np.sqrt(acc[rows] + eps), 0.0)
        w[rows] -= lr * scale * g
    return w, acc


def numpy_rowwise_adagrad(w, grads, lr, eps, wd, start_count=0):
    """One accumulator per row; a row whose denominator is 0 (eps = 0, zero
    gradients so far) gets a zero step; an empty row (D = 0) adds 0. ``lr``
    may be a schedule of the count, which starts at ``start_count``."""
    w = np.array(w, np.float64)
    acc = np.zeros(w.shape[0])
    row_size = max(1, int(np.prod(w.shape[1:])))
    for t, (_, dense, rows) in enumerate(grads):
        lr_t = step_lr(lr, start_count, t)
        g = dense[rows] + wd * w[rows]
        acc[rows] += np.sum(g**2, axis=tuple(range(1, g.ndim))) / row_size
        denom = (np.sqrt(acc[rows]) + eps).reshape((-1,) + (1,) * (w.ndim - 1))
        zero = np.broadcast_to(denom == 0, g.shape)
        w[rows] -= lr_t * np.divide(g, denom, out=np.zeros_like(g), where=~zero)
    return w, acc


def numpy_ftrl(w, grads, lr, lamda1, beta, wd, lazy=True, start_count=0):
    """``lr`` may be a schedule of the count, which starts at ``start_count``."""
    w = np.array(w, np.float64)
    z = np.zeros_like(w)
    n = np.zeros_like(w)
    for t, (_, dense, rows) in enumerate(grads):
        lr_t = step_lr(lr, start_count, t)
        rr = rows if lazy else np.arange(w.shape[0])
        g = dense[rr]
        z[rr] += g - (np.sqrt(n[rr] + g**2) - np.sqrt(n[rr])) * w[rr] / lr_t
        n[rr] += g**2
        new = (np.sign(z[rr]) * lamda1 - z[rr]) / ((beta + np.sqrt(n[rr])) / lr_t + wd)
        w[rr] = new * (np.abs(z[rr]) > lamda1)
    return w, z, n


# Every optimizer: name -> (factory, numpy oracle of the same hyperparameters,
# names of its state arrays in the order the oracle returns them).
ORACLES = {
    "sgd": (
        lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, weight_decay=0.1),
        lambda w, gs: numpy_sgd(w, gs, 0.1, 0.9, False, 0.1, 1.0, None, lazy=True),
        ("trace",),
    ),
    "adam": (
        lambda: jsr.optim.lazy_adam(0.1),
        lambda w, gs: numpy_adam(w, gs, 0.1, 0.9, 0.999, 1e-8, 0.0, 0.0, lazy=True),
        ("mu", "nu"),
    ),
    "adamw": (
        lambda: jsr.optim.lazy_adamw(0.1),
        lambda w, gs: numpy_adam(w, gs, 0.1, 0.9, 0.999, 1e-8, 0.0, 1e-4, lazy=True),
        ("mu", "nu"),
    ),
    "adagrad": (
        lambda: jsr.optim.lazy_adagrad(0.1),
        lambda w, gs: numpy_adagrad(w, gs, 0.1, 0.1, 1e-7),
        ("sum_of_squares",),
    ),
    "rowwise": (
        lambda: jsr.optim.lazy_rowwise_adagrad(0.1),
        lambda w, gs: numpy_rowwise_adagrad(w, gs, 0.1, 1e-8, 0.0),
        ("sum_of_squares",),
    ),
    "ftrl": (
        lambda: jsr.optim.lazy_ftrl(0.1),
        lambda w, gs: numpy_ftrl(w, gs, 0.1, 0.01, 1.0, 0.0),
        ("z", "n"),
    ),
}


def state_arrays(state, names):
    """The named arrays of an optimizer state (a chain's first element, or
    the state itself)."""
    inner = state if hasattr(state, names[0]) else state[0]
    return [getattr(inner, n) for n in names]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_apply_updates_matches_optax(dtype, jit_mode):
    rng = np.random.default_rng(1)
    g, dense, _ = random_rows(rng, 7, (3,), capacity=5, k=3)
    params = {"emb": jnp.asarray(rng.normal(size=(7, 3)), dtype), "b": jnp.ones(3, dtype)}
    updates = {"emb": g, "b": jnp.full(3, 0.5, jnp.float32)}
    ours = jit_mode(jsr.optim.apply_updates)(params, updates)
    theirs = jit_mode(optax.apply_updates)(params, updates)
    expected = np.asarray(params["emb"], np.float32) + dense.astype(np.float32)
    for k in params:
        assert ours[k].dtype == dtype
        np.testing.assert_array_equal(np.asarray(ours[k]), np.asarray(theirs[k]))
    np.testing.assert_allclose(
        np.asarray(ours["emb"], np.float32),
        np.asarray(jnp.asarray(expected).astype(dtype), np.float32),
    )


def test_apply_updates_padding_and_none():
    g = jsr.RowSparse._make(jnp.zeros((2, 2)), jnp.asarray([3, 3], index_dtype()), (3, 2))
    out = jsr.optim.apply_updates({"a": jnp.ones((3, 2)), "n": None}, {"a": g, "n": None})
    np.testing.assert_array_equal(np.asarray(out["a"]), np.ones((3, 2)))
    assert out["n"] is None


def test_apply_updates_shape_error_names_path():
    g = jsr.RowSparse([[1.0, 2.0]], [0], shape=(4, 2))
    with pytest.raises(ValueError, match=r"params\['layer'\]\['emb'\].*\(4, 2\).*\(3, 2\)"):
        jsr.optim.apply_updates({"layer": {"emb": jnp.ones((3, 2))}}, {"layer": {"emb": g}})
