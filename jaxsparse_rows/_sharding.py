"""Sharding helpers: arrays sharded over explicit mesh axes (sharding in
types) and gathering them whole."""

from __future__ import annotations

from typing import Any

import jax


def explicit_spec(x: Any):
    """The PartitionSpec of an array sharded over explicit mesh axes (sharding
    in types), or None (no mesh, automatic axes, or replicated)."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None)
    return spec if spec is not None and any(a is not None for a in spec) else None


def replicated(x: jax.Array) -> jax.Array:
    """``x`` resharded to be replicated where it is sharded over explicit mesh
    axes (an all-gather), else ``x``: for ids that a sort must see whole."""
    if explicit_spec(x) is None:
        return x
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec())
