"""A row-sharded embedding table trained with lazy Adam inside jax.shard_map.

The table [V, D] is split by rows over every device of a one-axis mesh
("x"), placed as NamedSharding(mesh, P("x", None)), so each device holds
V / n rows and the optimizer state of those rows. Each device takes its own
slice of the batch (bags of item ids drawn from a skewed distribution, a
label saying whether the items' hidden scores sum above zero) and, inside
shard_map:

    pooled = jsr.sharded_embedding_bag(table_shard, ids, axis_name="x")
                              # ids to their shards, rows back: two all_to_alls
    loss, grads = jsr.value_and_grad(loss_fn, sparse={"table": True, "out": False})(...)
                              # the shard's gradient: RowSparse, local row ids
    updates, state = lazy_adam.update(...)   # each shard updates its own rows

The held-out accuracy is computed under plain jax.jit from the same sharded
table (jnp.take on the NamedSharding array: XLA partitions the gather).

On a CPU, --host-devices N splits it into N devices (XLA's
--xla_force_host_platform_device_count, set before JAX starts); on GPUs the
mesh spans jax.devices().

    python examples/sharded_embedding.py --host-devices 8
    python examples/sharded_embedding.py --host-devices 4 --placement mod --capacity 1024
"""

from __future__ import annotations

import argparse
import os


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=1_048_576, help="table rows V (default 2**20)")
    p.add_argument("--dim", type=int, default=32, help="embedding size D (default 32)")
    p.add_argument("--batch-size", type=int, default=1024, help="samples per step, all devices")
    p.add_argument("--bag", type=int, default=8, help="ids per sample (default 8)")
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    p.add_argument("--placement", choices=("range", "mod"), default="range", help="row placement")
    p.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="distinct ids each device sends each shard (default: the device's ids, which "
        "never overflows); the step then runs under checkify, which reports an overflow",
    )
    p.add_argument(
        "--host-devices",
        type=int,
        default=None,
        metavar="N",
        help="on a CPU, run on N host devices (sets XLA_FLAGS before JAX starts)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab, args.dim, args.batch_size, args.steps = 4096, 8, 64, 20
    return args


if __name__ == "__main__":
    # The device count of the CPU platform is fixed when JAX starts.
    _n = parse_args().host_devices
    if _n:
        flag = f"--xla_force_host_platform_device_count={_n}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import hidden_score, train  # noqa: E402
from jax.experimental import checkify  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402


def sample_batch(key, args):
    """ids [B, bag] skewed towards small ids, and labels [B]."""
    u = jax.random.uniform(key, (args.batch_size, args.bag))
    ids = jnp.minimum((args.vocab * u**3).astype(jnp.int32), args.vocab - 1)
    labels = (jnp.sum(hidden_score(ids), axis=1) > 0).astype(jnp.float32)
    return ids, labels


def to_placement(table, n, placement):
    """The table's rows in the order P("x", None) splits them: shard s holds
    rows s, s + n, s + 2n, ... for "mod" (as they are for "range")."""
    if placement == "range":
        return table
    v, d = table.shape
    return table.reshape(v // n, n, d).swapaxes(0, 1).reshape(v, d)


def position(ids, n, v, placement):
    """Where row ``ids`` lies in that order."""
    return ids if placement == "range" else (ids % n) * (v // n) + ids // n


def main(argv=None) -> float:
    args = parse_args(argv)
    devices = jax.devices()
    n = len(devices)
    if args.vocab % n or args.batch_size % n:
        raise SystemExit(
            f"--vocab ({args.vocab}) and --batch-size ({args.batch_size}) must be multiples of "
            f"the device count ({n})"
        )
    mesh = jax.make_mesh((n,), ("x",), axis_types=(AxisType.Auto,), devices=devices)
    rows = NamedSharding(mesh, P("x", None))
    k_table, k_out, k_data = jax.random.split(jax.random.key(args.seed), 3)

    @jax.jit
    def init():
        table = 0.1 * jax.random.normal(k_table, (args.vocab, args.dim))
        table = jax.lax.with_sharding_constraint(table, rows)
        return {"table": table, "out": 0.1 * jax.random.normal(k_out, (args.dim,))}

    params = init()
    opt = jsr.optim.lazy_adam(args.lr)
    opt_state = opt.init(params)
    specs = {"table": P("x", None), "out": P()}
    state_specs = jax.tree.map(lambda a: P("x", None) if a.ndim == 2 else P(), opt_state)
    per_device = args.batch_size // n
    size_mb = args.vocab * args.dim * 4 / 1e6
    print(
        f"embedding table [{args.vocab}, {args.dim}] ({size_mb:.0f} MB) in {n} shards of "
        f"{args.vocab // n} rows ({args.placement} placement) on {devices[0].platform}, "
        f"{per_device} samples per device, lazy Adam lr {args.lr}"
    )

    def loss_fn(p, ids, labels):
        pooled = jsr.sharded_embedding_bag(
            p["table"], ids, axis_name="x", capacity=args.capacity, placement=args.placement
        )
        logits = pooled @ p["out"]
        total = jnp.sum(jnp.logaddexp(0.0, logits) - labels * logits)
        return jax.lax.psum(total, "x") / args.batch_size

    def local_step(p, state, ids, labels):
        loss, grads = jsr.value_and_grad(loss_fn, sparse={"table": True, "out": False})(
            p, ids, labels
        )
        updates, state = opt.update(grads, state, p)
        return jsr.optim.apply_updates(p, updates), state, loss

    sharded_step = jax.shard_map(
        local_step,
        mesh=mesh,
        in_specs=(specs, state_specs, P("x"), P("x")),
        out_specs=(specs, state_specs, P()),
    )

    def step(p, state, key):
        ids, labels = sample_batch(key, args)
        return sharded_step(p, state, ids, labels)

    if args.capacity is None:
        step = jax.jit(step, donate_argnums=(0, 1))
    else:
        # A capacity below the ids per device can overflow: run the step under
        # checkify, which reports an overflow instead of reading zero rows.
        checked = jax.jit(
            checkify.checkify(step, errors=checkify.user_checks), donate_argnums=(0, 1)
        )

        def step(p, state, key):
            err, out = checked(p, state, key)
            err.throw()
            return out

    capacity = (
        min(per_device * args.bag, args.vocab // n) if args.capacity is None else args.capacity
    )
    print(
        f"each step, every device sends {n} x {capacity} ids and receives as many rows of "
        f"{args.dim} floats (all_to_all), and as many gradient rows go back"
    )

    @jax.jit
    def evaluate(p, key):
        ids, labels = sample_batch(key, args)
        rows = jnp.take(p["table"], position(ids, n, args.vocab, args.placement), axis=0)
        logits = jnp.mean(rows, axis=1) @ p["out"]
        return jnp.mean((logits > 0) == (labels > 0.5))

    params["table"] = jax.jit(to_placement, static_argnums=(1, 2), out_shardings=rows)(
        params["table"], n, args.placement
    )
    params, opt_state, losses, rate, (acc0, acc) = train(
        step, evaluate, params, opt_state, k_data, args.steps, args.batch_size
    )
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    print(f"loss {first:.4f} -> {last:.4f}; held-out accuracy {acc0:.3f} -> {acc:.3f}")
    print(f"table still sharded by rows: {params['table'].sharding.is_equivalent_to(rows, 2)}")
    print(
        f"sharded_embedding: {args.steps} steps of {args.batch_size} x {args.bag} ids on a "
        f"[{args.vocab}, {args.dim}] table in {n} shards, {rate:,.0f} samples/s, final loss "
        f"{last:.4f}, accuracy {acc:.3f}"
    )
    return last


if __name__ == "__main__":
    main()
