"""Optimizer state read back from a checkpoint without a target.

A checkpointer that restores without a target (orbax's ``restore(path)``)
knows only containers and arrays: the state's NamedTuples come back as dicts
keyed by field name (or lists) and its tuples as lists. The optimizers refuse
such a state, naming this module's :func:`restore_structure`, which rebuilds
the types from a target by key, never by leaf order (a dict's leaves are
sorted by key, a NamedTuple's are in field order, so pairing leaves in order
could swap two moments of the same shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _empty(x: Any) -> bool:
    return x is None or (isinstance(x, (Mapping, list, tuple)) and len(x) == 0)


def _describe(x: Any) -> str:
    if isinstance(x, Mapping):
        return f"a {type(x).__name__} with keys {sorted(map(str, x))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)} items"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)} and dtype {jnp.dtype(x.dtype).name}"
    return f"{type(x).__name__} {x!r}"[:120]


def _by_key(restored: Mapping, key: Any) -> tuple[bool, Any]:
    for k in (key, str(key)):
        if k in restored:
            return True, restored[k]
    return False, None


def _children(where: str, keys: Sequence[Any], restored: Any, target: Any) -> list[Any]:
    """The restored child of each of ``keys`` (field names, dict keys or
    positions): looked up by key in a mapping, by position in a list."""
    if isinstance(restored, Mapping):
        extra = set(map(str, restored)) - set(map(str, keys))
        missing = [k for k in keys if not _by_key(restored, k)[0]]
        if missing or extra:
            raise ValueError(
                f"`restored{where}` does not match `target{where}`: expected the keys "
                f"{[str(k) for k in keys]} of {type(target).__name__}, got "
                f"{_describe(restored)}. Restore with the target of the same optimizer and "
                "parameters: `jax.eval_shape(opt.init, params)`."
            )
        return [_by_key(restored, k)[1] for k in keys]
    if isinstance(restored, (list, tuple)) and len(restored) == len(keys):
        return list(restored)
    raise ValueError(
        f"`restored{where}` does not match `target{where}`: expected {len(keys)} items of a "
        f"{type(target).__name__} (a dict keyed {[str(k) for k in keys]} or a list), got "
        f"{_describe(restored)}. Restore with the target of the same optimizer and "
        "parameters: `jax.eval_shape(opt.init, params)`."
    )


def _leaf(where: str, target: Any, restored: Any) -> Any:
    if not (hasattr(restored, "shape") and hasattr(restored, "dtype")):
        if isinstance(restored, (int, float, complex, np.generic)) and not isinstance(
            restored, bool
        ):
            restored = np.asarray(restored)
        else:
            raise ValueError(
                f"`restored{where}` must be an array like `target{where}` "
                f"({_describe(target)}), got {_describe(restored)}."
            )
    if not hasattr(target, "dtype"):  # a Python number the state keeps as it is
        if np.shape(restored) != ():
            raise ValueError(
                f"`restored{where}` must be a scalar like `target{where}` ({target!r}), got "
                f"{_describe(restored)}."
            )
        return type(target)(np.asarray(restored).item())
    want = (tuple(jnp.shape(target)), jnp.dtype(target.dtype))
    got = (tuple(restored.shape), jnp.dtype(restored.dtype))
    if want != got:
        raise ValueError(
            f"`restored{where}` is {_describe(restored)}, but `target{where}` is "
            f"{_describe(target)}: the checkpoint was written for other parameters or another "
            "optimizer configuration. Build `target` with `jax.eval_shape(opt.init, params)` "
            "for the optimizer and parameters that wrote it."
        )
    return restored if isinstance(restored, jax.Array) else jnp.asarray(restored)


def _rebuild(where: str, target: Any, restored: Any) -> Any:
    if target is None:
        if not _empty(restored):
            raise ValueError(
                f"`restored{where}` must be None (as in `target`), got {_describe(restored)}."
            )
        return None
    if _empty(restored) and not jax.tree.leaves(target):
        # Nothing was saved for a node without arrays (exact SGD's static
        # hyperparameters): the target's is the state's.
        return target
    if _is_namedtuple(target):
        kids = _children(where, target._fields, restored, target)
        return type(target)(
            *(
                _rebuild(f"{where}.{f}", t, r)
                for f, t, r in zip(target._fields, target, kids, strict=True)
            )
        )
    if isinstance(target, (list, tuple)):
        kids = _children(where, range(len(target)), restored, target)
        return type(target)(
            _rebuild(f"{where}[{i}]", t, r)
            for i, (t, r) in enumerate(zip(target, kids, strict=True))
        )
    if isinstance(target, dict):
        keys = list(target)
        kids = _children(where, keys, restored, target)
        return type(target)(
            (k, _rebuild(f"{where}[{k!r}]", target[k], r)) for k, r in zip(keys, kids, strict=True)
        )
    flat, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is not target)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1 and flat[0][1] is target:
        return _leaf(where, target, restored)
    keys = [_key_name(path[0]) for path, _ in flat]
    kids = _children(where, keys, restored, target)
    children = [
        _rebuild(f"{where}{jax.tree_util.keystr(path)}", t, r)
        for (path, t), r in zip(flat, kids, strict=True)
    ]
    return jax.tree.unflatten(treedef, children)


def _key_name(key: Any) -> Any:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def restore_structure(target: Any, restored: Any) -> Any:
    """Rebuilds optimizer state read back without a target into ``target``'s types.

    A checkpoint restored without a target (orbax's ``restore(path)``) gives
    plain dicts (or lists) where the state had NamedTuples and lists where it
    had tuples; the optimizers' ``update`` refuses such a state. This walks
    ``target`` and takes each NamedTuple field, dict entry or tuple item from
    ``restored`` by name or position (never by leaf order), checking every
    array's shape and dtype against ``target``'s. Restoring with the target in
    the first place (``checkpointer.restore(path, target)``) gives the same.

    Args:
      target: the state's structure, e.g. ``jax.eval_shape(opt.init, params)``
        (arrays or ``jax.ShapeDtypeStruct`` leaves).
      restored: the restored tree: dicts keyed by field names (or lists) for
        NamedTuples, lists for tuples, dicts for dicts, arrays for leaves.

    Returns:
      ``restored``'s arrays (as JAX arrays) in ``target``'s structure.

    Raises:
      ValueError: a key or item is missing or extra, or an array's shape or
        dtype differs from ``target``'s; the message names the path.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np, jaxsparse_rows as jsr
      >>> opt = jsr.optim.lazy_adam(1e-3)
      >>> params = {"emb": jnp.zeros((4, 2))}
      >>> restored = [{"count": np.int32(3), "mu": {"emb": np.ones((4, 2), np.float32)},
      ...              "nu": {"emb": np.ones((4, 2), np.float32)}}, {}]
      >>> state = jsr.optim.restore_structure(jax.eval_shape(opt.init, params), restored)
      >>> type(state[0]).__name__, int(state[0].count)
      ('ScaleByLazyAdamState', 3)
    """
    return _rebuild("", target, restored)
