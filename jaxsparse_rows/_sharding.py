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


def sharding_like(x: Any, spec: Any) -> jax.sharding.NamedSharding:
    """``spec`` on the mesh that ``x`` is sharded over explicitly, for an
    ``out_sharding`` or a ``reshard``. A bare PartitionSpec would need the
    caller's ``jax.set_mesh`` context; the mesh from ``x``'s type does not.
    Eagerly that is the concrete mesh of ``x``'s devices (an eager op must
    know them), under a trace the abstract mesh of its type."""
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        mesh = x.sharding.mesh
    else:
        mesh = jax.typeof(x).sharding.mesh
    return jax.sharding.NamedSharding(mesh, spec)


def replicated(x: jax.Array) -> jax.Array:
    """``x`` resharded to be replicated where it is sharded over explicit mesh
    axes (an all-gather), else ``x``: for ids that a sort must see whole."""
    if explicit_spec(x) is None:
        return x
    return jax.sharding.reshard(x, sharding_like(x, jax.sharding.PartitionSpec()))
