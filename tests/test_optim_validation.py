"""Bad input to `jsr.optim` fails with an error naming the argument, what was
expected and what was received: hyperparameters (at construction), gradient
dtypes, pytree structures, states of another optimizer, and exact SGD's
`catch_up` / `flush` with parameters or a state that do not fit.

Host values are checked at construction; JAX arrays (what
`optax.inject_hyperparams` passes, traced under `jit`) are accepted unread.
Almost every case runs eagerly; one jitted case per kind of check guards the
traced path.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr

optim = jsr.optim
NAN, INF = float("nan"), math.inf
W = jnp.ones((4, 2))
G = jsr.RowSparse([[1.0, 2.0]], [1], shape=(4, 2))


def _step(opt, grads=G, params=W, state=None):
    state = opt.init(params) if state is None else state
    return opt.update(grads, state, params)


# ---------------------------------------------------------------- hyperparameters

BAD_VALUES = [
    # (build, argument name, what the message says is expected)
    (lambda: optim.lazy_sgd(NAN), "learning_rate", "finite"),
    (lambda: optim.lazy_sgd(INF), "learning_rate", "finite"),
    (lambda: optim.lazy_sgd(np.float32(NAN)), "learning_rate", "finite"),
    (lambda: optim.lazy_sgd(np.array(INF)), "learning_rate", "finite"),
    (lambda: optim.lazy_sgd(NAN, lazy="exact"), "learning_rate", "finite"),
    (lambda: optim.lazy_sgd(0.1, momentum=-0.5), "momentum", ">= 0"),
    (lambda: optim.lazy_sgd(0.1, momentum=-0.5, lazy="exact"), "momentum", ">= 0"),
    (lambda: optim.lazy_sgd(0.1, weight_decay=NAN), "weight_decay", "finite"),
    (lambda: optim.lazy_sgd(0.1, rescale_grad=INF), "rescale_grad", "finite"),
    (lambda: optim.lazy_sgd(0.1, clip_gradient=NAN), "clip_gradient", "> 0"),
    (lambda: optim.lazy_adam(0.1, b1=1.0), "b1", r"\[0, 1\)"),
    (lambda: optim.lazy_adam(0.1, b1=-0.1), "b1", r"\[0, 1\)"),
    (lambda: optim.lazy_adam(0.1, b2=1.0), "b2", r"\[0, 1\)"),
    (lambda: optim.lazy_adamw(0.1, b2=NAN), "b2", r"\[0, 1\)"),
    (lambda: optim.lazy_adam(0.1, eps=-1.0), "eps", ">= 0"),
    (lambda: optim.lazy_adam(0.1, eps_root=-1e-8), "eps_root", ">= 0"),
    (lambda: optim.lazy_adam(NAN), "learning_rate", "finite"),
    (lambda: optim.lazy_adamw(0.1, weight_decay=INF), "weight_decay", "finite"),
    (
        lambda: optim.lazy_adagrad(0.1, initial_accumulator_value=-1.0),
        "initial_accumulator",
        ">= 0",
    ),
    (lambda: optim.lazy_adagrad(0.1, eps=-1.0), "eps", ">= 0"),
    (lambda: optim.lazy_rowwise_adagrad(0.1, eps=-10.0), "eps", ">= 0"),
    (lambda: optim.lazy_rowwise_adagrad(0.1, weight_decay=NAN), "weight_decay", "finite"),
    (lambda: optim.lazy_ftrl(0.0), "learning_rate", "> 0"),
    (lambda: optim.lazy_ftrl(-0.1), "learning_rate", "> 0"),
    (lambda: optim.lazy_ftrl(0.1, lamda1=-1.0), "lamda1", ">= 0"),
    (lambda: optim.lazy_ftrl(0.1, beta=-10.0), "beta", ">= 0"),
    (lambda: optim.lazy_ftrl(0.1, weight_decay=-1.0), "weight_decay", ">= 0"),
    (lambda: optim.clip_by_global_norm(-1.0), "max_norm", "> 0"),
    (lambda: optim.clip_by_global_norm(0.0), "max_norm", "> 0"),
    (lambda: optim.clip_by_global_norm(NAN), "max_norm", "> 0"),
    (lambda: optim.scale_by_learning_rate(NAN), "learning_rate", "finite"),
    (lambda: optim.add_decayed_weights(INF), "weight_decay", "finite"),
    (lambda: optim.lazy_adam(0.1, mu_dtype=jnp.int32), "mu_dtype", "floating dtype"),
    (lambda: optim.lazy_adam(0.1, mu_dtype="bool"), "mu_dtype", "floating dtype"),
]


@pytest.mark.parametrize("build,name,expected", BAD_VALUES)
def test_bad_host_hyperparameter_values_fail_at_construction(build, name, expected):
    """These gave NaN or exploding rows (b1=1, eps<0, ftrl lr=0), flipped every
    update (max_norm<0) or truncated the moments (integer mu_dtype)."""
    with pytest.raises(ValueError, match=rf"`{name}.*must be .*{expected}.*got"):
        build()


BAD_TYPES = [
    (lambda: optim.lazy_sgd("0.1"), "learning_rate", r"'0\.1' \(str\)"),
    (lambda: optim.lazy_sgd("0.1", lazy="exact"), "learning_rate", r"'0\.1' \(str\)"),
    (lambda: optim.lazy_sgd(None), "learning_rate", "None"),
    (lambda: optim.lazy_sgd(True), "learning_rate", r"True \(bool\)"),
    (lambda: optim.lazy_sgd(0.1j), "learning_rate", "complex"),
    (lambda: optim.lazy_sgd([0.1]), "learning_rate", "list"),
    (lambda: optim.lazy_sgd(jnp.full((4, 2), 0.1)), "learning_rate", r"shape \(4, 2\)"),
    (lambda: optim.lazy_sgd(np.ones(2)), "learning_rate", r"shape \(2,\)"),
    (lambda: optim.lazy_sgd(0.1, momentum="0.9"), "momentum", r"'0\.9' \(str\)"),
    (lambda: optim.lazy_sgd(0.1, clip_gradient="1"), "clip_gradient", r"'1' \(str\)"),
    (lambda: optim.lazy_sgd(0.1, clip_gradient=jnp.array([1.0, 2.0])), "clip_gradient", "shape"),
    (lambda: optim.lazy_sgd(0.1, rescale_grad=None), "rescale_grad", "None"),
    (lambda: optim.lazy_sgd(0.1, nesterov="no"), "nesterov", r"str 'no'"),
    (lambda: optim.lazy_sgd(0.1, nesterov="no", lazy="exact"), "nesterov", r"str 'no'"),
    (lambda: optim.lazy_adam("1e-3"), "learning_rate", "str"),
    (lambda: optim.lazy_adam(0.1, b1=None), "b1", "None"),
    (lambda: optim.lazy_adam(0.1, mu_dtype="foo"), "mu_dtype", "'foo'.*not a dtype"),
    (lambda: optim.lazy_adagrad(0.1, eps=[1e-7]), "eps", "list"),
    (lambda: optim.lazy_ftrl("0.1"), "learning_rate", "str"),
    (lambda: optim.add_decayed_weights("0.1"), "weight_decay", "str"),
    (lambda: optim.add_decayed_weights(0.1, lazy="no"), "lazy", r"str 'no'"),
    (lambda: optim.lazy_adamw(0.1, weight_decay=jnp.ones(3)), "weight_decay", "shape"),
    (lambda: optim.clip_by_global_norm("1"), "max_norm", "str"),
    (lambda: optim.scale_by_learning_rate(0.1, flip_sign="yes"), "flip_sign", r"str 'yes'"),
    (lambda: optim.lift_elementwise(3), "inner", r"3 \(int\)"),
    (lambda: optim.skip_nonfinite(3), "inner", r"3 \(int\)"),
]


@pytest.mark.parametrize("build,name,received", BAD_TYPES)
def test_bad_hyperparameter_types_fail_at_construction(build, name, received):
    """These failed at `update` with messages that did not name the argument
    (or, for `lazy_sgd("0.1", lazy="exact")` and `add_decayed_weights(lazy="no")`,
    were accepted)."""
    with pytest.raises(TypeError, match=rf"`{name}` must be .*got .*{received}"):
        build()


def test_good_hyperparameters_are_accepted():
    """Negative learning rates (as optax), NumPy scalars, 0-d arrays, None where
    a term can be off, NumPy bools and dtype names all still build and step
    (the steps run in one jitted function to keep the test fast)."""
    opts = (
        optim.lazy_sgd(-0.1),
        optim.lazy_sgd(np.float32(0.1), momentum=None, weight_decay=None, nesterov=np.bool_(True)),
        optim.lazy_sgd(np.array(0.1), momentum=np.float64(0.5), clip_gradient=np.int64(1)),
        optim.lazy_sgd(jnp.asarray(0.1), momentum=jnp.asarray(0.0)),
        optim.lazy_sgd(1, momentum=0, lazy="exact"),
        optim.lazy_adam(optax.linear_schedule(0.1, 0.0, 10), b1=0, eps=0, mu_dtype="float32"),
        optim.lazy_adamw(0.1, weight_decay=-0.1, mu_dtype=jnp.bfloat16),
        optim.lazy_adagrad(0.1, initial_accumulator_value=0, eps=0),
        optim.lazy_ftrl(optax.constant_schedule(0.1), lamda1=0, beta=0, weight_decay=0),
        optax.chain(
            optim.clip_by_global_norm(INF), optim.add_decayed_weights(None, lazy=np.bool_(0))
        ),
    )
    outs = jax.jit(lambda: [jsr.todense(_step(opt)[0]) for opt in opts])()
    assert all(np.all(np.isfinite(np.asarray(u))) for u in outs)


def test_traced_hyperparameters_are_accepted_unread():
    """Under `jit` (and `optax.inject_hyperparams`) hyperparameters are tracers:
    only their shape and dtype are checked, so building inside a trace works."""

    @jax.jit
    def step(h):
        opts = [
            optim.lazy_sgd(h["lr"], momentum=h["b1"], clip_gradient=h["eps"], rescale_grad=h["lr"]),
            optim.lazy_adamw(h["lr"], b1=h["b1"], b2=h["b1"], eps=h["eps"], weight_decay=h["lr"]),
            optim.lazy_adagrad(h["lr"], initial_accumulator_value=h["eps"], eps=h["eps"]),
            optim.lazy_rowwise_adagrad(h["lr"], eps=h["eps"], weight_decay=h["lr"]),
            optim.lazy_ftrl(h["lr"], lamda1=h["eps"], beta=h["b1"], weight_decay=h["eps"]),
            optax.chain(optim.clip_by_global_norm(h["lr"]), optim.add_decayed_weights(h["eps"])),
        ]
        return [jsr.todense(_step(opt)[0]) for opt in opts]

    outs = step({"lr": 0.1, "b1": jnp.asarray(0.5), "eps": jnp.asarray(1, jnp.int32)})
    assert all(np.all(np.isfinite(np.asarray(u))) for u in outs)
    injected = optax.inject_hyperparams(optim.clip_by_global_norm)(max_norm=1.0)
    u, _ = jax.jit(injected.update)(G, injected.init(W))
    np.testing.assert_allclose(np.asarray(u.data), [[0.4472136, 0.8944272]], rtol=1e-6)
    with pytest.raises(TypeError, match=r"`learning_rate` must be .*shape \(2,\)"):
        jax.jit(lambda lr: optim.lazy_sgd(lr))(jnp.ones(2))


# ---------------------------------------------------------------- gradient dtypes

INT_OPTS = {
    "sgd": lambda: optim.lazy_sgd(0.5),
    "sgd_momentum_dense": lambda: optim.lazy_sgd(0.5, momentum=0.9, lazy=False),
    "sgd_exact": lambda: optim.lazy_sgd(0.5, momentum=0.5, lazy="exact"),
    "adam": lambda: optim.lazy_adam(0.5),
    "adagrad": lambda: optim.lazy_adagrad(0.5),
    "rowwise_adagrad": lambda: optim.lazy_rowwise_adagrad(0.5),
    "ftrl": lambda: optim.lazy_ftrl(0.5),
    "scale_by_learning_rate": lambda: optim.scale_by_learning_rate(0.5),
    "scheduled_learning_rate": lambda: optim.scale_by_learning_rate(optax.constant_schedule(0.5)),
    "clip_by_global_norm": lambda: optim.clip_by_global_norm(1.0),
}
INT_GRADS = {
    "int_rowsparse": jsr.RowSparse([[1, 2]], [1], shape=(4, 2)),
    "bool_rowsparse": jsr.RowSparse([[True, False]], [1], shape=(4, 2)),
    "int_dense": jnp.ones((4, 2), jnp.int32),
}


@pytest.mark.parametrize("grad", sorted(INT_GRADS))
@pytest.mark.parametrize("name", sorted(INT_OPTS))
def test_integer_and_bool_gradients_are_refused(name, grad):
    """The learning rate was cast to the gradient's dtype: 0.5 became 0 (no
    step) and, for bool gradients, -0.5 became True (a step uphill)."""
    g = INT_GRADS[grad]
    dtype = "bool" if grad.startswith("bool") else "int32"
    with pytest.raises(TypeError, match=rf"`params` has dtype {dtype}.*must be floating"):
        _step(INT_OPTS[name](), grads=g)


def test_integer_gradients_are_refused_under_jit_with_the_parameter_path():
    opt = optim.lazy_adam(0.1)
    params = {"emb": W, "b": jnp.zeros(2)}
    grads = {"emb": jsr.RowSparse([[1, 2]], [1], shape=(4, 2)), "b": jnp.zeros(2)}
    with pytest.raises(TypeError, match=r"`params\['emb'\]` has dtype int32"):
        jax.jit(opt.update)(grads, opt.init(params), params)


def test_floating_and_complex_gradients_still_work():
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        g = jsr.RowSparse(jnp.asarray([[1.0, 2.0]], dtype), jnp.asarray([1]), shape=(4, 2))
        u, _ = _step(optim.lazy_sgd(0.5), grads=g)
        np.testing.assert_allclose(np.asarray(u.data, np.float32), [[-0.5, -1.0]])
    wc = jnp.ones((4, 2), jnp.complex64)
    gc = jsr.RowSparse(jnp.asarray([[1j, 2.0]], jnp.complex64), jnp.asarray([1]), shape=(4, 2))
    u, _ = _step(optim.lazy_sgd(0.5), grads=gc, params=wc)
    np.testing.assert_allclose(np.asarray(u.data), [[-0.5j, -1.0]])


# ---------------------------------------------------------------- pytree structures

PARAMS = {"emb": W, "b": jnp.zeros(2)}
GRADS = {"emb": G, "b": jnp.ones(2)}
CSR = jsr.csr_matrix(np.eye(4, 2, dtype=np.float32))
STRUCTURE_CASES = [
    # (optimizer, gradients, params, error, pattern)
    ("adam", {"emb": G}, PARAMS, ValueError, r"`updates` and `state.mu`.*\{'emb': \*\}.*'b'"),
    ("adam", {**GRADS, "c": jnp.ones(1)}, PARAMS, ValueError, r"`updates` and `state.mu`.*'c'"),
    ("adam", [G, jnp.ones(2)], PARAMS, ValueError, r"`updates` and `state.mu`.*\[\*, \*\]"),
    ("sgd", {"emb": G}, PARAMS, ValueError, r"`updates` and `state.trace`"),
    ("sgd_wd", GRADS, {"emb": W}, ValueError, r"`updates` and `params`.*\{'emb': \*\}"),
    ("adagrad", {"emb": G}, PARAMS, ValueError, r"`updates` and `state.sum_of_squares`"),
    ("ftrl", {"emb": G}, PARAMS, ValueError, r"`updates` and `state.z`"),
    ("exact", {"emb": G}, PARAMS, ValueError, r"`updates` and `state.trace`"),
    ("adamw", GRADS, [W, jnp.zeros(2)], ValueError, r"`updates` and `params`"),
    ("adam", {"emb": CSR, "b": jnp.ones(2)}, PARAMS, TypeError, r"`params\['emb'\]` is a CSR"),
]
STRUCT_OPTS = {
    "adam": lambda: optim.lazy_adam(0.1),
    "adamw": lambda: optim.lazy_adamw(0.1),
    "sgd": lambda: optim.lazy_sgd(0.1, momentum=0.9),
    "sgd_wd": lambda: optim.lazy_sgd(0.1, weight_decay=0.1),
    "adagrad": lambda: optim.lazy_adagrad(0.1),
    "ftrl": lambda: optim.lazy_ftrl(0.1),
    "exact": lambda: optim.lazy_sgd(0.1, momentum=0.5, lazy="exact"),
}


@pytest.mark.parametrize("name,grads,params,error,pattern", STRUCTURE_CASES)
def test_structure_mismatches_name_both_trees(name, grads, params, error, pattern):
    """These surfaced as jax's raw "Dict key mismatch" / "Expected list" /
    "Custom node type mismatch" errors, naming neither argument."""
    opt = STRUCT_OPTS[name]()
    state = opt.init(PARAMS)
    with pytest.raises(error, match=pattern):
        opt.update(grads, state, params)


def test_structure_mismatch_is_found_when_tracing():
    opt = optim.lazy_adam(0.1)
    with pytest.raises(ValueError, match=r"`updates` and `state.mu` have different pytree"):
        jax.jit(opt.update)({"emb": G}, opt.init(PARAMS), PARAMS)


@pytest.mark.parametrize(
    "make,use,got",
    [
        (
            lambda: optim.lazy_sgd(0.1),
            optim.lazy_adam(0.1),
            "ScaleByLazyAdamState.*ScaleByLazySgdState",
        ),
        (
            lambda: optim.lazy_adam(0.1),
            optim.lazy_sgd(0.1),
            "ScaleByLazySgdState.*ScaleByLazyAdamState",
        ),
        (lambda: optim.lazy_adam(0.1), optim.lazy_adagrad(0.1), "ScaleByLazyAdagradState"),
        (
            lambda: optim.lazy_adagrad(0.1),
            optim.lazy_rowwise_adagrad(0.1),
            "ScaleByLazyRowwiseAdagradState",
        ),
        (lambda: optim.lazy_adam(0.1), optim.lazy_ftrl(0.1), "LazyFtrlState.*tuple"),
        (lambda: optim.lazy_ftrl(0.1), optim.lazy_sgd(0.1, lazy="exact"), "ExactLazySgdState"),
        (
            lambda: optim.lazy_adam(0.1),
            optim.skip_nonfinite(optim.lazy_adam(0.1)),
            "SkipNonfiniteState",
        ),
        (
            lambda: optim.lazy_ftrl(0.1),
            optim.scale_by_learning_rate(optax.constant_schedule(0.1)),
            "ScaleByLearningRateState.*LazyFtrlState",
        ),
    ],
)
def test_state_of_another_optimizer_is_refused(make, use, got):
    """A lazy_sgd state passed to lazy_adam failed with "Value '<built-in
    method count of ScaleByLazySgdState>' ... not a valid JAX array type"."""
    state = make().init(W)
    with pytest.raises(TypeError, match=rf"`.*\.update` needs the {got}"):
        _step(use, state=state)


def test_state_of_another_optimizer_is_refused_under_jit():
    state = optim.lazy_sgd(0.1).init(W)
    with pytest.raises(TypeError, match="needs the ScaleByLazyAdamState"):
        jax.jit(optim.lazy_adam(0.1).update)(G, state, W)


def test_apply_updates_structure_mismatch_names_params_and_updates():
    """This gave jax's "pytree structure error: different numbers of pytree children"."""
    with pytest.raises(ValueError, match=r"`params` and `updates` .*'b'.*\{'emb': \*\}"):
        optim.apply_updates(PARAMS, {"emb": G})
    with pytest.raises(ValueError, match=r"`params` and `updates` have different"):
        jax.jit(optim.apply_updates)(PARAMS, [G, jnp.ones(2)])
    out = optim.apply_updates({"emb": W, "frozen": None}, {"emb": G, "frozen": None})
    np.testing.assert_array_equal(np.asarray(out["emb"][1]), [2.0, 3.0])


INT_PARAMS = {"step": jnp.array([1, 2], jnp.int32), "w": jnp.zeros(2)}
TRUNCATING_UPDATES = [
    # (parameter, update, parameter dtype, update dtype)
    (jnp.array([1, 2], jnp.int32), jnp.array([0.7, -0.7]), "int32", "float32"),
    (jnp.array([True, False]), jnp.array([-0.5, 0.5]), "bool", "float32"),
    (jnp.ones((4, 2), jnp.int32), G, "int32", "float32"),  # RowSparse update
    (jnp.array([1, 2], jnp.int8), jnp.array([0.5, 0.5], jnp.bfloat16), "int8", "bfloat16"),
    (jnp.array([1, 2], jnp.int32), jnp.array([1j, 0j], jnp.complex64), "int32", "complex64"),
    (jnp.array([1.0, 2.0]), jnp.array([1j, 0j], jnp.complex64), "float32", "complex64"),
]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("param,update,pdtype,udtype", TRUNCATING_UPDATES)
def test_apply_updates_refuses_updates_the_parameter_dtype_would_truncate(
    param, update, pdtype, udtype, jit
):
    """An int32 parameter 1 with an update 0.7 stayed 1 (and a bool parameter
    turned True for any nonzero update): the cast back to the parameter's
    dtype dropped the update silently, as `optax.apply_updates` does."""
    params = {"step": param, "w": jnp.zeros(2)}
    updates = {"step": update, "w": jnp.ones(2)}
    apply = jax.jit(optim.apply_updates) if jit else optim.apply_updates
    pattern = (
        rf"update for `params\['step'\]` has dtype {udtype}, but the parameter has dtype "
        rf"{pdtype}: .* cast back to the parameter's dtype\. .*"
    )
    with pytest.raises(TypeError, match=pattern):
        apply(params, updates)


@pytest.mark.parametrize("jit", [False, True])
def test_apply_updates_still_takes_exact_and_no_op_updates(jit):
    """Integer updates of integer parameters (exact, as optax), a float32
    update of a bfloat16 parameter (rounded: mixed precision), and None or
    float0 updates (`jax.grad(..., allow_int=True)` of an integer input),
    which leave the parameter unchanged; optax fails on the last two."""
    apply = jax.jit(optim.apply_updates) if jit else optim.apply_updates
    params = {
        "count": jnp.array([1, 2], jnp.int32),
        "flag": jnp.array([True, False]),
        "half": jnp.ones((4, 2), jnp.bfloat16),
        "w": jnp.zeros(2),
    }
    updates = {
        "count": jnp.array([3, -1], jnp.int32),
        "flag": np.zeros((2,), jax.dtypes.float0),
        "half": G,
        "w": jnp.ones(2),
    }
    out = apply(params, updates)
    np.testing.assert_array_equal(np.asarray(out["count"]), [4, 1])
    np.testing.assert_array_equal(np.asarray(out["flag"]), [True, False])
    assert out["half"].dtype == jnp.bfloat16 and out["count"].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out["half"], np.float32)[1], [2.0, 3.0])
    out = apply(params, {**updates, "count": None, "flag": None})
    np.testing.assert_array_equal(np.asarray(out["count"]), [1, 2])
    grads = jax.grad(lambda p: jnp.sum(p["w"]), allow_int=True)(INT_PARAMS)
    out = apply(INT_PARAMS, grads)
    np.testing.assert_array_equal(np.asarray(out["step"]), [1, 2])
    np.testing.assert_array_equal(np.asarray(out["w"]), [1.0, 1.0])
    with pytest.raises(ValueError, match=r"`params\['flag'\]`.*shape \(3,\)"):
        apply(params, {**updates, "flag": np.zeros((3,), jax.dtypes.float0)})


# ---------------------------------------------------------------- exact SGD


def _exact_state(momentum=0.5, shape=(4, 2)):
    opt = optim.lazy_sgd(0.1, momentum=momentum, lazy="exact")
    return opt, opt.init(jnp.ones(shape))


@pytest.mark.parametrize("momentum", [0.5, None])
@pytest.mark.parametrize("dense", [False, True])
def test_exact_update_checks_params_against_the_state(momentum, dense):
    """The update accepted a (6, 2) parameter with a (4, 2) state."""
    opt, s = _exact_state(momentum)
    w6 = jnp.ones((6, 2))
    g = jnp.ones((6, 2)) if dense else jsr.RowSparse([[1.0, 1.0]], [1], shape=(6, 2))
    what = r"shaped like the parameter\) has shape \(4, 2\)" if momentum else r"`last_step`"
    with pytest.raises(ValueError, match=rf"`params`.*\(6, 2\).*optimizer state.*{what}"):
        opt.update(g, s, w6)


@pytest.mark.parametrize("momentum", [0.5, None])
@pytest.mark.parametrize("rows", [6, 2])
def test_catch_up_and_flush_check_params_against_the_state(momentum, rows):
    """catch_up / flush with a (6, 2) or (2, 2) parameter and a (4, 2) state
    were silent no-ops, or a broadcasting error from deep inside."""
    _, s = _exact_state(momentum)
    w = jnp.ones((rows, 2))
    what = r"shaped like the parameter\) has shape \(4, 2\)" if momentum else r"`last_step`"
    pattern = rf"parameter `params` has shape \({rows}, 2\), but the optimizer state.*{what}"
    with pytest.raises(ValueError, match=pattern):
        optim.catch_up(w, s, jnp.array([1]))
    with pytest.raises(ValueError, match=pattern):
        optim.flush(w, s)


def test_catch_up_and_flush_check_structures():
    _, s = _exact_state()
    with pytest.raises(ValueError, match=r"`params` and `state.trace` have different"):
        optim.flush({"a": W}, s)
    s = optim.lazy_sgd(0.1, momentum=0.5, lazy="exact").init({"a": W, "b": W})
    with pytest.raises(ValueError, match=r"`ids` and `state.trace` have different"):
        optim.catch_up({"a": W}, s, {"a": jnp.array([1])})


@pytest.mark.parametrize(
    "state",
    [
        optim.lazy_sgd(0.1).init(W),
        optim.lazy_sgd(0.1, momentum=0.5, lazy=False).init(W),
        optim.lazy_adam(0.1).init(W),
        (),
    ],
    ids=["lazy_sgd", "lazy_sgd_dense", "lazy_adam", "empty"],
)
def test_catch_up_and_flush_refuse_a_state_without_exact_sgd(state):
    """Given another optimizer's state they did nothing, silently."""
    pattern = r"`{}` needs the state of `lazy_sgd\(\.\.\., lazy=\"exact\"\)`.*got"
    with pytest.raises(ValueError, match=pattern.format("catch_up")):
        optim.catch_up(W, state, jnp.array([0]))
    with pytest.raises(ValueError, match=pattern.format("flush")):
        optim.flush(W, state)


def test_catch_up_and_flush_checks_work_under_jit_and_inside_a_chain():
    opt, s = _exact_state()
    with pytest.raises(ValueError, match="contains no ExactLazySgdState"):
        jax.jit(optim.catch_up)(W, optim.lazy_adam(0.1).init(W), jnp.array([0]))
    with pytest.raises(ValueError, match=r"\(6, 2\), but the optimizer state"):
        jax.jit(optim.flush)(jnp.ones((6, 2)), s)
    # A chain's state holding the exact state is still found and caught up.
    chained = optax.chain(optim.clip_by_global_norm(10.0), opt)
    cs = chained.init(W)
    for row in (0, 1):
        u, cs = chained.update(jsr.RowSparse([[1.0, 1.0]], [row], shape=(4, 2)), cs, W)
    w, cs = jax.jit(optim.catch_up)(W, cs, jnp.array([0]))
    assert int(cs[1].last_step[0]) == 2
    w, cs = optim.flush(w, cs)
    np.testing.assert_array_equal(np.asarray(cs[1].last_step), [2, 2, 2, 2])
