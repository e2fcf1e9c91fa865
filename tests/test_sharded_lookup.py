"""Row-sharded lookups (``jsr.sharded_take``, ``jsr.sharded_embedding_bag``)
inside ``jax.shard_map``.

On 2, 4 and 8 host devices (``sharded_lookup_cases.py`` in a subprocess, one
per device count): values and gradients (dense and row-sparse) against the
whole table with ``jnp``, both placements, and lazy Adam steps against the
same steps on one device. On 4 devices also the compiled programs: the
all-to-all operands do not grow with the table, nothing but the shard's
parameters and their in-place updates has a table-sized axis, and the
``jit`` path (table as ``NamedSharding``) is one all-reduce of the gathered
rows. In process, on a one-device mesh: the arguments' errors, and a
gradient traced at 10**8 rows with no value of that size.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
from jaxpr_walk import big_values

import jaxsparse_rows as jsr

HERE = os.path.dirname(os.path.abspath(__file__))
# Timings do not matter here: cheaper XLA compilation shortens the runs.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

LOOKUPS = (
    "take",
    "take_one_shard",
    "take_capacity",
    "take_num_rows",
    "take_empty",
    "sum",
    "sum_one_shard",
    "mean_padding_id",
    "sqrtn_weighted",
    "max",
    "mean_all_padding",
    "grad_dense",
    "grad_sparse",
    "grad_sparse_local_ids",
    "grad_sparse_type",
)
OVERFLOW = (
    "overflow_reported",
    "overflow_reads_zeros",
    "exact_capacity_reports_nothing",
    "exact_capacity",
)
TRAINING = ("emb", "w", "loss_relative", "moved")
PLACEMENTS = ("range", "mod")
WITH_HLO = 4  # the device count whose run also checks values of every lookup and the HLO


def expected_cases(n_devices: int) -> set[str]:
    cases = {"overflow_cases", "training_cases", *OVERFLOW}
    cases |= {f"train_{p}_{k}" for p in PLACEMENTS for k in TRAINING}
    if n_devices == WITH_HLO:
        cases |= {"lookup_cases"} | {f"{p}_{k}" for p in PLACEMENTS for k in LOOKUPS}
        for axes in ("a_b", "b_a"):
            cases |= {"tuple_axes_cases", f"tuple_axes_{axes}", f"tuple_axes_{axes}_grad_sparse"}
    return cases


@functools.cache
def run_cases(n_devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = FAST_COMPILE  # the script adds the device count
    script = os.path.join(HERE, "sharded_lookup_cases.py")
    args = [sys.executable, script, str(n_devices)] + (["--hlo"] if n_devices == WITH_HLO else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n_devices", [2, 4, 8])
def test_sharded_lookups_and_training_match_one_device(n_devices):
    """Every lookup (take, the four pools, weights, ``padding_id``,
    ``num_rows``, an exact ``capacity``, repeats, ids all on one shard, an
    empty batch, all-padding bags) gives the values of the whole table, and
    ``jax.grad`` / ``jsr.grad(..., sparse=True)`` the gradient of the shard
    (a RowSparse ``[V / n, D]`` in local row ids); three lazy Adam steps
    (sum- and mean-pooled features; mixed, one-shard and empty batches) give
    the parameters of the same steps on one device; a capacity one short is
    reported through ``checkify`` and reads zeros for the ids it drops."""
    results = run_cases(n_devices)["errors"]
    assert set(results) == expected_cases(n_devices)
    failed = {k: v for k, v in results.items() if isinstance(v, str) or v > 1e-5}
    assert not failed, failed


def _elements(shapes) -> int:
    return sum(int(np.prod(s)) for s in shapes)


def test_all_to_all_does_not_grow_with_the_table():
    """The explicit step at V / n = 2**10 and 100 * 2**10 rows: the same three
    all-to-alls (ids out, rows back, gradients to their owners) of n x
    capacity ids and n x capacity x D values (capacity = the ids per device),
    and no collective, temporary or copy with a table-sized axis: only the
    shard parameters (table, Adam's moments) and their in-place updates."""
    hlo = run_cases(WITH_HLO)["hlo"]
    n, k, d = WITH_HLO, hlo["n_ids"], 4
    small, large = (hlo["explicit"][str(r)] for r in (2**10, 2**10 * 100))
    assert small["collectives"] == large["collectives"]
    to_all = sorted(_elements(s) for op, s in small["collectives"] if op == "all-to-all")
    assert to_all == [n * k, n * k * d, n * k * d]
    assert {op for op, _ in small["collectives"]} == {"all-to-all", "all-reduce"}
    for rows in (2**10, 2**10 * 100):
        found = hlo["explicit"][str(rows)]
        for _, shapes in found["collectives"]:
            assert not any(rows in s or n * rows in s for s in shapes), found["collectives"]
        assert found["table_sized"] == [], found["table_sized"]


def test_jit_path_is_one_all_reduce_of_the_gathered_rows():
    """``jit`` with the table as ``NamedSharding(mesh, P("x", None))``
    (``pull_rows`` + ``embedding_bag`` + lazy Adam): its only collective is
    one all-reduce of the rows gathered from the table and Adam's moments
    ``[ids, D]``, at both table sizes; no all-gather of the table, and no
    table-sized temporary."""
    hlo = run_cases(WITH_HLO)["hlo"]
    k = hlo["n_ids"]
    for rows in (2**10, 2**10 * 100):
        found = hlo["jit"][str(rows)]
        (only,) = found["collectives"]
        assert only[0] == "all-reduce"
        assert only[1] and all(s == [k, 4] for s in only[1]), only
        assert found["table_sized"] == [], found["table_sized"]


# ------------------------------------------------------- one device, in process


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))


TABLE_AND_IDS = (P("x", None), P("x"))  # a row-sharded table, a batch of ids
ROWS = P("x")


def _mapped(mesh, fn, specs=TABLE_AND_IDS, out=ROWS):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out))


def test_one_device_matches_take_embedding_bag_and_jax_grad(mesh):
    """On one device every id is local: the values of ``jnp.take`` and
    ``jsr.embedding_bag`` (every pool, weights, ``padding_id``, out-of-range
    ids), and the gradient of ``jax.grad`` through ``jnp.take``, dense and
    row-sparse."""
    table = jnp.arange(30.0).reshape(10, 3) / 30
    ids = jnp.array([[1, 9, 1], [10, 0, 4], [3, 3, 3], [-1, 12, 7]])
    w = jnp.linspace(0.5, 2.0, 12).reshape(4, 3)
    modes = ("sum", "mean", "sqrtn", "max")

    def body(t, i, w):
        def loss(t):
            return jax.lax.psum(jnp.sum(jsr.sharded_take(t, i, axis_name="x") ** 2), "x")

        bags = {
            m: jsr.sharded_embedding_bag(
                t, i, axis_name="x", mode=m, weights=None if m == "max" else w, padding_id=3
            )
            for m in modes
        }
        grads = (jax.grad(loss)(t), jsr.grad(loss, sparse=True)(t).todense())
        return jsr.sharded_take(t, i, axis_name="x"), bags, grads

    f = _mapped(mesh, body, (P("x", None), P("x"), P("x")), (ROWS, ROWS, (ROWS, ROWS)))
    rows, bags, (dense, sparse) = f(table, ids, w)
    keep = (ids >= 0) & (ids < 10)
    clean = jnp.where(keep, ids, 10)

    @jax.jit
    def oracle(table):
        def loss(t):
            return jnp.sum(jnp.take(t, clean, axis=0, mode="fill", fill_value=0) ** 2)

        bags = {
            m: jsr.embedding_bag(
                table, clean, mode=m, weights=None if m == "max" else w, padding_id=3
            )
            for m in modes
        }
        return (
            jnp.take(table, clean, axis=0, mode="fill", fill_value=0),
            bags,
            jax.grad(loss)(table),
        )

    want_rows, want_bags, want_grad = oracle(table)
    np.testing.assert_array_equal(rows, want_rows)
    for m in modes:
        np.testing.assert_allclose(bags[m], want_bags[m], rtol=1e-6)
    np.testing.assert_allclose(dense, want_grad, rtol=1e-6)
    np.testing.assert_allclose(sparse, want_grad, rtol=1e-6)


def test_row_sparse_gradient_of_a_huge_shard_has_no_table_sized_value(mesh):
    """Traced at 10**8 rows (never allocated): ``jsr.grad(..., sparse="auto")``
    gives the shard a RowSparse gradient, and no value of the whole
    computation (nested programs and both forms of the library's kernels
    included) has a table-sized axis."""
    v, d = 10**8, 4

    def body(t, ids):
        def loss(t):
            pooled = jsr.sharded_embedding_bag(t, ids, axis_name="x", mode="mean")
            return jax.lax.psum(jnp.sum(pooled**2), "x")

        g = jsr.grad(loss, sparse="auto")(t)
        assert isinstance(g, jsr.RowSparse) and g.shape == (v, d)
        return g.data, g.indices

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("x", None), P("x")), out_specs=P("x"))
    jaxpr = jax.make_jaxpr(f)(
        jax.ShapeDtypeStruct((v, d), jnp.float32), jax.ShapeDtypeStruct((8, 3), jnp.int32)
    )
    assert big_values(jaxpr, v) == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"placement": "block"}, ValueError, r'`placement` must be "range" .* got \'block\''),
        ({"capacity": 0}, ValueError, r"`capacity` must be an int >= 1, got 0"),
        ({"capacity": -1}, ValueError, r"`capacity` must be an int >= 1, got -1"),
        ({"capacity": 2.0}, TypeError, r"`capacity` must be an int >= 1, got float 2.0"),
        ({"num_rows": 4}, ValueError, r"`num_rows` must be 6 for shards of 6 rows on 1 .* got 4"),
        ({"axis_name": "y"}, NameError, r"must run inside `jax.shard_map` .* 'y'"),
    ],
)
def test_argument_errors(mesh, kwargs, error, match):
    kw = {"axis_name": "x", **kwargs}
    f = _mapped(mesh, lambda t, i: jsr.sharded_take(t, i, **kw))
    with pytest.raises(error, match=match):
        f(jnp.ones((6, 2)), jnp.array([1, 2]))


def test_outside_shard_map_names_shard_map():
    with pytest.raises(NameError, match=r"`sharded_take` .* inside `jax.shard_map`"):
        jsr.sharded_take(jnp.ones((6, 2)), jnp.array([1]), axis_name="x")


def test_table_errors(mesh):
    rsp = jsr.pull_rows(jnp.ones((6, 2)), jnp.array([1]))
    with pytest.raises(TypeError, match=r"`table_shard` must be the dense local shard"):
        _mapped(mesh, lambda i: jsr.sharded_take(rsp, i, axis_name="x"), (P("x"),))(
            jnp.ones(1, int)
        )
    replicated = _mapped(mesh, lambda t, i: jsr.sharded_take(t, i, axis_name="x"), (P(), P("x")))
    with pytest.raises(ValueError, match=r"replicated table, not a shard of one"):
        replicated(jnp.ones((6, 2)), jnp.array([1]))
    bag = _mapped(mesh, lambda t, i: jsr.sharded_embedding_bag(t, i, axis_name="x"))
    with pytest.raises(TypeError, match=r"`table_shard` must have a floating dtype"):
        bag(jnp.ones((6, 2), jnp.int32), jnp.array([[1]]))
    bad_mode = _mapped(mesh, lambda t, i: jsr.sharded_embedding_bag(t, i, axis_name="x", mode="x"))
    with pytest.raises(ValueError, match=r"`mode` must be one of"):
        bad_mode(jnp.ones((6, 2)), jnp.array([[1]]))
