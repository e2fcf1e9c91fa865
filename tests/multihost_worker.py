"""One process of the multi-host test (``test_multihost.py``).

``python multihost_worker.py OUT PROCESS_ID NUM_PROCESSES LOCAL_DEVICES [PORT]``

With ``NUM_PROCESSES > 1`` the process joins the others through
``jax.distributed.initialize`` (the coordinator on localhost:PORT; CPU
collectives across processes through gloo), and every process sees the
``NUM_PROCESSES * LOCAL_DEVICES`` global devices. It trains an embedding
table sharded by rows over all of them (``NamedSharding(Mesh(jax.devices(),
("x",)), P("x", None))``), ``pull_rows`` + ``take`` + ``embedding_bag``
forward, ``value_and_grad`` and lazy Adam in one jitted step, on batches
whose rows are split over the processes (each process builds its own part,
``jax.make_array_from_process_local_data``); and the SVRG full gradient of
the same batches. It writes ``OUT/result_<process id>.npz``: every leaf of
the parameters, the optimizer state and the full gradient, gathered whole.

With ``NUM_PROCESSES > 1`` it then saves an orbax checkpoint of the sharded
table and optimizer state (every process writes its shards), restores it in
every process into a target built from ``jax.eval_shape(opt.init, params)``
and the shardings, and adds to the file whether the restored leaves equal
the saved ones and keep their shardings.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxsparse_rows as jsr

V, D, B, L, STEPS = 64, 4, 8, 3, 3  # table rows, width, global batch, bag length, steps


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """The global batches (every process draws the same ones)."""
    rng = np.random.default_rng(0)
    return [
        (
            rng.integers(0, V, (B, L)).astype(np.int32),
            rng.standard_normal(B).astype(np.float32),
        )
        for _ in range(STEPS)
    ]


def loss_fn(view, ids, y):
    pooled = jsr.embedding_bag(view["emb"], ids, mode="sum") + jsr.take(view["emb"], ids[:, 0])
    return jnp.mean((jnp.tanh(pooled) @ view["w"] - y) ** 2)


def grad_fn(params, batch):
    ids, y = batch
    view = {**params, "emb": jsr.pull_rows(params["emb"], ids)}
    return jsr.grad(loss_fn)(view, ids, y)


def main(out: str, process_id: int, num_processes: int, local_devices: int, port: int) -> None:
    jax.config.update("jax_num_cpu_devices", local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if num_processes > 1:
        jax.distributed.initialize(
            f"localhost:{port}",
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=60,
        )
    assert jax.process_count() == num_processes and jax.device_count() == 4
    mesh = Mesh(jax.devices(), ("x",))
    by_rows = NamedSharding(mesh, P("x", None))
    batch_rows = NamedSharding(mesh, P("x"))
    replicated = NamedSharding(mesh, P())

    table = np.linspace(-1.0, 1.0, V * D, dtype=np.float32).reshape(V, D)
    params = {
        "emb": jax.make_array_from_callback((V, D), by_rows, lambda index: table[index]),
        "w": jax.device_put(jnp.linspace(0.5, 1.5, D), replicated),
    }
    opt = jsr.optim.lazy_adam(0.05)
    state = opt.init(params)

    def local_rows(a: np.ndarray) -> np.ndarray:
        """This process's part of a global batch: a contiguous block of rows."""
        n = a.shape[0] // num_processes
        return a[process_id * n : (process_id + 1) * n]

    data = [
        tuple(
            jax.make_array_from_process_local_data(batch_rows, local_rows(a), a.shape)
            for a in batch
        )
        for batch in batches()
    ]

    @jax.jit
    def step(params, state, ids, y):
        view = {**params, "emb": jsr.pull_rows(params["emb"], ids)}
        loss, grads = jsr.value_and_grad(loss_fn)(view, ids, y)
        updates, state = opt.update(grads, state, params)
        return jsr.optim.apply_updates(params, updates), state, loss

    for ids, y in data:
        params, state, _ = step(params, state, ids, y)
    full_grad = jsr.svrg.full_gradient(grad_fn, params, data)
    report = {"emb_sharded_by_rows": params["emb"].sharding.is_equivalent_to(by_rows, 2)}

    gather = multihost_utils.process_allgather
    leaves = jax.tree_util.tree_flatten_with_path(
        {"params": params, "state": state, "full_grad": full_grad}
    )[0]
    arrays = {
        jax.tree_util.keystr(path): np.asarray(gather(leaf, tiled=True)) for path, leaf in leaves
    }

    if num_processes > 1:
        report.update(checkpoint_round_trip(os.path.join(out, "ckpt"), params, state, opt, mesh))
    np.savez(os.path.join(out, f"result_{process_id}.npz"), **arrays)
    with open(os.path.join(out, f"report_{process_id}.json"), "w") as f:
        json.dump(report, f)
    if num_processes > 1:
        jax.distributed.shutdown()


def checkpoint_round_trip(path, params, state, opt, mesh) -> dict:
    """Saves the table and the optimizer state with orbax from every process,
    restores them into a target of shapes and shardings only, and compares."""
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, {"params": params, "opt_state": state})
    ckptr.wait_until_finished()

    def with_sharding(abstract, live):
        # The target's shardings: the table's rows (and those of its
        # moments) over the devices, the rest replicated.
        spec = P("x", None) if abstract.shape == live["emb"].shape else P()
        return jax.ShapeDtypeStruct(
            abstract.shape, abstract.dtype, sharding=NamedSharding(mesh, spec)
        )

    abstract_params = jax.eval_shape(lambda: params)
    target = {
        "params": jax.tree.map(lambda a: with_sharding(a, params), abstract_params),
        "opt_state": jax.tree.map(
            lambda a: with_sharding(a, params), jax.eval_shape(opt.init, params)
        ),
    }
    restored = ckptr.restore(path, target)
    saved = jax.tree.leaves({"params": params, "opt_state": state})
    back = jax.tree.leaves(restored)
    gather = multihost_utils.process_allgather
    equal = len(saved) == len(back) and all(
        bool(np.array_equal(gather(a, tiled=True), gather(b, tiled=True)))
        for a, b in zip(saved, back, strict=True)
    )
    same_sharding = all(
        b.sharding.is_equivalent_to(t.sharding, b.ndim)
        for b, t in zip(back, jax.tree.leaves(target), strict=True)
    )
    return {
        "restored_equal": equal,
        "restored_sharding": same_sharding,
        "restored_emb_by_rows": restored["params"]["emb"].sharding.is_equivalent_to(
            NamedSharding(mesh, P("x", None)), 2
        ),
    }


if __name__ == "__main__":
    out, pid, nproc, ndev = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    main(out, pid, nproc, ndev, int(sys.argv[5]) if len(sys.argv) > 5 else 0)
