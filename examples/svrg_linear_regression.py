"""SVRG vs plain SGD on sparse linear regression (MXNet's SVRGModule example).

Data: CSR rows X and noisy labels y = X . [1, ..., K] + noise. Both runs train a
row-sparse weight and a dense bias with the same gradient function, the same
learning rate, the same batches and the same number of epochs:

* SGD steps along the mini-batch gradient; its noise keeps it hovering above
  the optimum at a constant step size.
* SVRG (`jsr.svrg.fit`) takes a snapshot w~ every `--update-freq` epochs with
  the full-data gradient mu, and steps along g = grad(w) - grad(w~) + mu,
  whose variance vanishes near the optimum: it keeps converging.

Both MSE curves are printed; SVRG ends lower. The "excess" column is the MSE
above the least-squares optimum.

    python examples/svrg_linear_regression.py
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1000, help="training rows (default 1000)")
    p.add_argument("--features", type=int, default=100, help="features K (default 100)")
    p.add_argument("--density", type=float, default=0.1, help="CSR density (default 0.1)")
    p.add_argument("--noise", type=float, default=1.0, help="label noise std (default 1)")
    p.add_argument("--batch-size", type=int, default=10, help="rows per batch (default 10)")
    p.add_argument("--epochs", type=int, default=10, help="epochs (default 10)")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate for both (default 0.5)")
    p.add_argument("--update-freq", type=int, default=2, help="epochs between snapshots (2)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests (no check)")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.features, args.epochs = 100, 20, 2
    return args


def main(argv=None) -> tuple[float, float]:
    args = parse_args(argv)
    k_x, k_noise = jax.random.split(jax.random.key(args.seed))
    x = jsr.random.csr(k_x, (args.rows, args.features), args.density, minval=-1.0, maxval=1.0)
    target = jnp.arange(1, args.features + 1, dtype=jnp.float32).reshape(-1, 1)
    y = jsr.dot(x, target)[:, 0] + args.noise * jax.random.normal(k_noise, (args.rows,))
    batches = jsr.io.CSRIter(x, y, args.batch_size, shuffle=True, seed=args.seed)
    print(f"data: {x} (nnz={int(x.nnz)}), batch size {args.batch_size}, lr {args.lr}")

    def grad_fn(params, batch):
        """Mean gradient of 0.5 (x.w + b - y)^2 over the batch; row-sparse for w."""
        view = {"w": jsr.pull_rows(params["w"], batch.x.indices), "b": params["b"]}

        def loss(view):
            pred = jsr.dot(batch.x, view["w"])[:, 0] + view["b"]
            err = jnp.where(batch.mask, pred - batch.y, 0.0)
            return 0.5 * jnp.sum(err**2) / batch.num_rows

        return jsr.grad(loss)(view)

    @jax.jit
    def full_mse(params):
        return jnp.mean((jsr.dot(x, params["w"])[:, 0] + params["b"] - y) ** 2)

    # The least-squares optimum, to report the excess MSE.
    design = np.c_[np.asarray(x.todense(), np.float64), np.ones(args.rows)]
    sol = np.linalg.lstsq(design, np.asarray(y, np.float64), rcond=None)[0]
    best = float(np.mean((design @ sol - np.asarray(y, np.float64)) ** 2))

    def init():
        return {"w": jnp.zeros((args.features, 1)), "b": jnp.zeros((1,))}

    # Plain SGD (lazy SGD: the gradient of w is row-sparse).
    sgd = jsr.optim.lazy_sgd(args.lr)

    @jax.jit
    def sgd_step(params, state, batch):
        updates, state = sgd.update(grad_fn(params, batch), state, params)
        return jsr.optim.apply_updates(params, updates), state

    start = time.perf_counter()
    params, state = init(), sgd.init(init())
    sgd_curve = []
    for _ in range(args.epochs):
        for batch in batches:
            params, state = sgd_step(params, state, batch)
        sgd_curve.append(float(full_mse(params)))
    t_sgd = time.perf_counter() - start

    # SVRG: the corrected gradient is dense (mu touches every row): plain optax.sgd.
    svrg_curve = []
    start = time.perf_counter()
    jsr.svrg.fit(
        grad_fn,
        optax.sgd(args.lr),
        init(),
        batches,
        args.epochs,
        update_freq=args.update_freq,
        callback=lambda epoch, p: svrg_curve.append(float(full_mse(p))),
    )
    t_svrg = time.perf_counter() - start

    print(f"least-squares optimum: MSE {best:.6f}")
    print(
        f"{'epoch':>5}  {'SGD MSE':>12}  {'SVRG MSE':>12}  {'SGD excess':>12}  {'SVRG excess':>12}"
    )
    for e, (a, b) in enumerate(zip(sgd_curve, svrg_curve, strict=True)):
        print(f"{e:>5}  {a:>12.6f}  {b:>12.6f}  {a - best:>12.3e}  {b - best:>12.3e}")
    if not args.smoke:
        assert svrg_curve[-1] < sgd_curve[-1], "SVRG should end lower than SGD"
    print(
        f"svrg_linear_regression: after {args.epochs} epochs at lr {args.lr}, SGD MSE "
        f"{sgd_curve[-1]:.6f} ({t_sgd:.1f}s), SVRG MSE {svrg_curve[-1]:.6f} ({t_svrg:.1f}s, "
        f"snapshot every {args.update_freq} epochs); optimum {best:.6f}"
    )
    return sgd_curve[-1], svrg_curve[-1]


if __name__ == "__main__":
    main()
