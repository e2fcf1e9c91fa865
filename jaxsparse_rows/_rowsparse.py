"""The ``RowSparse`` array: a ``[N, D1..Dn]`` array whose rows are zero except
the listed ones (MXNet's ``RowSparseNDArray``), as a JAX pytree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey
from jax.typing import ArrayLike

from ._args import (
    as_data,
    as_int_array,
    as_jax,
    capacity_check,
    check_static_int,
    is_concrete,
    is_shape_tuple,
)
from ._arraybase import (
    SparseArray,
    broadcast_row_mask,
    check_unbatched,
    check_unbatched_args,
    check_unflattened_ids,
    shape_str,
    stacked_repr,
)
from ._dtypes import index_dtype
from ._limits import check_table_rows
from ._rowops import gather_rows_xla, scatter_rows_xla, sum_repeats, zeros_rows


def jnp_refusal(name: str, who: str = "jax.numpy functions do") -> str:
    """Why ``jax.numpy`` functions (or ``who``) refuse a sparse array, and what to use."""
    return (
        f"{who} not take a {name}: they would need its dense form, "
        f"which for a table of many rows is the [N, ...] array a {name} exists to avoid. "
        "Use jaxsparse_rows' ops, which keep the storage type or say what they build: "
        "`x.sum()` / `jsr.sum(x, axis)`, `jsr.norm(x)`, `jsr.square_sum(x)`, the "
        "zero-preserving maps `jsr.sqrt(x)`, `jsr.relu(x)`, `jsr.abs(x)`, ... (see "
        "`jsr.ZERO_PRESERVING_UNARY`), `jsr.add` / `jsr.multiply` / `x * 2`, `jsr.dot`, "
        "`jsr.take(x, ids)` for rows, or `x.data` for the stored values; call "
        "`x.todense()` to build the dense array on purpose."
    )


class JnpRefusal:
    """What a sparse array's ``__jax_array__`` returns: not an array, so JAX's
    binary operators hand ``w + x`` to the sparse operand's reflected method,
    and any ``jax.numpy`` function that tries to convert it fails with a
    message (this object's repr) that names the ops to use instead."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{jnp_refusal(self.name)}>"


def leaves_str(head: str, leaves: dict) -> str:
    """``head`` and, when every leaf is a known array, each leaf's values."""
    if not all(isinstance(v, jax.Array | np.ndarray) and is_concrete(v) for v in leaves.values()):
        return head
    lines = [head]
    for name, value in leaves.items():
        text = np.array2string(np.asarray(value), threshold=40, edgeitems=3)
        lines.append(f"  {name}={text}".replace("\n", "\n  " + " " * (len(name) + 1)))
    return "\n".join(lines)


def _unpickle(data: np.ndarray, indices: np.ndarray, shape: tuple[int, ...]) -> RowSparse:
    return RowSparse._make(jnp.asarray(data), jnp.asarray(indices), shape)


def dense_numpy(x: Any, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """``x.__array__``: the dense form as numpy, following numpy 2's ``copy`` protocol.

    Densifying always builds a new array, so ``copy=False`` (never copy) cannot be
    honoured and raises ``ValueError``; otherwise the result is a fresh writable array.
    """
    if copy is False:
        raise ValueError(
            f"a sparse {type(x).__name__} cannot be viewed as a dense numpy array without "
            "building a new one; use `np.asarray(x)` (copy=None) or `x.asnumpy()`."
        )
    out = host_dense(x)
    return out if dtype is None else out.astype(dtype, copy=False)


def host_dense(x: Any) -> np.ndarray:
    """The dense form as a new numpy array, scattered on the host when ``x`` is concrete
    (no device computation to compile for every new shape)."""
    check_unbatched_args("a host copy", x)
    if not is_concrete(*jax.tree.leaves(x)):
        return np.array(x.todense())
    data, idx = np.asarray(x.data), np.asarray(x.indices)
    out = np.zeros(x.shape, data.dtype)
    if isinstance(x, RowSparse):
        real = idx < x.shape[0]
        out[idx[real]] = data[real]
    else:
        ptr = np.asarray(x.indptr)
        nnz = int(ptr[-1])
        rows = np.repeat(np.arange(x.shape[0]), np.diff(ptr))
        np.add.at(out, (rows, idx[:nnz]), data[:nnz])
    return out


def as_shape(shape: Any, name: str = "shape", index_dims: int = 1) -> tuple[int, ...]:
    """Validates a static shape; its first ``index_dims`` sizes must fit the
    index dtype, because ids and the padding id (equal to that size) are
    stored in it."""
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    if isinstance(shape, str) or not isinstance(shape, Sequence | np.ndarray):
        raise TypeError(f"`{name}` must be a tuple of ints, got {shape!r}.")
    if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"`{name}` must be a tuple of ints, got {shape!r}.")
    out = tuple(int(d) for d in shape)
    if any(d < 0 for d in out):
        raise ValueError(f"`{name}` must be a tuple of non-negative ints, got {shape!r}.")
    limit = int(np.iinfo(index_dtype()).max)
    for axis, size in enumerate(out[:index_dims]):
        if size > limit:
            raise ValueError(
                f"`{name}[{axis}]` is {size}, more than the index dtype "
                f"{index_dtype().name} holds (at most {limit}, padding ids included). "
                "Enable 64-bit indices with `jax.config.update('jax_enable_x64', True)`."
            )
    return out


def as_index_array(indices: Any, name: str = "indices", *, host: bool = False) -> Any:
    return as_int_array(indices, name, index_dtype(), host=host)


def validate_padding_data(data: np.ndarray, n_real: int, n_rows: int) -> None:
    """Checks that the concrete ``data`` of the padding slots (from ``n_real``
    on) is zero, naming the first slot that is not."""
    pad = data[n_real:]
    if np.any(pad != 0):
        slot = n_real + int(np.argmax(np.any(pad.reshape(len(pad), -1) != 0, axis=1)))
        raise ValueError(
            f"padding slots (id N = {n_rows}) must hold zero `data`; slot {slot} holds "
            "non-zero values. Give every stored row a real id (`jsr.row_sparse_array` "
            "sorts them and sums repeats), and pad with zero rows (`x.with_capacity(k)`)."
        )


def validate_row_indices(indices: np.ndarray, n_rows: int, name: str = "indices") -> int:
    """Checks concrete row indices against the RowSparse invariant.

    Real indices must lie in ``[0, N)``, be strictly increasing, and be followed
    only by padding slots equal to ``N``. Returns the number of real rows.
    """
    idx = np.asarray(indices)
    if idx.size and idx.min() < 0:
        bad = int(idx[idx < 0][0])
        raise ValueError(
            f"`{name}` must be >= 0, got {bad}. Negative row ids are not allowed (they "
            "would wrap around); padding slots use the row count N as their id."
        )
    if idx.size and idx.max() > n_rows:
        bad = int(idx[idx > n_rows][0])
        raise ValueError(
            f"`{name}` must be < N = {n_rows} (or == N for a padding slot), got {bad}."
        )
    n_real = int(np.sum(idx < n_rows))
    if np.any(idx[n_real:] != n_rows):
        raise ValueError(
            f"padding slots (id N = {n_rows}) must come after every real row in `{name}`, "
            f"got {idx.tolist()}. Use `jsr.row_sparse_array` to canonicalise."
        )
    real = idx[:n_real]
    if n_real > 1 and np.any(np.diff(real) <= 0):
        pos = int(np.nonzero(np.diff(real) <= 0)[0][0])
        kind = "duplicate" if real[pos] == real[pos + 1] else "unsorted"
        raise ValueError(
            f"`{name}` must be sorted ascending without duplicates, got {kind} ids "
            f"{int(real[pos])}, {int(real[pos + 1])} at positions {pos}, {pos + 1}. Use "
            "`jsr.row_sparse_array` to sort and sum duplicates."
        )
    return n_real


@jax.tree_util.register_pytree_with_keys_class
class RowSparse(SparseArray):
    """A ``[N, D1, ..., Dn]`` array stored as its non-zero rows.

    ``dense[indices[i]] = data[i]`` for every real slot ``i``; all other rows are
    zero. ``indices`` is sorted ascending without duplicates; a fixed capacity
    ``k = data.shape[0]`` may end in padding slots whose index is ``N`` (out of
    bounds) and whose data is zero, so gathers (``mode="fill"``) and scatters
    (``mode="drop"``) never touch a real row through them.

    The constructor is strict: it checks shapes and dtypes always, and index
    values whenever they are concrete. Use :func:`row_sparse_array` for
    unsorted or duplicated input.

    Args:
      data: ``[k, D1, ..., Dn]`` row values.
      indices: ``[k]`` integer row ids.
      shape: the dense shape ``(N, D1, ..., Dn)``.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.RowSparse([[1., 2.], [3., 4.]], [1, 4], shape=(6, 2))
      >>> a
      RowSparse(float32[6, 2], rows=2)
      >>> a.asnumpy()
      array([[0., 0.],
             [1., 2.],
             [0., 0.],
             [0., 0.],
             [3., 4.],
             [0., 0.]], dtype=float32)
    """

    stype = "row_sparse"
    __array_priority__ = 1000  # numpy defers binary operators to us
    __hash__ = None  # type: ignore[assignment]

    data: jax.Array
    indices: jax.Array
    shape: tuple[int, ...]

    def __init__(self, data: ArrayLike, indices: ArrayLike, shape: Sequence[int]):
        shape = as_shape(shape)
        if len(shape) < 1:
            raise ValueError("`shape` must have at least one dimension (the rows), got ().")
        # Host input stays numpy until validated: under jit, jnp.asarray would
        # turn it into a tracer whose values could not be checked.
        data = as_data(data, host=True)
        indices = as_index_array(indices, host=True)
        if data.ndim != len(shape):
            raise ValueError(
                f"`data` must have ndim == len(shape) = {len(shape)} ([k, D1..Dn]), got "
                f"{shape_str(data.dtype, data.shape)} for shape {shape}."
            )
        if tuple(data.shape[1:]) != shape[1:]:
            raise ValueError(
                f"`data` trailing dims must equal shape[1:] = {shape[1:]}, got "
                f"{tuple(data.shape[1:])}."
            )
        if indices.ndim != 1:
            raise ValueError(f"`indices` must be 1-D, got shape {tuple(indices.shape)}.")
        if indices.shape[0] != data.shape[0]:
            raise ValueError(
                f"`data` and `indices` must have the same length (the capacity k), got "
                f"{data.shape[0]} rows of data and {indices.shape[0]} indices."
            )
        if is_concrete(indices):
            n_real = validate_row_indices(np.asarray(indices), shape[0])
            if n_real < data.shape[0] and is_concrete(data):
                validate_padding_data(np.asarray(data), n_real, shape[0])
        self.data = as_jax(data)
        self.indices = as_jax(indices)
        self.shape = shape

    @classmethod
    def _make(cls, data: Any, indices: Any, shape: tuple[int, ...]) -> RowSparse:
        """Builds without validation (for library internals and unflattening)."""
        obj = object.__new__(cls)
        obj.data = data
        obj.indices = indices
        obj.shape = tuple(shape)
        return obj

    # -- pytree -------------------------------------------------------------
    def tree_flatten_with_keys(self):
        # Named children: key paths read `.data` / `.indices` (checkpoint names).
        return ((GetAttrKey("data"), self.data), (GetAttrKey("indices"), self.indices)), self.shape

    def tree_flatten(self):
        return (self.data, self.indices), self.shape

    @classmethod
    def tree_unflatten(cls, shape, children):
        check_unflattened_ids("RowSparse", children[0], indices=children[1])
        return cls._make(children[0], children[1], shape)

    def __reduce__(self):
        return (_unpickle, (np.asarray(self.data), np.asarray(self.indices), self.shape))

    # -- attributes ---------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The dtype of the values (``data``)."""
        return self.data.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions of the (dense) shape."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements of the dense array, ``prod(shape)``."""
        return int(np.prod(self.shape))

    @property
    def capacity(self) -> int:
        """The static number of row slots ``k`` (real rows plus padding)."""
        return self.indices.shape[0]

    @property
    def nnz_rows(self) -> jax.Array:
        """Number of real (non-padding) rows; a traced scalar under jit (one
        per element, ``[S]``, for an array stacked by ``vmap``)."""
        return jnp.sum(self.indices < self.shape[0], axis=-1, dtype=index_dtype())

    @property
    def row_mask(self) -> jax.Array:
        """``[k]`` boolean mask of real (non-padding) slots."""
        return self.indices < self.shape[0]

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        odd = stacked_repr("RowSparse", self.shape, {"data": self.data, "indices": self.indices})
        if odd is not None:
            return odd
        head = shape_str(self.data.dtype, self.shape)
        if not jnp.issubdtype(self.indices.dtype, jnp.integer):  # a float0 cotangent's ids
            return f"RowSparse({head}, capacity={self.capacity}, indices=float0)"
        if is_concrete(self.indices) and isinstance(self.indices, jax.Array | np.ndarray):
            rows = int(np.sum(np.asarray(self.indices) < self.shape[0]))
            extra = "" if rows == self.capacity else f", capacity={self.capacity}"
            return f"RowSparse({head}, rows={rows}{extra})"
        return f"RowSparse({head}, capacity={self.capacity})"

    def __str__(self) -> str:
        """The repr, then the stored ``indices`` and ``data`` when they are known
        (what ``print`` and ``jax.debug.print`` show)."""
        ids_dtype = getattr(self.indices, "dtype", None)  # (leaves mapped to non-arrays)
        if ids_dtype is not None and not jnp.issubdtype(ids_dtype, jnp.integer):  # float0
            return leaves_str(repr(self), {"data": self.data})
        return leaves_str(repr(self), {"indices": self.indices, "data": self.data})

    def __jax_array__(self):
        return JnpRefusal("RowSparse")

    @property
    def T(self):  # noqa: N802
        """Not supported: a RowSparse stores rows, and its transpose would store
        columns. Raises ``TypeError`` pointing to ``jsr.dot(x, y,
        transpose_a=True)`` (``x.T @ y`` without building the transpose) and
        ``x.todense().T``."""
        raise TypeError(
            "RowSparse has no transpose (it would store columns, not rows); use "
            "`jsr.dot(x, y, transpose_a=True)` for x.T @ y, or `x.todense().T`."
        )

    def __getitem__(self, key: Any) -> Any:
        raise TypeError(
            f"a RowSparse cannot be indexed (got x[{key!r}]). Use `jsr.take(x, ids)` for "
            "rows as a dense array, `jsr.retain(x, rows)` for a RowSparse of some rows, or "
            "`x.todense()[...]` for any other indexing (it builds the dense array)."
        )

    # Indexing is refused, so iteration must not fall back to x[0], x[1], ...
    __iter__ = None

    # -- conversion ---------------------------------------------------------
    def todense(self) -> jax.Array:
        """The dense ``[N, D1..Dn]`` array (a scatter of ``data`` into zeros).

        Example:
          >>> import jaxsparse_rows as jsr
          >>> jsr.RowSparse([[1, 2]], [1], shape=(3, 2)).todense()
          Array([[0, 0],
                 [1, 2],
                 [0, 0]], dtype=int32)
        """
        check_unbatched(self, "todense")
        zeros = zeros_rows(self.shape[0], self.data)
        return scatter_rows_xla(zeros, self.indices, self.data, False)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return dense_numpy(self, dtype, copy)

    def asnumpy(self) -> np.ndarray:
        """The dense array as a new, writable ``numpy.ndarray`` (MXNet's ``asnumpy``)."""
        return host_dense(self)

    def astype(self, dtype: Any) -> RowSparse:
        """Casts ``data``; indices and padding are kept."""
        return RowSparse._make(self.data.astype(dtype), self.indices, self.shape)

    def copy(self) -> RowSparse:
        """A new RowSparse with copied buffers."""
        return RowSparse._make(jnp.array(self.data), jnp.array(self.indices), self.shape)

    def with_capacity(self, capacity: int) -> RowSparse:
        """Re-pads to ``capacity`` slots; shrinking below the real rows is an error
        when concrete and a ``checkify.debug_check`` under jit."""
        check_unbatched_args("with_capacity", self)
        capacity = check_static_int(capacity, "capacity")
        k = self.capacity
        if capacity >= k:
            pad = capacity - k
            data = jnp.concatenate([self.data, zeros_rows(pad, self.data)], axis=0)
            idx = jnp.concatenate(
                [self.indices, jnp.full((pad,), self.shape[0], self.indices.dtype)]
            )
            return RowSparse._make(data, idx, self.shape)
        capacity_check(
            self.nnz_rows <= capacity,
            f"with_capacity({capacity}) would drop rows: the array has more real rows.",
        )
        return RowSparse._make(self.data[:capacity], self.indices[:capacity], self.shape)

    @classmethod
    def fromdense(cls, x: ArrayLike, max_rows: int | None = None) -> RowSparse:
        """Row-sparse form of a dense array: one slot per row that has a non-zero.

        Exact when ``x`` is concrete. Under ``jax.jit`` the number of non-zero
        rows is unknown while tracing, so ``max_rows`` (a static capacity) is
        required; more non-zero rows than ``max_rows`` raise when concrete and
        fail a ``checkify.debug_check`` under jit.

        Example:
          >>> import jaxsparse_rows as jsr, jax.numpy as jnp
          >>> x = jnp.array([[1., 2.], [0., 0.], [3., 0.]])
          >>> r = jsr.RowSparse.fromdense(x)
          >>> r, r.indices
          (RowSparse(float32[3, 2], rows=2), Array([0, 2], dtype=int32))
        """
        if not isinstance(x, jax.Array):
            x = jnp.asarray(x)
        if x.ndim < 1:
            raise ValueError(f"`x` must have at least one dimension, got a scalar {x!r}.")
        check_table_rows(x, "x")
        n = x.shape[0]
        axes = tuple(range(1, x.ndim))
        if max_rows is not None:
            max_rows = check_static_int(max_rows, "max_rows")
        if is_concrete(x):
            xn = np.asarray(x)
            rows = np.nonzero(np.any(xn != 0, axis=axes) if axes else xn != 0)[0]
            cap = len(rows) if max_rows is None else max_rows
            if len(rows) > cap:
                raise ValueError(
                    f"`x` has {len(rows)} non-zero rows, more than `max_rows` = {cap}."
                )
            idx = np.full((cap,), n, dtype=index_dtype())
            idx[: len(rows)] = rows
            data = np.zeros((cap,) + x.shape[1:], dtype=xn.dtype)
            data[: len(rows)] = xn[rows]
            return cls._make(jnp.asarray(data), jnp.asarray(idx), x.shape)
        if max_rows is None:
            raise ValueError(
                "RowSparse.fromdense on a traced array (inside jax.jit, vmap, grad...) needs "
                "a static `max_rows`: the number of non-zero rows is only known at run time "
                "and fixes the output shape. Pass e.g. `RowSparse.fromdense(x, max_rows=k)`."
            )
        mask = jnp.any(x != 0, axis=axes) if axes else x != 0
        (idx,) = jnp.nonzero(mask, size=max_rows, fill_value=n)
        idx = idx.astype(index_dtype())
        if max_rows < n:  # else it cannot overflow: emit no check (see capacity_check)
            capacity_check(
                jnp.sum(mask) <= max_rows,
                f"RowSparse.fromdense: `x` has more non-zero rows than `max_rows` = {max_rows}.",
            )
        data = gather_rows_xla(x, idx)
        return cls._make(data, idx, x.shape)


def shape_arg(arg: tuple[int, ...], shape: Any) -> tuple[int, ...]:
    """The shape of the shape-only constructor form (``row_sparse_array((N, D))``,
    ``csr_matrix((M, N))``); a ``shape`` given too must agree."""
    if shape is not None and as_shape(shape) != tuple(int(d) for d in arg):
        raise ValueError(f"`shape` {tuple(shape)} does not match the shape `arg` {arg}.")
    return tuple(int(d) for d in arg)


def empty_rowsparse(shape: Sequence[int], dtype: Any = jnp.float32) -> RowSparse:
    """An all-zero RowSparse of ``shape`` with no row slots."""
    shape = as_shape(shape)
    if len(shape) < 1:
        raise ValueError("`shape` must have at least one dimension for row_sparse, got ().")
    dtype = jnp.dtype(dtype)
    return RowSparse._make(
        jnp.zeros((0,) + shape[1:], dtype), jnp.zeros((0,), index_dtype()), shape
    )


def row_sparse_array(
    arg: Any,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
) -> RowSparse:
    """Creates a RowSparse array, MXNet style.

    ``arg`` is ``(data, indices)`` (lists, numpy or jax arrays), a dense array,
    another RowSparse, or a shape ``(N, D1..)`` for an empty array (as
    ``jsr.zeros("row_sparse", shape)``). When ``indices`` are concrete (``data`` may be traced),
    unsorted indices are sorted and duplicate indices are summed, and ids outside
    ``[0, N)`` raise ``ValueError``. Traced ``indices`` are assumed canonical,
    and later scatters rely on it (duplicates give unspecified results); use
    :func:`jsr.check <jaxsparse_rows.check>` with checkify to verify.

    Args:
      arg: ``(data, indices)``, a dense array-like, or a RowSparse.
      shape: the dense shape; required for ``(data, indices)`` input.
      dtype: optional dtype of the data (default: float32 for Python lists, as
        in MXNet; the input dtype for numpy / jax arrays, with float64 numpy
        input kept as float32 unless x64 is enabled).

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[3, 4], [1, 2], [1, 1]], [4, 1, 4]), shape=(6, 2))
      >>> a.indices, a.data
      (Array([1, 4], dtype=int32), Array([[1., 2.],
             [4., 5.]], dtype=float32))
      >>> jsr.row_sparse_array((4, 2))
      RowSparse(float32[4, 2], rows=0)
    """
    if is_shape_tuple(arg):
        return empty_rowsparse(shape_arg(arg, shape), jnp.float32 if dtype is None else dtype)
    if isinstance(arg, RowSparse):
        if shape is not None and as_shape(shape) != arg.shape:
            raise ValueError(
                f"`shape` {tuple(shape)} does not match the RowSparse's shape {arg.shape}."
            )
        return arg.astype(dtype) if dtype is not None else arg
    if not isinstance(arg, tuple):
        if isinstance(arg, SparseArray):  # a CSR
            out = arg.tostype("row_sparse")
            return out.astype(dtype) if dtype is not None else out
        if isinstance(arg, list) and dtype is None:
            dtype = jnp.float32  # MXNet: Python lists default to float32
        out = RowSparse.fromdense(as_data(arg, dtype))
        if shape is not None and as_shape(shape) != out.shape:
            raise ValueError(f"`shape` {tuple(shape)} does not match the array's {out.shape}.")
        return out
    if len(arg) != 2:
        raise ValueError(f"`arg` must be a (data, indices) pair, got a tuple of {len(arg)}.")
    if shape is None:
        raise ValueError("`shape` is required when creating a RowSparse from (data, indices).")
    shape = as_shape(shape)
    if len(shape) < 1:
        raise ValueError("`shape` must have at least one dimension (the rows), got ().")
    data, indices = arg
    if isinstance(data, list | tuple) and dtype is None:
        dtype = jnp.float32  # MXNet: Python lists default to float32
    data = as_data(data, dtype)
    idx = as_index_array(indices)
    if data.ndim == len(shape) - 1 and idx.shape == (1,):
        data = data[None]
    if data.size == 0 and data.ndim == 1 and idx.shape == (0,):  # ([], []): no rows
        data = data.reshape((0,) + shape[1:])
    if idx.ndim != 1 or data.ndim < 1 or idx.shape[0] != data.shape[0]:
        raise ValueError(
            f"`indices` must be 1-D with one id per row of `data`, got indices of shape "
            f"{tuple(idx.shape)} and data of shape {tuple(data.shape)}."
        )
    if data.ndim != len(shape) or tuple(data.shape[1:]) != shape[1:]:
        raise ValueError(
            f"`data` must have shape [k, *shape[1:]] = [k, {', '.join(map(str, shape[1:]))}]"
            f", got {tuple(data.shape)}."
        )
    if isinstance(indices, jax.core.Tracer):
        return RowSparse(data, idx, shape)
    # Host copy of the ids (inside jit, `idx` itself is a staged constant).
    idx_np = np.asarray(indices).astype(index_dtype()).reshape(idx.shape)
    n = shape[0]
    if idx_np.size and (idx_np.min() < 0 or idx_np.max() >= n):
        bad = int(idx_np[(idx_np < 0) | (idx_np >= n)][0])
        raise ValueError(
            f"`indices` must lie in [0, N) = [0, {n}), got {bad}. Negative ids are not "
            "allowed (they would wrap around)."
        )
    if idx_np.size < 2 or np.all(np.diff(idx_np) > 0):
        return RowSparse(data, idx, shape)
    # Canonicalise: sort and sum duplicates (data may be traced; the ids are known).
    uniq, inverse = np.unique(idx_np, return_inverse=True)
    values = np.asarray(data) if is_concrete(data) else data  # host: no compilation per shape
    summed = sum_repeats(values, inverse.reshape(-1), len(uniq))
    return RowSparse(jnp.asarray(summed), jnp.asarray(uniq.astype(index_dtype())), shape)


def mask_padding(data: jax.Array, indices: jax.Array, n_rows: int) -> jax.Array:
    """Zeros the data of padding slots (ids ``>= n_rows``)."""
    mask = broadcast_row_mask(indices < n_rows, data.ndim)
    return jnp.where(mask, data, jnp.zeros((), data.dtype))
