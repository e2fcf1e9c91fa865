"""The base class of the library's sparse arrays (``RowSparse`` and ``CSR``).

``isinstance(x, SparseArray)`` is how the library tells its sparse arrays
from everything else. The class holds no behaviour of its own: the Python
operators and the methods that compute with the library's ops (``x + y``,
``x @ y``, ``x.sum()``, ``x.tostype(...)``) are attached by ``_methods``,
which sits above the ops, so the array types import nothing above them.
"""

from __future__ import annotations


class SparseArray:
    """Base class of :class:`~jaxsparse_rows.RowSparse` and
    :class:`~jaxsparse_rows.CSR`."""

    __slots__ = ()
