"""Which sparse optimizers are exact? Lazy AdaGrad vs lazy Adam on row-sparse
gradients (the point of PyTorch's "sparse semantics for Adagrad" tutorial).

A row-sparse gradient lists some rows; every other row is zero. A lazy
optimizer touches only the listed rows. That is *exact* (equal to the dense
optimizer fed the densified gradient) exactly when a zero gradient row leaves
both the row's state and its weight unchanged under the dense rule:

* AdaGrad: ``s += g**2; w -= lr * g / sqrt(s + eps)``. With g = 0 the
  accumulator does not move and the step is 0 * (...) = 0, whatever ``eps`` is
  and wherever it is added. So lazy AdaGrad == dense AdaGrad, bit for bit.
  (PyTorch's sparse AdaGrad adds eps only to the specified values, "sparsity
  as a mask"; for AdaGrad that is harmless for the same reason.)
* Adam: ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g**2; w -= lr m^ / (sqrt(v^) + eps)``.
  With g = 0 the moments still decay and the weight still moves by
  ``lr m^ / (sqrt(v^) + eps)`` for every row with a non-zero history. Lazy Adam
  skips those rows: a different (and cheaper) algorithm, not an exact one.

This script trains both ways for a few steps on the same random row-sparse
gradients and prints the differences.

    python examples/adagrad_semantics.py [--rows 6] [--steps 4]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import optax

import jaxsparse_rows as jsr


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=6, help="rows of the parameter (default 6)")
    p.add_argument("--dim", type=int, default=3, help="columns of the parameter (default 3)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--smoke", action="store_true", help="tiny run for tests")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps = 3
    return args


def run(lazy_opt, dense_opt, w0, grads):
    """Applies the same gradients lazily (RowSparse) and densely (optax).

    Op by op (not jitted), so both run the same float operations per element:
    a compiled program may fuse (e.g. contract into FMAs) differently and move
    the last bit, which is rounding, not semantics.
    """
    w_lazy, w_dense = w0, w0
    s_lazy, s_dense = lazy_opt.init(w0), dense_opt.init(w0)
    for g in grads:
        u, s_lazy = lazy_opt.update(g, s_lazy, w_lazy)
        w_lazy = jsr.optim.apply_updates(w_lazy, u)
        u, s_dense = dense_opt.update(g.todense(), s_dense, w_dense)
        w_dense = optax.apply_updates(w_dense, u)
    return np.asarray(w_lazy), np.asarray(w_dense)


def main(argv=None) -> dict[str, float]:
    args = parse_args(argv)
    key = jax.random.key(args.seed)
    k_w, k_g = jax.random.split(key)
    shape = (args.rows, args.dim)
    w0 = jax.random.normal(k_w, shape)
    # Each step's gradient lists a different half of the rows.
    grads = [
        jsr.random.row_sparse(k, shape, 0.5, minval=-1.0, maxval=1.0)
        for k in jax.random.split(k_g, args.steps)
    ]
    np.set_printoptions(precision=6, suppress=True)
    print(f"parameter {shape}; {args.steps} steps; rows listed by each gradient:")
    for t, g in enumerate(grads):
        print(f"  step {t}: rows {np.asarray(g.indices).tolist()}")

    results = {}
    pairs = {
        "AdaGrad": (jsr.optim.lazy_adagrad(args.lr), optax.adagrad(args.lr)),
        "Adam": (jsr.optim.lazy_adam(args.lr), optax.adam(args.lr)),
    }
    last_rows = set(np.asarray(grads[-1].indices).tolist())
    for name, (lazy_opt, dense_opt) in pairs.items():
        w_lazy, w_dense = run(lazy_opt, dense_opt, w0, grads)
        diff = np.abs(w_lazy - w_dense)
        results[name] = float(diff.max())
        exact = np.array_equal(w_lazy, w_dense)
        print(f"\n{name}: lazy == dense exactly? {exact}   max |lazy - dense| = {diff.max():.3g}")
        if exact:
            print("  bit for bit: every skipped row had a zero gradient, a no-op for this rule.")
        print("  per-row max |lazy - dense|:", diff.max(axis=1))
        if not exact:
            moved = [r for r in range(args.rows) if diff[r].max() > 1e-5]
            print(
                f"  rows that differ by more than rounding: {moved}. Dense {name} kept "
                "moving rows the gradients skipped (their moments decay but stay non-zero); lazy "
                f"{name} leaves a row alone until a gradient lists it again."
            )
            untouched_last = sorted(set(range(args.rows)) - last_rows)
            print(f"  (rows not listed by the last gradient: {untouched_last})")
    how = "exactly" if results["AdaGrad"] == 0 else "to rounding"
    print(
        f"\nadagrad_semantics: lazy AdaGrad matches dense AdaGrad {how} (max diff "
        f"{results['AdaGrad']:.3g}); lazy Adam does not (max diff {results['Adam']:.3g}): "
        "only rules where a zero gradient is a no-op can be lazy and exact."
    )
    assert results["AdaGrad"] <= 1e-6, "lazy AdaGrad should equal dense AdaGrad"
    return results


if __name__ == "__main__":
    main()
