"""Mixed precision: bfloat16 / float16 parameters with float32 optimizer state
(``mu_dtype``, or state initialised from float32 shapes), against optax run
on the same values (every row listed, where lazy equals dense)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr

V, D = 6, 3


def _all_rows(g):
    """The dense gradient as a RowSparse listing every row."""
    return jsr.RowSparse(g, jnp.arange(g.shape[0]), g.shape)


def _grads(dtype, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=(V, D)), dtype) for _ in range(n)]


def _params(dtype, seed=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(V, D)), dtype)


def _f32_shapes(params):
    return jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32), params)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("make", ["lazy_adam", "lazy_adamw"])
def test_mu_dtype_follows_optax(jit_mode, dtype, make):
    """``mu_dtype`` as in ``optax.adam``: float32 first moments, second
    moments and parameters in the parameters' dtype; equal to optax when
    every row is listed."""
    kw = {"weight_decay": 0.1} if make == "lazy_adamw" else {}
    ours = getattr(jsr.optim, make)(0.05, mu_dtype=jnp.float32, **kw)
    ref = getattr(optax, make.removeprefix("lazy_"))(0.05, mu_dtype=jnp.float32, **kw)
    p = q = _params(dtype)
    s, rs = ours.init(p), ref.init(q)
    assert s[0].mu.dtype == jnp.float32 and s[0].nu.dtype == dtype

    def step(opt, apply, wrap):
        return jit_mode(lambda p, s, g: (lambda u, s: (apply(p, u), s))(*opt.update(wrap(g), s, p)))

    ours_step = step(ours, jsr.optim.apply_updates, _all_rows)
    ref_step = step(ref, optax.apply_updates, lambda g: g)
    for g in _grads(dtype):
        p, s = ours_step(p, s, g)
        q, rs = ref_step(q, rs, g)
        assert p.dtype == dtype and s[0].mu.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(p, np.float32), np.asarray(q, np.float32))
    np.testing.assert_array_equal(np.asarray(s[0].mu), np.asarray(rs[0].mu))


REFERENCES = {
    "lazy_adam": (lambda: jsr.optim.lazy_adam(0.05), lambda: optax.adam(0.05)),
    "lazy_sgd": (
        lambda: jsr.optim.lazy_sgd(0.05, momentum=0.9),
        lambda: optax.sgd(0.05, momentum=0.9),
    ),
    "lazy_adagrad": (
        lambda: jsr.optim.lazy_adagrad(0.05, initial_accumulator_value=0.1),
        lambda: optax.adagrad(0.05, initial_accumulator_value=0.1),
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_float32_state_from_shapes_with_bfloat16_params(name):
    """State initialised from float32 shapes (no float32 copy of the table),
    bfloat16 parameters: jitted, donated steps keep both dtypes and equal
    optax initialised the same way."""
    ours, ref = (f() for f in REFERENCES[name])
    p, q = _params(jnp.bfloat16), _params(jnp.bfloat16)  # p is donated
    s, rs = ours.init(_f32_shapes(p)), ref.init(_f32_shapes(q))

    @jax.jit
    def ref_step(q, rs, g):
        u, rs = ref.update(g, rs, q)
        return optax.apply_updates(q, u), rs

    step = jax.jit(
        lambda p, s, g: (lambda u, s: (jsr.optim.apply_updates(p, u), s))(*ours.update(g, s, p)),
        donate_argnums=(0, 1),
    )
    for g in _grads(jnp.bfloat16):
        p, s = step(p, s, _all_rows(g))
        q, rs = ref_step(q, rs, g)
        assert p.dtype == jnp.bfloat16
        assert {x.dtype for x in jax.tree.leaves(s) if x.ndim == 2} == {np.dtype(np.float32)}
        np.testing.assert_array_equal(np.asarray(p, np.float32), np.asarray(q, np.float32))


@pytest.mark.parametrize(
    "make",
    [
        lambda: jsr.optim.lazy_adam(0.05, mu_dtype=jnp.float32),
        lambda: jsr.optim.lazy_sgd(0.05, momentum=0.9),
        lambda: jsr.optim.lazy_adagrad(0.05),
        lambda: jsr.optim.lazy_rowwise_adagrad(0.05),
        lambda: jsr.optim.lazy_ftrl(0.05),
    ],
)
def test_untouched_bfloat16_rows_stay_bitwise_equal(make):
    """A float32 update of a bfloat16 table changes only the listed rows."""
    opt = make()
    p = _params(jnp.bfloat16)
    s = opt.init(_f32_shapes(p))
    g = jsr.RowSparse(jnp.ones((2, D), jnp.bfloat16), jnp.array([1, 4]), (V, D))
    u, s = jax.jit(opt.update)(g, s, p)
    out = jax.jit(jsr.optim.apply_updates)(p, u)
    assert out.dtype == jnp.bfloat16
    same = np.asarray(out, np.float32) == np.asarray(p, np.float32)
    np.testing.assert_array_equal(same.all(axis=1), [True, False, True, True, False, True])


def test_mu_dtype_is_checked():
    with pytest.raises(TypeError):
        jsr.optim.lazy_adam(0.1, mu_dtype="not a dtype")
