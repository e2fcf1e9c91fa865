"""Small helpers shared by the array types and the ops: index dtypes,
concreteness tests, capacity checks and segment helpers (the id bookkeeping of
unique ids, slots and row coalescing is in ``_ids``)."""

from __future__ import annotations

import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from ._invariants import refuse_invalid


def index_dtype() -> np.dtype:
    """The default index dtype: int32, or int64 when ``jax_enable_x64`` is on."""
    return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.int64))


def is_concrete(*xs: Any) -> bool:
    """True when every argument has a value known now (not a tracer)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def check_flag(value: Any, name: str) -> bool:
    """``value`` as a Python bool; a TypeError naming ``name`` unless it is one
    (a string such as ``"false"`` is truthy, so it would mean the opposite)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise TypeError(f"`{name}` must be True or False, got {type(value).__name__} {value!r}.")


def as_int_array(x: Any, name: str, dtype: Any = None, *, host: bool = False) -> Any:
    """``x`` as an integer JAX array of ``dtype`` (default: its own dtype,
    canonicalised), for ids and indices given by a caller.

    Raises ``TypeError`` for a non-integer dtype and ``ValueError`` for a
    concrete value that the conversion would wrap (a 64-bit id when x64 is off),
    naming ``name``. ``[]`` (float64 to numpy) is taken as an empty int array.
    With ``host=True`` host input comes back as a numpy array, so that its
    values can be checked inside ``jit`` too (``jnp.asarray`` would trace it).
    """
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
        if x.size == 0 and x.dtype == np.float64:
            x = x.astype(np.int64)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"`{name}` must have an integer dtype, got {x.dtype}.")
    target = jnp.dtype(jax.dtypes.canonicalize_dtype(x.dtype if dtype is None else dtype))
    src, info = np.iinfo(x.dtype), np.iinfo(target)
    narrows = src.min < info.min or src.max > info.max  # int32 -> int64 cannot wrap
    if narrows and x.size and is_concrete(x):
        values = np.asarray(x)
        bad = (values < info.min) | (values > info.max)
        if np.any(bad):
            hint = "" if jax.config.jax_enable_x64 else " (enable jax_enable_x64 for 64-bit ids)"
            raise ValueError(
                f"`{name}` must fit in {target.name}{hint}, got {int(values[bad][0])}."
            )
    if host and isinstance(x, np.ndarray):
        return x.astype(target, copy=False)
    if isinstance(x, jax.Array) and x.dtype == target:
        return x  # jnp.asarray would dispatch a no-op conversion (about 13 us)
    return jnp.asarray(x, dtype=target)


def check_unflattened_ids(cls_name: str, **children: Any) -> None:
    """Refuses index children that a ``tree_map`` over a sparse array's leaves
    has turned into floats of the same shape (``optax.scale`` multiplies every
    leaf, row ids included; a whole-tree cast converts them), instead of
    building an array whose row ids are fractions.

    Everything else passes: integer ids, leaves without a dtype
    (``jax.tree.map(jnp.shape, x)``, vmap axis specs), ``float0`` tangents of
    integer leaves, bool leaves (``jax.tree.map(jnp.isfinite, x)``,
    ``optax.zero_nans``'s flags) and 0-d summaries (``jax.tree.map(jnp.mean,
    x)`` for logging).
    """
    for name, child in children.items():
        dtype = getattr(child, "dtype", None)
        if dtype is None or getattr(dtype, "kind", "i") in "iub":
            continue  # the common case, decided cheaply: this runs at every unflatten
        if getattr(child, "ndim", 0) == 0:
            continue
        if dtype == jax.dtypes.float0 or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        raise TypeError(
            f"{cls_name} `{name}` must stay integer, got {jnp.dtype(dtype).name}: a "
            f"function mapped over every leaf of a {cls_name} (e.g. an optax transform "
            "such as `optax.scale` or `optax.clip`, or a dtype cast of a whole pytree) "
            "changed its row ids. Map over `.data` only (`jsr.optim.lift_elementwise`, "
            "`jsr.optim.scale_by_learning_rate`), or skip sparse leaves with "
            "`is_leaf=jsr.is_sparse`."
        )


def stacked_repr(cls_name: str, shape: tuple[int, ...], leaves: dict[str, Any]) -> str | None:
    """The repr of a sparse array whose leaves are not one array's: stacked by
    ``jax.vmap`` (ids with leading batch axes) or replaced by ``tree.map``
    (``jnp.shape``, ``None``); ``None`` for an ordinary one."""
    ids = list(leaves.values())[-1]
    if not all(hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves.values()):
        parts = ", ".join(f"{k}={v!r}" for k, v in leaves.items())
        return f"{cls_name}(shape={tuple(shape)}, {parts})"
    if ids.ndim == 1:
        return None
    data = leaves["data"]
    head = shape_str(data.dtype, shape)
    if ids.ndim > 1:
        slots = list(leaves.values())[1].shape[-1]
        size = "capacity" if cls_name == "RowSparse" else "nse"
        return f"{cls_name}({head}, batch={tuple(ids.shape[:-1])}, {size}={slots})"
    parts = ", ".join(f"{k}={shape_str(v.dtype, v.shape)}" for k, v in leaves.items())
    return f"{cls_name}({head}, {parts})"


def check_unbatched_args(what: str, *args: Any) -> None:
    """:func:`check_unbatched` for every sparse array among ``args``."""
    for a in args:
        if getattr(a, "stype", "default") != "default":
            check_unbatched(a, what)


def check_unbatched(x: Any, what: str) -> None:
    """Refuses a sparse array whose leaves ``jax.vmap`` stacked (its ids have
    leading batch axes) where ``what`` needs one array, and a concrete
    RowSparse that breaks its invariant (see ``_invariants``)."""
    ids = x.indptr if hasattr(x, "indptr") else x.indices
    if getattr(ids, "ndim", 1) == 0:
        raise ValueError(
            f"{what} needs one {type(x).__name__}, got one whose row ids are a scalar: "
            "jax.vmap over the rows of a RowSparse (axis 0 of its `data` and `indices`) "
            "would break its sorted-unique invariant. Map over a dense array instead, e.g. "
            "`jax.vmap(f)(x.todense())`, or over rows looked up with `jsr.take`."
        )
    if getattr(ids, "ndim", 1) != 1:
        name = type(x).__name__
        raise ValueError(
            f"{what} needs one {name}, got a batch of shape {tuple(ids.shape[:-1])} (leaves "
            f"stacked by jax.vmap: {repr(x)}). Map over the batch with jax.vmap, e.g. "
            f"`jax.vmap(jsr.todense)(x)`, or pick one with `jax.tree.map(lambda a: a[i], x)`."
        )
    if getattr(x, "stype", None) == "row_sparse":
        refuse_invalid(x, what if what.startswith("the ") else f"the RowSparse given to {what}")


def shape_str(dtype: Any, shape: tuple[int, ...]) -> str:
    """``float32[6, 2]``: the compact shape notation used by reprs and errors."""
    return f"{jnp.dtype(dtype).name}[{', '.join(str(int(d)) for d in shape)}]"


def check_static_int(value: Any, name: str, *, minimum: int = 0) -> int:
    """``value`` as a Python int ``>= minimum``, for a static argument such as a
    capacity: errors name ``name``.

    Takes what ``operator.index`` takes (a Python or NumPy int, a concrete
    integer JAX scalar); refuses a bool, a float such as ``16.0`` (it would
    hide a computed size that is not whole) and a traced value.

    Example:
      >>> from jaxsparse_rows._util import check_static_int
      >>> check_static_int(16, "capacity")
      16
      >>> check_static_int(16.0, "capacity")
      Traceback (most recent call last):
        ...
      TypeError: `capacity` must be an int >= 0, got float 16.0.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"`{name}` must be a concrete Python int because it fixes an array shape; "
            "got a traced value. Pass it as a static argument (e.g. "
            "`jax.jit(f, static_argnames=...)`) or compute it outside jit."
        )
    expected = f"`{name}` must be an int >= {minimum}"
    try:
        if isinstance(value, bool | np.bool_):
            raise TypeError
        ivalue = operator.index(value)
    except TypeError:
        raise TypeError(f"{expected}, got {type(value).__name__} {value!r}.") from None
    if ivalue < minimum:
        raise ValueError(f"{expected}, got {value!r}.")
    return ivalue


def capacity_check(ok: Any, message: str) -> None:
    """Reports a static-capacity overflow.

    Concrete values raise ``ValueError`` now. Under a trace the check is a
    ``checkify.debug_check``: it does nothing by default, and is an error when
    the caller wraps the function with
    ``checkify.checkify(f, errors=checkify.user_checks)``. It is not free,
    though: a jitted function that contains one carries an error effect, which
    sends every call down JAX's slower dispatch path (about 0.1 ms per call on
    CPU, and up to 1 ms on the embedding benchmark's step). Callers therefore
    emit it only when the capacity can actually overflow.
    """
    if is_concrete(ok):
        if not bool(ok):
            raise ValueError(message)
    else:
        checkify.debug_check(ok, message)


# Flags for a scatter at the indices of a RowSparse: they are sorted, and
# unique apart from padding ids (== N), which ``mode="drop"`` skips, so no two
# writes ever land on one row. On GPU XLA may then store without atomics; on
# CPU an A/B run of AdaGrad steps was about 7% faster with them.
ROWSPARSE_INDEXING = {"indices_are_sorted": True, "unique_indices": True}


def as_jax(x: Any) -> jax.Array:
    """``x`` as a JAX array; a JAX array (or tracer) as it is, without the
    dispatch ``jnp.asarray`` costs."""
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def _check_numeric(data: np.ndarray, name: str) -> None:
    """Raise a TypeError naming ``name`` unless ``data`` holds numbers or bools."""
    if not (jnp.issubdtype(data.dtype, jnp.number) or data.dtype == np.bool_):
        raise TypeError(
            f"`{name}` must hold numbers or bools, got an array of dtype {data.dtype} "
            f"({np.ravel(data)[:3].tolist()!r}...)."
        )


def _check_int_range(
    values: np.ndarray, target: np.dtype, name: str, *, x64_hint: bool = False
) -> None:
    """Raise a ValueError naming ``name`` if integer ``values`` would wrap in ``target``."""
    if values.dtype.kind not in "iu" or target.kind not in "iu" or not values.size:
        return
    src, info = np.iinfo(values.dtype), np.iinfo(target)
    if src.min >= info.min and src.max <= info.max:
        return
    bad = (values < info.min) | (values > info.max)
    if np.any(bad):
        hint = " (enable jax_enable_x64 for 64-bit values)" if x64_hint else ""
        raise ValueError(f"`{name}` must fit in {target.name}{hint}, got {values[bad][0]}.")


def as_data(data: Any, dtype: Any = None, *, host: bool = False, name: str = "data") -> Any:
    """``jnp.asarray`` for the values of a sparse array; float64 numpy input (or
    lists of floats) become float32 when x64 is off, without a truncation warning.

    ``dtype`` is canonicalised first (``float`` means float32 when x64 is off).
    With ``host=True`` host input stays a numpy array (no device round trip).
    Errors name the argument ``name``.
    """
    if dtype is not None:
        dtype = jax.dtypes.canonicalize_dtype(dtype)
    if not isinstance(data, jax.Array):
        if dtype is not None and not isinstance(data, np.ndarray):
            # Check the values before converting: numpy turns None into NaN and
            # "1" into 1.0 for a float dtype.
            try:
                _check_numeric(np.asarray(data), name)
            except ValueError as e:  # ragged nesting
                raise ValueError(f"`{name}` could not be converted to an array: {e}") from e
        if dtype is not None and isinstance(data, np.ndarray):
            _check_int_range(data, np.dtype(dtype), name)  # numpy's cast would wrap
        try:
            data = np.asarray(data, dtype=dtype)
        except (ValueError, OverflowError) as e:
            target = "an array" if dtype is None else f"an array of {dtype}"
            raise ValueError(f"`{name}` could not be converted to {target}: {e}") from e
        _check_numeric(data, name)
        if not data.dtype.isnative:  # big-endian input: JAX takes native order only
            data = data.astype(data.dtype.newbyteorder("="))
        if data.dtype == np.float64 and dtype is None and not jax.config.jax_enable_x64:
            data = data.astype(np.float32)
        # int64 becomes int32 when x64 is off: refuse values that would wrap.
        target = np.dtype(jax.dtypes.canonicalize_dtype(data.dtype))
        _check_int_range(data, target, name, x64_hint=True)
        if host:
            return data
    return jnp.asarray(data, dtype=dtype)


@functools.cache
def _jitted_bind(prim: Any, params: tuple) -> Any:
    return jax.jit(lambda *args: prim.bind(*args, **dict(params)))


def jitted_impl(prim: Any) -> Any:
    """An eager evaluation rule for ``prim``: one jitted ``prim.bind`` per set
    of parameters (which must be hashable), compiled once per shape."""

    def impl(*args, **params):
        return _jitted_bind(prim, tuple(sorted(params.items())))(*args)

    return impl


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


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype sums of ``dtype`` run in: float32 for float16 and bfloat16
    (as ``jnp.sum`` and ``jnp.dot`` accumulate them; a bfloat16 running sum of
    ones stops at 256), else ``dtype`` itself."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return jnp.dtype(jnp.float32)
    return dtype


def broadcast_row_mask(mask: jax.Array, ndim: int) -> jax.Array:
    """Reshapes a ``[k]`` mask so it broadcasts against ``[k, D1..Dn]`` data
    (a ``[S.., k]`` mask of leaves stacked by ``jax.vmap`` against
    ``[S.., k, D1..Dn]``)."""
    return mask.reshape(mask.shape + (1,) * (ndim - mask.ndim))


def is_shape_tuple(arg: Any) -> bool:
    """True for a tuple of ints (a shape): the MXNet / scipy ``(M, N)`` form
    of a constructor, which builds an empty array."""
    return (
        isinstance(arg, tuple)
        and len(arg) > 0
        and all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in arg)
    )
