"""Cost properties of the lazy step: in-place donation, no [V, ...]
intermediates at V = 10**8, no recompilation; and state handling (tree
utilities, device_put, pickling, checkpoint round trip)."""

from __future__ import annotations

import functools
import pickle
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim_common import grad_sequence

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows._dtypes import index_dtype

# Every test runs with the native CPU row kernels (where built) and with XLA's
# gathers and scatters.
pytestmark = pytest.mark.usefixtures("kernels")


def _is_row_scatter(eqn) -> bool:
    """A native in-place row scatter, or row-wise AdaGrad's fused update of its
    accumulator rows: a kernel whose (first) result aliases operand 0."""
    return (
        eqn.primitive.name == "ffi_call"
        and eqn.params["target_name"]
        in (_native.SCATTER_ROWS.target, _native.ROWWISE_ADAGRAD.target)
        and dict(eqn.params["input_output_aliases"]) == {0: 0}
    )


OPTS = {
    "sgd": lambda: jsr.optim.lazy_sgd(
        0.1, momentum=0.9, nesterov=True, weight_decay=1e-3, clip_gradient=1.0
    ),
    "adam": lambda: jsr.optim.lazy_adam(optax.exponential_decay(0.1, 10, 0.9)),
    "adamw": lambda: jsr.optim.lazy_adamw(0.1),
    "adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "rowwise": lambda: jsr.optim.lazy_rowwise_adagrad(0.1, weight_decay=1e-3),
    "ftrl": lambda: jsr.optim.lazy_ftrl(0.1, weight_decay=1e-3),
    "skip_adam": lambda: jsr.optim.skip_nonfinite(jsr.optim.lazy_adam(0.1)),
    "exact_sgd": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, weight_decay=1e-3, lazy="exact"),
}


def _step(opt, apply=optax.apply_updates):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return apply(params, updates), state

    return step


def _sparse_grads(v, d, k):
    return {
        "emb": jsr.RowSparse._make(
            jax.ShapeDtypeStruct((k, d), jnp.float32),
            jax.ShapeDtypeStruct((k,), index_dtype()),
            (v, d),
        ),
        "b": jax.ShapeDtypeStruct((d,), jnp.float32),
    }


def _sub_jaxprs(value):
    items = value if isinstance(value, tuple | list) else (value,)
    for v in items:
        if isinstance(v, jax.extend.core.ClosedJaxpr):
            yield v.jaxpr
        elif isinstance(v, jax.extend.core.Jaxpr):
            yield v


def _all_eqns(jaxpr):
    """``(eqn, inputs)`` for every primitive equation, nested calls, conds and
    loops included; ``inputs`` are the variables of the jaxpr it sits in. A
    scatter's ``update_jaxpr`` (its combiner, e.g. ``add``) is not a nested
    program: the scatter itself is yielded. A ``jsr_kernel_call`` is opened
    into both of its forms, the native call and the XLA ops, as their own
    programs (like the branches of a cond)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "jsr_kernel_call":
            avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
            for fn in (eqn.params["native"], eqn.params["xla"]):
                if fn is None:  # a call with no native form
                    continue
                fn = functools.partial(fn, **dict(eqn.params["static"]))
                yield from _all_eqns(jax.make_jaxpr(fn)(*avals).jaxpr)
            continue
        subs = [j for k, v in eqn.params.items() if k != "update_jaxpr" for j in _sub_jaxprs(v)]
        if subs:
            for sub in subs:
                yield from _all_eqns(sub)
        else:
            yield eqn, set(jaxpr.invars)


@pytest.mark.parametrize("name", sorted(OPTS))
@pytest.mark.parametrize("apply", ["optax", "jsr"])
def test_no_full_table_intermediates_at_1e8_rows(name, apply, kernels):
    v, d, k = 10**8, 4, 64
    opt = OPTS[name]()
    params = {
        "emb": jax.ShapeDtypeStruct((v, d), jnp.float32),
        "b": jax.ShapeDtypeStruct((d,), jnp.float32),
    }
    state = jax.eval_shape(opt.init, params)
    ap = optax.apply_updates if apply == "optax" else jsr.optim.apply_updates
    jaxpr = jax.make_jaxpr(_step(opt, ap))(params, state, _sparse_grads(v, d, k)).jaxpr
    big = [
        (e, ins)
        for e, ins in _all_eqns(jaxpr)
        if any(getattr(o.aval, "shape", ())[:1] == (v,) for o in e.outvars)
    ]
    assert big, "expected the in-place scatters into params/state"
    assert all(
        e.primitive.name in ("scatter", "scatter-add") or _is_row_scatter(e) for e, _ in big
    ), [str(e.primitive) for e, _ in big]
    # With the kernels on, the optimizer's own row scatters are native on CPU
    # (next to their XLA form, the other platforms' branch).
    assert any(_is_row_scatter(e) for e, _ in big) == (kernels == "native")
    # Every big scatter writes into an input buffer (or the output of another
    # such scatter), never into a freshly built [V, ...] array.
    produced = {o for e, _ in big for o in e.outvars}
    for e, ins in big:
        assert e.invars[0] in ins or e.invars[0] in produced
        # RowSparse indices are sorted and unique (padding is dropped): XLA is
        # told so, and may split the scatter across threads.
        if not _is_row_scatter(e):
            assert e.params["indices_are_sorted"] and e.params["unique_indices"], e


@pytest.mark.parametrize("name", sorted(OPTS))
def test_donated_step_is_in_place(name):
    v, d, k = 1000, 8, 16
    opt = OPTS[name]()
    params = {"emb": jnp.zeros((v, d)), "b": jnp.zeros(d)}
    state = opt.init(params)
    g, _, _ = grad_sequence(0, 1, v, (d,), capacity=k, empty_steps=())[0]
    grads = {"emb": g, "b": jnp.ones(d)}
    text = jax.jit(_step(opt), donate_argnums=(0, 1)).lower(params, state, grads).compile()
    text = text.as_text()
    header = text.splitlines()[0]
    aliased = set(int(i) for i in re.findall(r"\(\s*(\d+),\s*\{\}", header))
    n_in = len(jax.tree.leaves((params, state)))
    big_inputs = [
        i for i, x in enumerate(jax.tree.leaves((params, state))) if jnp.shape(x)[:1] == (v,)
    ]
    assert big_inputs and set(big_inputs) <= aliased, (big_inputs, header)
    assert max(aliased) < n_in
    # ...and XLA did not have to copy a full table to do it.
    copies = [ln for ln in text.splitlines() if " copy(" in ln and f"[{v}," in ln]
    assert not copies, copies


@pytest.mark.parametrize("name", sorted(OPTS))
def test_step_compiles_ahead_of_time_from_shapes(name, kernels):
    """The recipe of training.md: a donated step compiled from
    ``jax.eval_shape`` of the parameters and of ``opt.init`` (no array
    allocated) takes the real state, and steps as the jitted step does."""
    v, d, k = 300, 4, 8
    opt = OPTS[name]()

    def init_params():
        return {"emb": jnp.linspace(-1.0, 1.0, v * d).reshape(v, d), "b": jnp.ones(d)}

    seq = grad_sequence(2, 3, v, (d,), capacity=k, empty_steps=())
    grads = [{"emb": g, "b": jnp.full(d, 0.5)} for g, _, _ in seq]
    shapes = jax.eval_shape(init_params)
    g_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), grads[0])
    compiled = (
        jax.jit(_step(opt, jsr.optim.apply_updates), donate_argnums=(0, 1))
        .trace(shapes, jax.eval_shape(opt.init, shapes), g_spec)
        .lower()
        .compile()
    )
    jitted = jax.jit(_step(opt, jsr.optim.apply_updates))
    p, s = init_params(), opt.init(init_params())
    want_p, want_s = init_params(), opt.init(init_params())
    for g in grads:
        p, s = compiled(p, s, g)
        want_p, want_s = jitted(want_p, want_s, g)
    assert jax.tree.structure(s) == jax.tree.structure(want_s)
    for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((want_p, want_s)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert not np.allclose(p["emb"], init_params()["emb"])


@pytest.mark.parametrize("name", ["sgd", "adam", "ftrl"])
def test_second_call_compiles_nothing(name):
    opt = OPTS[name]()
    params = {"emb": jnp.zeros((50, 3)), "b": jnp.zeros(3)}
    f = jax.jit(_step(opt))
    state = opt.init(params)
    for g, _, _ in grad_sequence(1, 4, 50, (3,), capacity=6):
        params, state = f(params, state, {"emb": g, "b": jnp.ones(3)})
    assert f._cache_size() == 1


@pytest.mark.parametrize("name", sorted(OPTS))
def test_embedding_training_step_has_no_effects(name):
    # pull_rows + take + value_and_grad + a lazy optimizer: no checkify check
    # (which would give the step an error effect and JAX's slow dispatch path).
    opt = OPTS[name]()
    params = {"emb": jnp.zeros((50, 3)), "b": jnp.zeros(3)}

    def loss(view, ids):
        return jnp.sum(jsr.take(view["emb"], ids).sum(axis=1) @ view["b"])

    def step(params, state, ids):
        view = dict(params, emb=jsr.pull_rows(params["emb"], ids))
        _, grads = jsr.value_and_grad(loss)(view, ids)
        updates, state = opt.update(grads, state, params)
        return jsr.optim.apply_updates(params, updates), state

    ids = jnp.array([[1, 4], [4, 7]])
    jaxpr = jax.make_jaxpr(step)(params, opt.init(params), ids)
    assert not jaxpr.effects, jaxpr.effects


@pytest.mark.parametrize("name", sorted(OPTS))
def test_state_is_an_ordinary_pytree(name):
    opt = OPTS[name]()
    params = {"emb": jnp.ones((6, 2)), "b": jnp.zeros(2)}
    state = opt.init(params)
    leaves, treedef = jax.tree.flatten(state)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is type(state) and len(leaves) >= 1
    doubled = jax.tree.map(lambda x: x * 2, state)
    assert jax.tree.structure(doubled) == treedef
    moved = jax.device_put(state, jax.devices()[0])
    restored = pickle.loads(pickle.dumps(moved))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("name", sorted(OPTS))
def test_checkpoint_round_trip_is_identical(name, tmp_path):
    opt = OPTS[name]()
    params = {
        "emb": jnp.asarray(np.random.default_rng(3).normal(size=(20, 3)), jnp.float32),
        "b": jnp.zeros(3),
    }
    grads = [
        {"emb": g, "b": jnp.full(3, 0.1 * i, jnp.float32)}
        for i, (g, _, _) in enumerate(grad_sequence(4, 12, 20, (3,), capacity=5))
    ]
    step = jax.jit(_step(opt, jsr.optim.apply_updates))
    full, full_state = params, opt.init(params)
    for g in grads:
        full, full_state = step(full, full_state, g)
    half, half_state = params, opt.init(params)
    for g in grads[:6]:
        half, half_state = step(half, half_state, g)
    path = tmp_path / "ckpt.pkl"
    leaves, treedef = jax.tree.flatten((half, half_state))
    with open(path, "wb") as f:
        pickle.dump([np.asarray(x) for x in leaves], f)
    del half, half_state
    with open(path, "rb") as f:
        p2, s2 = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in pickle.load(f)])
    for g in grads[6:]:
        p2, s2 = step(p2, s2, g)
    for a, b in zip(jax.tree.leaves((full, full_state)), jax.tree.leaves((p2, s2)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
