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

    def __matmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(other, self)
