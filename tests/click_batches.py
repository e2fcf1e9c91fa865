"""Batches of a small click model, shared by the framework tests
(``test_frameworks_*.py``): ids ``[B, L]`` into a ``V``-row table and 0/1
labels ``[B]``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

V, D, B, L = 40, 4, 6, 3


def batches(n, every_step=None, seed=0):
    """``n`` batches of ids [B, L] and labels [B]; ``every_step`` rows (if given)
    are in every batch and no other row is."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if every_step is None:
            ids = rng.integers(0, V, (B, L))
        else:
            ids = rng.permutation(np.resize(np.asarray(every_step), B * L)).reshape(B, L)
        out.append((jnp.asarray(ids, jnp.int32), jnp.asarray(rng.integers(0, 2, B), jnp.float32)))
    return out
