"""A flax nnx click model with large embedding tables, trained row-sparsely.

A DLRM-style model: a user table [U, D], an item table [I, D] read for the
candidate item and for the user's last `--history` items (one table, two
lookups), a dot-product interaction and a small MLP. Clicks come from hidden
user and item scores. The model is written as in flax's nnx tutorials
(`nnx.Embed`, `nnx.Linear`, `nnx.Optimizer`, `nnx.jit`); the training step
differs from theirs in three lines:

    grad_fn = jsr.value_and_grad(loss_fn, has_aux=True, sparse="auto")  # nnx.value_and_grad
    optimizer = nnx.Optimizer(model, jsr.optim.lazy_adam(lr), wrt=nnx.Param)  # optax.adam
    @nnx.jit(donate_argnums=(0, 1))                                     # @nnx.jit

so the tables get RowSparse gradients of the rows a batch reads, Adam updates
only those rows, and the donated tables are updated in place: a step costs
O(batch * D), not O(rows * D). `--no-donate` shows the cost of a step that
copies the tables instead. Progress shows the loss and samples/s; --plot FILE
saves the loss curve when matplotlib is installed.

    python examples/flax_recommender.py                  # 1,000,000 users and items, D = 32
    python examples/flax_recommender.py --users 100000 --items 50000 --steps 300
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import Progress, hidden_score, save_loss_curve

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=1_000_000, help="user rows (default 1e6)")
    p.add_argument("--items", type=int, default=1_000_000, help="item rows (default 1e6)")
    p.add_argument("--dim", type=int, default=32, help="embedding size D (default 32)")
    p.add_argument("--history", type=int, default=8, help="past items per user (default 8)")
    p.add_argument("--batch-size", type=int, default=1024, help="samples per step (default 1024)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    p.add_argument("--no-donate", action="store_true", help="do not donate (tables are copied)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--plot", metavar="FILE", help="save the loss curve as a PNG (matplotlib)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.users, args.items, args.dim, args.batch_size, args.steps = 3000, 2000, 8, 64, 30
    return args


def sample_batch(key, args):
    """user ids [B], candidate item ids [B], history item ids [B, H], clicks [B]."""
    k_user, k_item, k_hist = jax.random.split(key, 3)
    skew = lambda k, shape, n: jnp.minimum(
        (n * jax.random.uniform(k, shape) ** 3).astype(int), n - 1
    )
    users = skew(k_user, (args.batch_size,), args.users)
    items = skew(k_item, (args.batch_size,), args.items)
    history = skew(k_hist, (args.batch_size, args.history), args.items)
    appeal = hidden_score(items, 11.11)  # popular items are seen often: learnable
    taste = jnp.mean(hidden_score(history, 11.11), axis=1) * hidden_score(users, 78.233)
    clicks = (appeal + 0.5 * taste > 0).astype(jnp.float32)
    return users, items, history, clicks


def build(args):
    from flax import nnx

    class ClickModel(nnx.Module):
        def __init__(self, users: int, items: int, dim: int, *, rngs: nnx.Rngs):
            self.user_embed = nnx.Embed(users, dim, rngs=rngs)
            self.item_embed = nnx.Embed(items, dim, rngs=rngs)
            self.hidden = nnx.Linear(3 * dim + 3, 32, rngs=rngs)
            self.out = nnx.Linear(32, 1, rngs=rngs)

        def __call__(self, users, items, history):
            u = self.user_embed(users)
            i = self.item_embed(items)
            h = self.item_embed(history).mean(axis=1)  # the same table, looked up again
            dots = jnp.stack([(u * i).sum(-1), (u * h).sum(-1), (i * h).sum(-1)], axis=-1)
            x = jnp.concatenate([u, i, h, dots], axis=-1)
            return self.out(nnx.relu(self.hidden(x)))[:, 0]

    def loss_fn(model, users, items, history, clicks):
        logits = model(users, items, history)
        return optax.sigmoid_binary_cross_entropy(logits, clicks).mean(), logits

    def train_step(model, optimizer, users, items, history, clicks):
        grad_fn = jsr.value_and_grad(loss_fn, has_aux=True, sparse="auto")
        (loss, _), grads = grad_fn(model, users, items, history, clicks)
        optimizer.update(model, grads)
        return loss

    @nnx.jit
    def accuracy(model, users, items, history, clicks):
        return jnp.mean((model(users, items, history) > 0) == (clicks > 0.5))

    model = ClickModel(args.users, args.items, args.dim, rngs=nnx.Rngs(args.seed))
    optimizer = nnx.Optimizer(model, jsr.optim.lazy_adam(args.lr), wrt=nnx.Param)
    donate = () if args.no_donate else (0, 1)
    return model, optimizer, nnx.jit(train_step, donate_argnums=donate), accuracy


def main(argv=None) -> float:
    args = parse_args(argv)
    try:
        import flax  # noqa: F401
    except ImportError:
        print("flax is not installed: pip install flax")
        sys.exit(1)
    model, optimizer, step, accuracy = build(args)
    rows = args.users + args.items
    size_mb = rows * args.dim * 4 / 1e6
    print(
        f"tables [{args.users}, {args.dim}] + [{args.items}, {args.dim}] ({size_mb:.0f} MB), "
        f"lazy Adam lr {args.lr}, {'no ' if args.no_donate else ''}donation"
    )
    k_data = jax.random.key(args.seed + 1)
    k_eval = jax.random.fold_in(k_data, 2**31 - 1)  # a key no training step uses
    acc0 = float(accuracy(model, *sample_batch(k_eval, args)))
    loss = step(model, optimizer, *sample_batch(jax.random.fold_in(k_data, 0), args))  # compile
    losses = [float(loss)]
    bar = Progress(args.steps - 1, "train", unit="step")
    start = time.perf_counter()
    for t in range(1, args.steps):
        loss = step(model, optimizer, *sample_batch(jax.random.fold_in(k_data, t), args))
        if t % 10 == 0 or t == args.steps - 1:
            losses.append(float(loss))
            rate = t * args.batch_size / (time.perf_counter() - start)
            bar.update(10 if t % 10 == 0 else t % 10, loss=losses[-1], samples_per_s=rate)
    jax.block_until_ready(model.user_embed.embedding.get_value())
    elapsed = time.perf_counter() - start
    bar.close()
    ms = 1e3 * elapsed / max(args.steps - 1, 1)
    acc = float(accuracy(model, *sample_batch(k_eval, args)))
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    print(f"loss {first:.4f} -> {last:.4f}; held-out accuracy {acc0:.3f} -> {acc:.3f}")

    if args.plot:
        save_loss_curve(args.plot, losses, args.steps, "flax nnx click model, lazy Adam")
    print(
        f"flax_recommender: {args.steps} steps of {args.batch_size} samples on {rows:,} table "
        f"rows, {ms:.2f} ms/step, final loss {last:.4f}, accuracy {acc:.3f}"
    )
    return last


if __name__ == "__main__":
    main()
