"""jaxsparse_rows: row-sparse and CSR arrays, row-sparse gradients and lazy
optimizers for JAX.

Import convention::

    import jaxsparse_rows as jsr
"""

from . import _methods  # noqa: F401  (attaches the operators and methods)
from . import io as io
from . import optim as optim
from . import random as random
from . import svrg as svrg
from . import testing as testing
from ._autodiff import grad as grad
from ._autodiff import value_and_grad as value_and_grad
from ._checks import check as check
from ._checks import check_ids as check_ids
from ._config import StorageFallbackWarning as StorageFallbackWarning
from ._config import is_verbose as is_verbose
from ._config import set_verbose as set_verbose
from ._config import verbose as verbose
from ._csr import CSR as CSR
from ._csr import csr_matrix as csr_matrix
from ._dot import dot as dot
from ._elementwise import ZERO_PRESERVING_UNARY as ZERO_PRESERVING_UNARY
from ._elementwise import abs as abs  # noqa: A004
from ._elementwise import add as add
from ._elementwise import arcsin as arcsin
from ._elementwise import arcsinh as arcsinh
from ._elementwise import arctan as arctan
from ._elementwise import arctanh as arctanh
from ._elementwise import ceil as ceil
from ._elementwise import deg2rad as deg2rad
from ._elementwise import divide as divide
from ._elementwise import expm1 as expm1
from ._elementwise import floor as floor
from ._elementwise import log1p as log1p
from ._elementwise import multiply as multiply
from ._elementwise import negative as negative
from ._elementwise import power as power
from ._elementwise import rad2deg as rad2deg
from ._elementwise import relu as relu
from ._elementwise import rint as rint
from ._elementwise import sign as sign
from ._elementwise import sin as sin
from ._elementwise import sinh as sinh
from ._elementwise import sqrt as sqrt
from ._elementwise import square as square
from ._elementwise import subtract as subtract
from ._elementwise import tan as tan
from ._elementwise import tanh as tanh
from ._elementwise import trunc as trunc
from ._embedding import embedding_bag as embedding_bag
from ._interop import from_bcoo as from_bcoo
from ._interop import from_scipy as from_scipy
from ._interop import to_bcoo as to_bcoo
from ._interop import to_scipy as to_scipy
from ._native import native_kernels_available as native_kernels_available
from ._native import native_kernels_enabled as native_kernels_enabled
from ._native import native_kernels_status as native_kernels_status
from ._native import set_native_kernels as set_native_kernels
from ._reductions import norm as norm
from ._reductions import square_sum as square_sum
from ._reductions import sum as sum  # noqa: A004
from ._reductions import sum_stacked as sum_stacked
from ._rows import pull_rows as pull_rows
from ._rows import retain as retain
from ._rows import take as take
from ._rowsparse import RowSparse as RowSparse
from ._rowsparse import row_sparse_array as row_sparse_array
from ._sharded import sharded_embedding_bag as sharded_embedding_bag
from ._sharded import sharded_take as sharded_take
from ._storage import apply_dense as apply_dense
from ._storage import cast_storage as cast_storage
from ._storage import is_sparse as is_sparse
from ._storage import stype as stype
from ._storage import todense as todense
from ._storage import zeros as zeros

__version__ = "0.1.0"

__all__ = [
    "CSR",
    "RowSparse",
    "StorageFallbackWarning",
    "ZERO_PRESERVING_UNARY",
    "abs",
    "add",
    "apply_dense",
    "arcsin",
    "arcsinh",
    "arctan",
    "arctanh",
    "cast_storage",
    "ceil",
    "check",
    "check_ids",
    "csr_matrix",
    "deg2rad",
    "divide",
    "embedding_bag",
    "dot",
    "expm1",
    "floor",
    "from_bcoo",
    "from_scipy",
    "grad",
    "io",
    "is_sparse",
    "is_verbose",
    "log1p",
    "multiply",
    "native_kernels_available",
    "native_kernels_enabled",
    "native_kernels_status",
    "negative",
    "norm",
    "optim",
    "power",
    "pull_rows",
    "rad2deg",
    "relu",
    "retain",
    "rint",
    "row_sparse_array",
    "set_native_kernels",
    "set_verbose",
    "sharded_embedding_bag",
    "sharded_take",
    "sign",
    "sin",
    "sinh",
    "sqrt",
    "square",
    "square_sum",
    "stype",
    "subtract",
    "sum",
    "sum_stacked",
    "take",
    "tan",
    "tanh",
    "to_bcoo",
    "to_scipy",
    "todense",
    "trunc",
    "value_and_grad",
    "verbose",
    "zeros",
    "random",
    "svrg",
    "testing",
]
