"""The optax compatibility contract: each optax transform a training step uses,
fed the RowSparse gradients of a real step, eagerly and under jit.

Every row of the table "Which optax transforms are safe on RowSparse updates"
in docs/optimizers.md is a case here, keyed by the row's first cell. A case
runs the transform in a training loop (``pull_rows`` view, ``jsr.grad``,
``optax.apply_updates``) next to the dense loop (``jax.grad`` of the dense
table, optax), and observes one outcome: ``works`` (the same parameters),
``error`` (raised while tracing, naming the ``jsr`` replacement), ``pytree
error`` (JAX's structure error), ``invalid ids`` (row ids refused eagerly,
left wrong under jit), ``state mismatch`` (right numbers, state structure
changed) or ``wrong value``. The test asserts the outcome the table states,
and that every ``jsr.optim`` replacement the table names exists and is
checked against the dense computation here.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "optimizers.md"
SECTION = "## Which optax transforms are safe on RowSparse updates"
OUTCOMES = {"works", "error", "pytree error", "invalid ids", "state mismatch", "wrong value"}

V, D, B, L = 10, 3, 3, 2
# Repeated ids within a batch leave padding slots in the gradient's capacity.
BATCHES = [
    (np.array([[1, 4], [4, 7], [1, 1]]), np.array([1.0, -1.0, 0.5])),
    (np.array([[2, 2], [9, 0], [5, 2]]), np.array([0.5, 2.0, -1.0])),
    (np.array([[1, 7], [3, 3], [8, 1]]), np.array([-1.0, 1.0, 0.25])),
]
# Small ids, no padding: where mapped ids stay in range and look valid.
SMALL = [(np.array([[0, 1], [2, 3]]), np.array([1.0, -1.0]))] * 2
# Every row listed at every step: where a lazy rule equals the dense one.
ALL_ROWS = [
    (np.array([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]), np.array([1.0, -1.0, 0.5, 2.0, -2.0])),
    (np.array([[9, 8], [7, 6], [5, 4], [3, 2], [1, 0]]), np.array([0.5, 0.5, -1.0, 1.0, 0.0])),
]
# A NaN target at the second step: NaN gradients in its rows and in `w`.
NAN_STEP = [BATCHES[0], (BATCHES[1][0], np.array([0.5, np.nan, -1.0])), BATCHES[2]]


def init_params():
    rng = np.random.default_rng(0)
    return {
        "emb": jnp.asarray(rng.normal(size=(V, D)), jnp.float32),
        "w": jnp.asarray(rng.normal(size=D), jnp.float32),
    }


def loss(emb, w, ids, y):
    pooled = jsr.take(emb, ids).sum(axis=1)
    return jnp.mean((pooled @ w - y) ** 2)


def sparse_grads(params, ids, y):
    view = jsr.pull_rows(params["emb"], ids)
    g_emb, g_w = jsr.grad(loss, argnums=(0, 1))(view, params["w"], ids, y)
    assert isinstance(g_emb, jsr.RowSparse)
    return {"emb": g_emb, "w": g_w}


def dense_grads(params, ids, y):
    g_emb, g_w = jax.grad(loss, argnums=(0, 1))(params["emb"], params["w"], ids, y)
    return {"emb": g_emb, "w": g_w}


def train(tx, *, sparse, jit, batches=BATCHES, apply=optax.apply_updates, params=None):
    """Runs ``tx`` over ``batches``; returns (params, init state, states, updates)."""
    grads_fn = sparse_grads if sparse else dense_grads
    params = init_params() if params is None else params

    def step(params, state, ids, y):
        fast = params.fast if isinstance(params, optax.LookaheadParams) else params
        updates, state = tx.update(grads_fn(fast, ids, y), state, params)
        return apply(params, updates), state, updates

    step = jax.jit(step) if jit else step
    state0 = tx.init(params)
    state, states, ups = state0, [], []
    for ids, y in batches:
        params, state, updates = step(params, state, jnp.asarray(ids, jnp.int32), jnp.asarray(y))
        states.append(state)
        ups.append(updates)
    return params, state0, states, ups


def ids_valid(u) -> bool:
    ids = np.asarray(u.indices)
    if not np.issubdtype(ids.dtype, np.integer):
        return False
    n = u.shape[0]
    real = ids < n
    k = int(real.sum())
    return bool(
        np.all(real[:k])
        and np.all(ids[k:] == n)
        and np.all(np.diff(ids[:k]) > 0)
        and np.all(ids >= 0)
        and np.all(np.asarray(u.data)[k:] == 0)
    )


def observe(tx, oracle, jit, *, batches=BATCHES, oracle_sparse=False, **kw) -> str:
    """The outcome class of ``tx`` on RowSparse gradients against ``oracle``."""
    try:
        params, state0, states, ups = train(tx, sparse=True, jit=jit, batches=batches, **kw)
    except (TypeError, ValueError) as err:
        message = str(err)
        if "invalid row ids" in message:
            return "invalid ids"
        if "pytree structure error" in message:
            return "pytree error"
        return "error" if "`jsr." in message else f"unnamed error: {message[:200]}"
    for u in ups:
        for leaf in jax.tree.leaves(u, is_leaf=jsr.is_sparse):
            if isinstance(leaf, jsr.RowSparse) and not ids_valid(leaf):
                return "invalid ids"
    want = jax.tree.structure(state0)
    if any(jax.tree.structure(s) != want for s in states):
        return "state mismatch"
    ref, _, _, _ = train(oracle, sparse=oracle_sparse, jit=jit, batches=batches, **kw)
    got_leaves, ref_leaves = jax.tree.leaves(params), jax.tree.leaves(ref)
    if len(got_leaves) != len(ref_leaves):
        return "wrong value"
    for a, b in zip(got_leaves, ref_leaves, strict=True):
        if not np.allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6, equal_nan=True):
            return "wrong value"
    return "works"


def stateless(fn: Callable) -> optax.GradientTransformation:
    """A transform that maps the updates with a tree helper such as ``optax.tree.add``."""
    return optax.GradientTransformation(optax.init_empty_state, lambda u, s, p=None: (fn(u), s))


def lazy_ag():
    return jsr.optim.lazy_adagrad(0.1)  # equals optax.adagrad on the dense gradient


def dense_ag():
    return optax.adagrad(0.1)


def ndim_labels(tree):
    return jax.tree.map(lambda x: "table" if x.ndim == 2 else "vector", tree)


def ndim_labels_is_leaf(tree):
    return jax.tree.map(lambda x: "table" if x.ndim == 2 else "vector", tree, is_leaf=jsr.is_sparse)


def two_groups(labels, lazy=True):
    first = lazy_ag() if lazy else dense_ag()
    return optax.multi_transform({"table": first, "vector": optax.sgd(0.1)}, labels)


def half(count):
    return 0.5 + 0.0 * count


# --- the cases: table row -> (jit -> outcome) -------------------------------------

CASES: dict[str, Callable[[bool], str]] = {
    "`optax.chain`": lambda jit: observe(
        optax.chain(jsr.optim.clip_by_global_norm(1.0), lazy_ag()),
        optax.chain(optax.clip_by_global_norm(1.0), dense_ag()),
        jit,
    ),
    "`optax.identity`": lambda jit: observe(
        optax.chain(optax.identity(), lazy_ag()), optax.chain(optax.identity(), dense_ag()), jit
    ),
    "`optax.apply_updates`": lambda jit: observe(lazy_ag(), dense_ag(), jit),
    "`optax.inject_hyperparams`": lambda jit: observe(
        optax.inject_hyperparams(jsr.optim.lazy_adam)(learning_rate=0.05),
        jsr.optim.lazy_adam(0.05),
        jit,
        oracle_sparse=True,
    ),
    "`optax.multi_transform`, labels a pytree": lambda jit: observe(
        two_groups({"emb": "table", "w": "vector"}),
        two_groups({"emb": "table", "w": "vector"}, lazy=False),
        jit,
    ),
    "`optax.multi_transform`, label function mapping with `is_leaf=jsr.is_sparse`": (
        lambda jit: observe(
            two_groups(ndim_labels_is_leaf), two_groups(ndim_labels, lazy=False), jit
        )
    ),
    "`optax.multi_transform`, label function mapping with plain `jax.tree.map`": (
        lambda jit: observe(two_groups(ndim_labels), two_groups(ndim_labels, lazy=False), jit)
    ),
    "`optax.masked`, mask a pytree": lambda jit: observe(
        optax.masked(lazy_ag(), {"emb": True, "w": False}),
        optax.masked(dense_ag(), {"emb": True, "w": False}),
        jit,
    ),
    "`optax.masked`, mask function mapping with `is_leaf=jsr.is_sparse`": lambda jit: observe(
        optax.masked(
            lazy_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p, is_leaf=jsr.is_sparse)
        ),
        optax.masked(dense_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        jit,
    ),
    "`optax.masked`, mask function mapping with plain `jax.tree.map`": lambda jit: observe(
        optax.masked(lazy_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        optax.masked(dense_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        jit,
    ),
    "`optax.MultiSteps`": lambda jit: observe(
        optax.MultiSteps(lazy_ag(), 2).gradient_transformation(),
        optax.MultiSteps(dense_ag(), 2).gradient_transformation(),
        jit,
    ),
    "`optax.apply_if_finite`": lambda jit: observe(
        optax.apply_if_finite(lazy_ag(), 3),
        optax.apply_if_finite(dense_ag(), 3),
        jit,
        batches=NAN_STEP,
    ),
    "`optax.zero_nans`": lambda jit: observe(
        optax.chain(optax.zero_nans(), lazy_ag()),
        optax.chain(optax.zero_nans(), dense_ag()),
        jit,
    ),
    "`optax.clip`": lambda jit: observe(
        optax.chain(optax.clip(0.05), lazy_ag()), optax.chain(optax.clip(0.05), dense_ag()), jit
    ),
    "`optax.clip_by_global_norm`": lambda jit: observe(
        optax.chain(optax.clip_by_global_norm(1.0), lazy_ag()),
        optax.chain(optax.clip_by_global_norm(1.0), dense_ag()),
        jit,
    ),
    "`optax.clip_by_block_rms`": lambda jit: observe(
        optax.chain(optax.clip_by_block_rms(0.1), lazy_ag()),
        optax.chain(optax.clip_by_block_rms(0.1), dense_ag()),
        jit,
    ),
    "`optax.add_decayed_weights`": lambda jit: observe(
        optax.chain(jsr.optim.lazy_adam(0.05), optax.add_decayed_weights(0.1)),
        optax.chain(optax.adam(0.05), optax.add_decayed_weights(0.1)),
        jit,
        batches=ALL_ROWS,
    ),
    "`optax.scale`": lambda jit: observe(
        optax.chain(optax.scale(0.5), lazy_ag()), optax.chain(optax.scale(0.5), dense_ag()), jit
    ),
    "`optax.scale_by_learning_rate` with a float": lambda jit: observe(
        optax.chain(jsr.optim.scale_by_lazy_adagrad(), optax.scale_by_learning_rate(0.1)),
        dense_ag(),
        jit,
    ),
    "`optax.scale_by_learning_rate` with a schedule": lambda jit: observe(
        optax.chain(jsr.optim.scale_by_lazy_adagrad(), optax.scale_by_learning_rate(half)),
        optax.adagrad(half),
        jit,
    ),
    "`optax.scale_by_schedule`": lambda jit: observe(
        optax.chain(optax.scale_by_schedule(half), lazy_ag()),
        optax.chain(optax.scale_by_schedule(half), dense_ag()),
        jit,
    ),
    "`optax.set_to_zero`": lambda jit: observe(optax.set_to_zero(), optax.set_to_zero(), jit),
    "`optax.ema`": lambda jit: observe(
        optax.chain(optax.ema(0.9), lazy_ag()), optax.chain(optax.ema(0.9), dense_ag()), jit
    ),
    "`optax.lookahead`": lambda jit: observe(
        optax.lookahead(lazy_ag(), 2, 0.5),
        optax.lookahead(dense_ag(), 2, 0.5),
        jit,
        params=optax.LookaheadParams.init_synced(init_params()),
    ),
    "`optax.adam`": lambda jit: observe(optax.adam(0.05), optax.adam(0.05), jit),
    "`optax.tree.norm`": lambda jit: observe(
        optax.chain(_norm_clip(optax.tree.norm), lazy_ag()),
        optax.chain(_norm_clip(optax.tree.norm), dense_ag()),
        jit,
    ),
    "`optax.tree.add`": lambda jit: observe(
        optax.chain(stateless(lambda u: optax.tree.add(u, u)), lazy_ag()),
        optax.chain(stateless(lambda u: optax.tree.add(u, u)), dense_ag()),
        jit,
        batches=SMALL,
    ),
    "`optax.tree.zeros_like`": lambda jit: observe(
        optax.chain(lazy_ag(), stateless(optax.tree.zeros_like)),
        optax.chain(dense_ag(), stateless(optax.tree.zeros_like)),
        jit,
    ),
    "`optax.tree.scale`": lambda jit: observe(
        optax.chain(stateless(lambda u: optax.tree.scale(0.5, u)), lazy_ag()),
        optax.chain(stateless(lambda u: optax.tree.scale(0.5, u)), dense_ag()),
        jit,
    ),
}


def _norm_clip(norm_fn):
    """Divides every leaf by ``1 + norm``: a norm-dependent step, as clipping is,
    with the norm from ``norm_fn`` (optax's or jsr's)."""

    def fn(u):
        scale = 1.0 / (1.0 + norm_fn(u))
        return jax.tree.map(lambda x: x * scale, u, is_leaf=jsr.is_sparse)

    return stateless(fn)


# --- the replacements the table names: each against the dense computation -----

REPLACEMENTS: dict[str, Callable[[bool], str]] = {
    "multi_transform": lambda jit: observe(
        jsr.optim.multi_transform({"table": lazy_ag(), "vector": optax.sgd(0.1)}, ndim_labels),
        two_groups(ndim_labels, lazy=False),
        jit,
    ),
    "masked": lambda jit: observe(
        jsr.optim.masked(lazy_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        optax.masked(dense_ag(), lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
        jit,
    ),
    "MultiSteps": lambda jit: observe(
        jsr.optim.MultiSteps(lazy_ag(), 2, capacity={"emb": 2 * B * L, "w": None}),
        optax.MultiSteps(dense_ag(), 2).gradient_transformation(),
        jit,
        batches=BATCHES + BATCHES[:1],
    ),
    "apply_if_finite": lambda jit: observe(
        jsr.optim.apply_if_finite(lazy_ag(), 3),
        optax.apply_if_finite(dense_ag(), 3),
        jit,
        batches=NAN_STEP,
    ),
    "skip_nonfinite": lambda jit: observe(
        jsr.optim.skip_nonfinite(lazy_ag()),
        optax.apply_if_finite(dense_ag(), 100),
        jit,
        batches=NAN_STEP,
    ),
    "zero_nans": lambda jit: observe(
        optax.chain(jsr.optim.zero_nans(), lazy_ag()),
        optax.chain(optax.zero_nans(), dense_ag()),
        jit,
        batches=NAN_STEP,
    ),
    "lift_elementwise": lambda jit: observe(
        optax.chain(
            jsr.optim.lift_elementwise(optax.clip(0.05)),
            jsr.optim.lift_elementwise(optax.scale_by_schedule(half)),
            jsr.optim.lift_elementwise(optax.scale(2.0)),
            lazy_ag(),
        ),
        optax.chain(optax.clip(0.05), optax.scale_by_schedule(half), optax.scale(2.0), dense_ag()),
        jit,
    ),
    "clip_by_global_norm": lambda jit: observe(
        optax.chain(jsr.optim.clip_by_global_norm(0.5), lazy_ag()),
        optax.chain(optax.clip_by_global_norm(0.5), dense_ag()),
        jit,
    ),
    "clip_by_block_rms": lambda jit: observe(
        optax.chain(jsr.optim.clip_by_block_rms(0.1), lazy_ag()),
        optax.chain(optax.clip_by_block_rms(0.1), dense_ag()),
        jit,
    ),
    "add_decayed_weights": lambda jit: observe(
        optax.chain(jsr.optim.lazy_adam(0.05), jsr.optim.add_decayed_weights(0.1)),
        optax.chain(optax.adam(0.05), optax.add_decayed_weights(0.1)),
        jit,
        batches=ALL_ROWS,
    ),
    "scale_by_learning_rate": lambda jit: observe(
        optax.chain(jsr.optim.scale_by_lazy_adagrad(), jsr.optim.scale_by_learning_rate(half)),
        optax.adagrad(half),
        jit,
    ),
    "ema": lambda jit: observe(
        optax.chain(jsr.optim.ema(0.9), jsr.optim.scale_by_learning_rate(0.1)),
        optax.chain(optax.ema(0.9), optax.scale(-0.1)),
        jit,
        batches=ALL_ROWS,
    ),
    "lookahead": lambda jit: observe(
        jsr.optim.lookahead(lazy_ag(), 2, 0.5),
        optax.lookahead(dense_ag(), 2, 0.5),
        jit,
        params=optax.LookaheadParams.init_synced(init_params()),
        batches=BATCHES + BATCHES[:1],
    ),
    "lazy_adam": lambda jit: observe(
        jsr.optim.lazy_adam(0.05), optax.adam(0.05), jit, batches=ALL_ROWS
    ),
    "lazy_adagrad": lambda jit: observe(lazy_ag(), dense_ag(), jit),
    "global_norm": lambda jit: observe(
        optax.chain(_norm_clip(jsr.optim.global_norm), lazy_ag()),
        optax.chain(_norm_clip(optax.tree.norm), dense_ag()),
        jit,
    ),
    "apply_updates": lambda jit: observe(
        lazy_ag(), dense_ag(), jit, apply=lambda p, u: jsr.optim.apply_updates(p, u)
    ),
}


# --- the table --------------------------------------------------------------------


def table_rows() -> dict[str, tuple[str, str]]:
    """First cell -> (outcome, "use instead" cell) of each row of the table."""
    text = DOC.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `optax"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row of the table must have 4 cells: {line}"
        assert cells[0] not in rows, f"two rows for {cells[0]}"
        rows[cells[0]] = (cells[1], cells[3])
    return rows


def named_replacements(cell: str) -> set[str]:
    return set(re.findall(r"`jsr\.optim\.(\w+)", cell))


def test_every_table_row_has_a_case_and_every_case_a_row():
    rows = table_rows()
    assert set(rows) == set(CASES)
    for key, (outcome, _) in rows.items():
        assert outcome in OUTCOMES, f"{key}: unknown outcome {outcome!r}"


def test_every_named_replacement_exists_and_is_checked():
    for key, (outcome, use) in table_rows().items():
        names = named_replacements(use)
        if outcome != "works":
            assert use, f"{key} does not work on RowSparse updates: the table must say what to use"
        for name in names:
            assert name in jsr.optim.__all__, f"{key}: `jsr.optim.{name}` is not exported"
            assert name in REPLACEMENTS, f"{key}: `jsr.optim.{name}` has no contract check"
        for other in re.findall(r"`jsr\.(\w+)\(", use):
            assert other in jsr.__all__, f"{key}: `jsr.{other}` does not exist"


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("key", sorted(CASES))
def test_optax_transform_outcome_matches_the_table(key, jit):
    expected, _ = table_rows()[key]
    assert CASES[key](jit) == expected


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(REPLACEMENTS))
def test_replacement_matches_the_dense_computation(name, jit):
    assert REPLACEMENTS[name](jit) == "works"


def test_optax_errors_happen_while_tracing():
    """The error outcomes are raised when the step is traced: ``jax.eval_shape``
    (which runs nothing) raises them already."""
    params = init_params()
    ids, y = (jnp.asarray(a) for a in BATCHES[0])
    for tx in (
        optax.chain(optax.clip_by_global_norm(1.0), lazy_ag()),
        optax.chain(optax.scale(0.5), lazy_ag()),
        optax.MultiSteps(lazy_ag(), 2).gradient_transformation(),
    ):
        state = tx.init(params)
        with pytest.raises((TypeError, ValueError)):
            jax.eval_shape(
                lambda p, s, tx=tx: tx.update(sparse_grads(p, ids, y), s, p), params, state
            )


def test_lifting_a_whole_leaf_rule_is_refused_naming_the_replacement():
    with pytest.raises(TypeError, match=r"optax.clip_by_block_rms.*jsr.optim.clip_by_block_rms"):
        jsr.optim.lift_elementwise(optax.clip_by_block_rms(1.0))
    with pytest.raises(TypeError, match=r"optax.centralize.*no row-sparse version"):
        jsr.optim.lift_elementwise(optax.centralize())


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_zero_nans_keeps_its_state_and_compiles_once(jit):
    tx = optax.chain(jsr.optim.zero_nans(), lazy_ag())
    params, state0, states, ups = train(tx, sparse=True, jit=jit, batches=NAN_STEP)
    assert all(jax.tree.structure(s) == jax.tree.structure(state0) for s in states)
    flags = [bool(s[0].found_nan["emb"]) for s in states]
    assert flags == [False, True, False]
    assert all(ids_valid(u["emb"]) for u in ups)
    step = jax.jit(tx.update)
    state = tx.init(params)
    for ids, y in NAN_STEP:
        _, state = step(sparse_grads(params, jnp.asarray(ids), jnp.asarray(y)), state, params)
    assert step._cache_size() == 1


def test_zero_nans_ignores_padding_and_handles_empty_capacity(jit_mode):
    tx = jsr.optim.zero_nans()
    g = jsr.RowSparse._make(
        jnp.array([[jnp.nan, 1.0], [0.0, 0.0]]), jnp.array([2, 4], jnp.int32), (4, 2)
    )
    u, s = jit_mode(tx.update)(g, tx.init(jnp.zeros((4, 2))))
    np.testing.assert_array_equal(np.asarray(u.data), [[0.0, 1.0], [0.0, 0.0]])
    assert u.indices.tolist() == [2, 4] and bool(s.found_nan)
    empty = jsr.RowSparse(jnp.zeros((0, 2)), jnp.zeros((0,), jnp.int32), (4, 2))
    u, s = jit_mode(tx.update)(empty, tx.init(jnp.zeros((4, 2))))
    assert u.capacity == 0 and not bool(s.found_nan)


def test_zero_nans_passes_a_none_update_and_keeps_its_state_structure(jit_mode):
    """A frozen parameter's update is None: it stays None, its flag stays a
    bool (the structure ``init`` gives), and the other leaves are cleaned."""
    params = {"emb": jnp.ones((4, 2)), "frozen": jnp.ones(2)}
    tx = jsr.optim.zero_nans()
    state = tx.init(params)
    g = {"emb": jsr.RowSparse([[1.0, jnp.nan]], [1], shape=(4, 2)), "frozen": None}
    u, new_state = jit_mode(tx.update)(g, state)
    assert u["frozen"] is None
    np.testing.assert_array_equal(np.asarray(u["emb"].data), [[1.0, 0.0]])
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert bool(new_state.found_nan["emb"]) and not bool(new_state.found_nan["frozen"])


def test_apply_if_finite_follows_optax_state_and_gives_up(jit_mode):
    """optax's rule: ignore up to ``max_consecutive_errors`` non-finite steps,
    then apply; the state's counters equal optax's on the dense gradient."""
    w = jnp.ones((4, 2))
    ours = jsr.optim.apply_if_finite(jsr.optim.lazy_sgd(0.5), 1)
    ref = optax.apply_if_finite(optax.sgd(0.5), 1)
    s, r = ours.init(w), ref.init(w)
    p, q = w, w
    for value in (1.0, jnp.inf, jnp.inf, 2.0):
        g = jsr.RowSparse(jnp.array([[value, 1.0]]), [1], shape=(4, 2))
        u, s = jit_mode(ours.update)(g, s, p)
        v, r = jit_mode(ref.update)(g.todense(), r, q)
        assert ids_valid(u)
        p, q = jsr.optim.apply_updates(p, u), optax.apply_updates(q, v)
        for field in ("notfinite_count", "last_finite", "total_notfinite"):
            assert int(getattr(s, field)) == int(getattr(r, field)), field
    np.testing.assert_array_equal(np.asarray(p), np.asarray(q))


def test_ema_lazy_keeps_untouched_rows_and_dense_mode_is_optax(jit_mode):
    rng = np.random.default_rng(3)
    w = jnp.zeros((5, 2))
    lazy, dense, ref = jsr.optim.ema(0.8), jsr.optim.ema(0.8, lazy=False), optax.ema(0.8)
    s1, s2, s3 = lazy.init(w), dense.init(w), ref.init(w)
    for ids in ([1, 3], [3, 5], [0, 4]):  # 5 is padding
        data = jnp.asarray(rng.normal(size=(2, 2)), jnp.float32) * (np.array(ids) < 5)[:, None]
        g = jsr.RowSparse(data, ids, shape=(5, 2))
        u1, s1 = jit_mode(lazy.update)(g, s1)
        u2, s2 = jit_mode(dense.update)(g, s2)
        u3, s3 = jit_mode(ref.update)(g.todense(), s3)
        assert u1.indices.tolist() == list(ids)
        np.testing.assert_allclose(np.asarray(u2), np.asarray(u3), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(s2.ema), np.asarray(s3.ema), rtol=1e-6)
    # Row 2 was never listed: its average stayed 0; row 1, listed once, kept its value.
    assert np.all(np.asarray(s1.ema)[2] == 0)
    assert int(s1.count) == 3
