"""A small lazy Adam training run of an embedding table, optionally sharded
over an explicit mesh axis; shared by the sharding tests of
``test_native_rows.py`` (in process, and in a subprocess with two host
devices, which imports this file)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

import jaxsparse_rows as jsr

ROWS = 1000
IDS = ((1, 600), (999, 1), (3, 600), (7, 7))


def initial_table() -> jax.Array:
    return jnp.arange(ROWS * 8.0).reshape(ROWS, 8) / (ROWS * 8)


def train(mesh=None, spec=None, ids_spec=None):
    """Two jitted steps (``pull_rows``, ``take``, ``value_and_grad``, lazy
    Adam, ``apply_updates``) on the table placed with ``spec`` on ``mesh``
    (unsharded without them), and batches of ids placed with ``ids_spec``.
    Returns ``(params, state, last gradient's data, a CSR product with the
    final table)``."""
    opt = jsr.optim.lazy_adam(0.1)
    emb = initial_table()
    if spec is not None:
        emb = jax.device_put(emb, NamedSharding(mesh, spec))
    w = jnp.linspace(-1.0, 1.0, 8)
    if mesh is not None:  # replicated on the mesh (else its gradient's sharding is ambiguous)
        w = jax.device_put(w, NamedSharding(mesh, jax.sharding.PartitionSpec()))
    params = {"emb": emb, "w": w}
    state = opt.init(params)
    x = jsr.csr_matrix(([7.0, 8, 9], [0, 600, 1], [0, 2, 2, 3]), shape=(3, ROWS))

    def loss(view, ids, y):
        # Per-example weights sharded like the ids make the cotangent of the
        # lookups batch-sharded too (their transpose failed on it).
        looked_up = jsr.take(view["emb"], ids).sum(1) + jsr.embedding_bag(view["emb"], ids)
        return jnp.sum(jnp.tanh(looked_up @ view["w"]) * y)

    @jax.jit
    def step(p, s, ids, y):
        view = dict(p, emb=jsr.pull_rows(p["emb"], ids))
        _, g = jsr.value_and_grad(loss)(view, ids, y)
        u, s = opt.update(g, s, p)
        return jsr.optim.apply_updates(p, u), s, g["emb"].data

    ids = jnp.array(IDS)
    y = jnp.arange(1.0, len(IDS) + 1.0)
    batches = [(ids, y), (ids[::-1], y[::-1])]
    if ids_spec is not None:
        on_ids = NamedSharding(mesh, ids_spec)
        on_y = NamedSharding(mesh, jax.sharding.PartitionSpec(ids_spec[0]))
        batches = [(jax.device_put(i, on_ids), jax.device_put(w, on_y)) for i, w in batches]
    for batch, weights in batches:
        params, state, g_data = step(params, state, batch, weights)
    return params, state, g_data, jax.jit(jsr.dot)(x, params["emb"])


def op_cases() -> dict:
    """``{name: fn(table, dense)}``: ops on a [ROWS, 8] table and a [3, 8]
    dense operand that scatter rows into fresh zeros (``todense``, sums of
    rows, products) - each must keep an explicit sharding of the rows'
    trailing axis in the zeros it builds."""
    x = jsr.csr_matrix(([7.0, 8, 9], [0, 600, 1], [0, 2, 2, 3]), shape=(3, ROWS))
    a, b = jnp.array([1, 600]), jnp.array([600, 3])
    return {
        "dot": lambda t, d: jsr.dot(x, t),
        "dot_transpose_a": lambda t, d: jsr.dot(x, d, transpose_a=True).todense(),
        "take": lambda t, d: jsr.take(t, a),
        "pull_rows_todense": lambda t, d: jsr.pull_rows(t, a).todense(),
        "rowsparse_plus_rowsparse": lambda t, d: (
            jsr.pull_rows(t, a) + jsr.pull_rows(t, b)
        ).todense(),
        "rowsparse_times_dense": lambda t, d: (jsr.pull_rows(t, a) * t).todense(),
        "rowsparse_plus_dense": lambda t, d: jsr.pull_rows(t, a) + t,
        "retain": lambda t, d: jsr.retain(jsr.pull_rows(t, a), b).todense(),
        "sum_axis_1": lambda t, d: jsr.sum(jsr.pull_rows(t, a), axis=1),
        "pad": lambda t, d: jsr.pull_rows(t, a).with_capacity(5).todense(),
    }
