"""Every op of the library inside ``jax.shard_map`` (``check_vma=True``) against
the same computation written with ``jnp`` ops, on a row-sharded table.

Run as a script with the number of host devices as its argument (the device
count must be set before JAX starts, so ``test_shard_map.py`` runs it in a
subprocess). It prints one JSON object: ``{case: largest absolute error}``,
or ``{case: "ErrorType: message"}`` for a case that raised.
"""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(sys.argv[1])}"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import jaxsparse_rows as jsr

LOCAL_ROWS = 4  # rows of the table on each device
D = 3
# Global ids looked up by every device: repeats, first and last rows.
IDS = (0, 3, 3, 5, 2, 7, 0)


def _local_ids(ids, n_local):
    """Global ids as ids into this device's shard; those of other shards
    become the shard's padding id (``n_local``)."""
    lid = ids - jax.lax.axis_index("x") * n_local
    return jnp.where((lid >= 0) & (lid < n_local), lid, n_local)


def _dense_take(t, ids):
    return jnp.take(t, ids, axis=0, mode="fill", fill_value=0)


def _loss_weights(shape):
    return jnp.linspace(-1.0, 1.0, int(np.prod(shape))).reshape(shape)


def lookup_cases():
    """``{name: (jsr_fn, jnp_fn)}`` of ``fn(table_shard, ids) -> outputs``:
    forward values and gradients with respect to the table shard."""

    def take_dense(f):
        def fn(t, ids):
            lid = _local_ids(ids, t.shape[0])
            w = _loss_weights((ids.shape[0], D))

            def loss(t):
                return jnp.sum(jax.lax.psum(f(t, lid), "x") * w)

            return jax.lax.psum(f(t, lid), "x"), jax.grad(loss)(t)

        return fn

    def take_view(t, ids):
        lid = _local_ids(ids, t.shape[0])
        w = _loss_weights((ids.shape[0], D))
        view = jsr.pull_rows(t, lid)

        def loss(v):
            return jnp.sum(jax.lax.psum(jsr.take(v, lid), "x") * w)

        value, g = jsr.value_and_grad(loss)(view)
        return value, g.todense(), view.todense()

    def take_view_oracle(t, ids):
        lid = _local_ids(ids, t.shape[0])
        w = _loss_weights((ids.shape[0], D))

        def loss(t):
            return jnp.sum(jax.lax.psum(_dense_take(t, lid), "x") * w)

        value, g = jax.value_and_grad(loss)(t)
        touched = jnp.zeros(t.shape[0], bool).at[lid].set(True, mode="drop")
        return value, g, jnp.where(touched[:, None], t, 0)

    def bag(mode, view):
        def fn(t, ids):
            lid = _local_ids(ids, t.shape[0]).reshape(-1, 1)
            bags = jnp.concatenate([lid, lid[::-1]], axis=1)  # [7, 2]
            w = _loss_weights((bags.shape[0], D))
            pulled = jsr.pull_rows(t, bags) if view else t

            def loss(x):
                return jnp.sum(jax.lax.psum(jsr.embedding_bag(x, bags, mode=mode), "x") * w)

            if view:
                g = jsr.grad(loss)(pulled).todense()
            else:
                g = jax.grad(loss)(pulled)
            return jax.lax.psum(jsr.embedding_bag(pulled, bags, mode=mode), "x"), g

        return fn

    def bag_oracle(mode):
        def pool(t, bags):
            rows = _dense_take(t, bags)  # [B, 2, D]
            kept = (bags < t.shape[0])[..., None].astype(t.dtype)
            total = jnp.sum(rows * kept, axis=1)
            if mode == "sum":
                return total
            return total / jnp.maximum(jnp.sum(kept, axis=1), 1)

        def fn(t, ids):
            lid = _local_ids(ids, t.shape[0]).reshape(-1, 1)
            bags = jnp.concatenate([lid, lid[::-1]], axis=1)
            w = _loss_weights((bags.shape[0], D))

            def loss(t):
                return jnp.sum(jax.lax.psum(pool(t, bags), "x") * w)

            return jax.lax.psum(pool(t, bags), "x"), jax.grad(loss)(t)

        return fn

    def jvp_take(t, ids):
        lid = _local_ids(ids, t.shape[0])
        return jax.jvp(lambda t: jsr.take(t, lid), (t,), (t * 2,))

    def jvp_take_oracle(t, ids):
        lid = _local_ids(ids, t.shape[0])
        return jax.jvp(lambda t: _dense_take(t, lid), (t,), (t * 2,))

    def invariant_table(f):
        # A replicated (invariant) table looked up by varying ids: its
        # gradient is summed over the devices (a psum), as JAX's own is.
        def fn(t, ids):
            lid = _local_ids(ids, LOCAL_ROWS)
            table = jnp.arange(LOCAL_ROWS * D, dtype=t.dtype).reshape(LOCAL_ROWS, D)
            w = _loss_weights((ids.shape[0], D))
            return jax.grad(lambda tab: jnp.sum(f(tab, lid) * w))(table)

        return fn

    def auto_sparse(t, ids):
        # jsr.grad(sparse="auto") of jnp.take on the shard: a RowSparse of the
        # shard's rows whose cotangents are this device's own.
        lid = _local_ids(ids, t.shape[0])
        w = _loss_weights((ids.shape[0], D))

        def loss(t):
            return jnp.sum(
                jax.lax.psum(jnp.take(t, lid, axis=0, mode="fill", fill_value=0), "x") * w
            )

        return jsr.grad(loss, sparse="auto")(t).todense()

    def auto_sparse_oracle(t, ids):
        lid = _local_ids(ids, t.shape[0])
        w = _loss_weights((ids.shape[0], D))
        return jax.grad(lambda t: jnp.sum(jax.lax.psum(_dense_take(t, lid), "x") * w))(t)

    return {
        "take_dense": (take_dense(jsr.take), take_dense(_dense_take)),
        "take_auto_sparse": (auto_sparse, auto_sparse_oracle),
        "take_view": (take_view, take_view_oracle),
        "embedding_bag_sum_dense": (bag("sum", False), bag_oracle("sum")),
        "embedding_bag_mean_dense": (bag("mean", False), bag_oracle("mean")),
        "embedding_bag_sum_view": (bag("sum", True), bag_oracle("sum")),
        "embedding_bag_mean_view": (bag("mean", True), bag_oracle("mean")),
        "jvp_take": (jvp_take, jvp_take_oracle),
        "take_invariant_table": (invariant_table(jsr.take), invariant_table(_dense_take)),
    }


def _batch(t, ids, varying):
    """A CSR ``[3, LOCAL_ROWS]`` batch over the shard's rows and its dense
    form; its values vary over the devices when ``varying``."""
    lid = _local_ids(ids, t.shape[0])
    cols = jnp.sort(jnp.unique(lid, size=3, fill_value=t.shape[0]))
    vals = jnp.array([1.5, -2.0, 0.5], t.dtype)
    if varying:
        vals = vals * (1.0 + jax.lax.axis_index("x"))
    vals = jnp.where(cols < t.shape[0], vals, 0)
    # One entry per row: row i holds column cols[i] (padding reads as empty).
    indptr = jnp.array([0, 1, 2, 3], jsr.RowSparse([[0.0]], [0], (1, 1)).indices.dtype)
    x = jsr.CSR._make(vals, cols.astype(indptr.dtype), indptr, (3, t.shape[0]))
    dense = jnp.zeros((3, t.shape[0]), t.dtype).at[jnp.arange(3), cols].add(vals, mode="drop")
    return x, dense


def dot_cases():
    """``{name: (jsr_fn, jnp_fn)}`` for ``dot`` in every storage combination,
    with forward values and gradients with respect to the dense operand."""

    def make(kind, varying):
        def fn(t, ids, use_jsr):
            x, xd = _batch(t, ids, varying)
            rs = jsr.pull_rows(t, _local_ids(ids, t.shape[0])) if use_jsr else None
            rd = rs.todense() if use_jsr else None
            if not use_jsr:
                lid = _local_ids(ids, t.shape[0])
                touched = jnp.zeros(t.shape[0], bool).at[lid].set(True, mode="drop")
                rd = jnp.where(touched[:, None], t, 0)
            vec = jnp.linspace(0.5, 1.5, 3 * D).reshape(3, D)
            sq = jnp.linspace(-1.0, 1.0, LOCAL_ROWS * 3).reshape(LOCAL_ROWS, 3)
            calls = {
                "csr_dense": (lambda t: jsr.dot(x, t), lambda t: xd @ t),
                "csr_t_dense": (
                    lambda t: jsr.dot(x, vec + t[:3], transpose_a=True).todense(),
                    lambda t: xd.T @ (vec + t[:3]),
                ),
                "csr_rsp": (lambda t: jsr.dot(x, rs), lambda t: xd @ rd),
                "csr_t_rsp": (
                    lambda t: jsr.dot(x, jsr.pull_rows(t[:3], jnp.arange(3)), transpose_a=True),
                    lambda t: xd.T @ t[:3],
                ),
                "rsp_dense": (lambda t: jsr.dot(rs, t.T).todense(), lambda t: rd @ t.T),
                "rsp_t_dense": (lambda t: jsr.dot(rs, t, transpose_a=True), lambda t: rd.T @ t),
                "dense_csr": (lambda t: jsr.dot(t.T, _csr_of(xd.T)), lambda t: t.T @ xd.T),
                "dense_rsp": (
                    lambda t: jsr.dot(sq.T + t.T[:1], rs),
                    lambda t: (sq.T + t.T[:1]) @ rd,
                ),
            }
            f = calls[kind][0 if use_jsr else 1]

            def densify(y):
                return y.todense() if isinstance(y, jsr.RowSparse) else y

            w = _loss_weights(jax.eval_shape(lambda t: densify(f(t)), t).shape)
            out = jax.lax.psum(densify(f(t)), "x")
            g = jax.grad(lambda t: jnp.sum(jax.lax.psum(densify(f(t)), "x") * w))(t)
            return out, g

        return (lambda t, ids: fn(t, ids, True)), (lambda t, ids: fn(t, ids, False))

    kinds = (
        "csr_dense",
        "csr_t_dense",
        "csr_rsp",
        "csr_t_rsp",
        "rsp_dense",
        "rsp_t_dense",
        "dense_csr",
        "dense_rsp",
    )
    out = {}
    for kind in kinds:
        for varying in (True, False):
            out[f"dot_{kind}_{'varying' if varying else 'invariant'}_csr"] = make(kind, varying)
    return out


def _csr_of(dense):
    """A CSR of a traced dense matrix (every entry stored)."""
    m, n = dense.shape
    cols = jnp.tile(jnp.arange(n), m)
    indptr = jnp.arange(m + 1) * n
    idx_dtype = jsr.RowSparse([[0.0]], [0], (1, 1)).indices.dtype
    return jsr.CSR._make(
        dense.reshape(-1), cols.astype(idx_dtype), indptr.astype(idx_dtype), (m, n)
    )


OPTIMIZERS = {
    "lazy_sgd": lambda: jsr.optim.lazy_sgd(0.1),
    "lazy_sgd_momentum": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9),
    "lazy_sgd_nesterov": lambda: jsr.optim.lazy_sgd(0.1, momentum=0.9, nesterov=True),
    "lazy_adam": lambda: jsr.optim.lazy_adam(0.1),
    "lazy_adamw": lambda: jsr.optim.lazy_adamw(0.1, weight_decay=0.01),
    "lazy_adagrad": lambda: jsr.optim.lazy_adagrad(0.1),
    "lazy_rowwise_adagrad": lambda: jsr.optim.lazy_rowwise_adagrad(0.1),
    "lazy_ftrl": lambda: jsr.optim.lazy_ftrl(0.1),
}


def _train(make_opt, t, lid, steps=2):
    """``steps`` lazy steps on the shard ``t`` (the loss sums over devices)."""
    opt = make_opt()
    params = {"emb": t}
    state = opt.init(params)
    w = _loss_weights((lid.shape[0], D))
    for i in range(steps):
        ids = lid if i % 2 == 0 else lid[::-1]
        view = {"emb": jsr.pull_rows(params["emb"], ids)}
        g = jsr.grad(lambda v, ids=ids: jnp.sum(jsr.take(v["emb"], ids) ** 2 * w))(view)
        updates, state = opt.update(g, state, params)
        params = jsr.optim.apply_updates(params, updates)
    return params["emb"]


def optimizer_cases(n_dev):
    """The lazy optimizers inside ``shard_map`` against the same steps run
    on each shard alone, outside ``shard_map``; plain lazy SGD also against
    the dense ``optax.sgd`` step written with ``jnp``."""
    out = {}
    for name, make_opt in OPTIMIZERS.items():

        def fn(t, ids, make_opt=make_opt):
            return _train(make_opt, t, _local_ids(ids, t.shape[0]))

        def oracle(t_full, ids, make_opt=make_opt):
            shards = []
            for d in range(n_dev):
                t = t_full[d * LOCAL_ROWS : (d + 1) * LOCAL_ROWS]
                lid = ids - d * LOCAL_ROWS
                lid = jnp.where((lid >= 0) & (lid < LOCAL_ROWS), lid, LOCAL_ROWS)
                shards.append(_train(make_opt, t, lid))
            return jnp.concatenate(shards)

        out[name] = (fn, oracle)
    return out


def apply_updates_case():
    def fn(t, ids):
        lid = _local_ids(ids, t.shape[0])
        upd = jsr.pull_rows(t * 0.5 + 1.0, lid)
        return jsr.optim.apply_updates({"p": t}, {"p": upd})["p"], t + upd

    def oracle(t, ids):
        lid = _local_ids(ids, t.shape[0])
        uniq = jnp.unique(lid, size=lid.shape[0], fill_value=t.shape[0])
        rows = _dense_take(t * 0.5 + 1.0, uniq)
        new = t.at[uniq].add(rows, mode="drop")
        return new, new

    return fn, oracle


def _varying(x):
    """``x`` as a value that varies over ``"x"`` (an output stacked per device)."""
    if "x" in jax.typeof(x).mat.varying if hasattr(jax.typeof(x), "mat") else jax.typeof(x).vma:
        return x
    return jax.lax.pcast(x, "x", to="varying")


def main(n_dev: int) -> dict:
    mesh = jax.make_mesh((n_dev,), ("x",), axis_types=(AxisType.Auto,))
    rows = n_dev * LOCAL_ROWS
    table = jnp.arange(rows * D, dtype=jnp.float32).reshape(rows, D) / (rows * D) - 0.3
    ids = jnp.array([i % rows for i in IDS] + [rows - 1])
    results = {}

    def run(fn, jit=True):
        # Every device's outputs, stacked: [n_dev, ...] each.
        def body(t, i):
            return jax.tree.map(lambda o: _varying(o)[None], fn(t, i))

        mapped = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
        return (jax.jit(mapped) if jit else mapped)(table, ids)

    cases = {**lookup_cases(), **dot_cases()}
    eager = {f"{k}_eager": v for k, v in cases.items() if k in ("take_dense", "take_view")}
    for name, (f, g) in {**cases, **eager}.items():
        try:
            got = run(f, jit=not name.endswith("_eager"))
            want = run(g)
            err = max(
                float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                if np.size(a)
                else 0.0
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
            )
            results[name] = err
        except Exception as e:  # reported, and failed by the test
            results[name] = f"{type(e).__name__}: {str(e)[:400]}"
    for name, (f, oracle) in {
        **optimizer_cases(n_dev),
        "apply_updates": apply_updates_case(),
    }.items():
        try:
            got = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x")))(
                table, ids
            )
            if name == "apply_updates":
                want = jax.jit(
                    jax.shard_map(oracle, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
                )(table, ids)
            else:
                want = jax.jit(oracle)(table, ids)
            err = max(
                float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
            )
            results[name] = err
        except Exception as e:  # reported, and failed by the test
            results[name] = f"{type(e).__name__}: {str(e)[:400]}"
    return results


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
