"""lazy_sgd(lazy="exact") and flush: equal to dense (lazy=False) SGD."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify
from test_optim_common import grad_sequence, run_steps

import jaxsparse_rows as jsr
from tests import strategies as sst

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


# -- catch_up: the rows a forward pass reads, current before it reads them ----


def _train(cfg, catch, seed, n_steps, jit=True, v=15, dtype=jnp.float32):
    """Trains ``{"emb": [v, 2], "h": [2]}`` on a loss whose gradient depends on
    the rows it reads, with exact lazy SGD (optionally ``catch_up`` first) and
    with optax's dense SGD; returns both parameter trees after ``flush``."""
    rng = np.random.default_rng(seed)
    params = {
        "emb": jnp.asarray(rng.normal(size=(v, 2)), dtype),
        "h": jnp.asarray(rng.normal(size=(2,)), dtype),
    }
    opt = jsr.optim.lazy_sgd(0.1, lazy="exact", **cfg)
    dense = optax.chain(
        optax.add_decayed_weights(cfg.get("weight_decay", 0.0)),
        optax.sgd(0.1, momentum=cfg.get("momentum"), nesterov=cfg.get("nesterov", False)),
    )

    def loss(p, ids):
        return jnp.sum(jnp.tanh(jsr.take(p["emb"], ids) @ p["h"]) ** 2)

    def step(p, s, ids):
        if catch:
            p, s = jsr.optim.catch_up(p, s, {"emb": ids, "h": None})
        view = dict(p, emb=jsr.pull_rows(p["emb"], ids))
        u, s = opt.update(jsr.grad(loss)(view, ids), s, p)
        return jsr.optim.apply_updates(p, u), s

    def dense_step(p, s, ids):
        u, s = dense.update(jax.grad(loss)(p, ids), s, p)
        return optax.apply_updates(p, u), s

    if jit:
        step, dense_step = jax.jit(step), jax.jit(dense_step)
    p, s, dp, ds = params, opt.init(params), params, dense.init(params)
    for _ in range(n_steps):
        # duplicates, and the padding id v, included
        ids = jnp.asarray(rng.integers(0, v + 1, (2, 2)), jnp.int32)
        p, s = step(p, s, ids)
        dp, ds = dense_step(dp, ds, ids)
    p, s = jsr.optim.flush(p, s)
    return p, dp


CATCH_UP_CASES = [
    (cfg, True) for cfg in CONFIGS[:2] + CONFIGS[4:] + [dict(momentum=0.5, weight_decay=0.1)]
] + [(CONFIGS[4], False)]


@pytest.mark.parametrize(("cfg", "jit"), CATCH_UP_CASES)
def test_catch_up_makes_weight_dependent_training_equal_dense(cfg, jit):
    n_steps = 30 if jit else 4
    with jax.enable_x64(True):  # float64 separates float error from a missed step
        p, dp = _train(cfg, True, 3, n_steps, jit, dtype=jnp.float64)
        for k in p:
            np.testing.assert_allclose(np.asarray(p[k]), np.asarray(dp[k]), rtol=1e-10, atol=1e-12)
        # Without catch_up the gradients are taken at stale rows: the test's
        # loss really depends on the rows it reads.
        stale, dp = _train(cfg, False, 3, n_steps, jit, dtype=jnp.float64)
        assert np.max(np.abs(np.asarray(stale["emb"]) - np.asarray(dp["emb"]))) > 1e-4


@settings(max_examples=sst.examples(8), deadline=None)
@given(seed=st.integers(0, 2**16), v=st.integers(1, 12), n_steps=st.integers(1, 8))
def test_catch_up_property(seed, v, n_steps):
    p, dp = _train(dict(momentum=0.9, weight_decay=0.01), True, seed, n_steps, v=v)
    for k in p:
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(dp[k]), rtol=2e-4, atol=2e-5)


def test_catch_up_inside_multi_transform_and_on_a_bare_array():
    w = jnp.arange(8.0).reshape(4, 2)
    exact = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")
    tx = optax.multi_transform({"e": exact, "d": optax.sgd(0.1)}, {"emb": "e", "h": "d"})
    params = {"emb": w, "h": jnp.ones(2)}
    s = tx.init(params)
    g = {"emb": jsr.RowSparse([[1.0, 1.0]], [1], shape=(4, 2)), "h": jnp.ones(2)}
    for _ in range(3):  # row 1 touched three times, then left alone
        u, s = tx.update(g, s, params)
        params = jsr.optim.apply_updates(params, u)
    g = {"emb": jsr.RowSparse([[0.0, 0.0]], [3], shape=(4, 2)), "h": jnp.zeros(2)}
    for _ in range(2):  # two steps that skip row 1
        u, s = tx.update(g, s, params)
        params = jsr.optim.apply_updates(params, u)
    flushed, _ = jsr.optim.flush(params, s)
    caught, s2 = jsr.optim.catch_up(params, s, {"emb": jnp.array([1, 1, 4]), "h": None})
    np.testing.assert_allclose(np.asarray(caught["emb"]), np.asarray(flushed["emb"]), rtol=1e-6)
    assert not np.allclose(np.asarray(params["emb"])[1], np.asarray(flushed["emb"])[1])
    # Caught-up rows are current: the next update replays nothing for them.
    last = s2.inner_states["e"].inner_state.last_step["emb"]
    np.testing.assert_array_equal(np.asarray(last), [0, 5, 0, 5])
    np.testing.assert_array_equal(np.asarray(caught["h"]), np.asarray(params["h"]))
    # A single array of parameters takes a single id array.
    s = exact.init(w)
    u, s = exact.update(jsr.RowSparse([[1.0, 1.0]], [0], shape=(4, 2)), s, w)
    w1 = jsr.optim.apply_updates(w, u)
    u, s = exact.update(jsr.RowSparse([[0.0, 0.0]], [2], shape=(4, 2)), s, w1)
    w2 = jsr.optim.apply_updates(w1, u)
    want, _ = jsr.optim.flush(w2, s)
    got, _ = jax.jit(jsr.optim.catch_up)(w2, s, jnp.array([0]))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_catch_up_bad_input():
    w = jnp.zeros((4, 2))
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")
    s = opt.init({"emb": w})
    with pytest.raises(ValueError, match=r"`ids` must have the structure of `params`"):
        jsr.optim.catch_up({"emb": w}, s, {"other": jnp.array([0])})
    with pytest.raises(ValueError, match=r"`ids\['emb'\]` must lie in \[0, 4\)"):
        jsr.optim.catch_up({"emb": w}, s, {"emb": jnp.array([7])})
    with pytest.raises(TypeError, match=r"`ids\['emb'\]` must have an integer dtype"):
        jsr.optim.catch_up({"emb": w}, s, {"emb": jnp.array([0.5])})
    # Empty ids: nothing to do, nothing changed.
    out, s2 = jsr.optim.catch_up({"emb": w}, s, {"emb": jnp.zeros((0,), jnp.int32)})
    assert out["emb"] is w and s2.last_step["emb"] is s.last_step["emb"]
    # Another optimizer's state holds nothing to catch up: refused, not ignored.
    st_adam = jsr.optim.lazy_adam(0.1).init({"emb": w})
    with pytest.raises(ValueError, match="contains no ExactLazySgdState"):
        jsr.optim.catch_up({"emb": w}, st_adam, {"emb": jnp.array([1])})


def _stale_exact_state(v=6, d=2, wrap=lambda x: x):
    """Exact-SGD parameters ``wrap(w)`` whose rows 1..v-1 owe different numbers
    of skipped steps (row 0 is current), their state, and what `flush` makes
    of them."""
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, weight_decay=0.1, lazy="exact")
    w = wrap(jnp.asarray(np.random.default_rng(5).normal(size=(v, d)), jnp.float32))
    s = opt.init(w)
    for r in [*range(v), 0, 0, 0]:
        g = wrap(jsr.RowSparse(jnp.ones((1, d)), [r], shape=(v, d)))
        u, s = opt.update(g, s, w)
        w = jsr.optim.apply_updates(w, u)
    flushed, _ = jsr.optim.flush(w, s)
    return w, s, flushed


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint32"])
def test_catch_up_under_jit_ignores_out_of_range_ids_as_padding(dtype):
    """Eagerly an id outside [0, V] is refused; under jit it cannot be seen and
    is treated as padding, as by `take` and `pull_rows`: it touches no row
    (a negative id is not wrapped to row V - 1), and the valid ids beside it
    are caught up as usual. Checked against a numpy oracle of which rows move."""
    v = 6
    w, s, flushed = _stale_exact_state(v)
    stale = ~np.isclose(np.asarray(flushed), np.asarray(w)).all(axis=1)
    np.testing.assert_array_equal(stale, [False] + [True] * (v - 1))  # a catch-up shows
    fn = jax.jit(jsr.optim.catch_up)
    info = np.iinfo(dtype)
    cases = [[-1], [-v], [v], [v + 1], [info.max], [info.min], [-1, 3, 7, 3], [2, -5, 6, 4]]
    for raw in cases:
        ids = np.asarray(raw).astype(dtype)  # wraps negatives for unsigned dtypes, as a user's cast
        got, s2 = fn(w, s, jnp.asarray(ids))
        rows = ids.astype(np.int64)
        touched = np.zeros(v, bool)
        touched[rows[(rows >= 0) & (rows < v)]] = True
        want = np.where(touched[:, None], np.asarray(flushed), np.asarray(w))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=str(ids))
        last = np.where(touched, int(s.count), np.asarray(s.last_step))
        np.testing.assert_array_equal(np.asarray(s2.last_step), last, err_msg=str(ids))
        trace = np.asarray(s2.trace)[~touched]
        np.testing.assert_array_equal(trace, np.asarray(s.trace)[~touched], err_msg=str(ids))


def test_catch_up_out_of_range_ids_are_refused_eagerly_and_found_by_checkify():
    params, s, _ = _stale_exact_state(4, wrap=lambda x: {"emb": x})
    w = params["emb"]
    state = (optax.EmptyState(), s)  # inside a chain's state
    for bad in ([-1], [0, 5], [[1, 2], [-3, 0]]):
        with pytest.raises(ValueError, match=r"`ids\['emb'\]` must lie in \[0, 4\)"):
            jsr.optim.catch_up(params, state, {"emb": jnp.asarray(bad)})

    def step(params, state, ids):
        jsr.check_ids(ids["emb"], params["emb"].shape[0])
        return jsr.optim.catch_up(params, state, ids)

    checked = checkify.checkify(jax.jit(step))
    err, (got, _) = checked(params, state, {"emb": jnp.array([-1, -4])})
    assert "`ids` must lie in [0, 4) (or equal 4, the padding id)" in err.get()
    np.testing.assert_array_equal(np.asarray(got["emb"]), np.asarray(w))  # nothing moved
    err, _ = checked(params, state, {"emb": jnp.array([1, 4])})
    assert err.get() is None


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(
    "cfg", [dict(momentum=0.9), dict(weight_decay=0.1), dict(momentum=0.5, weight_decay=0.2)]
)
def test_a_none_gradient_is_not_replayed(cfg, jit):
    """A None gradient leaves its parameter (and momentum) as they are with
    lazy=False; exact mode counted the step for its rows and replayed it at
    the next flush (0.6561 against 0.9 with momentum 0.9)."""
    p0 = {"a": jnp.ones((3, 1)), "b": jnp.ones((3, 1))}

    def rows(ids):
        return jsr.RowSparse(jnp.ones((len(ids), 1)), np.array(ids), shape=(3, 1))

    seq = [
        {"a": rows([0, 1, 2]), "b": rows([0, 1, 2])},
        {"a": rows([0, 1, 2]), "b": None},
        {"a": rows([0, 1, 2]), "b": rows([0])},
        {"a": rows([1]), "b": None},
        {"a": rows([2]), "b": None},
    ]

    def run(opt):
        p, s = p0, opt.init(p0)
        for g in seq:
            update = jax.jit(opt.update) if jit else opt.update
            u, s = update(g, s, p)
            p = jsr.optim.apply_updates(p, u)
        return p, s

    want, _ = run(jsr.optim.lazy_sgd(0.1, lazy=False, **cfg))
    got, state = run(jsr.optim.lazy_sgd(0.1, lazy="exact", **cfg))
    got, _ = jsr.optim.flush(got, state)
    for name in ("a", "b"):
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), atol=1e-6)
    assert not np.allclose(np.asarray(want["b"])[1:], 1.0)  # the steps did move "b"


def test_exact_keeps_the_precision_of_wide_momentum():
    """bfloat16 parameters with float32 momentum (init from a float32 shape):
    exact mode computed in bfloat16 and rounded the momentum every step
    (an error of 8.5e-4 against 1.3e-8 for lazy=False)."""
    v, d = 4, 8
    rng = np.random.default_rng(0)
    w0 = jnp.asarray(rng.normal(size=(v, d)), jnp.bfloat16)
    grads = [jnp.asarray(rng.normal(size=(v, d)) * 1e-2, jnp.bfloat16) for _ in range(50)]
    wide = jax.ShapeDtypeStruct((v, d), jnp.float32)

    def run(opt):
        w, s = w0, opt.init(wide)
        for g in grads:
            u, s = opt.update(jsr.RowSparse(g, np.arange(v), shape=(v, d)), s, w)
            w = jsr.optim.apply_updates(w, u)
        return w, s

    want = np.zeros((v, d))
    for g in grads:
        want = 0.9 * want + np.asarray(g, np.float64)
    w_exact, s_exact = run(jsr.optim.lazy_sgd(0.1, momentum=0.9, lazy="exact"))
    w_dense, _ = run(jsr.optim.lazy_sgd(0.1, momentum=0.9, lazy=False))
    assert s_exact.trace.dtype == jnp.float32 and w_exact.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(s_exact.trace), want, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(w_exact), np.asarray(w_dense))
    # flush and catch_up keep it too
    w_f, s_f = jsr.optim.flush(w_exact, s_exact)
    np.testing.assert_allclose(np.asarray(s_f.trace), want, atol=1e-6)
    w_c, s_c = jsr.optim.catch_up(w_exact, s_exact, jnp.arange(v))
    np.testing.assert_allclose(np.asarray(s_c.trace), want, atol=1e-6)


def test_state_repr_labels_the_hyperparameters():
    state = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact").init(jnp.zeros((2, 1)))
    text = repr(state.hparams)
    assert (
        text == "StaticHparams(learning_rate=0.1, momentum=0.5, nesterov=False, weight_decay=0.0)"
    )
    assert text in repr(state)


# -- the int32 step count at its limit -----------------------------------------

INT32_MAX = 2**31 - 1

LIMIT_CONFIGS = [
    dict(momentum=0.9, weight_decay=0.1),
    dict(momentum=0.7, nesterov=True, weight_decay=0.05),
    dict(weight_decay=0.2),
]


def _dense_sgd_at_limit(cfg, w0, m0, grads, start):
    """The oracle: optax's dense SGD (coupled weight decay added to the
    gradient first, as lazy_sgd adds it) started from weights ``w0`` and
    momentum ``m0``, fed the densified gradients. A step taken while the
    count is below int32's maximum moves every row, as in dense SGD; a step
    taken once the count stays at the maximum is owed only by the rows its
    gradient lists, so the others keep their weights and momentum."""
    ref = optax.chain(
        optax.add_decayed_weights(cfg["weight_decay"]),
        optax.sgd(0.1, momentum=cfg.get("momentum"), nesterov=cfg.get("nesterov", False)),
    )
    w, s = jnp.asarray(w0), ref.init(jnp.asarray(w0))
    if cfg.get("momentum"):
        s = optax.tree_utils.tree_set(s, trace=jnp.asarray(m0))
    for t, g in enumerate(grads):
        dense = jsr.todense(g)
        u, s_new = ref.update(dense, s, w)
        w_new = optax.apply_updates(w, u)
        if start + t >= INT32_MAX:
            listed = np.zeros((w.shape[0], 1), bool)
            listed[[i for i in np.asarray(g.indices) if i < w.shape[0]]] = True
            w_new = jnp.where(listed, w_new, w)
            s_new = jax.tree.map(lambda new, old, ok=listed: jnp.where(ok, new, old), s_new, s)
        w, s = w_new, s_new
    m = optax.tree_utils.tree_get(s, "trace") if cfg.get("momentum") else None
    return np.asarray(w), None if m is None else np.asarray(m)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("cfg", LIMIT_CONFIGS)
def test_exact_count_saturates_at_the_int32_limit(cfg, jit):
    """Counts set to 2**31 - 4 and five steps: the count stops at 2**31 - 1
    (optax.safe_increment) and no row's `last_step` passes it or wraps (a
    counter wrapped to -2**31 would make `flush` replay about 2**31 steps)."""
    v, start = 4, INT32_MAX - 3
    rng = np.random.default_rng(7)
    w0 = jnp.asarray(rng.normal(size=(v, 2)), jnp.float32)
    m0 = jnp.asarray(rng.normal(size=(v, 2)), jnp.float32)

    def rows(ids):
        data = rng.normal(size=(len(ids), 2)) * (np.asarray(ids) < v)[:, None]  # padding: 0
        return jsr.RowSparse(jnp.asarray(data, jnp.float32), jnp.asarray(ids), shape=(v, 2))

    # Three counted steps, then two at the limit: rows 1 and 3 owe counted
    # steps when first listed at the limit, row 2 is never listed there.
    grads = [rows([0, 1]), rows([2]), rows([0]), rows([1, 3]), rows([0, v])]
    opt = jsr.optim.lazy_sgd(0.1, lazy="exact", **cfg)

    def state_at_start():
        s = opt.init(w0)
        return s._replace(
            count=jnp.asarray(start, jnp.int32),
            trace=m0 if cfg.get("momentum") else s.trace,
            last_step=jnp.full((v,), start, jnp.int32),
        )

    def step(w, s, g):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    step = jax.jit(step) if jit else step
    w, s = w0, state_at_start()
    for t, g in enumerate(grads):
        w, s = step(w, s, g)
        assert int(s.count) == min(start + t + 1, INT32_MAX)
        last = np.asarray(s.last_step)
        assert np.all((last >= start) & (last <= int(s.count))), last
    flush = jax.jit(jsr.optim.flush) if jit else jsr.optim.flush
    w, s = flush(w, s)
    want_w, want_m = _dense_sgd_at_limit(cfg, w0, m0, grads, start)
    assert np.all(np.isfinite(np.asarray(w)))
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=2e-5, atol=2e-6)
    if want_m is not None:
        np.testing.assert_allclose(np.asarray(s.trace), want_m, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(s.last_step), INT32_MAX)
    # Every row listed at every step: no step is skipped by any row, and the
    # result is dense SGD's over all five steps, the limit included.
    full = [rows(list(range(v))) for _ in range(5)]
    w, s = w0, state_at_start()
    for g in full:
        w, s = step(w, s, g)
    want_w, _ = _dense_sgd_at_limit(cfg, w0, m0, full, start)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("jit", [False, True])
def test_exact_none_gradient_and_catch_up_at_the_int32_limit(jit):
    """A parameter with a None gradient keeps the steps it owed from before
    the limit and owes none of the later ones: its counter moves with the
    count and stops with it, never past 2**31 - 1. `catch_up` at the limit
    brings rows up to the saturated count."""
    v, start = 3, INT32_MAX - 2
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, weight_decay=0.1, lazy="exact")
    rng = np.random.default_rng(8)
    params = {k: jnp.asarray(rng.normal(size=(v, 1)), jnp.float32) for k in ("a", "b")}
    s = opt.init(params)
    # "b"'s rows owe 2 steps (and "a"'s none) when the run starts.
    s = s._replace(
        count=jnp.asarray(start, jnp.int32),
        last_step={
            "a": jnp.full((v,), start, jnp.int32),
            "b": jnp.full((v,), start - 2, jnp.int32),
        },
    )
    want_b, _ = jsr.optim.flush(params, s)
    g = {"a": jsr.RowSparse([[1.0]], [0], shape=(v, 1)), "b": None}
    update = jax.jit(opt.update) if jit else opt.update
    p = params
    for _ in range(4):  # two counted steps, two at the limit
        u, s = update(g, s, p)
        p = jsr.optim.apply_updates(p, u)
    assert int(s.count) == INT32_MAX
    np.testing.assert_array_equal(np.asarray(s.last_step["b"]), INT32_MAX - 2)
    np.testing.assert_array_equal(np.asarray(p["b"]), np.asarray(params["b"]))
    flushed, _ = jsr.optim.flush(p, s)
    np.testing.assert_allclose(np.asarray(flushed["b"]), np.asarray(want_b["b"]), rtol=1e-6)
    # Rows 1 and 2 of "a" owe the two counted steps; catch_up at the limit
    # brings them to what flush gives.
    catch = jax.jit(jsr.optim.catch_up) if jit else jsr.optim.catch_up
    caught, s2 = catch(p, s, {"a": jnp.array([1, 2]), "b": None})
    np.testing.assert_allclose(np.asarray(caught["a"]), np.asarray(flushed["a"]), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(s2.last_step["a"]), INT32_MAX)
    assert np.all(np.isfinite(np.asarray(caught["a"])))
