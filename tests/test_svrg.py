"""jsr.svrg: the full gradient and the corrected gradient against numpy
formulas (dense and row-sparse gradients, eager and jitted), one compilation
per step, and SVRG beating SGD on least squares."""

from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows.io import CSRIter


def make_problem(seed=0, n=60, k=12, density=0.3, noise=0.5):
    x = jsr.random.csr(jax.random.key(seed), (n, k), density, minval=-1.0, maxval=1.0)
    dense = np.asarray(x.todense(), np.float64)
    rng = np.random.default_rng(seed)
    y = (dense @ np.arange(1.0, k + 1) + noise * rng.standard_normal(n)).astype(np.float32)
    return x, dense, y


def grad_fn(params, batch):
    """Mean squared-error gradient over the real rows; row-sparse for ``w``."""
    w_rows = jsr.pull_rows(params["w"], batch.x.indices)

    def loss(w_rows, b):
        pred = jsr.dot(batch.x, w_rows)[:, 0] + b
        resid = jnp.where(batch.mask, pred - batch.y, 0.0)
        return 0.5 * jnp.sum(resid**2) / batch.num_rows

    g_w, g_b = jsr.grad(loss, argnums=(0, 1))(w_rows, params["b"])
    return {"w": g_w, "b": g_b}


def dense_grad_fn(params, batch):
    """The same gradient with dense leaves (plain jax.grad)."""

    def loss(p):
        pred = jsr.dot(batch.x, p["w"])[:, 0] + p["b"]
        resid = jnp.where(batch.mask, pred - batch.y, 0.0)
        return 0.5 * jnp.sum(resid**2) / batch.num_rows

    return jax.grad(loss)(params)


def np_grad(w, b, dense, y):
    """Numpy oracle: mean gradient of 0.5 (x.w + b - y)^2 over the given rows."""
    r = dense @ w[:, 0] + b - y
    return (dense.T @ r / len(y))[:, None], r.mean()


def params_at(k, seed):
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.standard_normal((k, 1)), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(), jnp.float32),
    }


@pytest.mark.parametrize("fn", [grad_fn, dense_grad_fn])
def test_full_gradient_is_the_mean_over_all_rows(fn):
    x, dense, y = make_problem()
    params = params_at(12, 1)
    batches = CSRIter(x, y, 8, last_batch="pad", nnz_buckets=[64])  # 60 = 7 * 8 + 4: padded
    mu = jsr.svrg.full_gradient(fn, params, batches)
    gw, gb = np_grad(np.asarray(params["w"], np.float64), float(params["b"]), dense, y)
    assert isinstance(mu["w"], jax.Array)  # densified once, dense result
    np.testing.assert_allclose(mu["w"], gw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mu["b"], gb, rtol=1e-4, atol=1e-5)


def test_full_gradient_needs_a_batch():
    with pytest.raises(ValueError, match="no batch"):
        jsr.svrg.full_gradient(grad_fn, params_at(3, 0), [])


@pytest.mark.parametrize("lazy", [False, True])
def test_corrected_gradient_matches_hand_formula(jit_mode, lazy):
    x, dense, y = make_problem(seed=2)
    w, w_snap = params_at(12, 3), params_at(12, 4)
    batches = CSRIter(x, y, 10, nnz_buckets=[64])
    mu = jsr.svrg.full_gradient(grad_fn, w_snap, batches)
    batch = next(iter(batches))
    g = jit_mode(lambda p, s, m, b: jsr.svrg.corrected_gradient(grad_fn, p, s, m, b, lazy))(
        w, w_snap, mu, batch
    )
    rows = slice(0, 10)
    gw_w, gw_b = np_grad(np.asarray(w["w"], np.float64), float(w["b"]), dense[rows], y[rows])
    gs_w, gs_b = np_grad(
        np.asarray(w_snap["w"], np.float64), float(w_snap["b"]), dense[rows], y[rows]
    )
    mu_w, mu_b = np.asarray(mu["w"], np.float64), float(mu["b"])
    want_w = gw_w - gs_w + mu_w
    np.testing.assert_allclose(g["b"], gw_b - gs_b + mu_b, rtol=1e-4, atol=1e-5)
    if not lazy:
        assert not isinstance(g["w"], jsr.RowSparse)
        np.testing.assert_allclose(g["w"], want_w, rtol=1e-4, atol=1e-5)
    else:
        assert isinstance(g["w"], jsr.RowSparse)
        touched = np.unique(np.asarray(batch.x.indices)[: int(batch.x.nnz)])
        want_lazy = np.zeros_like(want_w)
        want_lazy[touched] = want_w[touched]  # mu only on the batch's rows
        np.testing.assert_allclose(g["w"].asnumpy(), want_lazy, rtol=1e-4, atol=1e-5)


def test_corrected_gradient_storage_mismatch():
    x, _, y = make_problem()
    batch = next(iter(CSRIter(x, y, 10)))
    params = params_at(12, 0)
    mixed = lambda p, b: grad_fn(p, b) if p is params else dense_grad_fn(p, b)
    mu = jax.tree.map(jnp.zeros_like, params)
    with pytest.raises(TypeError, match="same storage"):
        jsr.svrg.corrected_gradient(mixed, params, params_at(12, 1), mu, batch)


def test_step_compiles_once_and_fit_calls_back():
    x, _, y = make_problem(n=64)
    batches = CSRIter(x, y, 16, nnz_buckets=[512])  # one bucket: one shape
    step = jsr.svrg.make_step(grad_fn, optax.sgd(0.1))
    params = params_at(12, 0)
    state = jsr.svrg.take_snapshot(jsr.svrg.init(params, optax.sgd(0.1)), params, grad_fn, batches)
    for batch in batches:
        params, state = step(params, state, batch)
    assert step._cache_size() == 1
    seen = []
    jsr.svrg.fit(
        grad_fn,
        optax.sgd(0.1),
        params_at(12, 0),
        batches,
        3,
        update_freq=2,
        callback=lambda e, p: seen.append(e),
    )
    assert seen == [0, 1, 2]
    with pytest.raises(ValueError, match="update_freq"):
        jsr.svrg.fit(grad_fn, optax.sgd(0.1), params_at(12, 0), batches, 1, update_freq=0)


def mse(params, dense, y):
    pred = dense @ np.asarray(params["w"], np.float64)[:, 0] + float(params["b"])
    return float(np.mean((pred - y) ** 2))


def test_svrg_beats_sgd_on_least_squares():
    x, dense, y = make_problem(seed=5, n=100, k=10, density=0.5, noise=1.0)
    batches = CSRIter(x, y, 5, shuffle=True, seed=0, nnz_buckets=[64])
    lr, epochs = 0.3, 10
    # SGD: the same gradient, step size and epochs, no variance reduction
    # (row-sparse gradients need a lazy optimizer: optax.sgd would scale the indices)
    sgd = jsr.optim.lazy_sgd(lr)
    sgd_step = jax.jit(lambda p, s, b: _sgd_update(p, s, b, sgd), donate_argnums=(0, 1))
    p_sgd, s_sgd = params_at(10, 0), sgd.init(params_at(10, 0))
    for _ in range(epochs):
        for batch in batches:
            p_sgd, s_sgd = sgd_step(p_sgd, s_sgd, batch)
    p_svrg, _ = jsr.svrg.fit(grad_fn, optax.sgd(lr), params_at(10, 0), batches, epochs)
    # the least-squares optimum, for the excess loss
    design = np.c_[dense, np.ones(len(y))]
    sol = np.linalg.lstsq(design, y, rcond=None)[0]
    best = float(np.mean((design @ sol - y) ** 2))
    sgd_excess = mse(p_sgd, dense, y) - best
    svrg_excess = mse(p_svrg, dense, y) - best
    assert svrg_excess < sgd_excess / 10, (svrg_excess, sgd_excess)


def _sgd_update(params, state, batch, opt):
    g = grad_fn(params, batch)
    updates, state = opt.update(g, state, params)
    return jsr.optim.apply_updates(params, updates), state


def test_full_gradient_keeps_dtype_and_sums_in_float32():
    grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
    batches = [jnp.full((3,), v, jnp.bfloat16) for v in np.linspace(0.0, 1.0, 200)]
    mu = jsr.svrg.full_gradient(grad_fn, jnp.zeros((3,), jnp.bfloat16), batches)
    assert mu.dtype == jnp.bfloat16
    want = -2.0 / 3 * np.mean([float(b[0]) for b in batches])  # d/dw mean over 3 entries
    np.testing.assert_allclose(np.asarray(mu, np.float32), want, rtol=1e-2)


def test_fit_callback_may_keep_the_params_it_gets():
    """The step donates params; the callback's copies must outlive the next epochs
    and equal the params after each epoch."""
    grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
    batches = [jnp.array([1.0]), jnp.array([3.0])]
    kept = []
    w, _ = jsr.svrg.fit(
        grad_fn, optax.sgd(0.4), jnp.zeros(()), batches, 3, callback=lambda e, p: kept.append(p)
    )
    values = [float(p) for p in kept]  # raised "Array has been deleted" before
    assert len(values) == 3 and values[-1] == float(w)
    assert values[0] != values[1]


def _scalar_grad(w, b):
    return jax.grad(lambda w: jnp.mean((w - b) ** 2))(w)


def test_fit_refuses_a_one_shot_iterator_and_keeps_re_iterables():
    """A generator was used up by the first snapshot: fit trained zero steps."""
    data = [jnp.array([1.0]), jnp.array([3.0])]
    with pytest.raises(TypeError, match=r"`batches` must be a re-iterable.*one-shot iterator"):
        jsr.svrg.fit(_scalar_grad, optax.sgd(0.4), jnp.zeros(()), (b for b in data), 1)
    with pytest.raises(TypeError, match="`batches` must be a re-iterable"):
        jsr.svrg.fit(_scalar_grad, optax.sgd(0.4), jnp.zeros(()), iter(data), 1)
    # a tuple still trains: mu = -4; steps 0 -> 1.6 -> 1.92 (a list is tested above)
    w, _ = jsr.svrg.fit(_scalar_grad, optax.sgd(0.4), jnp.zeros(()), tuple(data), 1)
    np.testing.assert_allclose(float(w), 1.92, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"num_epochs": -1}, ValueError, r"`num_epochs` must be an int >= 0, got -1"),
        ({"num_epochs": 2.0}, TypeError, r"`num_epochs` must be an int >= 0, got float 2.0"),
        ({"num_epochs": True}, TypeError, r"`num_epochs` .*got bool True"),
        ({"update_freq": 0}, ValueError, r"`update_freq` must be an int >= 1, got 0"),
        ({"update_freq": True}, TypeError, r"`update_freq` .*got bool True"),
    ],
)
def test_fit_checks_its_counts(kwargs, exc, match):
    """``update_freq=True`` is refused rather than run as 1, and
    ``num_epochs=2.0`` with a message that says more than "not an int"."""
    data = [jnp.array([1.0]), jnp.array([3.0])]
    kwargs = {"num_epochs": 1, **kwargs}
    with pytest.raises(exc, match=match):
        jsr.svrg.fit(_scalar_grad, optax.sgd(0.4), jnp.zeros(()), data, **kwargs)


def test_fit_takes_numpy_counts():
    data = [jnp.array([1.0]), jnp.array([3.0])]
    w, _ = jsr.svrg.fit(
        _scalar_grad, optax.sgd(0.4), jnp.zeros(()), data, np.int64(1), update_freq=np.int32(1)
    )
    np.testing.assert_allclose(float(w), 1.92, rtol=1e-6)


def test_optimizer_that_is_not_a_gradient_transformation_is_named():
    with pytest.raises(TypeError, match=r"`optimizer` must be an optax GradientTransformation"):
        jsr.svrg.init(jnp.zeros(2), 0.1)
    with pytest.raises(TypeError, match=r"`optimizer`.*got float 0.1"):
        jsr.svrg.make_step(_scalar_grad, 0.1)


def _rows_grad(table, ids):
    """Row-sparse gradient of the sum of the pulled rows."""
    return jsr.grad(lambda view: jnp.sum(view.data))(jsr.pull_rows(table, ids))


@pytest.mark.parametrize("lazy", [False, True])
def test_corrected_gradient_checks_full_grad_shapes(lazy):
    """A wrong-shape mu was broadcast, returned a wrong-shape gradient, or was
    read as zeros (lazy); the check names `full_grad`, the path and both shapes."""
    table, ids = {"emb": jnp.ones((5, 2))}, jnp.array([1, 3])
    for bad in ((1, 2), (7, 2)):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"`full_grad['emb']` has shape {bad}, but the parameter `params['emb']` "
                "has shape (5, 2)"
            ),
        ):
            jsr.svrg.corrected_gradient(
                lambda p, b: {"emb": _rows_grad(p["emb"], b)},
                table,
                table,
                {"emb": jnp.ones(bad)},
                ids,
                lazy=lazy,
            )
    with pytest.raises(ValueError, match=r"`full_grad` has shape \(1,\).*\(3,\)"):
        jsr.svrg.corrected_gradient(_scalar_grad, jnp.zeros(3), jnp.zeros(3), jnp.ones(1), 1.0)
    with pytest.raises(ValueError, match="`full_grad`.*tree structure of `params`"):
        jsr.svrg.corrected_gradient(
            _scalar_grad, {"w": jnp.zeros(3)}, {"w": jnp.zeros(3)}, {"v": jnp.zeros(3)}, 1.0
        )


def test_full_grad_check_is_static_under_jit():
    """The check runs when tracing: a jitted step raises, and a correct one's
    program is the plain formula's (no runtime check)."""
    w, snap = jnp.zeros(3), jnp.ones(3)
    step = jax.jit(lambda m: jsr.svrg.corrected_gradient(_scalar_grad, w, snap, m, 1.0))
    with pytest.raises(ValueError, match="`full_grad` has shape"):
        step(jnp.ones(1))
    np.testing.assert_allclose(step(jnp.ones(3)), 1.0 - 2 / 3)  # -2/3 - 0 + 1

    def plain(m):
        gw = _scalar_grad(w, 1.0)
        return (gw - _scalar_grad(snap, 1.0) + m).astype(gw.dtype)

    checked = lambda m: jsr.svrg.corrected_gradient(_scalar_grad, w, snap, m, 1.0)
    assert str(jax.make_jaxpr(checked)(jnp.ones(3))) == str(jax.make_jaxpr(plain)(jnp.ones(3)))


def _np_svrg(w, batches, lr, epochs, update_freq):
    """Numpy SVRG oracle with plain SGD steps: a snapshot and its mean
    full-data gradient every ``update_freq`` epochs; the weights after each epoch."""

    def g(w, xb, yb):
        return xb.T @ (xb @ w - yb) / len(yb)

    out = []
    for epoch in range(epochs):
        if epoch % update_freq == 0:
            snap = w.copy()
            mu = np.mean([g(snap, xb, yb) for xb, yb in batches], axis=0)
        for xb, yb in batches:
            w = w - lr * (g(w, xb, yb) - g(snap, xb, yb) + mu)
        out.append(w)
    return out


@pytest.mark.parametrize("update_freq", [1, 2, 3])
def test_fit_takes_snapshots_every_update_freq_epochs(update_freq):
    """Seed 004: ``update_freq = 2`` computes the full gradient every two
    epochs. Every epoch's weights follow the numpy oracle, whose trajectory
    differs for each cadence (a fit that snapshotted every epoch passed the
    other tests)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(12)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 12, 4)]
    lr, epochs = 0.1, 6

    def grad_fn(w, batch):
        xb, yb = batch
        return jax.grad(lambda w: 0.5 * jnp.mean((xb @ w - yb) ** 2))(w)

    seen = []
    jsr.svrg.fit(
        grad_fn,
        optax.sgd(lr),
        jnp.zeros(3),
        [(jnp.asarray(xb, jnp.float32), jnp.asarray(yb, jnp.float32)) for xb, yb in batches],
        epochs,
        update_freq=update_freq,
        callback=lambda e, p: seen.append(np.asarray(p)),
    )
    want = _np_svrg(np.zeros(3), batches, lr, epochs, update_freq)
    np.testing.assert_allclose(np.stack(seen), np.stack(want), rtol=1e-5, atol=1e-6)
    if update_freq > 1:  # the cadence shows in the weights
        every_epoch = _np_svrg(np.zeros(3), batches, lr, epochs, 1)
        assert not np.allclose(np.stack(want), np.stack(every_epoch), rtol=1e-3)


def test_init_refuses_row_sparse_params():
    """A RowSparse parameter gave a full gradient with duplicate ids, and then
    a misleading error from fit."""
    p = jsr.RowSparse.fromdense(np.array([[1.0, 1.0], [0, 0], [2, 2]], np.float32))
    with pytest.raises(TypeError, match=r"`jsr.svrg.init` got a RowSparse parameter at `params`"):
        jsr.svrg.init(p, optax.sgd(0.1))
    with pytest.raises(TypeError, match=r"RowSparse parameter at `params\['w'\]`"):
        jsr.svrg.fit(_scalar_grad, optax.sgd(0.1), {"w": p}, [jnp.ones(1)], 1)


def test_roll_over_iterators_are_refused():
    """With ``last_batch='roll_over'`` each pass carries rows into the next:
    three full gradients at the same point were -2.5, -2.67 and -3.56 for data
    whose mean gradient is -3."""
    x = jsr.csr_matrix(np.eye(7, dtype=np.float32))
    y = np.arange(7.0, dtype=np.float32)

    def grad_fn(w, batch):
        return jnp.sum(jnp.where(batch.mask, w - batch.y, 0.0)) / batch.num_rows

    rolling = CSRIter(x, y, 3, last_batch="roll_over")
    with pytest.raises(ValueError, match=r"`batches` is an iterator with `last_batch='roll_over'`"):
        jsr.svrg.full_gradient(grad_fn, 0.0, rolling)
    with pytest.raises(ValueError, match=r"last_batch='pad'"):
        jsr.svrg.fit(grad_fn, optax.sgd(0.1), jnp.zeros(()), rolling, 1)
    padded = CSRIter(x, y, 3)  # the default, last_batch="pad": every row once
    for _ in range(2):
        np.testing.assert_allclose(float(jsr.svrg.full_gradient(grad_fn, 0.0, padded)), -3.0)


def test_full_gradient_scans_a_stacked_epoch():
    """A ``stack_batches`` epoch is scanned in one program: the mean over all
    rows, as the list of its batches gives."""
    x, dense, y = make_problem()
    params = params_at(12, 1)
    batches = list(CSRIter(x, y, 8, nnz_buckets=[64]))  # 60 = 7 * 8 + 4: the last padded
    scanned = jsr.svrg.full_gradient(grad_fn, params, jsr.io.stack_batches(batches))
    gw, gb = np_grad(np.asarray(params["w"], np.float64), float(params["b"]), dense, y)
    np.testing.assert_allclose(scanned["w"], gw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scanned["b"], gb, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match=r"`batches` is one `jsr.io.Batch`: pass an iterable"):
        jsr.svrg.full_gradient(grad_fn, params, batches[0])
    with pytest.raises(TypeError, match=r"`batches` must be a re-iterable of batches"):
        jsr.svrg.fit(grad_fn, optax.sgd(0.1), params, jsr.io.stack_batches(batches), 1)


def test_a_batch_without_rows_counts_for_nothing():
    """Its mean gradient is 0 / 0 (a device whose part ran out of rows): the
    full gradient ignores it rather than turning NaN."""

    class Rows(NamedTuple):
        y: jax.Array
        num_rows: jax.Array

    def mean_grad(w, batch):
        return jax.grad(lambda w: jnp.sum((w - batch.y) ** 2) / batch.num_rows)(w)

    batches = [Rows(jnp.array([1.0, 3.0]), jnp.int32(2)), Rows(jnp.zeros(2), jnp.int32(0))]
    np.testing.assert_allclose(jsr.svrg.full_gradient(mean_grad, jnp.float32(0.0), batches), -4.0)


def test_axis_name_outside_a_mapped_axis_is_named():
    x, _, y = make_problem()
    batches = CSRIter(x, y, 30)
    with pytest.raises(ValueError, match=r"`axis_name='x'`: no mapped axis 'x' is bound here"):
        jsr.svrg.full_gradient(grad_fn, params_at(12, 0), batches, axis_name="x")
    mu = jax.tree.map(jnp.zeros_like, params_at(12, 0))
    with pytest.raises(ValueError, match=r"inside `jax.shard_map` \(or `jax.pmap`\)"):
        jsr.svrg.corrected_gradient(
            grad_fn, params_at(12, 0), params_at(12, 1), mu, next(iter(batches)), axis_name="x"
        )
