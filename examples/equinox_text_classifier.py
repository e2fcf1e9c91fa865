"""An equinox bag-of-words classifier with a large vocabulary, trained row-sparsely.

Each document is a bag of `--length` token ids drawn from a skewed (Zipf-like)
distribution over V tokens; its label says whether the tokens' hidden scores
sum above zero. The model (`eqx.nn.Embedding` [V, D], mean-pooled, an
`eqx.nn.MLP` head) is trained as in equinox's tutorials, with the step
differing from theirs where the gradient is taken and applied:

    params, static = eqx.partition(model, eqx.is_inexact_array)
    param_loss = lambda params, x, y: loss(eqx.combine(params, static), x, y)
    loss_value, grads = jsr.value_and_grad(param_loss, sparse="auto")(params, x, y)
    updates, opt_state = optim.update(grads, opt_state, params)
    model = eqx.combine(optax.apply_updates(params, updates), static)

with `optim = jsr.optim.lazy_adam(lr)` and `eqx.filter_jit(donate="all")`,
so the table gets a RowSparse gradient of the tokens a batch holds and Adam
updates only those rows, in place. Progress shows the loss and samples/s;
--plot FILE saves the loss curve when matplotlib is installed.

    python examples/equinox_text_classifier.py                 # V = 1,000,000, D = 32
    python examples/equinox_text_classifier.py --vocab 100000 --steps 500
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
    p.add_argument("--vocab", type=int, default=1_000_000, help="table rows V (default 1e6)")
    p.add_argument("--dim", type=int, default=32, help="embedding size D (default 32)")
    p.add_argument("--length", type=int, default=16, help="tokens per document (default 16)")
    p.add_argument("--batch-size", type=int, default=512, help="documents per step (default 512)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--lr", type=float, default=0.02, help="Adam learning rate (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--plot", metavar="FILE", help="save the loss curve as a PNG (matplotlib)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab, args.dim, args.batch_size, args.steps = 5000, 8, 64, 30
    return args


def sample_batch(key, args):
    """Token ids [B, length] skewed towards small ids, and labels [B]."""
    u = jax.random.uniform(key, (args.batch_size, args.length))
    ids = jnp.minimum((args.vocab * u**3).astype(jnp.int32), args.vocab - 1)
    labels = (jnp.sum(hidden_score(ids), axis=1) > 0).astype(jnp.float32)
    return ids, labels


def build(args):
    import equinox as eqx

    class BagOfWords(eqx.Module):
        embed: eqx.nn.Embedding
        head: eqx.nn.MLP

        def __init__(self, vocab: int, dim: int, key):
            k_embed, k_head = jax.random.split(key)
            self.embed = eqx.nn.Embedding(vocab, dim, key=k_embed)
            self.head = eqx.nn.MLP(dim, "scalar", width_size=32, depth=1, key=k_head)

        def __call__(self, ids):  # one document's token ids [length]
            return self.head(jnp.mean(jax.vmap(self.embed)(ids), axis=0))

    def loss(model, ids, labels):
        logits = jax.vmap(model)(ids)
        return optax.sigmoid_binary_cross_entropy(logits, labels).mean()

    optim = jsr.optim.lazy_adam(args.lr)

    @eqx.filter_jit(donate="all")
    def make_step(model, opt_state, ids, labels):
        params, static = eqx.partition(model, eqx.is_inexact_array)
        param_loss = lambda params, ids, labels: loss(eqx.combine(params, static), ids, labels)
        loss_value, grads = jsr.value_and_grad(param_loss, sparse="auto")(params, ids, labels)
        updates, opt_state = optim.update(grads, opt_state, params)
        model = eqx.combine(optax.apply_updates(params, updates), static)
        return model, opt_state, loss_value

    @eqx.filter_jit
    def accuracy(model, ids, labels):
        return jnp.mean((jax.vmap(model)(ids) > 0) == (labels > 0.5))

    model = BagOfWords(args.vocab, args.dim, jax.random.key(args.seed))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    return model, opt_state, make_step, accuracy


def main(argv=None) -> float:
    args = parse_args(argv)
    try:
        import equinox  # noqa: F401
    except ImportError:
        print("equinox is not installed: pip install equinox")
        sys.exit(1)
    model, opt_state, step, accuracy = build(args)
    size_mb = args.vocab * args.dim * 4 / 1e6
    print(f"embedding table [{args.vocab}, {args.dim}] ({size_mb:.0f} MB), lazy Adam lr {args.lr}")
    k_data = jax.random.key(args.seed + 1)
    k_eval = jax.random.fold_in(k_data, 2**31 - 1)  # a key no training step uses
    acc0 = float(accuracy(model, *sample_batch(k_eval, args)))
    batch = sample_batch(jax.random.fold_in(k_data, 0), args)
    model, opt_state, loss = step(model, opt_state, *batch)  # compile
    losses = [float(loss)]
    bar = Progress(args.steps - 1, "train", unit="step")
    start = time.perf_counter()
    for t in range(1, args.steps):
        batch = sample_batch(jax.random.fold_in(k_data, t), args)
        model, opt_state, loss = step(model, opt_state, *batch)
        if t % 10 == 0 or t == args.steps - 1:
            losses.append(float(loss))
            rate = t * args.batch_size / (time.perf_counter() - start)
            bar.update(10 if t % 10 == 0 else t % 10, loss=losses[-1], samples_per_s=rate)
    jax.block_until_ready(model.embed.weight)
    elapsed = time.perf_counter() - start
    bar.close()
    ms = 1e3 * elapsed / max(args.steps - 1, 1)
    acc = float(accuracy(model, *sample_batch(k_eval, args)))
    first, last = float(np.mean(losses[:3])), float(np.mean(losses[-3:]))
    print(f"loss {first:.4f} -> {last:.4f}; held-out accuracy {acc0:.3f} -> {acc:.3f}")

    if args.plot:
        save_loss_curve(args.plot, losses, args.steps, "equinox bag of words, lazy Adam")
    print(
        f"equinox_text_classifier: {args.steps} steps of {args.batch_size} x {args.length} "
        f"tokens on a [{args.vocab}, {args.dim}] table, {ms:.2f} ms/step, final loss "
        f"{last:.4f}, accuracy {acc:.3f}"
    )
    return last


if __name__ == "__main__":
    main()
