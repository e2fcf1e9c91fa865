"""The ``CSR`` matrix: 2-D compressed sparse rows (MXNet's ``CSRNDArray``) as a
JAX pytree with a static entry capacity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import GetAttrKey
from jax.typing import ArrayLike

from ._args import as_data, as_jax, capacity_check, check_static_int, is_concrete, is_shape_tuple
from ._arraybase import (
    SparseArray,
    check_unbatched,
    check_unbatched_args,
    check_unflattened_ids,
    shape_str,
    stacked_repr,
)
from ._dtypes import index_dtype
from ._limits import check_table_rows
from ._rowops import fit_ids, sum_repeats
from ._rowsparse import (
    JnpRefusal,
    as_index_array,
    as_shape,
    dense_numpy,
    host_dense,
    leaves_str,
    shape_arg,
)
from ._sharding import explicit_spec, replicated


def csr_row_ids(indptr: jax.Array, nse: int) -> jax.Array:
    """Row id of every entry slot; slots past ``indptr[-1]`` (padding) get ``M``.

    Example:
      >>> import jax.numpy as jnp
      >>> csr_row_ids(jnp.array([0, 2, 2, 3]), 4)
      Array([0, 0, 2, 3], dtype=int32)
    """
    idt = index_dtype()
    if nse == 0:
        return jnp.zeros((0,), idt)
    # fit_ids: XLA:CPU truncates 64-bit indices, so a malformed indptr past
    # 2**32 would mark a real slot.
    marks = jnp.zeros((nse,), idt).at[fit_ids(indptr[1:], nse)].add(1, mode="drop")
    return jnp.cumsum(marks, dtype=idt)


def whole_csr(x: Any) -> Any:
    """A CSR whose arrays are sharded over explicit mesh axes, gathered whole
    (replicated); anything else as it is.

    The ops that place each entry by its row and column (``todense``, sums
    over an axis, slicing, the products, conversions) combine the entries with
    the row ids of ``indptr``, which XLA cannot partition over the entries.
    Ops on the values alone (``x * 2``, ``jsr.sqrt``, ``astype``, ``sum()``)
    keep the sharding. The gradient with respect to the values of a gathered
    CSR comes back sharded like them.
    """
    if not isinstance(x, CSR) or all(
        explicit_spec(a) is None for a in (x.data, x.indices, x.indptr)
    ):
        return x
    return CSR._make(replicated(x.data), replicated(x.indices), replicated(x.indptr), x.shape)


def add_entries(base: jax.Array, x: CSR) -> jax.Array:
    """``base`` ``[M, K]`` plus the entries of ``x`` at their rows and columns
    (cast to ``base``'s dtype; ids outside the matrix dropped, a CSR sharded
    over explicit mesh axes gathered whole first)."""
    x = whole_csr(x)
    cols = fit_ids(x.indices, x.shape[1])  # an int64 id past 2**32 must not wrap
    data = x.data.astype(base.dtype)
    return base.at[x.row_ids(), cols].add(data, mode="drop", wrap_negative_indices=False)


def _unpickle(data, indices, indptr, shape) -> CSR:
    return CSR._make(jnp.asarray(data), jnp.asarray(indices), jnp.asarray(indptr), shape)


def validate_csr(data: np.ndarray | None, indices: np.ndarray, indptr: np.ndarray, shape) -> None:
    m, n = shape
    nse = len(indices)
    if indptr[0] != 0:
        raise ValueError(f"`indptr[0]` must be 0, got {int(indptr[0])}.")
    if np.any(np.diff(indptr) < 0):
        pos = int(np.nonzero(np.diff(indptr) < 0)[0][0])
        raise ValueError(
            f"`indptr` must be non-decreasing, got indptr[{pos}] = {int(indptr[pos])} > "
            f"indptr[{pos + 1}] = {int(indptr[pos + 1])}."
        )
    nnz = int(indptr[-1])
    if nnz > nse:
        raise ValueError(
            f"`indptr[-1]` = {nnz} exceeds the number of stored entries len(indices) = {nse}."
        )
    real = indices[:nnz]
    if real.size and (real.min() < 0 or real.max() >= n):
        bad = int(real[(real < 0) | (real >= n)][0])
        raise ValueError(f"`indices` (column ids) must lie in [0, {n}), got {bad}.")
    if nnz > 1:
        rows = np.repeat(np.arange(m), np.diff(indptr))
        same_row = rows[1:] == rows[:-1]
        bad = same_row & (real[1:] <= real[:-1])
        if np.any(bad):
            pos = int(np.nonzero(bad)[0][0])
            raise ValueError(
                f"column ids must be sorted ascending without duplicates within each row; "
                f"row {int(rows[pos])} has {int(real[pos])} then {int(real[pos + 1])}. Use "
                "`jsr.csr_matrix` to canonicalise."
            )
    if nnz < nse:
        if np.any(indices[nnz:] != n):
            raise ValueError(
                f"padding slots past indptr[-1] = {nnz} must carry column id {n} (the column "
                f"count), got {indices[nnz:].tolist()}."
            )
        if data is not None and np.any(data[nnz:] != 0):
            slot = nnz + int(np.argmax(data[nnz:] != 0))
            raise ValueError(
                f"padding slots past indptr[-1] = {nnz} must hold zero `data`, but slot "
                f"{slot} holds {data[slot].item()!r}. Build CSRs with `jsr.csr_matrix`, or pad "
                "with zeros."
            )


@jax.tree_util.register_pytree_with_keys_class
class CSR(SparseArray):
    """A 2-D compressed-sparse-row matrix with a static entry capacity ``nse``.

    Row ``r`` holds entries ``indptr[r]:indptr[r+1]`` of ``data``/``indices``
    (column ids, sorted within each row). Slots past ``indptr[-1]`` are padding:
    column id ``shape[1]`` and zero data. The constructor is strict; use
    :func:`csr_matrix` to canonicalise unsorted or duplicated input.

    Args:
      data: ``[nse]`` values.
      indices: ``[nse]`` integer column ids.
      indptr: ``[M + 1]`` integer row pointers.
      shape: ``(M, K)``.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> x = jsr.CSR([7., 8., 9.], [0, 2, 1], [0, 2, 2, 3], shape=(3, 5))
      >>> x
      CSR(float32[3, 5], nnz=3)
      >>> x.asnumpy()
      array([[7., 0., 8., 0., 0.],
             [0., 0., 0., 0., 0.],
             [0., 9., 0., 0., 0.]], dtype=float32)
    """

    stype = "csr"
    __array_priority__ = 1000
    __hash__ = None  # type: ignore[assignment]

    data: jax.Array
    indices: jax.Array
    indptr: jax.Array
    shape: tuple[int, int]

    def __init__(
        self, data: ArrayLike, indices: ArrayLike, indptr: ArrayLike, shape: Sequence[int]
    ):
        shape = as_shape(shape, index_dims=2)
        if len(shape) != 2:
            raise ValueError(f"CSR `shape` must be 2-D (M, K), got {shape}.")
        # Host input stays numpy until validated (see RowSparse.__init__).
        data = as_data(data, host=True)
        indices = as_index_array(indices, "indices", host=True)
        indptr = as_index_array(indptr, "indptr", host=True)
        if data.ndim != 1 or indices.ndim != 1 or indptr.ndim != 1:
            raise ValueError(
                "CSR `data`, `indices` and `indptr` must be 1-D, got shapes "
                f"{tuple(data.shape)}, {tuple(indices.shape)}, {tuple(indptr.shape)}."
            )
        if data.shape[0] != indices.shape[0]:
            raise ValueError(
                f"`data` and `indices` must have the same length, got {data.shape[0]} and "
                f"{indices.shape[0]}."
            )
        if indptr.shape[0] != shape[0] + 1:
            raise ValueError(
                f"`indptr` must have M + 1 = {shape[0] + 1} entries, got {indptr.shape[0]}."
            )
        if is_concrete(indices, indptr):
            host_data = np.asarray(data) if is_concrete(data) else None
            validate_csr(host_data, np.asarray(indices), np.asarray(indptr), shape)
        self.data, self.indices, self.indptr = as_jax(data), as_jax(indices), as_jax(indptr)
        self.shape = shape

    @classmethod
    def _make(cls, data, indices, indptr, shape) -> CSR:
        obj = object.__new__(cls)
        obj.data, obj.indices, obj.indptr, obj.shape = data, indices, indptr, tuple(shape)
        return obj

    def tree_flatten_with_keys(self):
        # Named children: key paths read `.data` / `.indices` (checkpoint names).
        return (
            (GetAttrKey("data"), self.data),
            (GetAttrKey("indices"), self.indices),
            (GetAttrKey("indptr"), self.indptr),
        ), self.shape

    def tree_flatten(self):
        return (self.data, self.indices, self.indptr), self.shape

    @classmethod
    def tree_unflatten(cls, shape, children):
        check_unflattened_ids("CSR", children[0], indices=children[1], indptr=children[2])
        return cls._make(*children, shape)

    def __reduce__(self):
        arrays = (np.asarray(self.data), np.asarray(self.indices), np.asarray(self.indptr))
        return (_unpickle, (*arrays, self.shape))

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the values (``data``)."""
        return self.data.dtype

    @property
    def ndim(self) -> int:
        """Always 2: a CSR is a matrix."""
        return 2

    @property
    def size(self) -> int:
        """The number of elements of the dense matrix, ``M * K``."""
        return self.shape[0] * self.shape[1]

    @property
    def nse(self) -> int:
        """Static entry capacity (stored entries plus padding)."""
        return self.data.shape[0]

    @property
    def nnz(self) -> jax.Array:
        """Number of stored (non-padding) entries, ``indptr[-1]`` (one per
        element, ``[S]``, for an array stacked by ``vmap``)."""
        return self.indptr[..., -1]

    def row_ids(self) -> jax.Array:
        """``[nse]`` row id of every entry slot (``M`` for padding); replicated
        where ``indptr`` is sharded over explicit mesh axes."""
        check_unbatched_args("row_ids", self)
        return csr_row_ids(replicated(self.indptr), self.nse)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        leaves = {"data": self.data, "indices": self.indices, "indptr": self.indptr}
        odd = stacked_repr("CSR", self.shape, leaves)
        if odd is not None:
            return odd
        head = shape_str(self.data.dtype, self.shape)
        if not jnp.issubdtype(self.indptr.dtype, jnp.integer):  # a float0 cotangent's ids
            return f"CSR({head}, nse={self.nse}, indices=float0)"
        if is_concrete(self.indptr) and isinstance(self.indptr, jax.Array | np.ndarray):
            nnz = int(np.asarray(self.indptr)[-1])
            extra = "" if nnz == self.nse else f", nse={self.nse}"
            return f"CSR({head}, nnz={nnz}{extra})"
        return f"CSR({head}, nse={self.nse})"

    def __str__(self) -> str:
        """The repr, then the stored ``data``, ``indices`` and ``indptr`` when
        they are known (what ``print`` and ``jax.debug.print`` show)."""
        leaves = {"data": self.data, "indices": self.indices, "indptr": self.indptr}
        ids_dtype = getattr(self.indptr, "dtype", None)  # (leaves mapped to non-arrays)
        if ids_dtype is not None and not jnp.issubdtype(ids_dtype, jnp.integer):  # float0
            leaves = {"data": self.data}
        return leaves_str(repr(self), leaves)

    def __jax_array__(self):
        return JnpRefusal("CSR")

    def todense(self) -> jax.Array:
        """The dense ``[M, K]`` array.

        Example:
          >>> import jaxsparse_rows as jsr
          >>> jsr.csr_matrix(([1., 2.], [1, 0], [0, 1, 2]), shape=(2, 2)).todense()
          Array([[0., 1.],
                 [2., 0.]], dtype=float32)
        """
        check_unbatched(self, "todense")
        if self.data.dtype == jnp.bool_:  # XLA's scatter-add rejects bool
            return self.astype(jnp.int32).todense() != 0
        return add_entries(jnp.zeros(self.shape, self.data.dtype), self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return dense_numpy(self, dtype, copy)

    def asnumpy(self) -> np.ndarray:
        """The dense matrix as a new, writable ``numpy.ndarray``."""
        return host_dense(self)

    def astype(self, dtype: Any) -> CSR:
        """Casts ``data``; structure is kept."""
        return CSR._make(self.data.astype(dtype), self.indices, self.indptr, self.shape)

    def copy(self) -> CSR:
        """A new CSR with copied buffers."""
        return CSR._make(
            jnp.array(self.data), jnp.array(self.indices), jnp.array(self.indptr), self.shape
        )

    @property
    def T(self):  # noqa: N802
        """Not supported: raises ``TypeError`` pointing to
        ``jsr.dot(x, y, transpose_a=True)``, which gives ``x.T @ y`` without
        building the transpose."""
        raise TypeError(
            "CSR has no lazy transpose; use `jsr.dot(x, y, transpose_a=True)` for x.T @ y "
            "(row-sparse result), or `x.todense().T`."
        )

    def __getitem__(self, key: Any) -> CSR:
        """Row slicing ``x[a:b]`` (step 1) returns a CSR with the same capacity.

        Example:
          >>> import jaxsparse_rows as jsr
          >>> x = jsr.csr_matrix(([7., 8., 9.], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
          >>> x[1:3].asnumpy()
          array([[0., 0., 0., 0., 0.],
                 [0., 9., 0., 0., 0.]], dtype=float32)
        """
        check_unbatched_args("row slicing", self)
        if isinstance(key, int | np.integer):
            m = self.shape[0]
            if not -m <= key < m:
                raise IndexError(f"row index {key} is out of range for {m} rows.")
            key = slice(int(key) % m, int(key) % m + 1)
        if not isinstance(key, slice):
            raise TypeError(f"CSR supports row slices `x[a:b]` and ints, got {key!r}.")
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise ValueError(f"CSR row slicing needs step 1, got {step}.")
        stop = max(stop, start)
        x = whole_csr(self)
        base = x.indptr[start]
        indptr = x.indptr[start : stop + 1] - base
        count = indptr[-1]
        pos = jnp.arange(x.nse, dtype=index_dtype())
        keep = pos < count
        src = pos + base
        data = jnp.where(keep, x.data.at[src].get(mode="fill", fill_value=0), 0)
        cols = jnp.where(keep, x.indices.at[src].get(mode="fill", fill_value=0), x.shape[1])
        return CSR._make(data.astype(x.dtype), cols, indptr, (stop - start, x.shape[1]))

    @classmethod
    def fromdense(cls, x: ArrayLike, nse: int | None = None) -> CSR:
        """CSR form of a dense 2-D array.

        Exact when ``x`` is concrete. Under ``jax.jit`` the number of non-zeros is
        unknown while tracing, so ``nse`` (a static capacity) is required; more
        non-zeros than ``nse`` raise when concrete and fail a
        ``checkify.debug_check`` under jit.

        Example:
          >>> import jaxsparse_rows as jsr, jax.numpy as jnp
          >>> x = jsr.CSR.fromdense(jnp.array([[0., 1.], [2., 0.]]))
          >>> x.data, x.indices
          (Array([1., 2.], dtype=float32), Array([1, 0], dtype=int32))
          >>> x.indptr
          Array([0, 1, 2], dtype=int32)
        """
        if not isinstance(x, jax.Array):
            x = jnp.asarray(x)
        if x.ndim != 2:
            raise ValueError(f"CSR.fromdense needs a 2-D `x`, got shape {tuple(x.shape)}.")
        check_table_rows(x, "x", axes=2)
        m, n = x.shape
        idt = index_dtype()
        if nse is not None:
            nse = check_static_int(nse, "nse")
        if is_concrete(x):
            xn = np.asarray(x)
            r, c = np.nonzero(xn)
            cap = len(r) if nse is None else nse
            if len(r) > cap:
                raise ValueError(f"`x` has {len(r)} non-zeros, more than `nse` = {cap}.")
            data = np.zeros((cap,), xn.dtype)
            data[: len(r)] = xn[r, c]
            cols = np.full((cap,), n, idt)
            cols[: len(r)] = c
            indptr = np.zeros((m + 1,), idt)
            np.cumsum(np.bincount(r, minlength=m), out=indptr[1:])
            return cls._make(jnp.asarray(data), jnp.asarray(cols), jnp.asarray(indptr), (m, n))
        if nse is None:
            raise ValueError(
                "CSR.fromdense on a traced array (inside jax.jit, vmap, grad...) needs a static "
                "`nse`: the number of non-zeros is only known at run time and fixes the output "
                "shape. Pass e.g. `CSR.fromdense(x, nse=k)`."
            )
        if x.size == 0:  # nothing to store; XLA rejects a gather from an empty array
            return cls._make(
                jnp.zeros((nse,), x.dtype),
                jnp.full((nse,), n, idt),
                jnp.zeros((m + 1,), idt),
                (m, n),
            )
        mask = x != 0
        r, c = jnp.nonzero(mask, size=nse, fill_value=(m, n))
        if nse < m * n:  # else it cannot overflow: emit no check (see capacity_check)
            capacity_check(
                jnp.sum(mask) <= nse, f"CSR.fromdense: `x` has more non-zeros than `nse` = {nse}."
            )
        data = x.at[r, c].get(mode="fill", fill_value=0)
        counts = jnp.sum(mask, axis=1, dtype=idt)
        indptr = jnp.concatenate([jnp.zeros((1,), idt), jnp.cumsum(counts, dtype=idt)])
        indptr = jnp.minimum(indptr, nse)
        return cls._make(data, c.astype(idt), indptr, (m, n))


def empty_csr(shape: Sequence[int], dtype: Any = jnp.float32) -> CSR:
    """An all-zero 2-D CSR of ``shape`` with no entries."""
    shape = as_shape(shape, index_dims=2)
    if len(shape) != 2:
        raise ValueError(f"`shape` must be 2-D for csr, got {shape}.")
    idt = index_dtype()
    dtype = jnp.dtype(dtype)
    return CSR._make(
        jnp.zeros((0,), dtype), jnp.zeros((0,), idt), jnp.zeros((shape[0] + 1,), idt), shape
    )


def csr_matrix(arg: Any, shape: Sequence[int] | None = None, dtype: Any = None) -> CSR:
    """Creates a CSR matrix, MXNet / scipy style.

    ``arg`` is ``(data, indices, indptr)``, a dense 2-D array-like, a CSR, a
    ``scipy.sparse`` matrix, or a shape ``(M, N)`` for an empty matrix (as
    ``jsr.zeros("csr", (M, N))``). With concrete input, column ids are sorted
    within each row and duplicates summed.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> x = jsr.csr_matrix(([1., 2., 3.], [2, 0, 0], [0, 3, 3]), shape=(2, 3))
      >>> x.data, x.indices
      (Array([5., 1.], dtype=float32), Array([0, 2], dtype=int32))
      >>> jsr.csr_matrix((2, 3))
      CSR(float32[2, 3], nnz=0)
    """
    if is_shape_tuple(arg):
        return empty_csr(shape_arg(arg, shape), jnp.float32 if dtype is None else dtype)
    if isinstance(arg, CSR):
        if shape is not None and tuple(shape) != arg.shape:
            raise ValueError(f"`shape` {tuple(shape)} does not match the matrix's {arg.shape}.")
        return arg.astype(dtype) if dtype is not None else arg
    if type(arg).__module__.startswith("scipy.sparse"):
        m = arg.tocsr()
        nnz = int(m.indptr[-1])  # scipy ignores entries past it (the triple form refuses them)
        parts = (as_data(m.data[:nnz], host=True), m.indices[:nnz], m.indptr)
        out = csr_matrix(parts, shape=m.shape)
        if shape is not None and as_shape(shape) != out.shape:
            raise ValueError(f"`shape` {tuple(shape)} does not match the matrix's {out.shape}.")
        return out.astype(dtype) if dtype is not None else out
    if not isinstance(arg, tuple):
        if isinstance(arg, list) and dtype is None:
            dtype = jnp.float32  # MXNet: Python lists default to float32
        out = CSR.fromdense(as_data(arg, dtype))
        if shape is not None and as_shape(shape) != out.shape:
            raise ValueError(f"`shape` {tuple(shape)} does not match the array's {out.shape}.")
        return out
    if len(arg) != 3:
        raise ValueError(
            f"`arg` must be a (data, indices, indptr) triple, got a tuple of {len(arg)}."
        )
    if shape is None:
        raise ValueError("`shape` is required when creating a CSR from (data, indices, indptr).")
    shape = as_shape(shape, index_dims=2)
    data, indices, indptr = arg
    if isinstance(data, list | tuple) and dtype is None:
        dtype = jnp.float32  # MXNet: Python lists default to float32
    # Host input stays numpy: under jit only `data` may be traced, and the
    # structure is still checked and canonicalised on the host.
    data = as_data(data, dtype, host=True)
    indices = as_index_array(indices, "indices", host=True)
    indptr = as_index_array(indptr, "indptr", host=True)
    if not is_concrete(indices, indptr) or len(shape) != 2 or indptr.ndim != 1:
        return CSR(data, indices, indptr, shape)
    ip = np.asarray(indptr)
    if ip.shape[0] != shape[0] + 1 or ip[0] != 0 or np.any(np.diff(ip) < 0):
        return CSR(data, indices, indptr, shape)  # the strict constructor explains
    nnz = int(ip[-1])
    if (
        data.ndim != 1
        or indices.ndim != 1
        or data.shape[0] != indices.shape[0]
        or nnz > len(indices)
    ):
        return CSR(data, indices, indptr, shape)
    tail = np.asarray(indices)[nnz:]
    if np.any(tail != shape[1]):  # scipy ignores them; here they would vanish silently
        raise ValueError(
            f"`data` and `indices` hold {len(indices)} entries but indptr[-1] = {nnz}: "
            f"the entries past {nnz} belong to no row. Slice them off (data[:{nnz}], "
            f"indices[:{nnz}]), or give them column id {shape[1]} to mark them as padding."
        )
    cols = np.asarray(indices)[:nnz].astype(np.int64)
    vals = np.asarray(data)[:nnz] if is_concrete(data) else data[:nnz]
    if cols.size and (cols.min() < 0 or cols.max() >= shape[1]):
        bad = int(cols[(cols < 0) | (cols >= shape[1])][0])
        raise ValueError(f"`indices` (column ids) must lie in [0, {shape[1]}), got {bad}.")
    rows = np.repeat(np.arange(shape[0], dtype=np.int64), np.diff(ip))
    # Sort by (row, column) and merge equal pairs. (A single key row * K + col
    # would overflow int64 for M * K >= 2**63 and move entries.)
    order = np.lexsort((cols, rows))
    rows_s, cols_s = rows[order], cols[order]
    start = np.ones(len(order), bool)
    start[1:] = (rows_s[1:] != rows_s[:-1]) | (cols_s[1:] != cols_s[:-1])
    inverse = np.empty(len(order), np.int64)
    inverse[order] = np.cumsum(start) - 1
    new_rows, new_cols = rows_s[start], cols_s[start]
    summed = sum_repeats(vals, inverse, len(new_rows))
    idt = index_dtype()
    new_ptr = np.zeros(shape[0] + 1, idt)
    np.cumsum(np.bincount(new_rows, minlength=shape[0]), out=new_ptr[1:])
    return CSR(jnp.asarray(summed), new_cols.astype(idt), new_ptr, shape)
