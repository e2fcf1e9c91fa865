"""``grad`` / ``value_and_grad`` that differentiate RowSparse (and CSR)
arguments with respect to their stored values only, and return gradients of
the same storage type."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from . import _sparsify
from ._csr import CSR
from ._elementwise import with_data, with_data_masked
from ._rowsparse import RowSparse


def _is_rsp(x: Any) -> bool:
    """A sparse leaf: differentiated with respect to its ``data``."""
    return isinstance(x, RowSparse | CSR)


def _is_int(a: Any) -> bool:
    return isinstance(a, int | np.integer) and not isinstance(a, bool | np.bool_)


def _normalize_argnums(argnums: int | Sequence[int], nargs: int) -> tuple[int, ...]:
    if _is_int(argnums):
        nums = (argnums,)
    elif isinstance(argnums, tuple | list):
        nums = tuple(argnums)
    else:
        raise ValueError(f"`argnums` must be an int or a sequence of ints, got {argnums!r}.")
    for a in nums:
        if not _is_int(a) or not -nargs <= a < nargs:
            raise ValueError(
                f"`argnums` {argnums!r} is out of range for a function called with {nargs} "
                "positional arguments."
            )
    out = tuple(int(a) % nargs for a in nums)
    if len(set(out)) != len(out):
        raise ValueError(f"`argnums` {argnums!r} names an argument twice.")
    return out


def value_and_grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    sparse: Any = None,
) -> Callable[..., Any]:
    """Like ``jax.value_and_grad``, with row-sparse gradients for RowSparse inputs.

    Every RowSparse inside the differentiated arguments (at any depth of a
    pytree) is differentiated with respect to its ``data`` only; its gradient
    comes back as a RowSparse with the same ``indices`` and shape, padding
    slots holding zero. A CSR argument likewise gets a CSR gradient with its
    structure: the derivative with respect to each stored entry (MXNet's
    gradient of a CSR weight keeps its sparsity pattern the same way). Dense
    leaves behave exactly as with ``jax``. Nothing of shape ``[V, ...]`` is
    built for a RowSparse view of a ``[V, ...]`` table.

    Args:
      fun: function returning a scalar (and an aux value if ``has_aux``).
      argnums: which positional argument(s) to differentiate.
      has_aux: as in ``jax.value_and_grad``.
      holomorphic: as in ``jax.value_and_grad`` (complex inputs and output).
      allow_int: as in ``jax.value_and_grad`` (integer inputs get ``float0``
        gradients).
      sparse: row-sparse gradients for dense tables that ``fun`` only looks
        rows up from (``x[ids]``, ``jnp.take(x, ids, axis=0)``,
        ``x.at[ids].get()``, along axis 0). ``None``: none. ``"auto"``: every
        floating-point leaf of the differentiated arguments whose every use is
        such a lookup gets a RowSparse gradient holding exactly the rows looked
        up (repeats summed, capacity the number of ids looked up); every other
        leaf gets the gradient jax gives. A pytree prefix of bools, or a
        callable ``(path, leaf) -> bool``, marks the leaves explicitly; a marked
        leaf that ``fun`` uses in any other way raises ``ValueError`` naming the
        leaf and the use. See the "Models and frameworks" docs page.

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> table = jnp.ones((1000, 2))
      >>> rows = jsr.pull_rows(table, jnp.array([3, 7, 3]))
      >>> loss = lambda r: jnp.sum(jsr.take(r, jnp.array([3, 7, 3])) ** 2)
      >>> value, g = jsr.value_and_grad(loss)(rows)
      >>> value, g
      (Array(6., dtype=float32), RowSparse(float32[1000, 2], rows=2, capacity=3))
      >>> g.indices[:2], g.data[:2]
      (Array([3, 7], dtype=int32), Array([[4., 4.],
             [2., 2.]], dtype=float32))

      With ``sparse="auto"`` the dense table itself gets a row-sparse gradient:

      >>> loss = lambda t, ids: jnp.sum(t[ids] ** 2)
      >>> value, g = jsr.value_and_grad(loss, sparse="auto")(table, jnp.array([3, 7, 3]))
      >>> g, g.indices
      (RowSparse(float32[1000, 2], rows=2, capacity=3), Array([   3,    7, 1000], dtype=int32))
    """

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any):
        nums = _normalize_argnums(argnums, len(args))
        diff = tuple(args[i] for i in nums)
        leaves, treedef = jax.tree.flatten(diff, is_leaf=_is_rsp)
        primals = [leaf.data if _is_rsp(leaf) else leaf for leaf in leaves]

        if sparse is not None:
            marks, names = _sparsify.leaf_marks(sparse, fun, diff, nums, _is_int(argnums), _is_rsp)
            marks = [False if _is_rsp(leaf) else m for leaf, m in zip(leaves, marks, strict=True)]

        def inner(flat_primals):
            rebuilt = [
                with_data(leaf, p) if _is_rsp(leaf) else p
                for p, leaf in zip(flat_primals, leaves, strict=True)
            ]
            new_diff = jax.tree.unflatten(treedef, rebuilt)
            call_args = list(args)
            for i, value in zip(nums, new_diff, strict=True):
                call_args[i] = value
            return fun(*call_args, **kwargs)

        if sparse is None:
            value, grads = jax.value_and_grad(
                inner, has_aux=has_aux, holomorphic=holomorphic, allow_int=allow_int
            )(primals)
        else:
            value, grads = _sparsify.value_and_grad_flat(
                inner,
                primals,
                marks,
                names,
                has_aux=has_aux,
                holomorphic=holomorphic,
                allow_int=allow_int,
            )
        out = [
            # padding slots get zero gradient, even if `fun` read `x.data` directly
            with_data_masked(leaf, g) if _is_rsp(leaf) else g
            for g, leaf in zip(grads, leaves, strict=True)
        ]
        grad_tree = jax.tree.unflatten(treedef, out)
        return value, (grad_tree[0] if _is_int(argnums) else grad_tree)

    return wrapped


def grad(
    fun: Callable[..., Any],
    argnums: int | Sequence[int] = 0,
    has_aux: bool = False,
    holomorphic: bool = False,
    allow_int: bool = False,
    *,
    sparse: Any = None,
) -> Callable[..., Any]:
    """Like ``jax.grad``, with row-sparse gradients for RowSparse inputs.

    See :func:`value_and_grad` (the arguments are the same, ``sparse`` included).

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> rows = jsr.pull_rows(jnp.ones((10, 2)), jnp.array([2, 5]))
      >>> g = jsr.grad(lambda r, w: jnp.sum(jsr.take(r, jnp.array([5])) * w))(rows, 3.0)
      >>> g.indices, g.data
      (Array([2, 5], dtype=int32), Array([[0., 0.],
             [3., 3.]], dtype=float32))
      >>> params = {"emb": jnp.ones((10, 2)), "w": jnp.ones(2)}
      >>> loss = lambda p, ids: jnp.sum(jnp.take(p["emb"], ids, axis=0) @ p["w"])
      >>> g = jsr.grad(loss, sparse="auto")(params, jnp.array([4, 1, 4]))
      >>> g["emb"].indices
      Array([ 1,  4, 10], dtype=int32)
      >>> g["emb"].data[:2], g["w"]
      (Array([[1., 1.],
             [2., 2.]], dtype=float32), Array([3., 3.], dtype=float32))
    """
    vg = value_and_grad(
        fun,
        argnums=argnums,
        has_aux=has_aux,
        holomorphic=holomorphic,
        allow_int=allow_int,
        sparse=sparse,
    )

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped
