"""Data input (``jsr.io``): LibSVM files and fixed-shape CSR mini-batches.

A jitted training step sees batches of one shape per nnz bucket, so it
compiles at most once per bucket. For data-parallel input, ``num_parts`` and
``part_index`` make each reader read one part of the rows (one per process
or device); across the parts every row is read exactly once.
"""

from ._iter import Batch as Batch
from ._iter import CSRIter as CSRIter
from ._iter import LibSVMIter as LibSVMIter
from ._iter import nnz_bucket as nnz_bucket
from ._iter import stack_batches as stack_batches
from ._libsvm import load_libsvm as load_libsvm
from ._libsvm import save_libsvm as save_libsvm

__all__ = [
    "Batch",
    "CSRIter",
    "LibSVMIter",
    "load_libsvm",
    "nnz_bucket",
    "save_libsvm",
    "stack_batches",
]
