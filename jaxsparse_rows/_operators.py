"""Python operator overloads shared by RowSparse and CSR.

The storage-type rules live in :mod:`._elementwise` and :mod:`._dot`; this
mixin only routes ``-x``, ``x + y``, ``x @ y``, ... to them (imported lazily,
because those modules import the array classes).
"""

from __future__ import annotations

from typing import Any


class SparseOperators:
    """Mixin: arithmetic operators with storage-type inference."""

    __slots__ = ()

    def __neg__(self) -> Any:
        from ._elementwise import negative

        return negative(self)

    def __abs__(self) -> Any:
        from ._elementwise import abs as abs_

        return abs_(self)

    def __add__(self, other: Any) -> Any:
        from ._elementwise import add

        return add(self, other)

    def __radd__(self, other: Any) -> Any:
        from ._elementwise import add

        return add(other, self)

    def __sub__(self, other: Any) -> Any:
        from ._elementwise import subtract

        return subtract(self, other)

    def __rsub__(self, other: Any) -> Any:
        from ._elementwise import subtract

        return subtract(other, self)

    def __mul__(self, other: Any) -> Any:
        from ._elementwise import multiply

        return multiply(self, other)

    def __rmul__(self, other: Any) -> Any:
        from ._elementwise import multiply

        return multiply(other, self)

    def __truediv__(self, other: Any) -> Any:
        from ._elementwise import divide

        return divide(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        from ._elementwise import divide

        return divide(other, self)

    def __pow__(self, other: Any) -> Any:
        from ._elementwise import power

        return power(self, other)

    # Elementwise, as numpy, jax.numpy and MXNet's sparse arrays; None and
    # other non-arrays compare by identity (see _is_operand).
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return _dense_op("equal", self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return _dense_op("not_equal", self, other)

    def __lt__(self, other: Any) -> Any:
        return _dense_op("less", self, other)

    def __le__(self, other: Any) -> Any:
        return _dense_op("less_equal", self, other)

    def __gt__(self, other: Any) -> Any:
        return _dense_op("greater", self, other)

    def __ge__(self, other: Any) -> Any:
        return _dense_op("greater_equal", self, other)

    def __pos__(self) -> Any:
        return self

    def __bool__(self) -> bool:
        # As numpy and jax.Array: only a one-element array has a truth value.
        # Without this, Python would use ``__len__`` and call any array with
        # rows true, whatever its values.
        name = type(self).__name__
        if self.size == 1:  # type: ignore[attr-defined]
            return bool(self.todense().reshape(()))  # type: ignore[attr-defined]
        what = f"an empty {name}" if self.size == 0 else f"a {name} of more than one element"  # type: ignore[attr-defined]
        raise ValueError(
            f"the truth value of {what} (shape "
            f"{tuple(self.shape)}) is ambiguous. Use `x.size > 0` to test for "  # type: ignore[attr-defined]
            "elements, `x.nnz_rows > 0` (RowSparse) or `x.nnz > 0` (CSR) for stored "
            "entries, or `jnp.any(x.todense())` / `jnp.all(x.todense())` for values."
        )

    def __rpow__(self, other: Any) -> Any:
        return _dense_op("power", other, self)

    def __floordiv__(self, other: Any) -> Any:
        return _dense_op("floor_divide", self, other)

    def __rfloordiv__(self, other: Any) -> Any:
        return _dense_op("floor_divide", other, self)

    def __mod__(self, other: Any) -> Any:
        return _dense_op("remainder", self, other)

    def __rmod__(self, other: Any) -> Any:
        return _dense_op("remainder", other, self)

    def __matmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(other, self)

    # -- reductions (as numpy's and scipy.sparse's methods) -------------------
    def sum(self, axis: int | None = None, keepdims: bool = False) -> Any:  # noqa: A003
        """``jsr.sum(self, axis, keepdims)``: the sum of all entries, or along
        ``axis``, as a dense array (``jnp.sum`` does not take sparse arrays).

        Example:
          >>> import jaxsparse_rows as jsr
          >>> x = jsr.RowSparse([[1., 2.], [3., 4.]], [0, 2], shape=(3, 2))
          >>> x.sum(), x.sum(axis=1)
          (Array(10., dtype=float32), Array([3., 0., 7.], dtype=float32))
        """
        from ._reductions import sum as sum_

        return sum_(self, axis=axis, keepdims=keepdims)


def _is_operand(x: Any) -> bool:
    """Arrays (sparse, JAX, numpy), numbers and lists: what jax.numpy computes with.
    Anything else (None, a ShapeDtypeStruct, a string) is not compared."""
    import jax
    import numpy as np

    array_types = (SparseOperators, jax.Array, np.ndarray, np.generic)
    return isinstance(x, array_types + (int, float, complex, bool, list, tuple))


def _dense_op(name: str, a: Any, b: Any) -> Any:
    """``jnp.<name>(a, b)`` on the dense forms, through the storage fallback (with
    its warning): the ops whose result is dense anyway (``x == y``, ``x < 1``,
    ``2 ** x``, ``x // 2``), as jax.numpy computes them. ``NotImplemented`` for
    a non-array operand, so Python falls back to identity for ``==``."""
    import jax.numpy as jnp
    import numpy as np

    from ._storage import apply_dense

    if not (_is_operand(a) and _is_operand(b)):
        return NotImplemented
    a, b = (np.asarray(x) if isinstance(x, list | tuple) else x for x in (a, b))
    return apply_dense(getattr(jnp, name), a, b)
