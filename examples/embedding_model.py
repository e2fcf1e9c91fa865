"""A model with a large embedding table trained row-sparsely with lazy Adam.

Each sample is a bag of `--bag` item ids drawn from a skewed (Zipf-like)
distribution over a vocabulary of V items; its label says whether the items'
hidden scores sum above zero. The model averages the items' embeddings
(table [V, D]) and scores them with a dense vector. One jitted step, with the
parameters and optimizer state donated so XLA updates them in place:

    rows = jsr.pull_rows(table, ids)         # only the rows the batch uses
    loss, grads = jsr.value_and_grad(loss_fn)(rows, ...)   # row-sparse gradient
    updates, state = lazy_adam.update(...)   # touches only those rows
    params = jsr.optim.apply_updates(...)    # scatter-add, O(rows * D)

so a step costs O(batch * bag * D), not O(V * D). Progress shows the loss and
samples/s; --plot FILE saves the loss curve when matplotlib is installed.

    python examples/embedding_model.py                       # V = 1,000,000, D = 64
    python examples/embedding_model.py --vocab 100000 --dim 16 --steps 500
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from _common import hidden_score, save_loss_curve, train

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=1_000_000, help="table rows V (default 1e6)")
    p.add_argument("--dim", type=int, default=64, help="embedding size D (default 64)")
    p.add_argument("--batch-size", type=int, default=512, help="samples per step (default 512)")
    p.add_argument("--bag", type=int, default=8, help="ids per sample (default 8)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--plot", metavar="FILE", help="save the loss curve as a PNG (matplotlib)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab, args.dim, args.batch_size, args.steps = 5000, 8, 64, 30
    return args


def sample_batch(key, args):
    """ids [B, bag] skewed towards small ids, and labels [B]."""
    u = jax.random.uniform(key, (args.batch_size, args.bag))
    ids = jnp.minimum((args.vocab * u**3).astype(jnp.int32), args.vocab - 1)
    labels = (jnp.sum(hidden_score(ids), axis=1) > 0).astype(jnp.float32)
    return ids, labels


def main(argv=None) -> float:
    args = parse_args(argv)
    k_table, k_out, k_data = jax.random.split(jax.random.key(args.seed), 3)
    params = {
        "table": 0.1 * jax.random.normal(k_table, (args.vocab, args.dim)),
        "out": 0.1 * jax.random.normal(k_out, (args.dim,)),
    }
    size_mb = params["table"].size * 4 / 1e6
    print(f"embedding table [{args.vocab}, {args.dim}] ({size_mb:.0f} MB), lazy Adam lr {args.lr}")
    opt = jsr.optim.lazy_adam(args.lr)
    opt_state = opt.init(params)

    def loss_fn(view, ids, labels):
        emb = jsr.take(view["table"], ids)  # [B, bag, D], zeros for rows not pulled
        logits = jnp.mean(emb, axis=1) @ view["out"]
        return jnp.mean(jnp.logaddexp(0.0, logits) - labels * logits)

    def step(params, opt_state, key):
        ids, labels = sample_batch(key, args)
        view = {"table": jsr.pull_rows(params["table"], ids), "out": params["out"]}
        loss, grads = jsr.value_and_grad(loss_fn)(view, ids, labels)
        updates, opt_state = opt.update(grads, opt_state, params)
        return jsr.optim.apply_updates(params, updates), opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1))

    @jax.jit
    def evaluate(params, key):
        ids, labels = sample_batch(key, args)
        logits = jnp.mean(params["table"][ids], axis=1) @ params["out"]
        return jnp.mean((logits > 0) == (labels > 0.5))

    params, opt_state, losses, rate, (acc0, acc) = train(
        step, evaluate, params, opt_state, k_data, args.steps, args.batch_size
    )
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    print(f"loss {first:.4f} -> {last:.4f}; held-out accuracy {acc0:.3f} -> {acc:.3f}")

    if args.plot:
        save_loss_curve(args.plot, losses, args.steps, "embedding model, lazy Adam")
    print(
        f"embedding_model: {args.steps} steps of {args.batch_size} x {args.bag} ids on a "
        f"[{args.vocab}, {args.dim}] table, {rate:,.0f} samples/s, final loss {last:.4f}, "
        f"accuracy {acc:.3f}"
    )
    return last


if __name__ == "__main__":
    main()
