"""Optional native CPU kernels, registered with XLA through its typed FFI.

The package builds one small C++ library, ``_kernels``, at install time (see
``setup.py``; the build is optional and needs only a C++17 compiler and
jaxlib's FFI headers). When it is present and passes a self-test on first use,
the CSR products of ``jsr.dot`` run it on CPU:

- ``dot(csr, dense)`` / ``dot(csr, rsp)`` (``csr_dense.cc``): a fused
  gather-scale-accumulate loop that prefetches the rows it is about to read
  and splits the output rows over XLA's intra-op thread pool;
- their ``transpose_a=True`` forms (``csr_t_dense.cc``): a stable radix sort of
  (column, row, value) entries and one pass per distinct column;
- the row gathers and in-place row scatters of the lazy optimizers,
  ``apply_updates``, ``pull_rows`` and ``take``, and the gathers' transpose, a
  sum of rows by id (``rows.cc``; the gather and the sum are the linear
  primitives of ``_rowops.py``): prefetching copy / add loops over the
  listed rows, split over the same pool;
- the id bookkeeping of ``pull_rows``, ``take``, lookup gradients and
  coalescing (``ids.cc``, used by ``_rowops.py``): the sorted unique ids of a
  batch with every id's slot (one radix sort), and the slots of ids in a
  sorted list (an interleaved branchless binary search).
- row-wise AdaGrad's rows (``rowwise_adagrad.cc``, used by
  ``optim/_rowwise_rows.py``): each listed row's mean square added to its
  accumulator and the row's update (learning rate included) written, in one
  pass.

Other platforms (GPU, TPU), other dtypes, and installs without the library run
the pure-XLA implementations (``_dot.py``, ``_rowops.py``,
``optim/_rowwise_rows.py``),
which are the reference the kernels are tested against and which also supply
their derivatives.

The kernels are declared in ``_registry``, loaded by
``_library`` and checked by ``_selftest`` on first use. :func:`use` is the one
rule for whether a kernel runs: the kernels are enabled and it takes the
operands. The environment variable ``JAXSPARSE_ROWS_NATIVE=0`` turns the
kernels off at import; :func:`set_native_kernels` does so at run time. The
same switch (:func:`kernels_switched_on`) turns off the lazy optimizers'
Pallas kernels on GPU (``optim/_fused_rows.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import jax

from .._args import check_flag
from . import _library
from ._library import library_path
from ._registry import (
    CSR_DENSE,
    CSR_T_DENSE,
    GATHER_ROWS,
    KERNELS,
    ROWWISE_ADAGRAD,
    SCATTER_ROWS,
    SEARCH_IDS,
    SUM_ROWS,
    TARGETS,
    UNIQUE_IDS,
    Kernel,
    csr_dense_call,
    csr_t_dense_call,
    gather_rows_call,
    rowwise_adagrad_call,
    scatter_rows_call,
    search_ids_call,
    sum_rows_call,
    supports,
    supports_ids,
    supports_rows,
    supports_rowwise_adagrad,
    unique_ids_call,
)

logger = logging.getLogger("jaxsparse_rows")

_enabled = os.environ.get("JAXSPARSE_ROWS_NATIVE", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
_lock = threading.Lock()
_status: str | None = None  # None: not loaded yet; "ok"; otherwise why the kernels are unusable


def native_kernels_status() -> str:
    """``"ok"`` when the native CPU kernels are loaded and verified, else the
    reason they are not used (e.g. not built). Loads them on the first call.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> status = jsr.native_kernels_status()
      >>> (status == "ok") == jsr.native_kernels_available()
      True
    """
    global _status
    with _lock:
        if _status is None:
            _status = _library.load()
            if _status != "ok":
                logger.info("native kernels unavailable, using XLA: %s", _status)
        return _status


def native_kernels_available() -> bool:
    """Whether the native CPU kernels were built, loaded and passed their self-test.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> isinstance(jsr.native_kernels_available(), bool)
      True
    """
    return native_kernels_status() == "ok"


def native_kernels_enabled() -> bool:
    """Whether ops traced from now on use the native CPU kernels: available and
    not turned off by :func:`set_native_kernels` or ``JAXSPARSE_ROWS_NATIVE=0``.

    They run in programs for one CPU device: a single-device computation (in
    a process with several devices too), and the body of a ``shard_map`` on
    each device's shard. A ``jax.jit`` program that XLA partitions over
    several devices (arrays sharded over a mesh) lowers the same ops to XLA's
    gathers and scatters instead: XLA cannot partition a custom call, and
    would gather a sharded table onto every device to run it.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.native_kernels_enabled() <= jsr.native_kernels_available()
      True
    """
    return _enabled and native_kernels_available()


def kernels_switched_on() -> bool:
    """The user's switch alone (:func:`set_native_kernels`,
    ``JAXSPARSE_ROWS_NATIVE``), whatever is built: it also turns the library's
    GPU kernels on and off."""
    return _enabled


def set_native_kernels(enabled: bool = True) -> None:
    """Turns the native CPU kernels (and the lazy optimizers' GPU kernels) on or off.

    They are on by default wherever they were built. Turning them off makes
    every op use its pure-XLA implementation, e.g. to compare the two. The
    choice is made when a function is traced, so a change clears JAX's
    compilation caches (``jax.clear_caches()``) to make already-jitted
    functions retrace.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> previous = jsr.native_kernels_enabled()
      >>> jsr.set_native_kernels(False); jsr.native_kernels_enabled()
      False
      >>> jsr.set_native_kernels(previous)
    """
    global _enabled
    enabled = check_flag(enabled, "enabled")
    if enabled != _enabled:
        _enabled = enabled
        jax.clear_caches()


def use(kernel: Kernel, *operands: Any, **options: Any) -> bool:
    """Whether ``kernel`` runs for these operands in programs traced now: the
    kernels are enabled (:func:`native_kernels_enabled`) and the kernel takes
    the operands (shapes and dtypes; any object with ``shape`` and ``dtype``).
    Callers then lower through :func:`jaxsparse_rows._kernel_call.kernel_call` (or
    their own primitive), which still picks XLA's ops off CPU and for
    ``jax.export``."""
    return native_kernels_enabled() and kernel.supports(*operands, **options)


__all__ = [
    "CSR_DENSE",
    "CSR_T_DENSE",
    "GATHER_ROWS",
    "KERNELS",
    "ROWWISE_ADAGRAD",
    "SCATTER_ROWS",
    "SEARCH_IDS",
    "SUM_ROWS",
    "TARGETS",
    "UNIQUE_IDS",
    "Kernel",
    "csr_dense_call",
    "csr_t_dense_call",
    "gather_rows_call",
    "kernels_switched_on",
    "library_path",
    "native_kernels_available",
    "native_kernels_enabled",
    "native_kernels_status",
    "rowwise_adagrad_call",
    "scatter_rows_call",
    "search_ids_call",
    "set_native_kernels",
    "sum_rows_call",
    "supports",
    "supports_ids",
    "supports_rows",
    "supports_rowwise_adagrad",
    "unique_ids_call",
    "use",
]
