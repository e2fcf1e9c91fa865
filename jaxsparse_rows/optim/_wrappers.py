"""``masked`` and ``multi_transform`` as optax names them, with label and mask
functions that see one leaf per RowSparse update."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import optax

from ._hparams import check_transformation
from ._tree import is_rowsparse


def _dense_view(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` called on its tree with every RowSparse replaced by a
    ``jax.ShapeDtypeStruct`` of its dense shape and dtype, so a function
    written for the parameters (``x.ndim``, ``x.shape``, the key paths) gives
    one label per RowSparse update, as for its dense parameter."""

    def call(tree):
        view = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if is_rowsparse(x) else x,
            tree,
            is_leaf=is_rowsparse,
        )
        return fn(view)

    return call


def masked(inner: optax.GradientTransformation, mask: Any) -> optax.GradientTransformation:
    """``optax.masked`` whose mask function sees RowSparse updates as single leaves.

    ``optax.masked`` calls a callable ``mask`` on the updates as well as on
    the parameters; written with a plain ``jax.tree.map`` it maps a RowSparse
    update's ``data`` and ``indices`` separately and the mask no longer fits
    the updates (a pytree structure error). Here ``mask`` sees each RowSparse
    update as a ``jax.ShapeDtypeStruct`` of its dense shape and dtype (it has
    ``shape``, ``ndim`` and ``dtype``, like the parameter), so any mask written
    for the parameters works. A pytree ``mask`` is passed to optax as is.

    Args:
      inner: the transformation to apply to the masked leaves.
      mask: a pytree of bools (a prefix of the parameters), or a function of
        the parameters returning one.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> params = {"emb": jnp.ones((4, 2)), "b": jnp.ones(2)}
      >>> tables = lambda p: jax.tree.map(lambda x: x.ndim == 2, p)
      >>> tx = jsr.optim.masked(jsr.optim.scale_by_learning_rate(0.5), tables)
      >>> g = {"emb": jsr.RowSparse([[2., 2.]], [1], shape=(4, 2)), "b": jnp.ones(2)}
      >>> u, _ = tx.update(g, tx.init(params), params)
      >>> u["emb"].data, u["b"]
      (Array([[-1., -1.]], dtype=float32), Array([1., 1.], dtype=float32))
    """
    check_transformation("inner", inner)
    return optax.masked(inner, _dense_view(mask) if callable(mask) else mask)


def multi_transform(
    transforms: Mapping[Hashable, optax.GradientTransformation], param_labels: Any
) -> optax.GradientTransformation:
    """``optax.multi_transform`` whose label function sees RowSparse updates as single leaves.

    ``optax.multi_transform`` calls a callable ``param_labels`` on the updates
    too; written with a plain ``jax.tree.map`` it labels a RowSparse update's
    ``data`` and ``indices`` separately (a pytree structure error). Here it
    sees each RowSparse update as a ``jax.ShapeDtypeStruct`` of its dense
    shape and dtype, so a label function written for the parameters works.
    Labels given as a pytree are passed to optax as they are.

    Args:
      transforms: a mapping from label to transformation.
      param_labels: a pytree of labels (a prefix of the parameters), or a
        function of the parameters returning one.

    Returns:
      An ``optax.GradientTransformation``.

    Example:
      >>> import jax, jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> params = {"emb": jnp.ones((4, 2)), "b": jnp.ones(2)}
      >>> label = lambda p: jax.tree.map(lambda x: "lazy" if x.ndim == 2 else "dense", p)
      >>> opt = jsr.optim.multi_transform(
      ...     {"lazy": jsr.optim.lazy_sgd(0.5), "dense": optax.sgd(0.1)}, label)
      >>> g = {"emb": jsr.RowSparse([[2., 2.]], [1], shape=(4, 2)), "b": jnp.ones(2)}
      >>> u, _ = opt.update(g, opt.init(params), params)
      >>> u["emb"].data, u["b"]
      (Array([[-1., -1.]], dtype=float32), Array([-0.1, -0.1], dtype=float32))
    """
    for name, tx in transforms.items():
        check_transformation(f"transforms[{name!r}]", tx)
    labels = _dense_view(param_labels) if callable(param_labels) else param_labels
    return optax.multi_transform(transforms, labels)
