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
