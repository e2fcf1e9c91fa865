"""The RowSparse invariant (row ids in ``[0, N]``, the real ones strictly
increasing, padding id ``N`` only after them and padding rows zero), as
traced conditions for ``jsr.check`` under ``checkify`` and as a host check
that the entry points run on concrete operands.

A RowSparse whose leaves were rebuilt by a function mapped over them (the
concatenation or sum of two gradients with ``jax.tree.map``) breaks it, and
every scatter would then give wrong rows silently; the entry points refuse
it instead. The host check reads the ids (``k`` integers) and the padding
rows only.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

NEGATIVE = "RowSparse `indices` must be >= 0 (negative ids wrap)."
ORDER = (
    "RowSparse `indices` must be sorted ascending without duplicates, with padding "
    "(id N) only at the end."
)
PADDING = "RowSparse padding slots must hold zero `data`."


def too_large(n: int) -> str:
    return f"RowSparse `indices` must be <= N = {n} (N marks padding)."


# How to build what the invalid array was meant to be.
REMEDY = (
    "A function mapped over every leaf of a RowSparse maps its row ids too: "
    "`jax.tree.map(jnp.add, g1, g2)` adds the ids of two gradients, `jax.tree.map(lambda "
    "a, b: jnp.concatenate([a, b]), g1, g2)` repeats them, and an optax transform that "
    "scales every leaf scales them (see 'Which optax transforms are safe on RowSparse "
    "updates' in the optimizers guide). Add row-sparse gradients with `jsr.add(g1, g2)` "
    "(or `g1 + g2`), build one from unsorted or repeated ids with "
    "`jsr.row_sparse_array((data, ids), shape)` (it sorts them and sums repeats), and map "
    "a transform over the values only with `jsr.optim.lift_elementwise(...)`. Under "
    "jax.jit this is not checked: call `jsr.check(x)` in a function wrapped with "
    "`jax.experimental.checkify.checkify` to check it there."
)


def row_id_conditions(idx: Any, n: int) -> list[tuple[Any, str]]:
    """The row-id invariants of a RowSparse with ``n`` rows as ``(condition,
    message)`` pairs of traced booleans. Compared in the ids' own dtype: where
    it cannot hold ``n`` (int8 ids of 300 rows), every id is below ``n`` and
    real."""
    fits = n <= jnp.iinfo(idx.dtype).max
    conds = [(jnp.all(idx >= 0), NEGATIVE)]
    if fits:
        conds.append((jnp.all(idx <= n), too_large(n)))
    if idx.shape[0] > 1:
        real_next = idx[1:] < n if fits else jnp.ones(idx.shape[0] - 1, bool)
        conds.append((jnp.all(jnp.where(real_next, idx[1:] > idx[:-1], True)), ORDER))
    return conds


def padding_condition(data: Any, idx: Any, n: int) -> tuple[Any, str]:
    """Padding rows (id ``>= n``) hold zeros, as a traced boolean."""
    pad = idx >= n if n <= jnp.iinfo(idx.dtype).max else jnp.zeros(idx.shape, bool)
    pad_mask = pad.reshape(pad.shape + (1,) * (data.ndim - 1))
    return jnp.all(jnp.where(pad_mask, data == 0, True)), PADDING


def _ids_violation(idx: np.ndarray, n: int) -> tuple[str, str] | None:
    """``(message, detail)`` of the first row-id invariant that the host ids
    ``idx`` break, or None."""
    if not idx.size:
        return None
    if idx.min() < 0:
        return NEGATIVE, f"got id {int(idx[idx < 0][0])}"
    if idx.max() > n:
        return too_large(n), f"got id {int(idx[idx > n][0])}"
    real = idx < n
    n_real = int(real.sum())
    if not real[:n_real].all():
        return ORDER, f"got ids {_short(idx)}: a padding id N = {n} before a real row"
    steps = np.diff(idx[:n_real])
    if steps.size and (steps <= 0).any():
        pos = int(np.argmax(steps <= 0))
        kind = "repeated" if steps[pos] == 0 else "unsorted"
        return ORDER, (
            f"got ids {_short(idx)}: {kind} ids {int(idx[pos])}, {int(idx[pos + 1])} at "
            f"positions {pos}, {pos + 1}"
        )
    return None


def _short(idx: np.ndarray, limit: int = 12) -> str:
    shown = ", ".join(str(int(i)) for i in idx[:limit])
    return f"[{shown}{', ...' if idx.size > limit else ''}]"


def _on_host(x: jax.Array) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


def _padding_nonzero(data: Any, idx: np.ndarray, n: int) -> int | None:
    """The first padding slot whose row is not zero, or None. Reads only the
    padding rows (on CPU the buffer is shared with numpy; elsewhere one
    reduction runs on the device)."""
    n_real = int((idx < n).sum())
    if n_real == idx.size:
        return None
    if isinstance(data, np.ndarray) or _on_host(data):
        pad = np.asarray(data)[n_real:].reshape(idx.size - n_real, -1)
        bad = np.any(pad != 0, axis=1)
        return n_real + int(np.argmax(bad)) if bad.any() else None
    cond, _ = _jitted_padding(data, jnp.asarray(idx), n)
    return None if bool(cond) else n_real


@functools.partial(jax.jit, static_argnums=2)
def _jitted_padding(data, idx, n):
    return padding_condition(data, idx, n)[0], None


def refuse_invalid(x: Any, what: str) -> None:
    """Raises ``ValueError`` naming ``what`` when the concrete RowSparse ``x``
    breaks its invariant; does nothing for traced (or stacked) ones, whose
    values are unknown: ``jsr.check`` with ``checkify`` covers those."""
    idx, data = x.indices, x.data
    if isinstance(idx, jax.core.Tracer) or isinstance(data, jax.core.Tracer):
        return
    if getattr(idx, "ndim", 1) != 1 or not hasattr(idx, "dtype"):
        return
    if not jnp.issubdtype(idx.dtype, jnp.integer):
        return  # (float0 cotangents and other non-id leaves are refused elsewhere)
    n = x.shape[0]
    host_ids = np.asarray(idx)
    found = _ids_violation(host_ids, n)
    if found is None and hasattr(data, "ndim") and data.ndim == len(x.shape):
        slot = _padding_nonzero(data, host_ids, n)
        if slot is not None:
            found = PADDING, f"slot {slot} (id {int(host_ids[slot])}) holds non-zero values"
    if found is not None:
        message, detail = found
        kind = "non-zero padding rows" if message == PADDING else "invalid row ids"
        raise ValueError(f"{what} has {kind}: {message} ({detail}.) {REMEDY}")
