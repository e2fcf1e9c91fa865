"""Shared bits of the examples: a progress reporter (tqdm when installed, else a
plain line every N steps), a timer, the hidden score that labels synthetic
ids, and the loss-curve plot."""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


class Progress:
    """``update(n, **metrics)`` after each step; ``close()`` at the end.

    Uses tqdm when it is installed; otherwise prints one plain line every
    ``every`` steps (default: about ten lines in total).
    """

    def __init__(self, total: int, desc: str, every: int | None = None, unit: str = "step"):
        self.total, self.desc, self.done = total, desc, 0
        self.every = every or max(total // 10, 1)
        self._next = self.every
        self.start = time.perf_counter()
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stdout, leave=False)

    def update(self, n: int = 1, **metrics: float) -> None:
        self.done += n
        text = ", ".join(f"{k}={v:.4g}" for k, v in metrics.items())
        if self._bar is not None:
            self._bar.update(n)
            if metrics:
                self._bar.set_postfix_str(text, refresh=False)
        elif self.done >= self._next or self.done == self.total:
            self._next = (self.done // self.every + 1) * self.every
            elapsed = time.perf_counter() - self.start
            print(f"  {self.desc}: {self.done}/{self.total} [{elapsed:.1f}s] {text}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def hidden_score(ids: jax.Array, salt: float = 78.233) -> jax.Array:
    """A fixed pseudo-random score in [-1, 1) per id (no table-sized array needed)."""
    x = jnp.sin(ids.astype(jnp.float32) * 12.9898 + salt) * 43758.5453
    return 2.0 * (x - jnp.floor(x)) - 1.0


def save_loss_curve(path: str, losses: list[float], steps: int, title: str) -> None:
    """Writes the loss curve to ``path`` as a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.linspace(0, steps - 1, len(losses)), losses)
    ax.set(xlabel="step", ylabel="loss", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"loss curve written to {path}")


def train(step, evaluate, params, opt_state, k_data, steps: int, batch_size: int):
    """Runs ``steps`` of ``step(params, opt_state, key) -> (params, opt_state,
    loss)`` on keys folded from ``k_data`` (the first compiles), with a
    progress bar; ``evaluate(params, key)`` is the held-out accuracy, taken
    before and after on a key no step uses. Returns ``(params, opt_state,
    losses, samples_per_s, (acc_before, acc_after))``."""
    k_eval = jax.random.fold_in(k_data, 2**31 - 1)  # a key no training step uses
    acc0 = float(evaluate(params, k_eval))
    params, opt_state, loss = step(params, opt_state, jax.random.fold_in(k_data, 0))  # compile
    losses = [float(loss)]
    bar = Progress(steps - 1, "train", unit="step")
    start = time.perf_counter()
    for t in range(1, steps):
        params, opt_state, loss = step(params, opt_state, jax.random.fold_in(k_data, t))
        if t % 10 == 0 or t == steps - 1:
            losses.append(float(loss))
            rate = t * batch_size / (time.perf_counter() - start)
            bar.update(10 if t % 10 == 0 else t % 10, loss=losses[-1], samples_per_s=rate)
    jax.block_until_ready(params)
    elapsed = time.perf_counter() - start
    bar.close()
    rate = (steps - 1) * batch_size / max(elapsed, 1e-9)
    acc = float(evaluate(params, k_eval))
    return params, opt_state, losses, rate, (acc0, acc)
