"""Logistic regression on LibSVM data with a lazy optimizer.

Writes a synthetic binary-classification LibSVM file (or reads yours with
--data), streams it in fixed-shape batches with `jsr.io.LibSVMIter`, and trains
a row-sparse weight with lazy AdaGrad (or FTRL): each step pulls only the
weight rows its batch touches. The training accuracy over the whole file
(`jsr.io.load_libsvm`) is printed after every epoch.

    python examples/linear_classification.py
    python examples/linear_classification.py --optimizer ftrl
    python examples/linear_classification.py --data my.svm --features 1000000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from _common import Progress

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a LibSVM file with labels -1/+1 or 0/1 (default: synthetic)")
    p.add_argument("--rows", type=int, default=20000, help="synthetic rows (default 20000)")
    p.add_argument("--features", type=int, default=10000, help="feature count (default 10000)")
    p.add_argument("--density", type=float, default=0.002, help="synthetic density (0.002)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
    p.add_argument("--epochs", type=int, default=5, help="epochs (default 5)")
    p.add_argument("--optimizer", choices=["adagrad", "ftrl"], default="adagrad")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.features, args.epochs, args.density = 600, 200, 2, 0.05
    return args


def write_synthetic(path, args):
    """Labels from a hidden linear model: y = sign(x . w_true)."""
    k_x, k_w = jax.random.split(jax.random.key(args.seed))
    x = jsr.random.csr(k_x, (args.rows, args.features), args.density, minval=-1.0, maxval=1.0)
    w_true = jax.random.normal(k_w, (args.features, 1))
    y = np.where(np.asarray(jsr.dot(x, w_true))[:, 0] > 0, 1, -1)
    jsr.io.save_libsvm(path, x, y)


def main(argv=None) -> float:
    args = parse_args(argv)
    tmp = None
    path = args.data
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = os.path.join(tmp.name, "train.svm")
        write_synthetic(path, args)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.2f} MB)")

    # Whole file, for evaluation; streamed batches, for training.
    x_all, y_all = jsr.io.load_libsvm(path, num_features=args.features)
    y_all = (y_all > 0).astype(jnp.float32)  # -1/+1 or 0/1 -> 0/1
    print(f"read back: {x_all} (nnz={int(x_all.nnz)}), positives {float(y_all.mean()):.1%}")
    train = jsr.io.LibSVMIter(path, args.batch_size, num_features=args.features)

    params = {"w": jnp.zeros((args.features, 1)), "b": jnp.zeros((1,))}
    if args.optimizer == "adagrad":
        opt = jsr.optim.lazy_adagrad(args.lr)
    else:
        opt = jsr.optim.lazy_ftrl(args.lr)
    opt_state = opt.init(params)

    def loss_fn(view, batch):
        logits = jsr.dot(batch.x, view["w"])[:, 0] + view["b"]
        labels = (batch.y > 0).astype(logits.dtype)
        per_row = jnp.logaddexp(0.0, logits) - labels * logits  # sigmoid cross-entropy
        return jnp.sum(jnp.where(batch.mask, per_row, 0.0)) / batch.num_rows

    @jax.jit
    def step(params, opt_state, batch):
        view = {"w": jsr.pull_rows(params["w"], batch.x.indices), "b": params["b"]}
        loss, grads = jsr.value_and_grad(loss_fn)(view, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return jsr.optim.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def accuracy(params, x, y):
        logits = jsr.dot(x, params["w"])[:, 0] + params["b"]
        return jnp.mean((logits > 0) == (y > 0.5))

    start = time.perf_counter()
    acc = float(accuracy(params, x_all, y_all))
    print(f"Epoch -, accuracy = {acc:.4f} (untrained)")
    n_batches = -(-x_all.shape[0] // args.batch_size)
    for epoch in range(args.epochs):
        bar = Progress(n_batches, f"epoch {epoch}", unit="batch")
        total, rows = 0.0, 0
        for batch in train:
            params, opt_state, loss = step(params, opt_state, batch)
            n = int(batch.num_rows)
            total, rows = total + float(loss) * n, rows + n
            bar.update(1, loss=float(loss))
        bar.close()
        acc = float(accuracy(params, x_all, y_all))
        print(f"Epoch {epoch}, loss = {total / rows:.4f}, accuracy = {acc:.4f}")
    elapsed = time.perf_counter() - start
    print(
        f"linear_classification: {args.epochs} epochs of {x_all.shape[0]} rows with lazy "
        f"{args.optimizer} in {elapsed:.2f}s ({step._cache_size()} compiled batch shapes), "
        f"final accuracy {acc:.4f}"
    )
    if tmp is not None:
        tmp.cleanup()
    return acc


if __name__ == "__main__":
    main()
