"""SVRG: stochastic variance-reduced gradient (MXNet's ``SVRGModule``), as
functions over pytrees.

Every ``update_freq`` epochs take a snapshot ``w~`` of the parameters and the
mean full-data gradient ``mu`` at it; for each batch, feed any optax
optimizer the corrected gradient::

    g = grad(w, batch) - grad(w~, batch) + mu

Its expectation over batches is the full gradient at ``w``, and its variance
vanishes as ``w`` and ``w~`` approach the optimum, so a constant step size
converges where plain SGD stalls at its noise floor.

``grad_fn(params, batch)`` must return the *mean* gradient over the batch's
real rows; its leaves may be dense or RowSparse (e.g. from
:func:`jsr.value_and_grad <jaxsparse_rows.value_and_grad>` through
:func:`jsr.pull_rows <jaxsparse_rows.pull_rows>`). RowSparse leaves must be
canonical (sorted unique indices, padding last), as every library op returns
them: the corrections scatter at those indices as unique.

Data-parallel training (several devices or hosts) takes either of two forms:

- ``jax.jit`` over global arrays: batches whose leading (row) axis is
  sharded over the devices, and a ``grad_fn`` that returns the mean over the
  whole global batch. Nothing changes here: XLA sums each batch's gradient
  over the devices, and :func:`full_gradient`, :func:`make_step` and
  :func:`fit` give what one device gives.
- Inside ``jax.shard_map`` (or ``jax.pmap``), with ``axis_name``: each device
  runs the functions on its own batches with ``params`` replicated, and
  ``grad_fn`` returns the mean over the device's rows. :func:`full_gradient`
  sums every device's gradients and row counts locally and reduces them once
  (a ``psum`` over ``axis_name``), as MXNet's ``SVRGModule`` accumulates the
  full gradient on each device and sums it through its kvstore;
  :func:`corrected_gradient` and :func:`make_step` reduce each step's
  correction the same way. Every device gets the mean over all devices' rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._args import check_static_int
from ._rowops import coalesce_rows, gather_rows, scatter_rows, sum_rows
from ._rowsparse import RowSparse
from ._vma import pvary, varying_axes
from .io import Batch
from .optim import apply_updates
from .optim._tree import check_dense_params

__all__ = [
    "SVRGState",
    "corrected_gradient",
    "fit",
    "full_gradient",
    "init",
    "make_step",
    "take_snapshot",
]

GradFn = Callable[[Any, Any], Any]


def _is_rsp(x: Any) -> bool:
    return isinstance(x, RowSparse)


def _check_optimizer(optimizer: Any) -> None:
    """Raises unless ``optimizer`` looks like an optax ``GradientTransformation``."""
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "`optimizer` must be an optax GradientTransformation (an object with `init` and "
            f"`update`, e.g. `optax.sgd(0.1)`), got {type(optimizer).__name__} {optimizer!r}."
        )


def _check_reiterable(batches: Any) -> None:
    """Raises unless ``batches`` can be iterated more than once.

    An iterator (a generator, ``iter(list)``, ...) is its own ``iter()``: the
    first pass would consume it. ``isinstance`` decides without calling
    ``iter()``, which would advance a :class:`jsr.io.CSRIter
    <jaxsparse_rows.io.CSRIter>`'s epoch (and so its shuffle order).
    """
    if isinstance(batches, Iterator):
        raise TypeError(
            "`batches` must be a re-iterable (a list, a tuple, a `jsr.io.CSRIter`, ...): "
            "`fit` iterates it once for every full-gradient snapshot and again for every "
            f"epoch, but got a one-shot iterator ({type(batches).__name__}), which the "
            "first pass would use up. Pass `list(batches)` or the iterable it came from."
        )
    if not isinstance(batches, Iterable) or isinstance(batches, Batch):
        raise TypeError(
            "`batches` must be a re-iterable of batches (a list, a tuple, a "
            f"`jsr.io.CSRIter`, ...), got {type(batches).__name__}."
        )
    _check_whole_passes(batches)


def _check_whole_passes(batches: Any) -> None:
    """Raises for a :mod:`jsr.io <jaxsparse_rows.io>` iterator whose passes
    carry rows into the next one (``last_batch="roll_over"``): a pass is then
    not the data once, so ``mu`` would not be its full gradient, and each
    snapshot pass would shift the rows of the training epochs after it."""
    if getattr(batches, "last_batch", None) == "roll_over":
        raise ValueError(
            "`batches` is an iterator with `last_batch='roll_over'`: each pass carries its "
            "last rows into the next, so a pass is not the whole data once and SVRG's full "
            "gradient would be wrong (and every snapshot pass would shift the training "
            "epochs). Build it with `last_batch='pad'` (padded batches are weighted by "
            "their `num_rows`) or `last_batch='discard'`."
        )


def _check_full_grad(params: Any, full_grad: Any) -> None:
    """Raises unless ``full_grad`` has the tree structure and leaf shapes of
    ``params`` (static metadata only: no cost in a jitted step)."""
    p_def, g_def = jax.tree.structure(params), jax.tree.structure(full_grad)
    if p_def != g_def:
        raise ValueError(
            "`full_grad` (mu, the mean full-data gradient at the snapshot) must have the "
            f"tree structure of `params`, with dense leaves: expected {p_def}, got {g_def}. "
            "Pass the `full_grad` of a state from `take_snapshot` / `full_gradient`."
        )
    flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, p), g in zip(flat_p, jax.tree.leaves(full_grad), strict=True):
        if jnp.shape(g) != jnp.shape(p):
            where = jax.tree_util.keystr(path)
            raise ValueError(
                f"`full_grad{where}` has shape {tuple(jnp.shape(g))}, but the parameter "
                f"`params{where}` has shape {tuple(jnp.shape(p))}: `full_grad` (mu, the mean "
                "full-data gradient at the snapshot) must have the shape of every parameter."
            )


class SVRGState(NamedTuple):
    """State of SVRG training.

    Attributes:
      snapshot: the parameters ``w~`` at the last snapshot.
      full_grad: ``mu``, the mean full-data gradient at ``snapshot`` (dense
        leaves: summed over all batches, it touches every row in general).
      opt_state: the inner optax optimizer's state.

    Example:
      >>> import jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> state = jsr.svrg.init({"w": jnp.ones(2)}, optax.sgd(0.1))
      >>> state.snapshot, state.full_grad
      ({'w': Array([1., 1.], dtype=float32)}, {'w': Array([0., 0.], dtype=float32)})
    """

    snapshot: Any
    full_grad: Any
    opt_state: Any


# -- devices ---------------------------------------------------------------------
def _axes(axis_name: Any) -> tuple | None:
    """``axis_name`` as a tuple of mapped axis names (``None``: no axis),
    each of which must be bound where the function runs."""
    if axis_name is None:
        return None
    axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if not axes:
        raise ValueError("`axis_name` must be None, a mesh axis name or a non-empty tuple of them.")
    for axis in axes:
        try:
            jax.lax.axis_size(axis)
        except NameError:
            raise ValueError(
                f"`axis_name={axis_name!r}`: no mapped axis {axis!r} is bound here. With "
                "`axis_name`, call this inside `jax.shard_map` (or `jax.pmap`) over that axis, "
                "each device with its own batches; on one device, or under `jax.jit` with "
                "batch-sharded global arrays, leave it None."
            ) from None
    return axes


def _device_view(tree: Any, axes: tuple | None) -> Any:
    """``tree`` cast to vary over ``axes`` (a no-op cast): the gradient of a
    varying value is the device's own, where that of an invariant one comes
    back summed over the devices (JAX's transpose of the implicit cast), with
    no weight for the device's row count."""
    if axes is None:
        return tree

    def leaf(x):
        missing = tuple(a for a in axes if a not in varying_axes(x))
        return pvary(x, missing) if missing else x

    return jax.tree.map(leaf, tree)


def _device_slots(x: jax.Array, axes: tuple) -> jax.Array:
    """``[devices, *x.shape]``: every device's ``x`` (an all-gather written as
    a ``psum`` of one-hot slots, whose result is invariant over ``axes``)."""
    size = math.prod(jax.lax.axis_size(a) for a in axes)
    slots = jnp.zeros((size,) + x.shape, x.dtype).at[jax.lax.axis_index(axes)].set(x)
    return jax.lax.psum(slots, axes)


def _weighted(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``weight * x``, zero where the weight is zero (a batch with no real
    rows, whose mean gradient may be 0 / 0)."""
    return jnp.where(weight > 0, weight * x, jnp.zeros((), x.dtype))


# -- the full gradient -----------------------------------------------------------
def _zeros_for(g: Any) -> jax.Array:
    """A dense accumulator for ``g``, at least float32 (bf16 sums drift)."""
    dtype = jnp.promote_types(g.dtype, jnp.float32)
    return jnp.zeros(g.shape, dtype)


def _add_leaf(a: jax.Array, g: Any, weight: jax.Array) -> jax.Array:
    if _is_rsp(g):
        rows = _weighted(g.data, weight).astype(a.dtype)
        return scatter_rows(a, g.indices, rows, add=True)
    return a + _weighted(g, weight).astype(a.dtype)


@functools.partial(jax.jit, donate_argnums=(0,))
def _accumulate(carry: tuple, grads: Any, weight: jax.Array) -> tuple:
    """``(acc + weight * grads, total + weight)``, leaf by leaf; RowSparse
    rows are scatter-added."""
    acc, total = carry
    acc = jax.tree.map(lambda a, g: _add_leaf(a, g, weight), acc, grads, is_leaf=_is_rsp)
    return acc, total + weight


@jax.jit
def _start(grads: Any, weight: jax.Array) -> tuple:
    """The first batch's ``(weight * grads, weight)``, its accumulators built
    inside ``jit`` (they follow the gradients' sharding)."""
    acc = jax.tree.map(_zeros_for, grads, is_leaf=_is_rsp)
    return _accumulate((acc, jnp.zeros((), jnp.float32)), grads, weight)


def _batch_weight(batch: Any) -> jax.Array:
    count = getattr(batch, "num_rows", None)
    return jnp.asarray(1.0 if count is None else count, jnp.float32)


def _is_stacked(batches: Any) -> bool:
    """A :class:`jsr.io.Batch <jaxsparse_rows.io.Batch>` from ``stack_batches``."""
    return isinstance(batches, Batch) and jnp.ndim(batches.num_rows) == 1


def _sums(gfn: GradFn, params: Any, batches: Any) -> tuple | None:
    """``(sum of weight * gradient, sum of weight)`` over the batches (None
    for no batch); a stacked epoch is scanned with ``lax.scan``."""
    if not _is_stacked(batches):
        carry = None
        for batch in batches:
            grads, weight = gfn(params, batch), _batch_weight(batch)
            carry = _start(grads, weight) if carry is None else _accumulate(carry, grads, weight)
        return carry
    first = jax.tree.map(lambda a: a[0], batches)
    rest = jax.tree.map(lambda a: a[1:], batches)

    def body(carry, batch):
        return _accumulate(carry, gfn(params, batch), _batch_weight(batch)), None

    return jax.lax.scan(body, _start(gfn(params, first), _batch_weight(first)), rest)[0]


def full_gradient(
    grad_fn: GradFn, params: Any, batches: Iterable[Any], *, axis_name: Any = None
) -> Any:
    """The mean gradient over all batches at ``params`` (``mu`` of SVRG).

    Batches with a ``num_rows`` attribute (:class:`jsr.io.Batch
    <jaxsparse_rows.io.Batch>`) are weighted by it, so a padded last batch
    counts for the rows it holds (a batch without rows counts for nothing);
    other batches count equally. RowSparse gradients are scatter-added into
    one dense accumulator per leaf (the only densification), inside a jitted,
    donated update.

    Args:
      grad_fn: ``grad_fn(params, batch)`` -> mean gradient over the batch.
      params: where to evaluate.
      batches: an iterable of batches (one pass is made), or one
        :class:`jsr.io.Batch <jaxsparse_rows.io.Batch>` stacked by
        :func:`jsr.io.stack_batches <jaxsparse_rows.io.stack_batches>`, whose
        batches are scanned by ``jax.lax.scan`` (one program, also inside
        ``jit`` and ``shard_map``). A :mod:`jsr.io <jaxsparse_rows.io>`
        iterator with ``last_batch="roll_over"`` is refused: its passes are
        not the data once.
      axis_name: ``None`` (default), or the mesh axis name (or tuple of
        names) of a ``jax.shard_map`` / ``jax.pmap`` this is called inside,
        with ``params`` replicated over it and each device iterating its own
        ``batches``: each device sums its weighted gradients and row counts,
        and one ``psum`` of both over the axis gives every device the mean
        over all devices' rows. Under ``jax.jit`` with batch-sharded global
        arrays, leave it ``None``: ``grad_fn`` already returns the mean over
        the global batch.

    Returns:
      A pytree like the gradients with dense leaves.

    Raises:
      ValueError: ``batches`` yields no batch, or is an iterator with
        ``last_batch="roll_over"``; ``axis_name`` names no axis bound here.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((b[0] * w - b[1]) ** 2))
      >>> batches = [(jnp.array([1., 2.]), jnp.zeros(2)), (jnp.array([3.]), jnp.zeros(1))]
      >>> jsr.svrg.full_gradient(grad_fn, 1.0, batches)  # mean of 5. and 18.
      Array(11.5, dtype=float32)

      Inside ``shard_map`` each device passes its own batches, and every
      device gets the mean over all of them (here a mesh of one device):

      >>> from jax.sharding import AxisType, PartitionSpec as P
      >>> mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
      >>> @jax.jit
      ... @jax.shard_map(mesh=mesh, in_specs=(P(), P("x")), out_specs=P())
      ... def mu(w, batch):
      ...     return jsr.svrg.full_gradient(grad_fn, w, [batch], axis_name="x")
      >>> mu(jnp.float32(1.0), (jnp.array([1., 2.]), jnp.zeros(2)))
      Array(5., dtype=float32)
    """
    _check_whole_passes(batches)
    if isinstance(batches, Batch) and not _is_stacked(batches):
        raise TypeError(
            "`batches` is one `jsr.io.Batch`: pass an iterable of batches (`[batch]` for one) "
            "or an epoch stacked by `jsr.io.stack_batches`."
        )
    axes = _axes(axis_name)
    gfn = grad_fn if hasattr(grad_fn, "lower") else jax.jit(grad_fn)  # jit once
    dtypes = None

    def local_grad(params, batch):
        nonlocal dtypes
        grads = gfn(_device_view(params, axes), batch)
        dtypes = jax.tree.map(lambda g: g.dtype, grads, is_leaf=_is_rsp)
        return grads

    sums = _sums(local_grad, params, batches)
    if sums is None:
        raise ValueError("`batches` yielded no batch: the full gradient needs at least one.")
    acc, total = sums
    if axes is not None:
        acc, total = jax.lax.psum((acc, total), axes)
    return jax.tree.map(lambda a, dt: (a / total).astype(dt), acc, dtypes)


# -- the corrected gradient --------------------------------------------------------
def _correct_leaf(gw: Any, gs: Any, mu: jax.Array, lazy: bool) -> Any:
    if not _is_rsp(gw) and not _is_rsp(gs):
        return (gw - gs + mu).astype(jnp.result_type(gw))
    _check_same_storage(gw, gs)
    dtype = gw.dtype
    if not lazy:
        out = scatter_rows(mu.astype(dtype), gw.indices, gw.data, add=True)
        return scatter_rows(out, gs.indices, -gs.data, add=True)
    n = gw.shape[0]
    ids = jnp.concatenate([gw.indices, gs.indices])
    data = jnp.concatenate([gw.data, -gs.data.astype(dtype)])
    idx, diff, _ = coalesce_rows(ids, data, n, gw.capacity + gs.capacity)
    rows = gather_rows(mu, idx, ids_sorted=True).astype(dtype)
    return RowSparse._make(diff + rows, idx, gw.shape)


def _check_same_storage(gw: Any, gs: Any) -> None:
    if _is_rsp(gw) != _is_rsp(gs):
        raise TypeError(
            "`grad_fn` returned a RowSparse gradient at one point and a dense one at the other "
            "for the same parameter; it must return the same storage at `params` and at the "
            "snapshot."
        )


def _correct_leaf_across(
    gw: Any, gs: Any, mu: jax.Array, lazy: bool, weight: jax.Array, axes: tuple
) -> Any:
    """:func:`_correct_leaf` over the devices of ``axes``: the device-weighted
    mean of ``gw - gs`` (one ``psum``) plus ``mu``."""
    total = jax.lax.psum(weight, axes)
    if not _is_rsp(gw) and not _is_rsp(gs):
        diff = jax.lax.psum(_weighted(gw - gs, weight), axes)
        return (diff / total + mu).astype(jnp.result_type(gw))
    _check_same_storage(gw, gs)
    dtype, n = gw.dtype, gw.shape[0]
    ids = jnp.concatenate([gw.indices, gs.indices])
    data = _weighted(jnp.concatenate([gw.data, -gs.data.astype(dtype)]), weight)
    if not lazy:
        diff = jax.lax.psum(sum_rows(data, ids, n), axes)
        return (diff / total + mu).astype(dtype)
    ids, data = _device_slots(ids, axes), _device_slots(data, axes)
    ids, data = ids.reshape(-1), data.reshape((-1,) + data.shape[2:])
    idx, diff, _ = coalesce_rows(ids, data, n, ids.shape[0])
    rows = gather_rows(mu, idx, ids_sorted=True)
    return RowSparse._make((diff / total + rows).astype(dtype), idx, gw.shape)


def corrected_gradient(
    grad_fn: GradFn,
    params: Any,
    snapshot: Any,
    full_grad: Any,
    batch: Any,
    lazy: bool = False,
    *,
    axis_name: Any = None,
) -> Any:
    """SVRG's gradient for one batch: ``grad(w) - grad(w~) + mu``.

    Both gradients are computed here, so jitting a caller of this function
    compiles them into one program.

    Args:
      grad_fn: ``grad_fn(params, batch)`` -> mean gradient over the batch.
      params: current parameters ``w``.
      snapshot: snapshot parameters ``w~``.
      full_grad: ``mu``, the mean full-data gradient at ``snapshot``.
      batch: the batch.
      lazy: for RowSparse gradient leaves: ``False`` (default) returns the
        exact dense correction (``mu`` touches every row); ``True`` returns a
        RowSparse holding the correction on the batch's rows only (the union
        of both gradients' rows), for lazy optimizers; ``mu`` is then not
        applied to the other rows.
      axis_name: ``None`` (default), or the mesh axis name (or names) of a
        ``jax.shard_map`` / ``jax.pmap`` this is called inside, each device
        with its own ``batch`` and replicated ``params``, ``snapshot`` and
        ``full_grad``: the correction ``grad(w) - grad(w~)`` is averaged over
        all devices' rows (each device weighted by its ``num_rows``, one
        ``psum``), so every device gets the gradient of the global batch. A
        lazy RowSparse result then holds the rows of every device's batch
        (its capacity is the devices' combined).

    Returns:
      The corrected gradient (dense leaves, or RowSparse with ``lazy=True``).

    Raises:
      ValueError: if ``full_grad`` does not have the tree structure and leaf
        shapes of ``params`` (checked when tracing: a jitted step pays
        nothing), or ``axis_name`` names no axis bound here.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((b * w) ** 2))
      >>> batch = jnp.array([1., 3.])  # grad = 10 w
      >>> jsr.svrg.corrected_gradient(grad_fn, 2.0, 1.0, 0.5, batch)  # 20 - 10 + 0.5
      Array(10.5, dtype=float32)
    """
    _check_full_grad(params, full_grad)
    axes = _axes(axis_name)
    gw = grad_fn(_device_view(params, axes), batch)
    gs = grad_fn(_device_view(snapshot, axes), batch)
    if axes is None:
        return jax.tree.map(
            lambda a, b, m: _correct_leaf(a, b, m, lazy), gw, gs, full_grad, is_leaf=_is_rsp
        )
    weight = _batch_weight(batch)
    return jax.tree.map(
        lambda a, b, m: _correct_leaf_across(a, b, m, lazy, weight, axes),
        gw,
        gs,
        full_grad,
        is_leaf=_is_rsp,
    )


# -- training ---------------------------------------------------------------------
def _copy(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)


def take_snapshot(
    state: SVRGState,
    params: Any,
    grad_fn: GradFn,
    batches: Iterable[Any],
    *,
    axis_name: Any = None,
) -> SVRGState:
    """A state whose snapshot is (a copy of) ``params`` and ``mu`` its full
    gradient (:func:`full_gradient`, with ``batches`` and ``axis_name`` as
    there).

    Example:
      >>> import jax, jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
      >>> state = jsr.svrg.init(jnp.zeros(()), optax.sgd(0.1))
      >>> state = jsr.svrg.take_snapshot(state, jnp.ones(()), grad_fn, [jnp.array([3.])])
      >>> state.snapshot, state.full_grad
      (Array(1., dtype=float32), Array(-4., dtype=float32))
    """
    mu = full_gradient(grad_fn, params, batches, axis_name=axis_name)
    return state._replace(snapshot=_copy(params), full_grad=mu)


def init(params: Any, optimizer: optax.GradientTransformation) -> SVRGState:
    """An initial state: snapshot = ``params``, ``mu`` = 0 (call
    :func:`take_snapshot` before the first step; :func:`fit` does).

    Raises:
      TypeError: if ``optimizer`` is not an optax ``GradientTransformation``,
        or a leaf of ``params`` is a RowSparse (parameters are dense; only
        gradients are row-sparse).

    Example:
      >>> import jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> jsr.svrg.init({"w": jnp.ones(2)}, optax.sgd(0.1)).full_grad
      {'w': Array([0., 0.], dtype=float32)}
    """
    _check_optimizer(optimizer)
    check_dense_params(params, "jsr.svrg")
    return SVRGState(_copy(params), jax.tree.map(jnp.zeros_like, params), optimizer.init(params))


def make_step(
    grad_fn: GradFn,
    optimizer: optax.GradientTransformation,
    lazy: bool = False,
    *,
    axis_name: Any = None,
) -> Callable[[Any, SVRGState, Any], tuple[Any, SVRGState]]:
    """A jitted SVRG step ``step(params, state, batch) -> (params, state)``.

    One XLA program computes both gradients, the correction, the optimizer
    update and :func:`jsr.optim.apply_updates
    <jaxsparse_rows.optim.apply_updates>` (RowSparse updates are
    scatter-added). ``params`` and ``state`` are donated.

    Args:
      grad_fn: ``grad_fn(params, batch)`` -> mean gradient over the batch.
      optimizer: any optax ``GradientTransformation`` (lazy ones accept the
        RowSparse gradients ``lazy=True`` produces).
      lazy: see :func:`corrected_gradient`.
      axis_name: for a step run inside ``jax.shard_map`` / ``jax.pmap``, each
        device with its own batch: see :func:`corrected_gradient`. The
        parameters and the state stay replicated; donate them in the ``jit``
        around the ``shard_map`` (the step's own donation applies only when
        it is called outside one).

    Example:
      >>> import jax, jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
      >>> opt = optax.sgd(0.25)
      >>> w = jnp.zeros(())
      >>> state = jsr.svrg.take_snapshot(jsr.svrg.init(w, opt), w, grad_fn, [jnp.array([4.])])
      >>> w, state = jsr.svrg.make_step(grad_fn, opt)(w, state, jnp.array([4.]))
      >>> w
      Array(2., dtype=float32)
    """
    _check_optimizer(optimizer)

    def step(params, state, batch):
        g = corrected_gradient(
            grad_fn, params, state.snapshot, state.full_grad, batch, lazy, axis_name=axis_name
        )
        updates, opt_state = optimizer.update(g, state.opt_state, params)
        return apply_updates(params, updates), state._replace(opt_state=opt_state)

    return jax.jit(step, donate_argnums=(0, 1))


def fit(
    grad_fn: GradFn,
    optimizer: optax.GradientTransformation,
    params: Any,
    batches: Iterable[Any],
    num_epochs: int,
    update_freq: int = 1,
    lazy: bool = False,
    callback: Callable[[int, Any], Any] | None = None,
) -> tuple[Any, SVRGState]:
    """Trains with SVRG: a snapshot and full gradient every ``update_freq`` epochs.

    Args:
      grad_fn: ``grad_fn(params, batch)`` -> mean gradient over the batch.
      optimizer: any optax ``GradientTransformation``.
      params: initial parameters (donated to the jitted step: do not reuse).
      batches: a re-iterable of batches (a list, a tuple, a :class:`jsr.io.CSRIter
        <jaxsparse_rows.io.CSRIter>`, ...), iterated once per epoch and once per
        snapshot. A one-shot iterator (a generator, ``iter(list)``) raises
        ``TypeError``: the first snapshot would use it up.
      num_epochs: epochs to run.
      update_freq: epochs between snapshots (the seed's ``update_freq``).
      lazy: see :func:`corrected_gradient`.
      callback: called as ``callback(epoch, params)`` after every epoch, with
        a copy of the parameters (the step donates its own), so that the
        callback may keep them.

    Returns:
      ``(params, state)``.

    Raises:
      TypeError: ``num_epochs`` or ``update_freq`` is not an int (a bool or a
        float is refused), or ``batches`` is a one-shot iterator.
      ValueError: ``num_epochs < 0`` or ``update_freq < 1``, or ``batches``
        is an iterator with ``last_batch="roll_over"`` (its passes are not the
        data once, which the full gradient needs).

    Example:
      >>> import jax, jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
      >>> batches = [jnp.array([1.]), jnp.array([3.])]
      >>> w, _ = jsr.svrg.fit(grad_fn, optax.sgd(0.4), jnp.zeros(()), batches, num_epochs=5)
      >>> round(float(w), 4)  # the mean of the data
      2.0
    """
    update_freq = check_static_int(update_freq, "update_freq", minimum=1)
    num_epochs = check_static_int(num_epochs, "num_epochs", minimum=0)
    _check_reiterable(batches)
    step = make_step(grad_fn, optimizer, lazy)
    jitted_grad = jax.jit(grad_fn)
    state = init(params, optimizer)
    for epoch in range(num_epochs):
        if epoch % update_freq == 0:
            state = take_snapshot(state, params, jitted_grad, batches)
        for batch in batches:
            params, state = step(params, state, batch)
        if callback is not None:
            callback(epoch, jax.tree.map(jnp.copy, params))
    return params, state
