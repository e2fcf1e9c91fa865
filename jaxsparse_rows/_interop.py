"""Conversion to and from ``scipy.sparse`` and ``jax.experimental.sparse.BCOO``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._args import is_concrete
from ._arraybase import check_unbatched_args
from ._csr import CSR, csr_matrix, whole_csr
from ._dtypes import index_dtype
from ._rowops import coalesce_rows, fit_ids
from ._rowsparse import RowSparse, row_sparse_array
from ._storage import cast_storage

_SCIPY_UNSUPPORTED = ("float16", "bfloat16")


def from_scipy(m: Any) -> CSR:
    """A CSR from any ``scipy.sparse`` matrix (converted with ``.tocsr()``).

    Duplicates are summed and column ids sorted, as ``csr_matrix`` does.

    Example:
      >>> import scipy.sparse as sp, jaxsparse_rows as jsr
      >>> jsr.from_scipy(sp.eye(3, format="csr", dtype="float32"))
      CSR(float32[3, 3], nnz=3)
    """
    if not type(m).__module__.startswith("scipy.sparse"):
        raise TypeError(f"`m` must be a scipy.sparse matrix, got {type(m).__name__}.")
    return csr_matrix(m)


def to_scipy(x: Any):
    """A ``scipy.sparse.csr_matrix`` holding the stored entries of ``x``.

    A 2-D RowSparse converts through its stored rows (zero values inside them
    are dropped). Padding is never included. float16 / bfloat16 data become
    float32 (scipy.sparse has no half-precision types).

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> a.to_scipy().toarray()
      array([[0., 0.],
             [1., 2.],
             [0., 0.]], dtype=float32)
    """
    check_unbatched_args("to_scipy", x)
    import scipy.sparse as sp

    if isinstance(x, RowSparse | CSR) and x.dtype.name in _SCIPY_UNSUPPORTED:
        x = x.astype(np.float32)  # scipy.sparse has no half-precision types
    if isinstance(x, CSR):
        nnz = int(np.asarray(x.indptr)[-1])
        return sp.csr_matrix(
            (np.asarray(x.data)[:nnz], np.asarray(x.indices)[:nnz], np.asarray(x.indptr)),
            shape=x.shape,
        )
    if isinstance(x, RowSparse):
        if x.ndim != 2:
            raise ValueError(f"only 2-D row_sparse arrays convert to scipy, got {x.shape}.")
        n = x.shape[0]
        idx = np.asarray(x.indices)
        real = idx < n
        rows = np.zeros((x.capacity, x.shape[1]), dtype=np.asarray(x.data).dtype)
        rows[real] = np.asarray(x.data)[real]
        coo = sp.coo_matrix(rows)
        return sp.csr_matrix((coo.data, (idx[coo.row], coo.col)), shape=x.shape)
    raise TypeError(f"`x` must be a RowSparse or CSR, got {type(x).__name__}.")


def _bcoo_ids(ids: jax.Array, n: int) -> jax.Array:
    """Ids for a BCOO: a malformed one (negative, or a 64-bit one past 2**32,
    which XLA:CPU would wrap) becomes ``n``, which BCOO ignores as padding."""
    ids = fit_ids(ids, n).astype(index_dtype())  # n may not fit a small id dtype
    return jnp.where((ids < 0) | (ids > n), n, ids)


def to_bcoo(x: Any):
    """A ``jax.experimental.sparse.BCOO`` with the same stored entries.

    A RowSparse becomes a BCOO with one sparse (row) dimension and dense
    trailing dimensions (``n_dense = ndim - 1``); a CSR becomes a 2-D BCOO.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))
      >>> jsr.to_bcoo(a).todense().tolist()
      [[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]]
    """
    check_unbatched_args("to_bcoo", x)
    from jax.experimental import sparse as jsparse

    if isinstance(x, RowSparse):
        return jsparse.BCOO((x.data, _bcoo_ids(x.indices, x.shape[0])[:, None]), shape=x.shape)
    if isinstance(x, CSR):
        x = whole_csr(x)
        idx = jnp.stack([x.row_ids(), _bcoo_ids(x.indices, x.shape[1])], axis=1)
        return jsparse.BCOO((x.data, idx), shape=x.shape)
    raise TypeError(f"`x` must be a RowSparse or CSR, got {type(x).__name__}.")


def from_bcoo(m: Any, stype: str = "row_sparse") -> Any:
    """A RowSparse (or CSR with ``stype="csr"``) from a BCOO.

    A BCOO with one sparse dimension (``n_sparse=1``, e.g. from ``to_bcoo`` of
    a RowSparse) maps straight to a RowSparse: its indices are sorted and
    duplicates summed, and BCOO padding (any index ``>= N``, which
    ``BCOO.todense`` drops too) is dropped (kept as RowSparse padding under
    jit, where the capacity stays ``nse``). Other layouts go through the dense
    form and need concrete input. A negative index raises ``ValueError``
    (outside jit; ``BCOO.todense`` would wrap it).

    Example:
      >>> import jax.numpy as jnp, jaxsparse_rows as jsr
      >>> from jax.experimental import sparse
      >>> b = sparse.BCOO.fromdense(jnp.array([[0., 1.], [0., 0.]]))
      >>> jsr.from_bcoo(b)
      RowSparse(float32[2, 2], rows=1)
    """
    from jax.experimental import sparse as jsparse

    if not isinstance(m, jsparse.BCOO):
        raise TypeError(f"`m` must be a jax.experimental.sparse.BCOO, got {type(m).__name__}.")
    if m.n_batch:
        raise ValueError(f"batched BCOO (n_batch={m.n_batch}) is not supported.")
    if stype not in ("row_sparse", "csr"):
        raise ValueError(f"`stype` must be 'row_sparse' or 'csr', got {stype!r}.")
    if m.n_sparse == 1 and stype == "row_sparse":
        ids = m.indices[:, 0]
        n = m.shape[0]
        if is_concrete(ids, m.data):
            keep = np.asarray(ids) < n  # BCOO pads with the out-of-bounds id N
            return row_sparse_array((m.data[keep], ids[keep]), shape=m.shape)
        # Under jit: sort, sum duplicates and keep the padding (id N) at the end.
        idx, data, _ = coalesce_rows(ids, m.data, n, m.nse)
        return RowSparse._make(data, idx, m.shape)
    if not is_concrete(m.data, m.indices):
        raise ValueError(
            "from_bcoo under jit supports only a BCOO with one sparse dimension and "
            "`stype='row_sparse'`; convert other layouts outside jit."
        )
    indices = np.asarray(m.indices)
    if np.any(indices < 0):  # BCOO.todense would wrap them to the far end
        where = tuple(int(i) for i in indices[np.nonzero(np.any(indices < 0, axis=-1))[0][0]])
        raise ValueError(f"`m` has a negative index {where}; BCOO indices lie in [0, shape).")
    return cast_storage(m.todense(), stype)
