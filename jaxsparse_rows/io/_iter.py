"""Fixed-shape CSR batches: ``CSRIter`` over in-memory data, ``LibSVMIter``
streaming a file, and the bucketing that keeps a jitted step's compilations
to one per nnz bucket."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._args import as_data, check_flag, check_static_int
from .._csr import CSR, csr_matrix
from .._dtypes import index_dtype
from ._libsvm import (
    Parsed,
    check_feature_count,
    check_num_features,
    check_value_dtype,
    header_zero_based,
    parse_part,
    read_header,
    shift_ids,
)
from ._parts import check_parts, part_bounds

_LAST_BATCH = ("discard", "pad", "roll_over")


class Batch(NamedTuple):
    """One fixed-shape mini-batch.

    Attributes:
      x: CSR ``[batch_size, K]`` whose entry capacity ``x.nse`` is a bucket
        (padding slots past ``indptr[-1]`` carry column id ``K`` and zero data).
      y: ``[batch_size, ...]`` labels; rows past ``num_rows`` are zero.
      num_rows: int32 scalar, the number of real rows (``< batch_size`` only
        for a padded last batch). It is an array, so it does not recompile.

    Example:
      >>> import jaxsparse_rows as jsr, numpy as np
      >>> x = jsr.csr_matrix(np.eye(3, dtype=np.float32))
      >>> b = list(jsr.io.CSRIter(x, np.array([1., 2., 3.]), batch_size=2))[-1]
      >>> b.x, b.y
      (CSR(float32[2, 3], nnz=1, nse=16), Array([3., 0.], dtype=float32))
      >>> b.num_rows, b.mask
      (Array(1, dtype=int32), Array([ True, False], dtype=bool))
    """

    x: CSR
    y: jax.Array
    num_rows: jax.Array

    @property
    def mask(self) -> jax.Array:
        """``[batch_size]`` boolean mask of the real rows (works under jit)."""
        return jnp.arange(self.x.shape[0]) < self.num_rows


def nnz_bucket(nnz: int, buckets: Sequence[int] | None = None, minimum: int = 16) -> int:
    """The entry capacity for a batch holding ``nnz`` entries.

    The smallest of ``buckets`` that holds ``nnz``; with no ``buckets``, or
    when ``nnz`` exceeds them all, the smallest power of two ``>= max(nnz,
    minimum)``. A batch therefore never loses entries: it moves to a larger
    bucket.

    Args:
      nnz: the number of entries, an int ``>= 0``.
      buckets: ``None``, or a non-empty sequence of allowed capacities (ints
        ``>= 1``, in any order; duplicates are ignored).
      minimum: the smallest power-of-two capacity, an int ``>= 1``.

    Returns:
      The capacity, an int ``>= nnz``.

    Raises:
      TypeError: ``nnz``, ``minimum`` or a bucket is not an int (bools and
        floats are refused), or ``buckets`` is not a sequence.
      ValueError: ``nnz`` is negative, ``minimum`` or a bucket is below 1, or
        ``buckets`` is empty.

    Example:
      >>> from jaxsparse_rows.io import nnz_bucket
      >>> nnz_bucket(3), nnz_bucket(100), nnz_bucket(100, buckets=[256, 64])
      (16, 128, 256)
      >>> nnz_bucket(100, buckets=64)
      Traceback (most recent call last):
        ...
      TypeError: `buckets` must be None or a sequence of ints >= 1 (e.g. [64, 256]), got int 64.
    """
    nnz = check_static_int(nnz, "nnz", minimum=0)
    minimum = check_static_int(minimum, "minimum", minimum=1)
    return _bucket(nnz, _check_buckets(buckets, "buckets"), minimum)


def _bucket(nnz: int, buckets: tuple[int, ...] | None, minimum: int) -> int:
    """:func:`nnz_bucket` for checked arguments (``buckets`` sorted, unique)."""
    if buckets is not None and nnz <= buckets[-1]:
        return next(b for b in buckets if b >= nnz)
    cap = max(nnz, minimum, 1)
    return 1 << (cap - 1).bit_length()


def _check_buckets(buckets: Any, name: str = "nnz_buckets") -> tuple[int, ...] | None:
    """``None``, or ``buckets`` (a non-empty flat sequence of ints >= 1) sorted
    and without duplicates; errors name the argument ``name``."""
    if buckets is None:
        return None
    if isinstance(buckets, str | bytes) or not isinstance(buckets, Sequence | np.ndarray):
        raise TypeError(
            f"`{name}` must be None or a sequence of ints >= 1 (e.g. [64, 256]), got "
            f"{type(buckets).__name__} {buckets!r}."
        )
    if np.ndim(buckets) != 1:
        raise ValueError(f"`{name}` must be a flat sequence of ints >= 1, got {buckets!r}.")
    out = tuple(check_static_int(b, f"{name}[{i}]", minimum=1) for i, b in enumerate(buckets))
    if not out:
        raise ValueError(
            f"`{name}` must be None (powers of two) or a non-empty sequence of ints >= 1, "
            f"got {buckets!r}."
        )
    return tuple(sorted(set(out)))


def _check_common(batch_size: Any, last_batch: str) -> int:
    batch_size = check_static_int(batch_size, "batch_size", minimum=1)
    if last_batch not in _LAST_BATCH:
        raise ValueError(f"`last_batch` must be one of {_LAST_BATCH}, got {last_batch!r}.")
    return batch_size


class _Rows(NamedTuple):
    """Host CSR rows (0-based column ids) with labels."""

    data: np.ndarray
    cols: np.ndarray
    indptr: np.ndarray
    y: np.ndarray

    @property
    def n(self) -> int:
        return self.indptr.size - 1

    def take(self, rows: np.ndarray) -> _Rows:
        """The listed rows, in order (vectorised segment gather)."""
        starts = self.indptr[rows]
        lens = self.indptr[rows + 1] - starts
        ptr = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lens, out=ptr[1:])
        pos = np.repeat(starts - ptr[:-1], lens) + np.arange(ptr[-1])
        return _Rows(self.data[pos], self.cols[pos], ptr, self.y[rows])

    def slice(self, a: int, b: int) -> _Rows:
        lo, hi = self.indptr[a], self.indptr[b]
        return _Rows(self.data[lo:hi], self.cols[lo:hi], self.indptr[a : b + 1] - lo, self.y[a:b])

    @staticmethod
    def concat(a: _Rows, b: _Rows) -> _Rows:
        ptr = np.concatenate([a.indptr, a.indptr[-1] + b.indptr[1:]])
        return _Rows(
            np.concatenate([a.data, b.data]),
            np.concatenate([a.cols, b.cols]),
            ptr,
            np.concatenate([a.y, b.y]),
        )


def _to_batch(rows: _Rows, batch_size: int, num_features: int, buckets, minimum: int) -> Batch:
    """Pads ``rows`` (at most ``batch_size``) to a fixed-shape :class:`Batch`."""
    n, nnz = rows.n, int(rows.indptr[-1])
    cap = _bucket(nnz, buckets, minimum)
    idt = index_dtype()
    data = np.zeros(cap, rows.data.dtype)
    data[:nnz] = rows.data
    cols = np.full(cap, num_features, idt)
    cols[:nnz] = rows.cols
    ptr = np.full(batch_size + 1, nnz, idt)
    ptr[: n + 1] = rows.indptr
    y = np.zeros((batch_size,) + rows.y.shape[1:], rows.y.dtype)
    y[:n] = rows.y
    data, cols, ptr, y, count = jax.device_put((data, cols, ptr, y, np.int32(n)))
    return Batch(CSR._make(data, cols, ptr, (batch_size, num_features)), y, count)


class _Batcher:
    """Shared batching state: bucket choice and the last-batch policy."""

    batch_size: int
    num_features: int
    last_batch: str
    _buckets: tuple[int, ...] | None
    _min_nnz: int
    _carry: _Rows | None

    def _emit(self, rows_iter: Iterator[_Rows]) -> Iterator[Batch]:
        m = self.batch_size
        pending = self._carry
        self._carry = None
        for block in rows_iter:
            pending = block if pending is None else _Rows.concat(pending, block)
            full = pending.n // m
            for i in range(full):
                yield self._batch(pending.slice(i * m, (i + 1) * m))
            pending = pending.slice(full * m, pending.n)
        if pending is not None and pending.n:
            if self.last_batch == "pad":
                yield self._batch(pending)
            elif self.last_batch == "roll_over":
                self._carry = pending

    def _batch(self, rows: _Rows) -> Batch:
        return _to_batch(rows, self.batch_size, self.num_features, self._buckets, self._min_nnz)


class CSRIter(_Batcher):
    """Fixed-shape mini-batches over an in-memory CSR matrix (MXNet's NDArrayIter).

    Each epoch (each ``iter()``) yields :class:`Batch` es of ``batch_size``
    rows; a batch's entry capacity is a bucket (:func:`nnz_bucket`), so a
    jitted step compiles at most once per bucket.

    Args:
      csr: a :class:`~jaxsparse_rows.CSR` ``[N, K]`` (or anything
        :func:`jsr.csr_matrix <jaxsparse_rows.csr_matrix>` accepts).
      labels: ``[N, ...]`` labels.
      batch_size: rows per batch ``M``.
      shuffle: ``True`` to visit rows in a new random order every epoch.
      seed: an int ``>= 0``, the seed of the shuffling (epoch ``e`` uses
        ``(seed, e)``).
      last_batch: what to do with the last ``N % M`` rows of an epoch:
        ``"pad"`` (default) yields a batch padded with empty rows and zero
        labels (``num_rows`` tells how many are real); ``"discard"`` drops
        them; ``"roll_over"`` keeps them for the start of the next epoch.
      nnz_buckets: a sequence of allowed entry capacities (ints >= 1);
        default: powers of two.
      min_nnz: smallest default bucket (default 16).
      num_parts: the number of parts the rows are split into for
        data-parallel input (one per process or device); default 1, all rows.
      part_index: the part this iterator reads, ``0 <= part_index <
        num_parts``. Part ``p`` is the contiguous row range ``[N * p //
        num_parts, N * (p + 1) // num_parts)`` (:attr:`rows`): the parts
        hold every row exactly once and differ in size by at most one row (a
        part is empty when there are more parts than rows). Shuffling,
        batching and ``last_batch`` apply within the part: epoch ``e`` of
        part ``p`` visits its rows in the order drawn from ``(seed, e)``
        with one part, from ``(seed, e, p)`` with several.

    Attributes:
      rows: the ``range`` of the rows of ``csr`` that this iterator reads
        (all of them with one part).

    Raises:
      TypeError, ValueError: naming the bad argument, at construction.

    Example:
      >>> import jaxsparse_rows as jsr, numpy as np
      >>> x = jsr.csr_matrix(np.eye(5, 3, dtype=np.float32))
      >>> batches = list(jsr.io.CSRIter(x, np.arange(5.), batch_size=2))
      >>> len(batches), batches[-1].num_rows, batches[-1].mask, batches[-1].x.nse
      (3, Array(1, dtype=int32), Array([ True, False], dtype=bool), 16)

      Part 1 of 2 (process 1 of 2, say) reads rows 2, 3 and 4:

      >>> it = jsr.io.CSRIter(x, np.arange(5.), batch_size=2, num_parts=2, part_index=1)
      >>> it.rows, len(it), [b.y.tolist() for b in it]
      (range(2, 5), 2, [[2.0, 3.0], [4.0, 0.0]])
    """

    def __init__(
        self,
        csr: Any,
        labels: Any,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        last_batch: str = "pad",
        nnz_buckets: Sequence[int] | None = None,
        min_nnz: int = 16,
        *,
        num_parts: int = 1,
        part_index: int = 0,
    ):
        self.batch_size = _check_common(batch_size, last_batch)
        self.last_batch = last_batch
        shuffle, seed = check_flag(shuffle, "shuffle"), check_static_int(seed, "seed", minimum=0)
        self.num_parts, self.part_index = check_parts(num_parts, part_index)
        csr = csr_matrix(csr)
        indptr = np.asarray(csr.indptr).astype(np.int64)
        nnz = int(indptr[-1])
        y = as_data(labels, host=True, name="labels")  # refuses values int32 would wrap
        y = y.astype(jax.dtypes.canonicalize_dtype(y.dtype))
        if y.ndim == 0 or y.shape[0] != csr.shape[0]:
            raise ValueError(
                f"`labels` must have a leading dimension of {csr.shape[0]} (the rows of `csr`), "
                f"got shape {y.shape}."
            )
        self.rows = range(*part_bounds(csr.shape[0], self.num_parts, self.part_index))
        rows = _Rows(np.asarray(csr.data)[:nnz], np.asarray(csr.indices)[:nnz], indptr, y)
        if self.num_parts > 1:  # a copy, so that the part does not keep the whole data
            rows = _Rows(*(np.array(a) for a in rows.slice(self.rows.start, self.rows.stop)))
        self._rows = rows
        self.num_features = csr.shape[1]
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._buckets = _check_buckets(nnz_buckets)
        self._min_nnz = check_static_int(min_nnz, "min_nnz", minimum=1)
        self._carry = None

    def __len__(self) -> int:
        """Batches per epoch (without a rolled-over remainder)."""
        n, m = self._rows.n, self.batch_size
        return n // m + (1 if self.last_batch == "pad" and n % m else 0)

    def __iter__(self) -> Iterator[Batch]:
        n = self._rows.n
        if self.shuffle:
            key = [self.seed, self.epoch] + ([self.part_index] if self.num_parts > 1 else [])
            order = np.random.default_rng(key).permutation(n)
            block = self._rows.take(order)
        else:
            block = self._rows
        self.epoch += 1
        return self._emit(iter([block]))


class LibSVMIter(_Batcher):
    """Streams a LibSVM file in chunks and yields fixed-shape batches.

    The file is read ``chunk_bytes`` at a time (cut at a line end) and parsed
    with the vectorised parser of :func:`load_libsvm`, so a file larger than
    memory can be trained on; each ``iter()`` is one pass (epoch). Batches
    are as in :class:`CSRIter`.

    Args:
      path: the LibSVM file.
      batch_size: rows per batch.
      num_features: the column count ``K`` (needed up front when streaming);
        an id beyond it raises ``ValueError`` naming the line.
      zero_based: whether ids count from 0 (default ``False``: the LibSVM
        convention, ids from 1). ``"auto"``: the base recorded in the header
        line that :func:`~jaxsparse_rows.io.save_libsvm` writes; a file
        without one raises when iterated (streaming cannot scan the file for
        a 0 id first). ``True`` or ``False`` must agree with the header's
        base when there is one.
      dtype: dtype of the data and the labels, a floating dtype. A number
        written as a finite value that it cannot hold raises when iterated,
        naming the line and the token, as in :func:`load_libsvm`.
      last_batch: ``"pad"`` (default), ``"discard"`` or ``"roll_over"``.
      nnz_buckets: as in :class:`CSRIter`.
      min_nnz: as in :class:`CSRIter`.
      chunk_bytes: bytes read per chunk (default 4 MiB).
      num_parts: the number of parts the file is split into for
        data-parallel input (one per process or device); default 1, the
        whole file.
      part_index: the part this iterator reads, ``0 <= part_index <
        num_parts``. The parts are contiguous ranges of lines of near-equal
        size in bytes (MXNet's ``LibSVMIter`` ``num_parts`` /
        ``part_index``): the file's bytes are cut into ``num_parts`` equal
        ranges, and a part holds the lines that start in its range. Every
        row is read by exactly one part; the parts hold near-equal row
        counts when the lines have near-equal lengths, and a part may be
        empty. A part seeks to its range and parses only its own lines.
        With several parts, ``zero_based="auto"`` takes the header line's
        base at every part (and raises when iterated if there is none), and
        ``path`` must be a regular file.

    Example:
      >>> import pathlib, tempfile, jaxsparse_rows as jsr
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "toy.svm"
      >>> _ = path.write_text("1 1:2\\n0 3:1 2:4\\n1\\n")
      >>> it = jsr.io.LibSVMIter(path, batch_size=2, num_features=3)
      >>> for b in it:
      ...     print(b.x.asnumpy().tolist(), int(b.num_rows))
      [[2.0, 0.0, 0.0], [0.0, 4.0, 1.0]] 2
      [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]] 1

      Part 1 of 2 holds the lines that start in the second half of the
      file's 18 bytes, here the last one:

      >>> part = jsr.io.LibSVMIter(path, 2, 3, num_parts=2, part_index=1)
      >>> for b in part:
      ...     print(b.y.tolist(), int(b.num_rows))
      [1.0, 0.0] 1
    """

    def __init__(
        self,
        path: str | os.PathLike,
        batch_size: int,
        num_features: int,
        zero_based: bool = False,
        dtype: Any = jnp.float32,
        last_batch: str = "pad",
        nnz_buckets: Sequence[int] | None = None,
        min_nnz: int = 16,
        chunk_bytes: int = 4 << 20,
        *,
        num_parts: int = 1,
        part_index: int = 0,
    ):
        self.batch_size = _check_common(batch_size, last_batch)
        self.last_batch = last_batch
        if zero_based not in (True, False, "auto"):
            raise ValueError(f'`zero_based` must be True, False or "auto", got {zero_based!r}.')
        if not os.path.exists(path):
            raise FileNotFoundError(f"`path` {os.fspath(path)!r} does not exist.")
        self.path = path
        self.zero_based = "auto" if isinstance(zero_based, str) else bool(zero_based)
        self.num_features = check_feature_count(num_features)
        self.dtype = check_value_dtype(dtype)
        self.chunk_bytes = check_static_int(chunk_bytes, "chunk_bytes", minimum=1)
        self._buckets = _check_buckets(nnz_buckets)
        self._min_nnz = check_static_int(min_nnz, "min_nnz", minimum=1)
        self.num_parts, self.part_index = check_parts(num_parts, part_index)
        self._carry = None

    def _no_base(self) -> ValueError:
        return ValueError(
            f'`zero_based="auto"` takes the base of the ids from the header line that '
            f"`jsr.io.save_libsvm` writes, and {os.fspath(self.path)} records none. Pass "
            "`zero_based=True` or `False`, or read the file with `jsr.io.load_libsvm` "
            '(whose "auto" also looks for a 0 id) and batch it with `CSRIter`.'
        )

    def _blocks(self) -> Iterator[_Rows]:
        zero_based = self.zero_based
        if self.num_parts > 1:  # a part may not hold line 1: the header is read first
            zero_based = header_zero_based(
                zero_based, read_header(self.path, self.num_parts), self.path
            )
            if isinstance(zero_based, str):
                raise self._no_base()

        def convert(parsed: Parsed) -> _Rows:
            nonlocal zero_based
            if parsed.header is not None:
                zero_based = header_zero_based(self.zero_based, parsed.header, self.path)
            if isinstance(zero_based, str):
                raise self._no_base()
            return self._rows(parsed, zero_based)

        yield from parse_part(
            self.path, self.chunk_bytes, self.dtype, convert, self.num_parts, self.part_index
        )

    def _rows(self, parsed: Parsed, zero_based: bool) -> _Rows:
        cols = shift_ids(parsed, zero_based, self.path)
        check_num_features(parsed, cols, self.num_features, self.path, 0 if zero_based else 1)
        return _Rows(
            parsed.values.astype(self.dtype),
            cols.astype(index_dtype()),
            parsed.indptr,
            parsed.labels.astype(self.dtype),
        )

    def __iter__(self) -> Iterator[Batch]:
        return self._emit(self._blocks())


def _check_stackable(batches: Sequence[Batch]) -> None:
    """Every batch must be a :class:`Batch` of the first one's shapes and dtypes."""
    for t, b in enumerate(batches):
        if not isinstance(b, Batch):
            raise TypeError(f"`batches[{t}]` must be a jsr.io.Batch, got {type(b).__name__}.")
    first = batches[0]
    for t, b in enumerate(batches[1:], start=1):
        for what, got, want in (
            ("x", b.x.shape, first.x.shape),
            ("y", b.y.shape, first.y.shape),
        ):
            if got != want:
                raise ValueError(
                    f"`batches[{t}].{what}` has shape {got}, but `batches[0].{what}` has shape "
                    f"{want}: every batch must have the same shape to be stacked."
                )
        for what, got, want in (
            ("x", b.x.dtype, first.x.dtype),
            ("x.indices", b.x.indices.dtype, first.x.indices.dtype),
            ("y", b.y.dtype, first.y.dtype),
        ):
            if got != want:
                raise TypeError(
                    f"`batches[{t}].{what}` has dtype {got}, but `batches[0].{what}` has dtype "
                    f"{want}: stacking would cast it. Cast the batches to one dtype first."
                )


def stack_batches(batches: Sequence[Batch]) -> Batch:
    """Stacks batches along a new leading axis, for ``jax.lax.scan``.

    Every batch is padded to the largest entry capacity among them. The result
    is a pytree of arrays with a leading ``[T]`` axis (its ``x`` is not a valid
    CSR by itself); ``lax.scan`` hands the step one ordinary :class:`Batch`
    per iteration.

    Raises:
      ValueError: if ``batches`` is empty, or the batches differ in shape.
      TypeError: if an item is not a :class:`Batch`, or the batches differ in
        the dtype of their data or labels (nothing is cast).

    Example:
      >>> import jax, jaxsparse_rows as jsr, numpy as np
      >>> x = jsr.csr_matrix(np.eye(4, 3, dtype=np.float32))
      >>> stacked = jsr.io.stack_batches(list(jsr.io.CSRIter(x, np.ones(4), 2)))
      >>> stacked.x.data.shape, stacked.num_rows
      ((2, 16), Array([2, 2], dtype=int32))
      >>> def step(carry, b):
      ...     return carry + jax.numpy.sum(b.x.todense()), None
      >>> jax.lax.scan(step, 0.0, stacked)[0]
      Array(3., dtype=float32)
    """
    if not batches:
        raise ValueError("`batches` is empty: nothing to stack.")
    _check_stackable(batches)
    shape = batches[0].x.shape
    host = jax.device_get([(b.x.data, b.x.indices, b.x.indptr, b.y, b.num_rows) for b in batches])
    cap = max(d.shape[0] for d, *_ in host)
    data = np.zeros((len(host), cap), host[0][0].dtype)
    cols = np.full((len(host), cap), shape[1], host[0][1].dtype)
    for t, (d, c, *_) in enumerate(host):  # host-side copies; no per-batch XLA op
        data[t, : d.shape[0]] = d
        cols[t, : c.shape[0]] = c
    ptr, y, n = (np.stack([h[i] for h in host]) for i in (2, 3, 4))
    data, cols, ptr, y, n = jax.device_put((data, cols, ptr, y, n))
    return Batch(CSR._make(data, cols, ptr, shape), y, n)
