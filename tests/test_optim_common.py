"""Shared helpers for the optimizer tests (random row sets, a training-loop
driver) and the tests of `jsr.optim.apply_updates`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows._util import index_dtype


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


def run_steps(opt, params, grads, jit, *, apply=jsr.optim.apply_updates):
    """Runs ``opt`` over the list ``grads`` (each a pytree like params)."""

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return apply(p, u), s

    if jit:
        step = jax.jit(step)
    state = opt.init(params)
    for g in grads:
        params, state = step(params, state, g)
    return params, state


def run_optax_on_dense(ref, params, grads, jit):
    """The reference: an optax optimizer fed the densified gradients of
    ``grad_sequence`` (float32), applied with ``optax.apply_updates``."""
    dense = [jnp.asarray(d, jnp.float32) for _, d, _ in grads]
    return run_steps(ref, params, dense, jit=jit, apply=optax.apply_updates)


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
