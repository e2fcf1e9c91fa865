"""Optimizer state restored from a checkpoint without a target (plain dicts and
lists where the state had NamedTuples and tuples, as orbax restores it): the
optimizers refuse it naming the recipe, ``jsr.optim.restore_structure``
rebuilds it, and the docs' orbax recipe runs (against a stand-in for orbax
when orbax is not installed)."""

from __future__ import annotations

import pathlib
import re
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsparse_rows as jsr

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "optimizers.md"


def as_restored_without_target(tree, namedtuple_as="dict"):
    """What a checkpointer without a target gives back: NamedTuples as dicts
    keyed by field name (or lists), tuples as lists, other nodes as dicts of
    their named children, arrays as numpy, and other nodes without leaves
    (exact SGD's static hyperparameters) as None."""
    plain = type(tree) in (tuple, list, dict) or hasattr(type(tree), "_fields")
    if not plain and not jax.tree.leaves(tree):
        return None
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):
        kids = [as_restored_without_target(x, namedtuple_as) for x in tree]
        if namedtuple_as == "dict":
            return dict(zip(tree._fields, kids, strict=True))
        return kids
    if isinstance(tree, (tuple, list)):
        return [as_restored_without_target(x, namedtuple_as) for x in tree]
    if isinstance(tree, dict):
        return {k: as_restored_without_target(v, namedtuple_as) for k, v in tree.items()}
    if isinstance(tree, jsr.RowSparse):  # a pytree node with named children
        return {"data": np.asarray(tree.data), "indices": np.asarray(tree.indices)}
    if tree is None:
        return None
    return np.asarray(tree)


def _params():
    rng = np.random.default_rng(0)
    return {"emb": jnp.asarray(rng.normal(size=(6, 2)), jnp.float32), "w": jnp.ones(2)}


def _grad():
    return {"emb": jsr.RowSparse([[1.0, -1.0]], [2], shape=(6, 2)), "w": jnp.ones(2)}


OPTIMIZERS = {
    "lazy_adam": lambda: jsr.optim.lazy_adam(0.1),
    "lazy_sgd momentum": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9),
    "lazy_adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "lazy_rowwise_adagrad": lambda: jsr.optim.lazy_rowwise_adagrad(0.1),
    "lazy_sgd exact": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact"),
    "inject_hyperparams": lambda: optax.inject_hyperparams(jsr.optim.lazy_adam)(learning_rate=0.1),
    "MultiSteps": lambda: jsr.optim.MultiSteps(
        jsr.optim.lazy_adam(0.1), 2, capacity={"emb": 4, "w": None}
    ).gradient_transformation(),
    "multi_transform": lambda: optax.multi_transform(
        {"a": jsr.optim.lazy_adam(0.1), "b": optax.adam(0.1)}, {"emb": "a", "w": "b"}
    ),
    "ema + skip_nonfinite": lambda: jsr.optim.skip_nonfinite(
        optax.chain(jsr.optim.ema(0.9), jsr.optim.scale_by_learning_rate(0.1))
    ),
}


@pytest.mark.parametrize("form", ["dict", "list"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_restore_structure_rebuilds_the_state(name, form, jit_mode):
    opt, params = OPTIMIZERS[name](), _params()
    update = jit_mode(opt.update)
    _, state = update(_grad(), opt.init(params), params)
    restored = as_restored_without_target(state, form)
    rebuilt = jsr.optim.restore_structure(jax.eval_shape(opt.init, params), restored)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(state), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    u1, s1 = update(_grad(), rebuilt, params)
    u2, s2 = update(_grad(), state, params)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "name", ["lazy_adam", "lazy_sgd momentum", "lazy_adagrad", "lazy_rowwise_adagrad"]
)
def test_update_refuses_a_state_restored_without_target_naming_the_recipe(name, jit_mode):
    opt, params = OPTIMIZERS[name](), _params()
    restored = as_restored_without_target(opt.init(params))
    with pytest.raises(
        TypeError,
        match=r"got a dict \(keys .*\).*jax\.eval_shape\(opt\.init, params\).*restore_structure",
    ):
        jit_mode(opt.update)(_grad(), restored, params)


def test_fields_are_matched_by_name_not_by_leaf_order():
    """A dict's leaves are sorted by key; pairing them with the NamedTuple's
    fields in order would swap two state arrays of the same shape."""
    opt, params = jsr.optim.lazy_adam(0.1), _params()
    _, state = opt.update(_grad(), opt.init(params), params)
    restored = as_restored_without_target(state)
    restored[0] = {"nu": restored[0]["nu"], "mu": restored[0]["mu"], "count": restored[0]["count"]}
    rebuilt = jsr.optim.restore_structure(jax.eval_shape(opt.init, params), restored)
    np.testing.assert_array_equal(rebuilt[0].mu["emb"], state[0].mu["emb"])
    np.testing.assert_array_equal(rebuilt[0].nu["emb"], state[0].nu["emb"])


def test_mismatches_are_named_by_path():
    opt, params = jsr.optim.lazy_adam(0.1), _params()
    target = jax.eval_shape(opt.init, params)
    restored = as_restored_without_target(opt.init(params))
    bad = {**restored[0], "mu": {"emb": np.zeros((5, 2), np.float32), "w": np.zeros(2)}}
    with pytest.raises(ValueError, match=r"`restored\[0\]\.mu\['emb'\]` is an array of shape"):
        jsr.optim.restore_structure(target, [bad, restored[1]])
    with pytest.raises(ValueError, match=r"`restored\[0\]` does not match.*'count', 'mu', 'nu'"):
        jsr.optim.restore_structure(target, [{"count": 0}, restored[1]])
    with pytest.raises(ValueError, match="expected 2 items"):
        jsr.optim.restore_structure(target, [restored[0]])


class _StandInCheckpointer:
    """orbax's StandardCheckpointer as the recipe uses it: ``restore(path)``
    without a target gives dicts and lists, with one the target's types."""

    store: dict = {}

    def save(self, path, tree):
        self.store[str(path)] = jax.tree.map(np.asarray, tree)

    def wait_until_finished(self):
        pass

    def restore(self, path, target=None):
        saved = self.store[str(path)]
        if target is None:
            return as_restored_without_target(saved)
        return jax.tree.unflatten(jax.tree.structure(target), jax.tree.leaves(saved))


def _recipe() -> str:
    text = DOC.read_text()
    section = text[text.index("## Checkpointing") :]
    return re.search(r"```\w*\n(.*?)```", section, re.S).group(1)


def test_the_docs_recipe_runs_and_restores_a_usable_state(tmp_path, monkeypatch):
    try:
        import orbax.checkpoint  # noqa: F401
    except ImportError:
        module = types.ModuleType("orbax.checkpoint")
        module.StandardCheckpointer = _StandInCheckpointer
        package = types.ModuleType("orbax")
        package.checkpoint = module
        monkeypatch.setitem(sys.modules, "orbax", package)
        monkeypatch.setitem(sys.modules, "orbax.checkpoint", module)
    opt, params = jsr.optim.lazy_adam(0.1), _params()
    _, state = opt.update(_grad(), opt.init(params), params)
    ns = {"jax": jax, "opt": opt, "params": params, "state": state, "path": tmp_path}
    exec(compile(_recipe(), str(DOC), "exec"), ns)
    assert jax.tree.structure(ns["state"]) == jax.tree.structure(state)
    ns["ckptr"].wait_until_finished()
    without_target = ns["ckptr"].restore(tmp_path / "opt_state")
    with pytest.raises(TypeError, match="restore_structure"):
        opt.update(_grad(), without_target, params)
    rebuilt = jsr.optim.restore_structure(ns["target"], without_target)
    u1, _ = opt.update(_grad(), rebuilt, params)
    u2, _ = opt.update(_grad(), state, params)
    np.testing.assert_array_equal(np.asarray(u1["emb"].data), np.asarray(u2["emb"].data))
