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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ._args import check_static_int
from ._rowops import coalesce_rows, gather_rows, scatter_rows
from ._rowsparse import RowSparse
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
    if not isinstance(batches, Iterable):
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


# -- the full gradient -----------------------------------------------------------
def _zeros_for(g: Any) -> jax.Array:
    """A dense accumulator for ``g``, at least float32 (bf16 sums drift)."""
    dtype = jnp.promote_types(g.dtype, jnp.float32)
    return jnp.zeros(g.shape, dtype)


@functools.partial(jax.jit, donate_argnums=(0,))
def _accumulate(acc: Any, grads: Any, weight: jax.Array) -> Any:
    """``acc += weight * grads`` leaf by leaf; RowSparse rows are scatter-added."""

    def leaf(a, g):
        if _is_rsp(g):
            rows = (weight * g.data).astype(a.dtype)
            return scatter_rows(a, g.indices, rows, add=True)
        return a + (weight * g).astype(a.dtype)

    return jax.tree.map(leaf, acc, grads, is_leaf=_is_rsp)


def _batch_weight(batch: Any) -> jax.Array:
    count = getattr(batch, "num_rows", None)
    return jnp.asarray(1.0 if count is None else count, jnp.float32)


def full_gradient(grad_fn: GradFn, params: Any, batches: Iterable[Any]) -> Any:
    """The mean gradient over all batches at ``params`` (``mu`` of SVRG).

    Batches with a ``num_rows`` attribute (:class:`jsr.io.Batch
    <jaxsparse_rows.io.Batch>`) are weighted by it, so a padded last batch
    counts for the rows it holds; other batches count equally. RowSparse
    gradients are scatter-added into one dense accumulator per leaf (the only
    densification), inside a jitted, donated update.

    Args:
      grad_fn: ``grad_fn(params, batch)`` -> mean gradient over the batch.
      params: where to evaluate.
      batches: an iterable of batches (one pass is made). A :mod:`jsr.io
        <jaxsparse_rows.io>` iterator with ``last_batch="roll_over"`` is
        refused: its passes are not the data once.

    Returns:
      A pytree like the gradients with dense leaves.

    Raises:
      ValueError: ``batches`` yields no batch, or is an iterator with
        ``last_batch="roll_over"``.

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((b[0] * w - b[1]) ** 2))
      >>> batches = [(jnp.array([1., 2.]), jnp.zeros(2)), (jnp.array([3.]), jnp.zeros(1))]
      >>> jsr.svrg.full_gradient(grad_fn, 1.0, batches)  # mean of 5. and 18.
      Array(11.5, dtype=float32)
    """
    _check_whole_passes(batches)
    gfn = grad_fn if hasattr(grad_fn, "lower") else jax.jit(grad_fn)  # jit once
    acc, total, dtypes = None, jnp.zeros((), jnp.float32), None
    for batch in batches:
        grads = gfn(params, batch)
        if acc is None:
            acc = jax.tree.map(_zeros_for, grads, is_leaf=_is_rsp)
            dtypes = jax.tree.map(lambda g: g.dtype, grads, is_leaf=_is_rsp)
        weight = _batch_weight(batch)
        acc = _accumulate(acc, grads, weight)
        total = total + weight
    if acc is None:
        raise ValueError("`batches` yielded no batch: the full gradient needs at least one.")
    return jax.tree.map(lambda a, dt: (a / total).astype(dt), acc, dtypes)


# -- the corrected gradient --------------------------------------------------------
def _correct_leaf(gw: Any, gs: Any, mu: jax.Array, lazy: bool) -> Any:
    if not _is_rsp(gw) and not _is_rsp(gs):
        return (gw - gs + mu).astype(jnp.result_type(gw))
    if _is_rsp(gw) != _is_rsp(gs):
        raise TypeError(
            "`grad_fn` returned a RowSparse gradient at one point and a dense one at the other "
            "for the same parameter; it must return the same storage at `params` and at the "
            "snapshot."
        )
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


def corrected_gradient(
    grad_fn: GradFn,
    params: Any,
    snapshot: Any,
    full_grad: Any,
    batch: Any,
    lazy: bool = False,
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

    Returns:
      The corrected gradient (dense leaves, or RowSparse with ``lazy=True``).

    Raises:
      ValueError: if ``full_grad`` does not have the tree structure and leaf
        shapes of ``params`` (checked when tracing: a jitted step pays nothing).

    Example:
      >>> import jax, jax.numpy as jnp, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((b * w) ** 2))
      >>> batch = jnp.array([1., 3.])  # grad = 10 w
      >>> jsr.svrg.corrected_gradient(grad_fn, 2.0, 1.0, 0.5, batch)  # 20 - 10 + 0.5
      Array(10.5, dtype=float32)
    """
    _check_full_grad(params, full_grad)
    gw = grad_fn(params, batch)
    gs = grad_fn(snapshot, batch)
    return jax.tree.map(
        lambda a, b, m: _correct_leaf(a, b, m, lazy), gw, gs, full_grad, is_leaf=_is_rsp
    )


# -- training ---------------------------------------------------------------------
def _copy(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)


def take_snapshot(
    state: SVRGState, params: Any, grad_fn: GradFn, batches: Iterable[Any]
) -> SVRGState:
    """A state whose snapshot is (a copy of) ``params`` and ``mu`` its full gradient.

    Example:
      >>> import jax, jax.numpy as jnp, optax, jaxsparse_rows as jsr
      >>> grad_fn = jax.grad(lambda w, b: jnp.mean((w - b) ** 2))
      >>> state = jsr.svrg.init(jnp.zeros(()), optax.sgd(0.1))
      >>> state = jsr.svrg.take_snapshot(state, jnp.ones(()), grad_fn, [jnp.array([3.])])
      >>> state.snapshot, state.full_grad
      (Array(1., dtype=float32), Array(-4., dtype=float32))
    """
    mu = full_gradient(grad_fn, params, batches)
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
    grad_fn: GradFn, optimizer: optax.GradientTransformation, lazy: bool = False
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
        g = corrected_gradient(grad_fn, params, state.snapshot, state.full_grad, batch, lazy)
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
