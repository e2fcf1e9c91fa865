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
  primitives of ``_gather_prim.py``): prefetching copy / add loops over the
  listed rows, split over the same pool;
- the id bookkeeping of ``pull_rows``, ``take``, lookup gradients and
  coalescing (``ids.cc``, used by ``_ids.py``): the sorted unique ids of a
  batch with every id's slot (one radix sort), and the slots of ids in a
  sorted list (an interleaved branchless binary search).
- row-wise AdaGrad's rows (``rowwise_adagrad.cc``, used by
  ``optim/_rowwise_rows.py``): each listed row's mean square added to its
  accumulator and the row's update (learning rate included) written, in one
  pass.

Other platforms (GPU, TPU), other dtypes, and installs without the library run
the pure-XLA implementations (``_dot.py``, ``_row_moves.py``, ``_gather_prim.py``, ``_ids.py``,
``optim/_rowwise_rows.py``),
which are the reference the kernels are tested against and which also supply
their derivatives.

The environment variable ``JAXSPARSE_ROWS_NATIVE=0`` turns the kernels off at
import; :func:`set_native_kernels` does so at run time.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np

logger = logging.getLogger("jaxsparse_rows")

CSR_DENSE_TARGET = "jaxsparse_rows_csr_dense"
CSR_T_DENSE_TARGET = "jaxsparse_rows_csr_t_dense"
GATHER_ROWS_TARGET = "jaxsparse_rows_gather_rows"
SCATTER_ROWS_TARGET = "jaxsparse_rows_scatter_rows"
SUM_ROWS_TARGET = "jaxsparse_rows_sum_rows"
UNIQUE_IDS_TARGET = "jaxsparse_rows_unique_ids"
SEARCH_IDS_TARGET = "jaxsparse_rows_search_ids"
ROWWISE_ADAGRAD_TARGET = "jaxsparse_rows_rowwise_adagrad"
_SYMBOLS = {  # custom-call target -> the library's handler symbol
    CSR_DENSE_TARGET: "jsr_csr_dense",
    CSR_T_DENSE_TARGET: "jsr_csr_t_dense",
    GATHER_ROWS_TARGET: "jsr_gather_rows",
    SCATTER_ROWS_TARGET: "jsr_scatter_rows",
    SUM_ROWS_TARGET: "jsr_sum_rows",
    UNIQUE_IDS_TARGET: "jsr_unique_ids",
    SEARCH_IDS_TARGET: "jsr_search_ids",
    ROWWISE_ADAGRAD_TARGET: "jsr_rowwise_adagrad",
}
TARGETS = tuple(_SYMBOLS)
"""Every custom-call target name of the kernels. A program lowered for
``jax.export`` contains none of them (``_kernel_call``)."""
_VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

_enabled = os.environ.get("JAXSPARSE_ROWS_NATIVE", "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
_lock = threading.Lock()
_status: str | None = None  # None: not loaded yet; "ok"; otherwise why the kernels are unusable
_library: Any = None  # the loaded ctypes library, kept alive for the process


def jaxlib_version() -> str:
    """The running jaxlib's version string."""
    from jaxlib import version

    return version.__version__


def library_path() -> Path | None:
    """The built kernel library next to this file, or None when it was not built."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_kernels{suffix}"
        if candidate.exists():
            return candidate
    return None


def _run_on_cpu(fn, *args) -> Any:
    """``fn(*args)`` compiled ahead of time and run on the CPU device; ``args``
    are pytrees of numpy arrays, the result comes back as numpy arrays.

    The first use of a kernel is often inside a jit trace: compiling and running
    on concrete arrays here keeps the self-test out of the caller's computation.
    ``fn`` is wrapped in a fresh closure so that JAX's trace and compilation
    caches let go of the program once it has run.
    """
    cpu = jax.devices("cpu")[0]
    with jax.transfer_guard("allow"), jax.ensure_compile_time_eval():
        put = jax.tree.map(lambda a: jax.device_put(a, cpu), args)
        compiled = jax.jit(lambda *a: fn(*a)).lower(*put).compile()
        return jax.tree.map(np.asarray, jax.block_until_ready(compiled(*put)))


def _csr_case(rng: np.random.Generator):
    """A small CSR with an empty row, a column id with no row and padding
    slots, big enough for the threaded path; the expected products."""
    m, k, d, per_row = 64, 50, 48, 24
    cols = np.stack([np.sort(rng.choice(k, per_row, replace=False)) for _ in range(m)])
    cols[3, -1] = k  # an id with no row reads zero
    cols = cols.reshape(-1).astype(np.int32)
    indptr = np.arange(0, (m + 1) * per_row, per_row, dtype=np.int32)
    indptr[5:] -= per_row  # row 4 is empty, and the last per_row slots are padding
    vals = rng.standard_normal(m * per_row).astype(np.float32)
    rows = np.repeat(np.arange(m), np.diff(indptr)).astype(np.int32)  # of the used slots
    used, valid = slice(0, len(rows)), cols[: len(rows)] < k
    table = rng.standard_normal((k, d)).astype(np.float32)
    expected = np.zeros((m, d))
    np.add.at(expected, rows[valid], vals[used][valid, None] * table[cols[used][valid]])
    t_table = rng.standard_normal((m, 5)).astype(np.float32)
    t_expected = np.zeros((k, 5))
    np.add.at(t_expected, cols[used][valid], vals[used][valid, None] * t_table[rows[valid]])
    present = np.unique(cols[used][valid])
    args = ((vals, cols, indptr, table), (vals[used], cols[used], rows, t_table))
    return args, k, expected, (present, t_expected[present])


def _rows_cases(rng: np.random.Generator):
    """Row gathers and scatters at sorted ids with a padding id and an id past
    the table, on the one-thread and the threaded path (the second case just
    over the threshold, to keep the test's memory small); the expected results."""
    cases = []
    for n, k, d in ((40, 7, 3), (600, 520, 64)):
        table = rng.standard_normal((n, d)).astype(np.float32)
        ids = np.sort(rng.choice(n, k - 2, replace=False))
        ids = np.concatenate([ids, [n, n + 5]]).astype(np.int32)
        rows = rng.standard_normal((k, d)).astype(np.float32)
        live = ids < n
        gathered = np.where(live[:, None], table[np.minimum(ids, n - 1)], 0)
        scattered = []
        for add in (False, True):
            out = table.copy()
            out[ids[live]] = rows[live] + (table[ids[live]] if add else 0)
            scattered.append(out)
        cases.append(((table, ids, rows), (gathered, *scattered)))
    return cases


def _sum_case(rng: np.random.Generator):
    """Rows summed at unsorted, repeated, negative and too-large ids, with a row
    width that is not a whole number of cache lines and enough rows for the
    threaded path; small integers, so any summation order is exact."""
    n, k, d = 50, 1500, 24
    ids = rng.integers(-2, n + 2, k).astype(np.int32)
    rows = rng.integers(-4, 5, (k, d)).astype(np.float32)
    live = (ids >= 0) & (ids < n)
    expected = np.zeros((n, d), np.float32)
    np.add.at(expected, ids[live], rows[live])
    return (rows, ids), n, expected


def _rowwise_case(rng: np.random.Generator):
    """Row-wise AdaGrad's accumulator update at sorted ids with a padding id and
    an id past the table, rows wide enough for the threaded path, and one row
    whose accumulator stays 0 with eps = 0; the expected (acc, direction)."""
    n, k, d = 600, 520, 64
    alpha = -0.5
    acc = rng.random(n).astype(np.float32)
    ids = np.sort(rng.choice(n, k - 2, replace=False))
    ids = np.concatenate([ids, [n, n + 5]]).astype(np.int32)
    acc[ids[0]] = 0.0
    grad = rng.standard_normal((k, d)).astype(np.float32)
    grad[0] = 0.0
    live = ids < n
    want = acc.astype(np.float64)
    want[ids[live]] += (grad[live].astype(np.float64) ** 2).mean(axis=1)
    denom = np.sqrt(want[ids[live]])
    scale = np.zeros(k)
    scale[live] = np.where(denom == 0, 0.0, 1.0 / np.where(denom == 0, 1.0, denom))
    args = (acc, ids, grad, np.float32(0.0), np.float32(alpha))
    return args, (want, grad * scale[:, None] * alpha)


def _ids_case(rng: np.random.Generator):
    """Ids with repeats, padding and out-of-range ids, big enough for the radix
    sort, unique-d into a capacity that leaves the largest out; queries of a
    sorted padded list. The expected (uniq, count, slots) and search slots."""
    n_rows, cap = 500, 300
    ids = rng.integers(-3, n_rows + 3, 1000).astype(np.int32)
    valid = ids[(ids >= 0) & (ids < n_rows)]
    present = np.unique(valid)
    uniq = np.full(cap, n_rows, np.int32)
    uniq[: min(cap, len(present))] = present[:cap]

    def slots_of(sorted_ids, queries):
        pos = np.searchsorted(sorted_ids, queries)
        pos = np.minimum(pos, len(sorted_ids) - 1)
        hit = (sorted_ids[pos] == queries) & (queries >= 0) & (queries < n_rows)
        return np.where(hit, pos, len(sorted_ids)).astype(np.int32)

    expected = (uniq, np.int32(len(present)), slots_of(uniq, ids))
    return (ids, uniq), n_rows, cap, expected


def _self_test() -> str:
    """Runs every kernel once, in one small program compiled once, against
    numpy; returns "ok" or which kernel went wrong."""
    rng = np.random.default_rng(0)
    (csr_args, t_args), k, expected, (present, t_expected) = _csr_case(rng)
    rows_cases = _rows_cases(rng)
    sum_args, sum_n, sum_expected = _sum_case(rng)
    (ids, uniq_in), n_rows, cap, ids_expected = _ids_case(rng)
    rowwise_args, rowwise_expected = _rowwise_case(rng)

    def probe(csr_args, t_args, rows_args, sum_args, ids_args, rowwise_args):
        return (
            csr_dense_call(*csr_args),
            csr_t_dense_call(*t_args, k),
            [
                (
                    gather_rows_call(t, i),
                    scatter_rows_call(t, i, r, False),
                    scatter_rows_call(t, i, r, True),
                )
                for t, i, r in rows_args
            ],
            sum_rows_call(*sum_args, sum_n),
            unique_ids_call(ids_args[0], n_rows, cap),
            search_ids_call(ids_args[1], ids_args[0], n_rows),
            rowwise_adagrad_call(*rowwise_args),
        )

    got, (idx, data), rows_got, sum_got, unique_got, search_got, rowwise_got = _run_on_cpu(
        probe,
        csr_args,
        t_args,
        [args for args, _ in rows_cases],
        sum_args,
        (ids, uniq_in),
        rowwise_args,
    )
    if not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        return "the self-test product differed from numpy"
    n = len(present)
    if not (
        np.array_equal(idx[:n], present)
        and (idx[n:] == k).all()
        and np.allclose(data[:n], t_expected, rtol=1e-4, atol=1e-4)
        and not data[n:].any()
    ):
        return "the self-test transposed product differed from numpy"
    for (_, want), results in zip(rows_cases, rows_got, strict=True):
        for what, w, r in zip(("gather", "scatter", "scatter-add"), want, results, strict=True):
            if not np.array_equal(r, w):
                return f"the self-test row {what} differed from numpy"
    if not np.array_equal(sum_got, sum_expected):
        return "the self-test sum of rows differed from numpy"
    if not all(np.array_equal(g, w) for g, w in zip(unique_got, ids_expected, strict=True)):
        return "the self-test unique ids differed from numpy"
    if not np.array_equal(search_got, ids_expected[2]):
        return "the self-test id search differed from numpy"
    pairs = zip(rowwise_got, rowwise_expected, strict=True)
    if not all(np.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in pairs):
        return "the self-test row-wise AdaGrad update differed from numpy"
    return "ok"


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.8.1"`` -> ``(0, 8, 1)``; stops at the first part that is not a number
    (``"0.9.0.dev20250101"`` -> ``(0, 9, 0)``)."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def _jaxlib_mismatch(built: str, running: str) -> str | None:
    """Why kernels compiled against jaxlib ``built`` must not be registered with
    jaxlib ``running``, or None when they may be.

    XLA accepts handlers of its own FFI API version or older, and refuses a
    newer one in a way that leaves the CPU backend unable to start. An older
    jaxlib at run time than at build time (e.g. ``pip install`` built the
    kernels in an isolated environment with the newest jaxlib) is therefore
    refused here, before anything is registered.

    Example:
      >>> from jaxsparse_rows._native import _jaxlib_mismatch
      >>> _jaxlib_mismatch("0.8.1", "0.10.2") is None
      True
      >>> print(_jaxlib_mismatch("0.10.2", "0.8.1"))  # doctest: +ELLIPSIS
      the kernels were built against jaxlib 0.10.2 but jaxlib 0.8.1 is running; ...
    """
    b, r = _version_tuple(built), _version_tuple(running)
    if b and r and r >= b:
        return None
    return (
        f"the kernels were built against jaxlib {built} but jaxlib {running} is running; "
        "rebuild them with the running jaxlib: pip install --no-build-isolation "
        "--force-reinstall --no-deps jaxsparse_rows (from its source)"
    )


def _load() -> str:
    global _library
    path = library_path()
    if path is None:
        return "the _kernels library was not built (it needs a C++17 compiler at install time)"
    try:
        _library = ctypes.cdll.LoadLibrary(str(path))
        built_with = _library.jsr_built_with_jaxlib
        built_with.restype = ctypes.c_char_p
        mismatch = _jaxlib_mismatch(built_with().decode(), jaxlib_version())
        if mismatch:
            return mismatch
        jax.devices("cpu")  # start the backend first: a refused handler then fails alone
        for target, symbol in _SYMBOLS.items():
            handler = jax.ffi.pycapsule(getattr(_library, symbol))
            jax.ffi.register_ffi_target(target, handler, platform="cpu")
        return _self_test()
    except Exception as err:  # any failure means: use the XLA path
        return f"{type(err).__name__}: {err}"


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
            _status = _load()
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
    """Whether ops traced from now on use the native CPU kernels: available, not
    turned off by :func:`set_native_kernels` or ``JAXSPARSE_ROWS_NATIVE=0``, and
    a single CPU device.

    With several CPU devices (``--xla_force_host_platform_device_count``, or a
    multi-process CPU run) an array may be sharded across them, and XLA cannot
    partition a custom call: it would gather a sharded table onto every device.
    The XLA ops, which it partitions, are used there instead.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.native_kernels_enabled() <= jsr.native_kernels_available()
      True
    """
    return _enabled and native_kernels_available() and _single_cpu_device()


def _single_cpu_device() -> bool:
    try:
        return len(jax.devices("cpu")) == 1
    except RuntimeError:  # no CPU backend
        return False


def set_native_kernels(enabled: bool = True) -> None:
    """Turns the native CPU kernels on or off.

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
    from .._util import check_flag

    global _enabled
    enabled = check_flag(enabled, "enabled")
    if enabled != _enabled:
        _enabled = enabled
        jax.clear_caches()


def supports(vals: Any, table: Any, *ids: Any) -> bool:
    """Whether the kernels handle these operands: float32/float64 ``vals`` and
    ``table`` of one dtype, int32/int64 ``ids`` of one dtype, nothing empty.

    One value dtype for both operands is also what keeps mixed-dtype products
    (e.g. a bfloat16 table) in XLA, which casts only the gathered rows instead
    of the whole ``[K, D]`` table.
    """
    vdt = np.dtype(vals.dtype)
    idts = {np.dtype(i.dtype) for i in ids}
    return (
        vdt in _VALUE_DTYPES
        and np.dtype(table.dtype) == vdt
        and len(idts) == 1
        and idts <= set(_INDEX_DTYPES)
        and table.ndim >= 1
        and vals.size > 0
        and table.size > 0
    )


def csr_dense_call(vals: Any, cols: Any, indptr: Any, table: Any) -> jax.Array:
    """The raw FFI call: ``out[r] = sum_j vals[j] * table[cols[j]]`` over row ``r``'s
    entries ``indptr[r] <= j < indptr[r+1]``; ids outside ``[0, K)`` read zero.

    CPU only and not differentiable by itself: ``jsr.dot`` wraps it with a JVP
    written in XLA ops. Batching runs the kernel once per batch element.
    """
    out = jax.ShapeDtypeStruct((indptr.shape[0] - 1,) + tuple(table.shape[1:]), table.dtype)
    call = jax.ffi.ffi_call(CSR_DENSE_TARGET, out, vmap_method="sequential")
    return call(vals, cols, indptr, table)


def csr_t_dense_call(vals: Any, cols: Any, rows: Any, table: Any, k: int):
    """The raw FFI call of the transposed product: ``(indices, data)`` of the
    row-sparse ``sum_j vals[j] * table[rows[j]]`` grouped by column ``cols[j]``.

    ``indices`` holds the distinct column ids in ``[0, k)``, sorted and padded
    with ``k`` to ``min(nse, k)`` slots; ``data`` the matching sums (zero in
    padding slots). Row ids outside the table read zero. CPU only and not
    differentiable by itself (``jsr.dot`` adds an XLA JVP).
    """
    cap = min(int(vals.shape[0]), int(k))
    out = (
        jax.ShapeDtypeStruct((cap,), cols.dtype),
        jax.ShapeDtypeStruct((cap,) + tuple(table.shape[1:]), table.dtype),
    )
    call = jax.ffi.ffi_call(CSR_T_DENSE_TARGET, out, vmap_method="sequential")
    return call(vals, cols, rows, table, k=np.int64(k))


_ROW_DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.float16,
        np.float32,
        np.float64,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.bool_,
    )
) + (np.dtype(jax.numpy.bfloat16),)


def supports_rows(table: Any, ids: Any, *, add: bool = False) -> bool:
    """Whether the row kernels handle ``table[ids]`` (and a scatter or a sum of
    rows into it): a table (anything with ``shape`` and ``dtype``) with at
    least one row and one element per row, of a plain numeric dtype
    (float32/float64 when ``add``), and non-empty 1-D int32/int64 ids."""
    shape = tuple(table.shape)
    ok = _VALUE_DTYPES if add else _ROW_DTYPES
    return (
        np.dtype(table.dtype) in ok
        and np.dtype(ids.dtype) in _INDEX_DTYPES
        and ids.ndim == 1
        and ids.shape[0] > 0
        and len(shape) >= 1
        and int(np.prod(shape)) > 0
    )


def gather_rows_call(table: Any, ids: Any) -> jax.Array:
    """The raw FFI call: ``out[i] = table[ids[i]]``, a zero row where ``ids[i]``
    is outside ``[0, N)``. CPU only and not differentiable by itself."""
    out = jax.ShapeDtypeStruct(tuple(ids.shape) + tuple(table.shape[1:]), table.dtype)
    return jax.ffi.ffi_call(GATHER_ROWS_TARGET, out, vmap_method="sequential")(table, ids)


def scatter_rows_call(table: Any, ids: Any, rows: Any, add: bool = False) -> jax.Array:
    """The raw FFI call: ``table`` with ``table[ids[i]] = rows[i]`` (``+=`` when
    ``add``); ids outside ``[0, N)`` are dropped. The result aliases ``table``, so
    XLA updates a donated (or dead) table in place. CPU only and not
    differentiable by itself."""
    out = jax.ShapeDtypeStruct(tuple(table.shape), table.dtype)
    call = jax.ffi.ffi_call(
        SCATTER_ROWS_TARGET, out, vmap_method="sequential", input_output_aliases={0: 0}
    )
    return call(table, ids, rows, add=bool(add))


def sum_rows_call(rows: Any, ids: Any, n: int) -> jax.Array:
    """The raw FFI call: ``out = zeros([n, ...]); out[ids[i]] += rows[i]`` for
    1-D ``ids`` in any order (repeats summed, ids outside ``[0, n)`` dropped),
    float32/float64 rows. CPU only and not differentiable by itself (the
    primitive of ``_gather_prim`` lowers to it)."""
    out = jax.ShapeDtypeStruct((int(n),) + tuple(rows.shape[1:]), rows.dtype)
    return jax.ffi.ffi_call(SUM_ROWS_TARGET, out, vmap_method="sequential")(rows, ids)


def supports_rowwise_adagrad(acc: Any, ids: Any, grad: Any) -> bool:
    """Whether :func:`rowwise_adagrad_call` takes these operands: a 1-D
    float32/float64 accumulator with at least one row, gradient rows
    ``[K, ...]`` of its dtype with at least one element each, and non-empty
    1-D int32/int64 ``ids`` of length ``K``."""
    return (
        np.dtype(acc.dtype) in _VALUE_DTYPES
        and np.dtype(grad.dtype) == np.dtype(acc.dtype)
        and len(acc.shape) == 1
        and acc.shape[0] > 0
        and np.dtype(ids.dtype) in _INDEX_DTYPES
        and ids.ndim == 1
        and ids.shape[0] > 0
        and grad.ndim >= 1
        and grad.shape[0] == ids.shape[0]
        and int(np.prod(grad.shape)) > 0
    )


def rowwise_adagrad_call(acc: Any, ids: Any, grad: Any, eps: Any, alpha: Any):
    """The raw FFI call of row-wise AdaGrad's per-row work: ``(acc, u)`` with
    ``acc[ids[i]] += mean(grad[i] ** 2)`` and the direction rows ``u[i] =
    (grad[i] * scale) * alpha``, ``scale = 1 / (sqrt(acc[ids[i]]) + eps)``
    (0 where that denominator is 0; ``u[i] = 0`` for ids outside ``[0, N)``);
    ``eps`` and ``alpha`` are scalar arrays of the accumulator's dtype. The
    accumulator result aliases ``acc``. CPU only and not differentiable by
    itself."""
    out = (
        jax.ShapeDtypeStruct(tuple(acc.shape), acc.dtype),
        jax.ShapeDtypeStruct(tuple(grad.shape), acc.dtype),
    )
    call = jax.ffi.ffi_call(
        ROWWISE_ADAGRAD_TARGET, out, vmap_method="sequential", input_output_aliases={0: 0}
    )
    return tuple(call(acc, ids, grad, eps, alpha))


def supports_ids(ids: Any) -> bool:
    """Whether the id kernels take ``ids``: non-empty, 1-D, int32/int64."""
    return np.dtype(ids.dtype) in _INDEX_DTYPES and ids.ndim == 1 and ids.shape[0] > 0


def unique_ids_call(ids: Any, n_rows: int, capacity: int):
    """The raw FFI call: ``(uniq, count, slots)`` of 1-D ``ids``, all of their
    dtype. ``uniq[capacity]`` holds the sorted distinct ids in ``[0, n_rows)``
    (the smallest ``capacity`` of them), padded with ``n_rows``; ``count`` how
    many distinct valid ids there are; ``slots[i]`` the position of ``ids[i]``
    in ``uniq``, or ``capacity`` where it is outside ``[0, n_rows)`` or left
    out. CPU only; integer results, so nothing to differentiate. The target
    exists once :func:`native_kernels_status` has loaded the library (callers
    check :func:`native_kernels_enabled` first)."""
    out = (
        jax.ShapeDtypeStruct((capacity,), ids.dtype),
        jax.ShapeDtypeStruct((), ids.dtype),
        jax.ShapeDtypeStruct(ids.shape, ids.dtype),
    )
    call = jax.ffi.ffi_call(UNIQUE_IDS_TARGET, out, vmap_method="sequential")
    return tuple(call(ids, n_rows=np.int64(n_rows)))


def search_ids_call(sorted_ids: Any, queries: Any, n_rows: int) -> jax.Array:
    """The raw FFI call: the position of each of the 1-D ``queries`` in the
    ascending ``sorted_ids`` (same dtype), or ``len(sorted_ids)`` where absent
    or outside ``[0, n_rows)``. CPU only; needs the library loaded, as
    :func:`unique_ids_call`."""
    out = jax.ShapeDtypeStruct(queries.shape, queries.dtype)
    call = jax.ffi.ffi_call(SEARCH_IDS_TARGET, out, vmap_method="sequential")
    return call(sorted_ids, queries, n_rows=np.int64(n_rows))


__all__ = [
    "native_kernels_available",
    "native_kernels_enabled",
    "set_native_kernels",
    "native_kernels_status",
    "supports",
    "csr_dense_call",
    "csr_t_dense_call",
    "supports_rows",
    "gather_rows_call",
    "scatter_rows_call",
    "sum_rows_call",
    "supports_rowwise_adagrad",
    "rowwise_adagrad_call",
    "supports_ids",
    "unique_ids_call",
    "search_ids_call",
    "library_path",
]
