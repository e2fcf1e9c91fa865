"""SVRG across data-parallel devices against one device.

Run as a script with the number of host devices as its argument (the device
count must be set before JAX starts, so ``test_svrg_devices.py`` runs it in a
subprocess); every case runs on a mesh of all the devices. It prints
one JSON object: ``{case: largest absolute error}``, or ``{case: "ErrorType:
message"}`` for a case that raised.

- ``shard_map``: each device reads its own part of the rows
  (``CSRIter(num_parts=, part_index=)``), the full gradient is a
  ``lax.scan`` over the device's stacked epoch with one ``psum``
  (``axis_name``), and the steps (exact and lazy) average the correction
  over the devices. The oracle is one device whose global batch ``t`` holds
  the rows of every device's batch ``t``.
- ``jit``: batches of ids whose rows are sharded over the devices (global
  arrays), ``fit`` unchanged, against the same batches on one device.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from test_svrg import grad_fn  # the same least-squares gradient as the one-device tests

import jaxsparse_rows as jsr

N, K, M = 21, 12, 3  # rows, features, rows per device and step
CAP = 64  # one entry capacity for every batch, so that they stack


def data():
    x = jsr.random.csr(jax.random.key(0), (N, K), 0.3, minval=-1.0, maxval=1.0)
    noise = 0.3 * np.random.default_rng(0).standard_normal(N)
    y = (x.to_scipy() @ np.arange(1.0, K + 1) + noise).astype(np.float32)
    return x, y


def init_params():
    return {"w": jnp.linspace(-1.0, 1.0, K).reshape(K, 1), "b": jnp.full((1,), 0.5, jnp.float32)}


def device_batches(x, y, n):
    """Each device's part, as ``[n, T, ...]`` stacked batches (every part has
    the same number of batches here), and the one-device oracle's batches:
    global batch ``t`` holds the rows of every device's batch ``t``."""
    its = [jsr.io.CSRIter(x, y, M, nnz_buckets=[CAP], num_parts=n, part_index=d) for d in range(n)]
    parts = [list(it) for it in its]
    assert len({len(p) for p in parts}) == 1, [len(p) for p in parts]
    stacks = [jsr.io.stack_batches(p) for p in parts]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *stacks)
    order = []
    for t in range(len(parts[0])):
        for it in its:
            lo = it.rows.start + t * M
            order.extend(range(lo, min(lo + M, it.rows.stop)))
    assert sorted(order) == list(range(N))
    rows = np.asarray(order)
    xo = jsr.csr_matrix(x.to_scipy()[rows])
    return stacked, jsr.io.CSRIter(xo, y[rows], n * M, nnz_buckets=[n * CAP])


def err(a, b):
    return max(
        float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
        for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def shard_map_cases(n):
    x, y = data()
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    host_stacked, oracle_batches = device_batches(x, y, n)
    host_stacked = jax.device_get(host_stacked)
    rows = NamedSharding(mesh, P("x"))
    stacked = jax.device_put(host_stacked, rows)
    steps = [  # the devices' batch t, [n, ...]
        jax.device_put(jax.tree.map(lambda a, t=t: a[:, t], host_stacked), rows)
        for t in range(host_stacked.y.shape[1])
    ]
    first = functools.partial(jax.tree.map, lambda a: a[0])  # a device's [1, ...] block

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())
    def mu_fn(params, stacked):  # the device's epoch, scanned
        return jsr.svrg.full_gradient(grad_fn, params, first(stacked), axis_name="x")

    out = {}
    mu_oracle = jsr.svrg.full_gradient(grad_fn, init_params(), oracle_batches)
    out[f"full_gradient_scan_{n}"] = err(mu_fn(init_params(), stacked), mu_oracle)

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("x")), out_specs=P())
    def mu_fn_loop(params, batches):  # the device's batches, a Python loop
        return jsr.svrg.full_gradient(grad_fn, params, map(first, batches), axis_name="x")

    out[f"full_gradient_loop_{n}"] = err(mu_fn_loop(init_params(), steps), mu_oracle)

    for lazy, opt in ((False, optax.sgd(0.05)), (True, jsr.optim.lazy_adam(0.05))):
        step = jsr.svrg.make_step(grad_fn, opt, lazy, axis_name="x")

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        @functools.partial(
            jax.shard_map, mesh=mesh, in_specs=(P(), P(), P("x")), out_specs=(P(), P())
        )
        def dp_step(params, state, batch, step=step):
            return step(params, state, first(batch))

        oracle_step = jsr.svrg.make_step(grad_fn, opt, lazy)
        params, oracle_params = init_params(), init_params()
        state = jsr.svrg.init(params, opt)
        oracle_state = jsr.svrg.init(oracle_params, opt)
        for _ in range(2):  # epochs, a snapshot at the start of each
            snapshot = jax.tree.map(jnp.copy, params)
            state = state._replace(snapshot=snapshot, full_grad=mu_fn(params, stacked))
            oracle_state = jsr.svrg.take_snapshot(
                oracle_state, oracle_params, grad_fn, oracle_batches
            )
            for batch, oracle_batch in zip(steps, oracle_batches, strict=True):
                params, state = dp_step(params, state, batch)
                oracle_params, oracle_state = oracle_step(oracle_params, oracle_state, oracle_batch)
        out[f"steps_{'lazy' if lazy else 'exact'}_{n}"] = err(params, oracle_params)
    return out


IDS_V, IDS_D, IDS_B = 30, 3, 8


def id_grad_fn(params, batch):
    view = {**params, "emb": jsr.pull_rows(params["emb"], batch["ids"])}

    def loss(v):
        pred = jsr.take(v["emb"], batch["ids"]).sum(1) @ v["w"]
        return 0.5 * jnp.mean((pred - batch["y"]) ** 2)

    return jsr.grad(loss)(view)


def id_batches():
    rng = np.random.default_rng(1)
    return [
        {
            "ids": rng.integers(0, IDS_V, (IDS_B, 2)).astype(np.int32),
            "y": rng.standard_normal(IDS_B).astype(np.float32),
        }
        for _ in range(3)
    ]


def id_params():
    emb = np.random.default_rng(2).standard_normal((IDS_V, IDS_D)).astype(np.float32)
    return {"emb": jnp.asarray(emb), "w": jnp.ones(IDS_D)}


@functools.cache
def id_oracle():
    return jsr.svrg.fit(
        id_grad_fn, jsr.optim.lazy_sgd(0.1), id_params(), id_batches(), 2, lazy=True
    )


def jit_cases(n):
    """``fit`` on batches of ids sharded over the devices (``jax.jit`` over
    global arrays): the same parameters and full gradient as on one device."""
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])
    sharded = [jax.device_put(b, NamedSharding(mesh, P("x"))) for b in id_batches()]
    got = jsr.svrg.fit(id_grad_fn, jsr.optim.lazy_sgd(0.1), id_params(), sharded, 2, lazy=True)
    want = id_oracle()
    return {
        f"jit_fit_{n}": err(got[0], want[0]),
        f"jit_full_gradient_{n}": err(got[1].full_grad, want[1].full_grad),
    }


def main():
    results, n = {}, jax.device_count()
    for cases in (shard_map_cases, jit_cases):
        try:
            results.update(cases(n))
        except Exception as e:  # reported, not raised: the test names the case
            results[f"{cases.__name__}_{n}"] = f"{type(e).__name__}: {e}"
    print(json.dumps(results))


if __name__ == "__main__":
    main()
