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

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return _compare("equal", self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return _compare("not_equal", self, other)

    def __matmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        from ._dot import dot

        return dot(other, self)


def _compare(name: str, a: Any, b: Any) -> Any:
    """Elementwise ``==`` / ``!=`` as jax.numpy and numpy do (and MXNet's sparse
    arrays): the dense bool result, through the storage fallback (with its
    warning), since zeros compare equal to zeros. ``None`` and objects that
    are not arrays compare by identity, as Python's default."""
    import jax.numpy as jnp
    import numpy as np

    from ._storage import apply_dense

    if b is None or not (
        hasattr(b, "shape") or isinstance(b, int | float | complex | bool | list | tuple)
    ):
        return NotImplemented
    fn = jnp.equal if name == "equal" else jnp.not_equal
    if isinstance(b, list | tuple):
        b = np.asarray(b)
    return apply_dense(fn, a, b)
