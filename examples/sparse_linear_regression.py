"""Linear regression with CSR input and a row-sparse weight (MXNet's "Train a
Linear Regression Model with Sparse Symbols" tutorial, done with jaxsparse_rows).

The data: 1000 x 100 CSR rows at density 0.01 and labels y = X . [1, 2, ..., 100].
The model: pred = X . w + b with a [100, 1] weight trained row-sparsely (each
step pulls only the rows its batch touches with `jsr.pull_rows`, differentiates
with `jsr.value_and_grad` and updates with lazy SGD, lr 0.05, momentum 0.9) and
a dense bias. Batch size 1, 10 epochs; the MSE of each epoch is printed and
the last one must be below 1, as the tutorial asserts.

Every epoch is one `jax.lax.scan` over the fixed-shape batches of
`jsr.io.CSRIter`, so the 10,000 steps take seconds.

    python examples/sparse_linear_regression.py            # the tutorial's sizes
    python examples/sparse_linear_regression.py --smoke    # a few seconds
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1000, help="training rows (default 1000)")
    p.add_argument("--features", type=int, default=100, help="feature dimension (default 100)")
    p.add_argument("--density", type=float, default=0.01, help="CSR density (default 0.01)")
    p.add_argument("--batch-size", type=int, default=1, help="rows per batch (default 1)")
    p.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests (no MSE check)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.epochs = 100, 2
    return args


def main(argv=None) -> float:
    args = parse_args(argv)
    k_data, k_init = jax.random.split(jax.random.key(args.seed))

    # Data: y = X . [1, ..., K], as in the tutorial.
    x = jsr.random.csr(k_data, (args.rows, args.features), args.density)
    target = jnp.arange(1, args.features + 1, dtype=jnp.float32).reshape(-1, 1)
    y = jsr.dot(x, target)[:, 0]
    print(f"data: {x} (nnz={int(x.nnz)}), labels {y.shape}")

    batches = jsr.io.CSRIter(x, y, args.batch_size, last_batch="discard")
    epoch_data = jsr.io.stack_batches(list(batches))  # one epoch, stacked for lax.scan
    steps = epoch_data.num_rows.shape[0]

    # Parameters: a [K, 1] weight (normal, sigma 0.01) and a dense bias.
    params = {
        "w": 0.01 * jax.random.normal(k_init, (args.features, 1)),
        "b": jnp.zeros((1,)),
    }
    opt = jsr.optim.lazy_sgd(args.lr, momentum=args.momentum)
    opt_state = opt.init(params)

    def loss_fn(view, batch):
        pred = jsr.dot(batch.x, view["w"])[:, 0] + view["b"]
        err = jnp.where(batch.mask, pred - batch.y, 0.0)
        # LinearRegressionOutput: 0.5 * squared error, gradient rescaled by 1 / batch size
        return 0.5 * jnp.sum(err**2) / args.batch_size, jnp.sum(err**2)

    def step(carry, batch):
        params, opt_state = carry
        view = {"w": jsr.pull_rows(params["w"], batch.x.indices), "b": params["b"]}
        (_, sq_err), grads = jsr.value_and_grad(loss_fn, has_aux=True)(view, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (jsr.optim.apply_updates(params, updates), opt_state), sq_err

    @jax.jit
    def run_epoch(params, opt_state, data):
        (params, opt_state), sq_err = jax.lax.scan(step, (params, opt_state), data)
        return params, opt_state, jnp.sum(sq_err) / jnp.sum(data.num_rows)

    start = time.perf_counter()
    mse = float("nan")
    for epoch in range(args.epochs):
        params, opt_state, mse_arr = run_epoch(params, opt_state, epoch_data)
        mse = float(mse_arr)  # the metric is taken before each step's update, as MXNet's
        print(f"Epoch {epoch}, MSE = {mse:.6f}")
    elapsed = time.perf_counter() - start

    if not args.smoke:
        assert mse < 1, f"Achieved MSE ({mse:f}) is larger than expected (1.0)"
    print(
        f"sparse_linear_regression: {args.epochs} epochs x {steps} steps in {elapsed:.2f}s, "
        f"final MSE {mse:.4f}" + ("" if args.smoke else " (< 1, as the MXNet tutorial asserts)")
    )
    return mse


if __name__ == "__main__":
    main()
