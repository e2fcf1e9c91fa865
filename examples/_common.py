"""Shared bits of the examples: a progress reporter (tqdm when installed, else a
plain line every N steps) and a timer."""

from __future__ import annotations

import sys
import time


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
