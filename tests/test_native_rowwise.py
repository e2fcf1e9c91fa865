"""Row-wise AdaGrad's fused native kernel (``_native/rowwise_adagrad.cc``): the
accumulator rows and the update rows (learning rate folded in) equal a numpy
oracle and the XLA ops it replaces, eagerly and under jit, over row shapes,
dtypes, padding, learning rates and the threaded path; in place under
donation; memory-safe with malformed ids; with the XLA ops' derivatives and
batching; the cases it does not take stay in XLA; and ``lazy_rowwise_adagrad``,
which folds its learning rate into the kernel, equals the chain it stands
for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_switch import kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows.optim import _rowwise_rows
from jaxsparse_rows.optim._rowwise_rows import rowwise_adagrad_rows
from tests import strategies as sst

ROWWISE = _native.ROWWISE_ADAGRAD.target

pytestmark = needs_kernels


@pytest.fixture(autouse=True)
def kernels_on():
    with kernels_set(True):
        yield


def _oracle(acc, ids, grad, eps, alpha=None):
    """``(acc, u)`` in float64: each listed row's mean square added to its
    accumulator, ``u = alpha * g / (sqrt(acc) + eps)`` (0 where that
    denominator is 0 and in padding slots)."""
    acc = np.array(acc, np.float64)
    g = np.asarray(grad, np.float64)
    g = g.reshape(len(ids), int(np.prod(g.shape[1:])))
    u = np.zeros_like(g)
    size = max(g.shape[1], 1)
    for i, r in enumerate(np.asarray(ids)):
        if 0 <= r < acc.shape[0]:
            acc[r] += (g[i] ** 2).sum() / size
            denom = np.sqrt(acc[r]) + eps
            if denom != 0:
                u[i] = g[i] / denom
    if alpha is not None:
        u *= alpha
    return acc, u.reshape(np.shape(grad))


def _case(rng, n, k, n_pad, row, dtype, idtype, zero_rows=0):
    ids = np.sort(rng.choice(n, min(k, n), replace=False))
    ids = np.concatenate([ids, [n] * n_pad]).astype(idtype)
    acc = rng.random(n).astype(dtype)
    grad = rng.standard_normal((len(ids),) + row).astype(dtype)
    grad[len(ids) - n_pad :] = 0  # RowSparse padding holds zeros
    for j in range(min(zero_rows, len(ids) - n_pad)):
        grad[j] = 0
        acc[ids[j]] = 0
    return acc, ids, grad


def _run(acc, ids, grad, eps, *, jit, alpha=None):
    fn = lambda a, i, g: rowwise_adagrad_rows(a, i, g, eps, alpha)  # noqa: E731
    if jit:
        fn = jax.jit(fn)
    return jax.tree.map(np.asarray, fn(jnp.asarray(acc), jnp.asarray(ids), jnp.asarray(grad)))


def _close(got, want, dtype):
    rtol = 2e-6 if np.dtype(dtype) == np.float32 else 1e-13
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-3)


@settings(deadline=None, max_examples=sst.examples(25))
@given(
    n=st.integers(1, 60),
    k=st.integers(1, 40),
    n_pad=st.integers(0, 3),
    row=st.sampled_from([(), (1,), (3,), (8,), (2, 3), (17,)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    idtype=st.sampled_from([np.int32, np.int64]),
    eps=st.sampled_from([0.0, 1e-8, 0.5]),
    alpha=st.sampled_from([None, -0.05, 1.0, 3.0, 0.0]),
    zero_rows=st.integers(0, 2),
    jit=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_numpy_and_the_xla_ops(
    n, k, n_pad, row, dtype, idtype, eps, alpha, zero_rows, jit, seed
):
    with jax.enable_x64(True):  # float64 and int64 operands stay what they are
        case = _case(np.random.default_rng(seed), n, k, n_pad, row, dtype, idtype, zero_rows)
        _check_against_numpy_and_xla(*case, dtype, eps, alpha, jit)


def _check_against_numpy_and_xla(acc, ids, grad, dtype, eps, alpha, jit):
    got_acc, got_u = _run(acc, ids, grad, eps, jit=jit, alpha=alpha)
    want_acc, want_u = _oracle(acc, ids, grad, eps, alpha)
    assert got_acc.dtype == got_u.dtype == np.dtype(dtype)
    _close(got_acc, want_acc, dtype)
    _close(got_u, want_u, dtype)
    with kernels_set(False):
        xla_acc, xla_u = _run(acc, ids, grad, eps, jit=jit, alpha=alpha)
    _close(got_acc, xla_acc, dtype)  # (the row sums add in another order)
    _close(got_u, xla_u, dtype)
    text = jax.jit(lambda a, i, g: rowwise_adagrad_rows(a, i, g, eps, alpha)).lower(acc, ids, grad)
    assert ROWWISE in text.as_text()


@pytest.mark.parametrize("idtype", [np.int32, np.int64])
def test_threaded_path_matches_numpy_and_repeats_exactly(rng, idtype):
    """Enough bytes of rows to split over the pool (a long padding tail too)."""
    acc, ids, grad = _case(rng, 5000, 3000, 500, (64,), np.float32, idtype, zero_rows=3)
    with jax.enable_x64(True):
        first = _run(acc, ids, grad, 1e-8, jit=True)
        again = _run(acc, ids, grad, 1e-8, jit=True)
    want = _oracle(acc, ids, grad, 1e-8)
    for got, w in zip(first, want, strict=True):
        _close(got, w, np.float32)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("alpha", [None, -0.5])
def test_zero_rows_with_eps_zero_get_zero_updates_and_nan_stays_visible(alpha):
    acc = np.zeros(4, np.float32)
    ids = np.array([0, 1, 2, 4], np.int32)  # 4: padding
    grad = np.array([[0.0, 0.0], [np.nan, 1.0], [np.inf, 1.0], [0.0, 0.0]], np.float32)
    for jit in (False, True):
        new_acc, u = _run(acc, ids, grad, 0.0, jit=jit, alpha=alpha)
        np.testing.assert_array_equal(u[0], [0.0, 0.0])  # 0, not 0/0
        assert np.isnan(u[1]).all() and np.isnan(u[2, 0])  # NaN and inf / inf
        np.testing.assert_array_equal(u[3], [0.0, 0.0])  # padding
        # padding rows are 0 * alpha, as the XLA ops scale them: -0.0 here
        assert np.signbit(u[3]).all() == (alpha is not None)
        assert new_acc[0] == 0 and np.isnan(new_acc[1]) and np.isinf(new_acc[2])
        assert new_acc[3] == 0  # an untouched row
        with kernels_set(False):
            _, xla_u = _run(acc, ids, grad, 0.0, jit=jit, alpha=alpha)
        np.testing.assert_array_equal(_bits(u), _bits(xla_u))


def _bits(x):
    """The bit patterns of a float array: equal only where the floats are
    identical, sign of zero and NaN payload included."""
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def test_donated_accumulator_is_updated_in_place():
    acc = jnp.zeros(10_000)
    ids = jnp.arange(0, 10_000, 7, dtype=jnp.int32)
    grad = jnp.ones((ids.shape[0], 16))
    f = jax.jit(lambda a, i, g: rowwise_adagrad_rows(a, i, g, 1e-8), donate_argnums=0)
    compiled = f.lower(acc, ids, grad).compile().as_text()
    assert ROWWISE in compiled
    assert not [ln for ln in compiled.splitlines() if " copy(" in ln and "[10000]" in ln]
    before = acc.unsafe_buffer_pointer()
    out, u = f(acc, ids, grad)
    assert out.unsafe_buffer_pointer() == before and acc.is_deleted()
    np.testing.assert_array_equal(np.asarray(out)[::7], 1.0)
    assert float(out.sum()) == ids.shape[0]
    np.testing.assert_allclose(np.asarray(u), 1.0, rtol=1e-6)


def test_undonated_accumulator_is_left_alone():
    acc = jnp.zeros(5)
    out, _ = jax.jit(lambda a: rowwise_adagrad_rows(a, jnp.array([1, 5]), jnp.ones((2, 2)), 0.0))(
        acc
    )
    assert float(out.sum()) == 1.0 and float(acc.sum()) == 0.0


@pytest.mark.parametrize(
    "ids",
    [
        [-1, 2, 5],  # negative
        [9, 2, 2**30, 0],  # unsorted and huge
        [2**31 - 1, -(2**31)],  # extremes
    ],
)
def test_malformed_ids_are_memory_safe(ids):
    """Ids are not checked under jit; the kernel range-checks each one: ids
    outside the accumulator get a zero update row and write nothing."""
    i = np.asarray(ids, np.int32)
    grad = np.full((len(ids), 3), 2.0, np.float32)
    acc, u = jax.jit(lambda a, i, g: rowwise_adagrad_rows(a, i, g, 0.0, -2.0))(
        jnp.zeros(10), jnp.asarray(i), jnp.asarray(grad)
    )
    want_acc, want_u = _oracle(np.zeros(10), i, grad, 0.0, -2.0)
    np.testing.assert_allclose(np.asarray(acc), want_acc, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(u), want_u, rtol=1e-6)


@pytest.mark.parametrize("ids", [[5] * 4000, "sorted_repeats", "unsorted_repeats"])
def test_repeated_ids_are_each_added_once(rng, ids):
    """Repeated ids (malformed: a RowSparse's are unique) on the threaded path
    never make two threads update one accumulator: each repeat adds its row's
    mean square once, as a serial loop would."""
    n, d = 1000, 64
    if ids == "sorted_repeats":
        ids = np.sort(rng.integers(0, 50, 4000))
    elif ids == "unsorted_repeats":
        ids = rng.integers(0, 50, 4000)
    ids = np.asarray(ids, np.int32)
    grad = np.ones((len(ids), d), np.float32)
    one = jnp.float32(1)
    acc, _ = jax.jit(lambda a, i, g: _rowwise_rows._fused(a, i, g, jnp.float32(0), one))(
        jnp.zeros(n), jnp.asarray(ids), jnp.asarray(grad)
    )
    np.testing.assert_array_equal(np.asarray(acc), np.bincount(ids, minlength=n))


def test_gradients_match_the_xla_ops(rng):
    # no padding slot: its zero accumulator would put sqrt's infinite slope at 0
    # into the derivative (the rule's, either way)
    acc0, ids, grad0 = _case(rng, 9, 4, 0, (3,), np.float32, np.int32)

    def loss(fn):
        def f(acc, grad, eps, alpha):
            a, u = fn(acc, jnp.asarray(ids), grad, eps, alpha)
            return jnp.sin(a).sum() + (u * jnp.arange(1.0, u.size + 1).reshape(u.shape)).sum()

        return f

    args = (jnp.asarray(acc0) + 1.0, jnp.asarray(grad0), jnp.float32(0.1), jnp.float32(-0.7))
    native = jax.grad(loss(_rowwise_rows._fused), (0, 1, 2, 3))(*args)
    xla = jax.grad(loss(_rowwise_rows._xla), (0, 1, 2, 3))(*args)
    for a, b in zip(native, xla, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    jax.test_util.check_grads(loss(_rowwise_rows._fused), args, 1, modes=("fwd", "rev"), eps=1e-2)


def test_vmap_matches_the_xla_ops(rng):
    accs = jnp.asarray(rng.random((3, 8)).astype(np.float32))
    ids = jnp.array([[0, 5, 8], [1, 2, 3], [7, 8, 8]], jnp.int32)
    grads = jnp.asarray(rng.standard_normal((3, 3, 2)).astype(np.float32))
    eps, alphas = jnp.float32(1e-3), jnp.array([-0.1, 1.0, 2.5], jnp.float32)
    fused = jax.vmap(lambda a, i, g, s: _rowwise_rows._fused(a, i, g, eps, s))
    got = jax.jit(fused)(accs, ids, grads, alphas)
    want = jax.vmap(lambda a, i, g, s: _rowwise_rows._xla(a, i, g, eps, s))(
        accs, ids, grads, alphas
    )
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _lowered(acc, ids, grad, eps=1e-8):
    return (
        jax.jit(lambda a, i, g: rowwise_adagrad_rows(a, i, g, eps)).lower(acc, ids, grad).as_text()
    )


def test_cases_the_kernel_does_not_take_run_in_xla():
    """Mixed or half-precision dtypes, complex rows, no ids, rows of no
    elements, a weakly typed accumulator and turned-off kernels use the XLA
    ops, with the results of the rule."""
    ids = jnp.array([1, 3], jnp.int32)
    f32 = jnp.zeros(4, jnp.float32)
    cases = [
        (f32, ids, jnp.full((2, 3), 3.0, jnp.float16)),  # float16 rows, float32 accumulator
        (f32.astype(jnp.bfloat16), ids, jnp.full((2, 3), 3.0, jnp.bfloat16)),
        (f32, jnp.zeros((0,), jnp.int32), jnp.ones((0, 3))),
        (f32, ids, jnp.ones((2, 0))),
        (jnp.full((4,), 0.0), ids, jnp.full((2, 3), 3.0)),  # weakly typed
    ]
    for acc, i, g in cases:
        assert ROWWISE not in _lowered(acc, i, g), (acc.dtype, g.dtype, g.shape)
        new_acc, u = rowwise_adagrad_rows(acc, i, g, 1e-8)
        want_acc, want_u = _oracle(np.asarray(acc, np.float64), np.asarray(i), np.asarray(g), 1e-8)
        np.testing.assert_allclose(np.asarray(new_acc, np.float64), want_acc, rtol=1e-2)
        np.testing.assert_allclose(np.asarray(u, np.float64), want_u, rtol=1e-2)
    c64 = jnp.zeros(4, jnp.complex64)
    assert ROWWISE not in _lowered(c64, ids, jnp.ones((2, 3), jnp.complex64))
    assert ROWWISE in _lowered(f32, ids, jnp.ones((2, 3)))
    with kernels_set(False):
        assert ROWWISE not in _lowered(f32, ids, jnp.ones((2, 3)))


def test_the_optimizer_step_runs_the_kernel_and_matches_numpy(rng):
    """``lazy_rowwise_adagrad`` in a jitted, donated step: one kernel call for
    the accumulator, and the result of the numpy rule, with weight decay too."""
    v, d = 50, 4
    w0 = rng.standard_normal((v, d)).astype(np.float32)
    for wd in (0.0, 0.1):
        opt = jsr.optim.lazy_rowwise_adagrad(0.1, eps=1e-8, weight_decay=wd)

        def step(p, s, g, opt=opt):
            u, s = opt.update(g, s, p)
            return jsr.optim.apply_updates(p, u), s

        f = jax.jit(step, donate_argnums=(0, 1))
        p = jnp.asarray(w0)
        s = opt.init(p)
        w = w0.astype(np.float64)
        acc = np.zeros(v)
        for t in range(3):
            ids = np.sort(rng.choice(v, 10, replace=False)).astype(np.int32)
            data = rng.standard_normal((10, d)).astype(np.float32)
            g = jsr.RowSparse._make(jnp.asarray(data), jnp.asarray(ids), (v, d))
            if t == 0:
                assert ROWWISE in f.lower(p, s, g).as_text()
            p, s = f(p, s, g)
            gw = data + wd * w[ids]
            acc, u = _oracle(acc, ids, gw, 1e-8)
            w[ids] -= 0.1 * u
        np.testing.assert_allclose(np.asarray(p), w, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(s[0].sum_of_squares), acc, rtol=2e-5)


def test_self_test_catches_a_wrong_kernel(monkeypatch):
    assert _native._selftest.self_test() == "ok"
    real = _native.rowwise_adagrad_call

    def no_mean(acc, ids, grad, eps, alpha):  # the sum of squares, not its mean
        return real(acc, ids, grad * np.sqrt(grad.shape[1]), eps, alpha)

    monkeypatch.setattr(_native._registry, "rowwise_adagrad_call", no_mean)
    assert (
        _native._selftest.self_test() == "the self-test row-wise AdaGrad update differed from numpy"
    )


def _folded_and_chain(lr, wd):
    chain = optax.chain(
        jsr.optim.scale_by_lazy_rowwise_adagrad(1e-8, wd), jsr.optim.scale_by_learning_rate(lr)
    )
    return jsr.optim.lazy_rowwise_adagrad(lr, eps=1e-8, weight_decay=wd), chain


_FOLD_CASES = {
    # name: (table dtype, learning rate, row shape, x64)
    "float32": (jnp.float32, 0.1, (8,), False),
    "schedule": (jnp.float32, "schedule", (8,), False),
    "0-d array lr": (jnp.float32, "array", (8,), False),
    "n-d rows": (jnp.float32, 0.1, (2, 3), False),
    "bfloat16 (XLA)": (jnp.bfloat16, 0.1, (8,), False),
    "float64 x64": (jnp.float64, "schedule", (8,), True),
}


@pytest.mark.parametrize(
    ("case", "kernels"),
    # bfloat16 never reaches the kernel: it runs once, with them off
    [(c, on) for c in _FOLD_CASES for on in (True, False) if not (on and "XLA" in c)],
)
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_folded_learning_rate_equals_the_chain(rng, kernels, case, wd):
    """``lazy_rowwise_adagrad`` folds its learning rate into the row-wise pass
    (the kernel's ``alpha``). It keeps the state of the chain it stands for
    (row-wise AdaGrad, then ``scale_by_learning_rate``) and gives its updates
    and states bit for bit (sign of zero included: padding rows are -0.0 in
    both), on a RowSparse leaf with padding, a dense leaf and a None leaf."""
    dtype, lr, row, x64 = _FOLD_CASES[case]
    if lr == "schedule":
        lr = optax.linear_schedule(0.2, 0.01, 4)
    elif lr == "array":
        lr = jnp.asarray(0.1, jnp.float32)
    folded, chain = _folded_and_chain(lr, wd)
    v = 40
    with jax.enable_x64(x64), kernels_set(kernels):
        params = {
            "table": jnp.asarray(rng.standard_normal((v,) + row), dtype),
            "w": jnp.asarray(rng.standard_normal((5, 3)), dtype),
            "none": None,
        }
        sa, sb = folded.init(params), chain.init(params)
        assert jax.tree.structure(sa) == jax.tree.structure(sb)
        fa, fb = jax.jit(folded.update), jax.jit(chain.update)
        for _ in range(3):
            ids = np.sort(rng.choice(v, 6, replace=False))
            ids = np.concatenate([ids, [v, v]]).astype(np.int32)  # two padding slots
            data = rng.standard_normal((8,) + row)
            data[6:] = 0
            grads = {
                "table": jsr.RowSparse._make(
                    jnp.asarray(data, dtype), jnp.asarray(ids), (v,) + row
                ),
                "w": jnp.asarray(rng.standard_normal((5, 3)), dtype),
                "none": None,
            }
            (ua, sa), (ub, sb) = fa(grads, sa, params), fb(grads, sb, params)
            assert jax.tree.structure(ua) == jax.tree.structure(ub)
            for a, b in zip(jax.tree.leaves((ua, sa)), jax.tree.leaves((ub, sb)), strict=True):
                assert a.dtype == b.dtype
                if jnp.issubdtype(a.dtype, jnp.floating):
                    np.testing.assert_array_equal(_bits(a), _bits(b))
                else:
                    np.testing.assert_array_equal(a, b)
            assert float(jnp.abs(ua["table"].data[:6]).min()) > 0  # not a vacuous match
            assert np.signbit(np.asarray(ua["table"].data[6:], np.float32)).all()
        native = kernels and dtype != jnp.bfloat16
        assert (ROWWISE in fa.lower(grads, sa, params).as_text()) == native


def test_folded_learning_rate_step_is_two_kernel_calls():
    """With the learning rate in the kernel, a jitted, donated step of
    ``lazy_rowwise_adagrad`` on CPU is the row-wise kernel writing the final
    update rows and the scatter-add consuming them: no XLA pass over the
    ``[K, D]`` rows in between."""
    opt = jsr.optim.lazy_rowwise_adagrad(0.1)
    p = jnp.zeros((1000, 16))
    g = jsr.RowSparse._make(jnp.ones((64, 16)), jnp.arange(0, 640, 10, dtype=jnp.int32), p.shape)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return jsr.optim.apply_updates(p, u), s

    hlo = jax.jit(step, donate_argnums=(0, 1)).lower(p, opt.init(p), g).compile().as_text()
    entry = hlo[hlo.index("\nENTRY") :]
    assert entry.count("custom-call(") == 2 and ROWWISE in entry
    assert _native.SCATTER_ROWS.target in entry
    assert " fusion(" not in entry and " multiply(" not in entry


def test_folded_learning_rate_keeps_the_chain_errors_and_extra_args():
    """The chain's errors, in the chain's order: a state whose halves are
    swapped gets the row-wise state's error, as the chain gives it; a wrong
    schedule state gets scale_by_learning_rate's. Like an optax.chain, the
    update takes (and ignores) optax's extra arguments."""
    sched = optax.constant_schedule(0.1)
    folded, chain = _folded_and_chain(sched, 0.0)
    p = jnp.zeros((4, 2))
    g = jsr.RowSparse([[1.0, 1.0]], [1], shape=(4, 2))
    rowwise_state, lr_state = chain.init(p)
    swapped = (lr_state, rowwise_state)
    with pytest.raises(TypeError) as want:
        chain.update(g, swapped, p)
    with pytest.raises(TypeError) as got:
        folded.update(g, swapped, p)
    assert "scale_by_lazy_rowwise_adagrad" in str(got.value)
    assert str(got.value) == str(want.value)
    with pytest.raises(TypeError, match="scale_by_learning_rate"):
        folded.update(g, (rowwise_state, optax.EmptyState()), p)
    assert isinstance(folded, optax.GradientTransformationExtraArgs)
    ua, _ = folded.update(g, folded.init(p), p, value=jnp.float32(1.0))
    ub, _ = chain.update(g, chain.init(p), p, value=jnp.float32(1.0))
    np.testing.assert_array_equal(_bits(ua.data), _bits(ub.data))
