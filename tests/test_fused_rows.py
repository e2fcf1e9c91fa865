"""The fused Pallas kernels of the lazy optimizers (``optim/_fused_rows.py``).

They run on GPU; here they run in Pallas interpret mode (``_fused_rows.force()``)
through the public optimizers, against the XLA path (what runs without them)
and a float64 numpy oracle, for row widths 1 to 300, float32, float64,
float16 / bfloat16 parameters with float32 state and bfloat16 throughout. The
dispatch is checked too: a CPU trace holds no kernel unless forced, the user
switch and unsupported operands keep the XLA ops, and a program lowered for
``cuda`` (lowered here, not run) holds one Triton call per kernel with the
state buffers aliased to its outputs.

The interpreter compiles slowly (about half a second per kernel), so each case
runs several optimizers in one jitted program, built once per module
(:func:`_case_results`), with one row per program (the GPU's rows per program
are tested once, in :func:`test_default_tuning`).
"""

from __future__ import annotations

import functools
import json
import re
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxpr_walk import all_eqns
from kernel_switch import kernels_set

import jaxsparse_rows as jsr
from jaxsparse_rows.optim import _fused_kernel as fused_kernel
from jaxsparse_rows.optim import _fused_rows as fused

pytest.importorskip("jax.experimental.pallas.triton", reason="this jaxlib has no Pallas Triton")

ROOT = Path(__file__).resolve().parents[1]
V = 11  # table rows
K = 6  # row slots of each gradient: 4 real rows and 2 padding slots
REAL = 4

# The optimizers, as :func:`_oracle` computes them.
OPTIMIZERS = {
    "sgd_momentum": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9),
    "sgd_nesterov": lambda: jsr.optim.lazy_sgd(
        0.1, momentum=0.9, nesterov=True, weight_decay=0.01, rescale_grad=0.5, clip_gradient=0.8
    ),
    "adam": lambda: jsr.optim.lazy_adam(0.01, eps_root=1e-8),
    "adamw": lambda: jsr.optim.lazy_adamw(0.01, weight_decay=0.1),
    "adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "rowwise_adagrad": lambda: jsr.optim.lazy_rowwise_adagrad(0.1, weight_decay=0.01),
    "ftrl": lambda: jsr.optim.lazy_ftrl(0.1, lamda1=0.01, beta=1.0, weight_decay=0.01),
}

# name: (row shape, parameter dtype, state dtype (None: the parameter's), x64, optimizers)
CASES = {
    "f32-d1": ((1,), "float32", None, False, ("sgd_momentum", "rowwise_adagrad", "ftrl")),
    "f32-d3": ((3,), "float32", None, False, ("sgd_nesterov", "adamw", "adagrad")),
    "f32-d64": ((64,), "float32", None, False, ("adam", "adagrad", "rowwise_adagrad")),
    "f32-3x100": ((3, 100), "float32", None, False, ("rowwise_adagrad", "sgd_momentum", "adam")),
    "bf16+f32state-d64": (
        (64,), "bfloat16", "float32", False, ("adam", "sgd_nesterov", "rowwise_adagrad", "ftrl")
    ),
    "f16+f32state-d3": ((3,), "float16", "float32", False, ("adamw", "sgd_momentum", "adagrad")),
    "bf16-d129": ((129,), "bfloat16", None, False, ("adagrad", "adam", "ftrl")),
    "f64-d3": ((3,), "float64", None, True, ("adam", "rowwise_adagrad", "ftrl")),
}  # fmt: skip

PAIRS = [(c, o) for c, spec in CASES.items() for o in spec[4]]


def _gradients(seed: int, row: tuple, dtype) -> list[jsr.RowSparse]:
    """Two RowSparse gradients of REAL rows in K slots (the rest padding)."""
    keys = jax.random.split(jax.random.key(seed), 2)
    grads = []
    for key in keys:
        g = jsr.random.row_sparse(key, (V, *row), REAL / V, dtype, -1.0, 1.0, capacity=K)
        grads.append(g)
    return grads


def _state_params(params, state_dtype):
    if state_dtype is None:
        return params
    return jax.ShapeDtypeStruct(params.shape, jnp.dtype(state_dtype))


def _two_steps(names, params, grads, state_dtype, *, jit=True):
    """``{name: [(params, state, update) after each of two steps]}``. The
    first optimizer's updates are applied by ``jsr.optim.apply_updates`` (a
    kernel when forced), the others' by ``optax.apply_updates`` (XLA ops),
    so that a case compiles one ``apply_updates`` kernel."""
    opts = {n: OPTIMIZERS[n]() for n in names}

    def step(ws, states, g):
        out = {}
        for i, (n, opt) in enumerate(opts.items()):
            u, s = opt.update(g, states[n], ws[n])
            apply = optax.apply_updates if i else jsr.optim.apply_updates
            out[n] = (apply(ws[n], u), s, u)
        return out

    run = jax.jit(step) if jit else step
    ws = {n: params for n in names}
    states = {n: opts[n].init(_state_params(params, state_dtype)) for n in names}
    history = {n: [] for n in names}
    for g in grads:
        out = run(ws, states, g)
        for n in names:
            history[n].append(jax.tree.map(np.asarray, out[n]))
        ws = {n: out[n][0] for n in names}
        states = {n: out[n][1] for n in names}
    return history, jax.make_jaxpr(step)(ws, states, grads[0])


@functools.cache
def _case_results(case: str):
    """The case run by the XLA path and by the kernels (interpreted), with the
    inputs as float64 numpy arrays and the fused program's jaxpr."""
    row, dtype, state_dtype, x64, names = CASES[case]
    with jax.enable_x64(x64):
        grads = _gradients(len(case), row, jnp.dtype(dtype))
        key = jax.random.key(7)
        params = jax.random.normal(key, (V, *row), jnp.float32).astype(dtype)
        xla, _ = _two_steps(names, params, grads, state_dtype)
        with fused.force(interpret=True), fused.tuned(rows_per_program=1):
            kern, jaxpr = _two_steps(names, params, grads, state_dtype)
        inputs = (
            np.asarray(params, np.float64),
            [(np.asarray(g.indices), np.asarray(g.data, np.float64)) for g in grads],
        )
    return xla, kern, inputs, jaxpr


# ------------------------------------------------------------------ oracles


def _oracle(name: str, w: np.ndarray, grads, dtype) -> list[np.ndarray]:
    """The parameters after each step, in float64 numpy, for gradients of
    ``dtype``, which Adam, AdaGrad and FTRL square in (as optax does)."""

    def rounded(x):  # an operation of the rule in the gradient's dtype
        return np.asarray(np.asarray(x).astype(jnp.dtype(dtype)), np.float64)

    def square(g):
        return rounded(np.square(g))

    w = w.copy()
    a = np.zeros_like(w)  # first state (momentum, mu, accumulator, z)
    b = np.zeros_like(w)  # second state (nu, n)
    if name == "adagrad":
        a += 0.1
    if name == "rowwise_adagrad":
        a = np.zeros(w.shape[:1])
    out = []
    for t, (ids, data) in enumerate(grads, start=1):
        for i, r in enumerate(ids):
            if r >= V:
                continue
            g, wr = data[i], w[r]
            if name in ("sgd_momentum", "sgd_nesterov"):
                if name == "sgd_nesterov":
                    g = np.clip(0.5 * g, -0.8, 0.8) + 0.01 * wr
                a[r] = 0.9 * a[r] + g
                u = g + 0.9 * a[r] if name == "sgd_nesterov" else a[r]
                w[r] = wr - 0.1 * u
            elif name in ("adam", "adamw"):
                a[r] = 0.9 * a[r] + rounded(0.1 * g)
                b[r] = 0.999 * b[r] + rounded(0.001 * square(g))
                root = 1e-8 if name == "adam" else 0.0
                u = (a[r] / (1 - 0.9**t)) / (np.sqrt(b[r] / (1 - 0.999**t) + root) + 1e-8)
                w[r] = wr - 0.01 * (u + (0.1 * wr if name == "adamw" else 0))
            elif name == "adagrad":
                a[r] = a[r] + square(g)
                w[r] = wr - 0.1 * g / np.sqrt(a[r] + 1e-7)
            elif name == "rowwise_adagrad":
                g = g + 0.01 * wr
                a[r] = a[r] + np.mean(g**2)
                w[r] = wr - 0.1 * g / (np.sqrt(a[r]) + 1e-8)
            elif name == "ftrl":
                z, n = a[r], b[r]
                z = z + g - (np.sqrt(n + square(g)) - np.sqrt(n)) * wr / 0.1
                n = n + square(g)
                new = (np.sign(z) * 0.01 - z) / ((1.0 + np.sqrt(n)) / 0.1 + 0.01)
                a[r], b[r], w[r] = z, n, np.where(np.abs(z) > 0.01, new, 0.0)
        out.append(w.copy())
    return out


# The kernels evaluate the XLA path's operations in its order, but XLA
# itself does not round every operation as written: it divides by a
# broadcast scalar (Adam's bias corrections, FTRL's learning rate) as a
# multiplication by the scalar's reciprocal, keeps float16 / bfloat16
# intermediates in float32 (xla_allow_excess_precision), and row-wise
# AdaGrad's row sums are added in another order. Both sides run through XLA
# here, each rewritten its own way, so they agree to a few units in the last
# place of the largest value, and most elements bit for bit.
def _assert_close_to_xla(a: np.ndarray, b: np.ndarray, narrowest=None) -> None:
    """``b`` (kernels) equals ``a`` (XLA) to a few units in the last place of
    ``a``'s dtype, or of ``narrowest``, the narrowest dtype that went in."""
    a, b = np.asarray(a), np.asarray(b)
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        np.testing.assert_array_equal(b, a)
        return
    eps = float(max(jnp.finfo(a.dtype).eps, jnp.finfo(narrowest or a.dtype).eps))
    scale = max(1.0, float(np.max(np.abs(np.asarray(a, np.float64)), initial=0.0)))
    np.testing.assert_allclose(
        np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=4 * eps, atol=4 * eps * scale
    )


# ------------------------------------------------------------------ the kernels


@pytest.mark.parametrize("case,name", PAIRS)
def test_kernels_match_xla(case, name):
    """Parameters, optimizer state and updates after two steps (the second
    one from the first one's in-place state), leaf by leaf."""
    xla, kern, _, _ = _case_results(case)
    for step in range(2):
        want = jax.tree.leaves(xla[name][step])
        got = jax.tree.leaves(kern[name][step])
        assert len(want) == len(got)
        for a, b in zip(want, got, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            _assert_close_to_xla(a, b, CASES[case][1])


@pytest.mark.parametrize("case,name", PAIRS)
def test_kernels_match_oracle(case, name):
    _, kern, (w, grads), _ = _case_results(case)
    dtype = CASES[case][1]
    tol = {"float64": 1e-12, "float32": 2e-5}.get(dtype, 0.05)
    flat = [(ids, data.reshape(K, -1)) for ids, data in grads]
    for step, want in enumerate(_oracle(name, w.reshape(V, -1), flat, dtype)):
        got = np.asarray(kern[name][step][0], np.float64).reshape(V, -1)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_one_kernel_per_update_and_apply(case):
    """Every optimizer's rule and every ``apply_updates`` ran as a kernel."""
    *_, jaxpr = _case_results(case)
    assert str(jaxpr).count("jsr_fused_rows(") == len(CASES[case][4]) + 1


def test_padding_slots_stay_zero():
    _, kern, (_, grads), _ = _case_results("f32-d3")
    for name in CASES["f32-d3"][4]:
        for step, (ids, _) in enumerate(grads):
            u = kern[name][step][2]
            data = np.asarray(u.data if isinstance(u, jsr.RowSparse) else u)
            assert np.all(data[ids >= V] == 0)


def test_eager():
    """Outside ``jit`` each kernel is one compiled call, as every primitive."""
    row, names = (3,), ("adagrad",)
    grads = _gradients(1, row, jnp.float32)
    params = jax.random.normal(jax.random.key(1), (V, *row))
    want, _ = _two_steps(names, params, grads, None, jit=False)
    with fused.force(interpret=True), fused.tuned(rows_per_program=1):
        got, jaxpr = _two_steps(names, params, grads, None, jit=False)
    assert "jsr_fused_rows" in str(jaxpr)
    for n in names:
        for a, b in zip(jax.tree.leaves(want[n]), jax.tree.leaves(got[n]), strict=True):
            _assert_close_to_xla(a, b)


def test_default_tuning():
    """The GPU's rows per program (4 at these widths), with a last program
    whose slots run past K (K = 6)."""
    assert fused.tuning(3)[0] == 4 and K % 4
    names = ("adagrad",)
    grads = _gradients(2, (3,), jnp.float32)
    params = jax.random.normal(jax.random.key(2), (V, 3))
    want, _ = _two_steps(names, params, grads, None)
    with fused.force(interpret=True):
        got, _ = _two_steps(names, params, grads, None)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(b, a)


def _compiles(fn, *args):
    """``(fn(*args), the XLA compilations that call made)``."""
    count = [0]

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        out = jax.block_until_ready(fn(*args))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return out, count[0]


def test_hyperparameters_are_operands():
    """Schedules and injected hyperparameters reach the kernels as scalar
    operands: a step with new values compiles nothing."""
    schedule = optax.linear_schedule(0.1, 0.01, 10)
    opts = {
        "adam": optax.inject_hyperparams(jsr.optim.lazy_adam)(
            learning_rate=0.01, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-9
        ),
        "ftrl": jsr.optim.lazy_ftrl(schedule),
    }
    grads = _gradients(3, (3,), jnp.float32)
    params = jax.random.normal(jax.random.key(3), (V, 3))

    def step(ws, states, g):
        out = {n: opt.update(g, states[n], ws[n]) for n, opt in opts.items()}
        ws = {n: optax.apply_updates(ws[n], out[n][0]) for n in opts}
        return ws, {n: out[n][1] for n in opts}

    def run(jitted):
        ws = {n: params for n in opts}
        states = {n: opt.init(params) for n, opt in opts.items()}
        counts = []
        for g in [*grads, grads[0]]:
            (ws, states), count = _compiles(jitted, ws, states, g)
            counts.append(count)
        return ws, states, counts

    want = run(jax.jit(step))
    with fused.force(interpret=True), fused.tuned(rows_per_program=1):
        jaxpr = jax.make_jaxpr(step)(
            {n: params for n in opts}, {n: o.init(params) for n, o in opts.items()}, grads[0]
        )
        kernels = [dict(e.params["static"])["kernel"] for e in _fused_eqns(jaxpr.jaxpr)]
        got = run(jax.jit(step))
    rules = {k.name: k for k in kernels}
    assert set(rules) == {"adam", "ftrl"}
    assert len(rules["adam"].const_dtypes) >= 5  # b1, b2, eps, eps_root, bias corrections
    assert len(rules["ftrl"].const_dtypes) >= 1  # the schedule's learning rate
    assert got[2][1:] == [0, 0]  # later steps compile nothing
    for a, b in zip(jax.tree.leaves(want[:2]), jax.tree.leaves(got[:2]), strict=True):
        _assert_close_to_xla(a, b)


def _fused_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        static = (
            dict(eqn.params.get("static", ())) if eqn.primitive.name == "jsr_kernel_call" else {}
        )
        if isinstance(static.get("kernel"), fused_kernel.Kernel):
            yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _fused_eqns(sub)


def test_empty_gradient():
    """K = 0: nothing to launch; the XLA path runs."""
    g = jsr.RowSparse(jnp.zeros((0, 3)), jnp.zeros((0,), jnp.int32), shape=(V, 3))
    w = jnp.ones((V, 3))
    opt = jsr.optim.lazy_adam(0.1)

    def step(w, s):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    want = jax.jit(step)(w, opt.init(w))
    with fused.force(interpret=True):
        assert "jsr_fused_rows" not in str(jax.make_jaxpr(step)(w, opt.init(w)))
        got = jax.jit(step)(w, opt.init(w))
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("weight_decay", [0.1, 0.0])
def test_adamw_decay_runs_inside_the_adam_kernel(weight_decay):
    """AdamW's decoupled decay reads each listed parameter row inside Adam's
    kernel (which then takes the parameter), so the fused step gathers no row
    outside its two kernels; without decay the kernel reads no parameter."""
    g = _gradients(8, (3,), jnp.float32)[0]
    w = jax.random.normal(jax.random.key(8), (V, 3))
    opt = jsr.optim.lazy_adamw(0.01, weight_decay=weight_decay)

    def step(w, s):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    with fused.force(interpret=False):
        jaxpr = jax.make_jaxpr(step)(w, opt.init(w)).jaxpr
    eqns = list(all_eqns(jaxpr, twins=False))  # not into the kernels' XLA twins
    # Row gathers are kernel calls too (gather_rows), or XLA gathers.
    calls = [dict(e.params["static"]) for e in eqns if e.primitive.name == "jsr_kernel_call"]
    kernels = sorted(c["kernel"].name if "kernel" in c else str(c) for c in calls)
    assert kernels == ["adam", "apply_updates"]
    kernels = {c["kernel"].name: c["kernel"] for c in calls}
    assert kernels["adam"].param_dtype == (jnp.float32 if weight_decay else None)
    assert [e.primitive.name for e in eqns if "gather" in e.primitive.name] == []


# ------------------------------------------------------------------ dispatch


def _step_jaxpr(opt, w, g) -> str:
    def step(w, s):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    return str(jax.make_jaxpr(step)(w, opt.init(w)))


def test_cpu_trace_has_no_kernel():
    """Unforced, a CPU trace is the XLA path's: no pallas_call, no fused primitive."""
    assert jax.default_backend() == "cpu" and fused.forced() is None
    g = _gradients(4, (3,), jnp.float32)[0]
    w = jax.random.normal(jax.random.key(4), (V, 3))
    for name, make in OPTIMIZERS.items():
        text = _step_jaxpr(make(), w, g)
        assert "pallas_call" not in text and "jsr_fused_rows" not in text, name
    assert not fused.use_fused("adam", [jnp.ones((V, 3))], g.indices, g.data)


def test_user_switch_turns_kernels_off():
    g = _gradients(5, (3,), jnp.float32)[0]
    w = jnp.ones((V, 3), jnp.float32) * 2
    with fused.force(interpret=True):
        assert "jsr_fused_rows" in _step_jaxpr(jsr.optim.lazy_adagrad(0.1), w, g)
        with kernels_set(False):
            assert "jsr_fused_rows" not in _step_jaxpr(jsr.optim.lazy_adagrad(0.1), w, g)


def test_operands_the_kernel_does_not_take():
    ids = jnp.array([0, 2, V], jnp.int32)
    state = jnp.zeros((V, 3))
    ok = dict(states=[state], ids=ids, grad=jnp.ones((3, 3)))
    with fused.force(interpret=True):
        assert fused.use_fused("adam", **ok)
        assert fused.use_fused("rowwise_adagrad", [jnp.zeros((V,))], ids, jnp.ones((3, 3)))
        wide = fused.MAX_WIDTH + 1
        assert not fused.use_fused("adam", [jnp.zeros((2, wide))], ids[:1], jnp.ones((1, wide)))
        assert not fused.use_fused("adam", [state.astype(jnp.complex64)], ids, ok["grad"])
        assert not fused.use_fused("adam", [jnp.full((V, 3), 1.0)], ids, ok["grad"])  # weak
        assert not fused.use_fused("adam", [state], ids[:0], jnp.ones((0, 3)))  # K = 0
        assert not fused.use_fused("adam", [state], ids.reshape(3, 1), ok["grad"])
        assert not fused.use_fused("adam", [jnp.zeros((V, 4))], ids, ok["grad"])
        assert not fused.use_fused("sgd", [], ids, ok["grad"])  # nothing to gather
        assert not fused.use_fused("adam", [jnp.zeros((V, 0))], ids, jnp.ones((3, 0)))
        with pytest.raises(ValueError, match="rule_name"):
            fused.use_fused("lamb", **ok)
    assert not fused.use_fused("adam", **ok)  # CPU, not forced


# ------------------------------------------------------------ lowered for GPU


def _cuda_text(step, *args, donate=(0, 1)) -> str:
    lowered = jax.jit(step, donate_argnums=donate).trace(*args).lower(lowering_platforms=("cuda",))
    return re.sub(r'ir = "[^"]*"', "ir = ...", lowered.as_text())


def _triton_calls(text: str) -> list[str]:
    return [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]


# Each rule lowered once, the dtypes taking turns: (optimizer, dtype, state
# dtype, the rule's kernel, the state arrays it writes).
LOWERED = [
    ("sgd_momentum", "float32", None, "sgd", 1),
    ("sgd_nesterov", "bfloat16", "float32", "sgd", 1),
    ("adam", "float16", None, "adam", 2),
    ("adamw", "bfloat16", None, "adam", 2),
    ("adagrad", "float16", "float32", "adagrad", 1),
    ("rowwise_adagrad", "bfloat16", "float32", "rowwise_adagrad", 1),
    ("ftrl", "float32", None, "ftrl", 2),
]


def test_triton_lowering_aliases_state():
    """Lowered for ``cuda``, a donated step of every optimizer holds one
    Triton call per rule and one per ``apply_updates``, each writing the
    state (or the parameter) it reads in place, and every donated array is
    one of the program's outputs."""
    row = (129,)
    opts = {name: OPTIMIZERS[name]() for name, *_ in LOWERED}
    ws, states, grads = {}, {}, {}
    for name, dtype, state_dtype, *_ in LOWERED:
        grads[name] = _gradients(6, row, jnp.dtype(dtype))[0]
        ws[name] = jnp.ones((V, *row), dtype)
        states[name] = opts[name].init(_state_params(ws[name], state_dtype))

    def step(ws, states, grads):
        out = {n: opt.update(grads[n], states[n], ws[n]) for n, opt in opts.items()}
        ws = {n: jsr.optim.apply_updates(ws[n], out[n][0]) for n in opts}
        return ws, {n: out[n][1] for n in opts}

    with fused.force(interpret=False):
        text = _cuda_text(step, ws, states, grads)
    calls = _triton_calls(text)
    names = [re.search(r'name = "jsr_fused_(\w+)_rows"', c).group(1) for c in calls]
    aliased = {}
    for name, call in zip(names, calls, strict=True):
        aliased.setdefault(name, []).append(len(re.findall(r"output_operand_alias<", call)))
    want = {}
    for *_, rule, n_states in LOWERED:
        want.setdefault(rule, []).append(n_states)
    want["apply_updates"] = [1] * len(LOWERED)
    assert {k: sorted(v) for k, v in aliased.items()} == {k: sorted(v) for k, v in want.items()}
    (main,) = [line for line in text.splitlines() if "func.func public @main" in line]
    donated = len(jax.tree.leaves((ws, states)))
    assert main.count("tf.aliasing_output") == donated


def test_triton_lowering_float64_and_wide_rows():
    with jax.enable_x64(True):
        g = _gradients(7, (300,), jnp.float64)[0]
        w = jnp.ones((V, 300), jnp.float64)
        opt = jsr.optim.lazy_ftrl(0.1)

        def step(w, s, g):
            u, s = opt.update(g, s, w)
            return jsr.optim.apply_updates(w, u), s

        with fused.force(interpret=False):
            text = _cuda_text(step, w, opt.init(w), g)
    assert len(_triton_calls(text)) == 2
    assert "num_warps = 4" in text  # the table's warps for 512-wide blocks


def test_lowering_picks_the_platform():
    """Bound as on a GPU (``force(interpret=False)``): a CPU run lowers the
    primitive to the XLA ops (equal to the XLA path), ``jax.export`` too."""
    g = _gradients(8, (3,), jnp.float32)[0]
    w = jax.random.normal(jax.random.key(8), (V, 3))
    opt = jsr.optim.lazy_adam(0.1)

    def step(w, s, g):
        u, s = opt.update(g, s, w)
        return jsr.optim.apply_updates(w, u), s

    want = jax.jit(step)(w, opt.init(w), g)
    with fused.force(interpret=False):
        assert "jsr_fused_rows" in str(jax.make_jaxpr(step)(w, opt.init(w), g))
        cpu_text = jax.jit(step).trace(w, opt.init(w), g).lower().as_text()
        got = jax.jit(step)(w, opt.init(w), g)
        exported = jax.export.export(jax.jit(step), platforms=["cuda"])(w, opt.init(w), g)
    assert "triton" not in cpu_text and "pallas" not in cpu_text
    assert "triton" not in exported.mlir_module()
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        _assert_close_to_xla(a, b)


def test_grad_and_vmap_through_the_kernels():
    """Derivatives and batches of a fused step are the XLA ops'."""
    g = _gradients(9, (3,), jnp.float32)[0]
    w = jax.random.normal(jax.random.key(9), (V, 3))
    opt = jsr.optim.lazy_adam(0.1)
    s = opt.init(w)

    def loss(w, data):
        u, s2 = opt.update(jsr.RowSparse._make(data, g.indices, g.shape), s, w)
        return jnp.sum(jsr.optim.apply_updates(w, u) ** 2) + jnp.sum(s2[0].nu)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    batched = jax.jit(jax.vmap(loss, in_axes=(None, 0)))
    datas = jnp.stack([g.data, 2 * g.data])
    want = grad(w, g.data), batched(w, datas)
    with fused.force(interpret=False):  # (the rules are those of either lowering)
        assert "jsr_fused_rows" in str(jax.make_jaxpr(grad)(w, g.data))
        got = grad(w, g.data), batched(w, datas)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_interpreted_kernel_aliases_state():
    """The ``pallas_call`` of a rule maps each state operand to its output."""
    g = _gradients(10, (3,), jnp.float32)[0]
    w = jnp.ones((V, 3))
    opt = jsr.optim.scale_by_lazy_adam()
    with fused.force(interpret=True):
        jaxpr = jax.make_jaxpr(opt.update)(g, opt.init(w))
        (eqn,) = _fused_eqns(jaxpr.jaxpr)
        kernel = dict(eqn.params["static"])["kernel"]
        avals = [v.aval for v in eqn.invars]
        inner = jax.make_jaxpr(functools.partial(fused_kernel.pallas_call, kernel, True))(*avals)
    (call,) = [e for e in inner.jaxpr.eqns if e.primitive.name == "pallas_call"]
    first_state = 2 + len(kernel.const_dtypes)  # ids, consts, gradient rows, then mu, nu
    assert dict(call.params["input_output_aliases"]) == {first_state: 1, first_state + 1: 2}


# ------------------------------------------------------------------ benchmark


def test_benchmark_smoke(tmp_path, capsys):
    """``benchmarks/fused_rows.py --smoke``, in this process (its own
    settings are restored when it returns)."""
    out = tmp_path / "fused_rows.json"
    program = runpy.run_path(str(ROOT / "benchmarks" / "fused_rows.py"))
    assert program["main"](["--smoke", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["smoke"] and {r["rule"] for r in record["results"]} == {"adam", "apply_updates"}
    assert "adam" in printed and fused.forced() is None
