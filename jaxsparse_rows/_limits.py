"""The largest dense table that row ids can address.

Row ids are stored in the index dtype (int32, or int64 with
``jax_enable_x64``), and a table's row count ``V`` is an id too: the padding
id. So ``V`` must be at most the index dtype's maximum (2**31 - 1 for int32):
ids ``0 .. V - 1`` name rows and ``V`` is padding. :func:`check_table_rows`
refuses a larger table from its shape alone, so it costs nothing and works
under ``jax.jit``. This module imports no other module of the package but
``_dtypes`` (which imports none), so any module can call it without a cycle.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dtypes import index_dtype

_INT32_MAX = int(np.iinfo(np.int32).max)


def max_table_rows() -> int:
    """The most rows a dense table may have: the index dtype's maximum, since
    ids ``0 .. V - 1`` name its rows and ``V`` itself is the padding id."""
    return int(np.iinfo(index_dtype()).max)


def check_table_rows(table: Any, name: str, *, axes: int = 1) -> None:
    """Refuses a dense ``table`` whose row count the index dtype cannot hold.

    Only the shape is read (``table`` may be an array, a tracer or a
    ``jax.ShapeDtypeStruct``). With ``axes=2`` the columns are checked too
    (the column ids of a CSR matrix, padded with the column count).

    Args:
      table: the dense array (or anything with a ``shape``).
      name: how the error names it, e.g. ``"table"`` or ``"params['emb']"``.
      axes: how many leading axes are addressed by ids.

    Raises:
      ValueError: a leading size exceeds the index dtype's maximum.
    """
    shape = tuple(np.shape(table))[:axes]
    if all(size <= _INT32_MAX for size in shape):  # fits every index dtype
        return
    limit = max_table_rows()
    for axis, size in enumerate(shape):
        if size <= limit:
            continue
        dtype = index_dtype().name
        what = "rows" if axis == 0 else "columns"
        bits = np.iinfo(index_dtype()).bits
        if bits < 64:
            fix = (
                "Enable 64-bit indices with `jax.config.update('jax_enable_x64', True)` "
                f"(at startup, before arrays are created), or split it into tables of at most "
                f"{limit} {what}."
            )
        else:
            fix = f"Split it into tables of at most {limit} {what}."
        raise ValueError(
            f"`{name}` has {size} {what}, more than {dtype} ids can address: at most "
            f"{limit} = 2**{bits - 1} - 1 ({dtype}'s maximum), since ids 0 to {limit - 1} "
            f"name the {what} and the count itself is the padding id. {fix}"
        )
