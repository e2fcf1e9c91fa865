"""The Python operators and the op-backed methods of ``RowSparse`` and ``CSR``,
attached to their base class from above the ops (as ``jax.experimental.sparse``
attaches its methods), so that the array types import nothing above them.

The storage-type rules live in the ops (``_elementwise``, ``_dot``,
``_reductions``, ``_storage``, ``_interop``); this module only routes ``-x``,
``x + y``, ``x @ y``, ``x == y``, ``x.sum()``, ``x.tostype(...)`` and
``x.to_scipy()`` to them. The package imports it once, at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _dot, _elementwise, _interop, _reductions, _storage
from ._arraybase import SparseArray
from ._rowsparse import jnp_refusal


def _is_operand(x: Any) -> bool:
    """Arrays (sparse, JAX, numpy), numbers and lists: what jax.numpy computes with.
    Anything else (None, a ShapeDtypeStruct, a string) is not compared."""
    array_types = (SparseArray, jax.Array, np.ndarray, np.generic)
    return isinstance(x, array_types + (int, float, complex, bool, list, tuple))


def _dense_op(name: str, a: Any, b: Any) -> Any:
    """``jnp.<name>(a, b)`` on the dense forms, through the storage fallback (with
    its warning): the ops whose result is dense anyway (``x == y``, ``x < 1``,
    ``2 ** x``, ``x // 2``), as jax.numpy computes them. ``NotImplemented`` for
    a non-array operand, so Python falls back to identity for ``==``."""
    if not (_is_operand(a) and _is_operand(b)):
        return NotImplemented
    a, b = (np.asarray(x) if isinstance(x, list | tuple) else x for x in (a, b))
    return _storage.apply_dense(getattr(jnp, name), a, b)


def _binary(fn: Callable, reflected: bool = False) -> Callable:
    """An operator computed by ``fn``; ``NotImplemented`` for a non-array
    operand (``x * None``, ``x + "a"``), so Python raises its usual
    ``TypeError: unsupported operand type(s)``."""

    def op(self: Any, other: Any) -> Any:
        if not _is_operand(other):
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)

    return op


def _dense_binary(name: str, reflected: bool = False) -> Callable:
    if reflected:
        return lambda self, other: _dense_op(name, other, self)
    return lambda self, other: _dense_op(name, self, other)


def _bool(self: Any) -> bool:
    # As numpy and jax.Array: only a one-element array has a truth value.
    # Without this, Python would use ``__len__`` and call any array with
    # rows true, whatever its values.
    name = type(self).__name__
    if self.size == 1:
        return bool(self.todense().reshape(()))
    what = f"an empty {name}" if self.size == 0 else f"a {name} of more than one element"
    raise ValueError(
        f"the truth value of {what} (shape "
        f"{tuple(self.shape)}) is ambiguous. Use `x.size > 0` to test for "
        "elements, `x.nnz_rows > 0` (RowSparse) or `x.nnz > 0` (CSR) for stored "
        "entries, or `jnp.any(x.todense())` / `jnp.all(x.todense())` for values."
    )


def _sum(
    self: Any, axis: int | None = None, keepdims: bool = False, dtype: Any = None, out: Any = None
) -> Any:
    """``jsr.sum(self, axis, keepdims)``: the sum of all entries, or along
    ``axis``, as a dense array (``jnp.sum`` does not take sparse arrays).
    ``dtype`` casts the sum; ``out`` (which ``np.sum`` passes) must be None.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> x = jsr.RowSparse([[1., 2.], [3., 4.]], [0, 2], shape=(3, 2))
      >>> x.sum(), x.sum(axis=1)
      (Array(10., dtype=float32), Array([3., 0., 7.], dtype=float32))
    """
    if out is not None:
        raise TypeError("`out` is not supported: JAX arrays are immutable; use the result.")
    total = _reductions.sum(self, axis=axis, keepdims=keepdims)
    return total if dtype is None else total.astype(dtype)


def _tostype(self: Any, stype: str) -> Any:
    """Converts to ``"default"`` (dense), ``"row_sparse"`` or ``"csr"`` storage
    (``jsr.cast_storage(self, stype)``)."""
    return _storage.cast_storage(self, stype)


def _to_scipy(self: Any):
    """A ``scipy.sparse.csr_matrix`` with the stored entries (2-D only; needs scipy)."""
    return _interop.to_scipy(self)


# numpy ufuncs that are Python operators: `ndarray * x` reaches the sparse
# operand as `np.multiply(ndarray, x)`, and is computed as the operator is.
_UFUNC_OPERATORS = {
    np.add: ("__add__", "__radd__"),
    np.subtract: ("__sub__", "__rsub__"),
    np.multiply: ("__mul__", "__rmul__"),
    np.true_divide: ("__truediv__", "__rtruediv__"),
    np.matmul: ("__matmul__", "__rmatmul__"),
    np.power: ("__pow__", "__rpow__"),
    np.floor_divide: ("__floordiv__", "__rfloordiv__"),
    np.remainder: ("__mod__", "__rmod__"),
    np.equal: ("__eq__", "__eq__"),
    np.not_equal: ("__ne__", "__ne__"),
    np.less: ("__lt__", "__gt__"),
    np.less_equal: ("__le__", "__ge__"),
    np.greater: ("__gt__", "__lt__"),
    np.greater_equal: ("__ge__", "__le__"),
}


def _array_ufunc(self: Any, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """numpy's ufuncs: the binary operators as the Python operators compute
    them (``np.ones((3, 2)) * x`` keeps the storage type); any other ufunc
    refuses, as ``jax.numpy`` does, rather than densify a table silently."""
    pair = _UFUNC_OPERATORS.get(ufunc)
    if pair is not None and method == "__call__" and not kwargs and len(inputs) == 2:
        a, b = inputs
        return getattr(self, pair[0])(b) if a is self else getattr(self, pair[1])(a)
    name = type(self).__name__
    raise TypeError(jnp_refusal(name, f"numpy ufuncs such as `{ufunc.__name__}` do"))


_METHODS = {
    "__neg__": _elementwise.negative,
    "__abs__": _elementwise.abs,
    "__pos__": lambda self: self,
    "__add__": _binary(_elementwise.add),
    "__radd__": _binary(_elementwise.add, reflected=True),
    "__sub__": _binary(_elementwise.subtract),
    "__rsub__": _binary(_elementwise.subtract, reflected=True),
    "__mul__": _binary(_elementwise.multiply),
    "__rmul__": _binary(_elementwise.multiply, reflected=True),
    "__truediv__": _binary(_elementwise.divide),
    "__rtruediv__": _binary(_elementwise.divide, reflected=True),
    "__pow__": _binary(_elementwise.power),
    "__matmul__": _binary(_dot.dot),
    "__rmatmul__": _binary(_dot.dot, reflected=True),
    # Elementwise, as numpy, jax.numpy and MXNet's sparse arrays; None and
    # other non-arrays compare by identity (see _is_operand).
    "__eq__": _dense_binary("equal"),
    "__ne__": _dense_binary("not_equal"),
    "__lt__": _dense_binary("less"),
    "__le__": _dense_binary("less_equal"),
    "__gt__": _dense_binary("greater"),
    "__ge__": _dense_binary("greater_equal"),
    "__rpow__": _dense_binary("power", reflected=True),
    "__floordiv__": _dense_binary("floor_divide"),
    "__rfloordiv__": _dense_binary("floor_divide", reflected=True),
    "__mod__": _dense_binary("remainder"),
    "__rmod__": _dense_binary("remainder", reflected=True),
    "__bool__": _bool,
    "__array_ufunc__": _array_ufunc,
    # Reductions and conversions (as numpy's and scipy.sparse's methods).
    "sum": _sum,
    "tostype": _tostype,
    "to_scipy": _to_scipy,
}

for _name, _fn in _METHODS.items():
    setattr(SparseArray, _name, _fn)
