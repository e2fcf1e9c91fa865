"""jsr.io data-parallel input: ``num_parts`` / ``part_index`` of ``CSRIter``,
``LibSVMIter`` and ``load_libsvm`` read every row exactly once across the
parts (against a row-range / byte-range oracle, for several part counts,
more parts than rows included, with shuffling and each ``last_batch``
policy), a part of a file parses only its own lines, errors name the file's
line numbers, and bad arguments are named."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows.io import CSRIter, LibSVMIter

M = 3  # batch size
N = 10  # rows


def rows_of(batches) -> list[int]:
    """The ids (labels) of the real rows of ``batches``, in order."""
    out = []
    for b in batches:
        out.extend(int(v) for v in np.asarray(b.y)[: int(b.num_rows)])
    return out


def check_batch_data(batches, dense: np.ndarray) -> None:
    """Every real row of every batch holds the row of ``dense`` its label names."""
    for b in batches:
        ptr, cols, data = (np.asarray(a) for a in (b.x.indptr, b.x.indices, b.x.data))
        got = np.zeros(b.x.shape, np.float64)
        rows = np.repeat(np.arange(b.x.shape[0]), np.diff(ptr))
        got[rows, cols[: ptr[-1]]] = data[: ptr[-1]]
        n = int(b.num_rows)
        ids = np.asarray(b.y)[:n].astype(int)
        np.testing.assert_array_equal(got[:n], dense[ids])
        assert not got[n:].any()


def epochs_for(last_batch: str) -> int:
    """``roll_over`` carries ``(k * n) % M`` rows after k epochs: none after M."""
    return M if last_batch == "roll_over" else 1


def expected_reads(part: list[int], last_batch: str, shuffle: bool) -> list[int] | None:
    """The rows one pass over ``part`` reads, in order when that is known."""
    if last_batch == "pad":
        return part if not shuffle else None
    if last_batch == "discard":
        return part[: len(part) - len(part) % M] if not shuffle else None
    return None


def check_parts_cover_rows(parts_rows, whole, last_batch, shuffle):
    """``parts_rows[p]``: the rows part p read over ``epochs_for`` epochs;
    ``whole[p]``: the rows part p holds. Every row is read once per epoch
    (pad, roll_over over M epochs) or dropped only at its part's end
    (discard); parts are disjoint and cover the data."""
    flat = [r for part in whole for r in part]
    assert flat == list(range(N))  # contiguous, in order, every row once
    for read, part in zip(parts_rows, whole, strict=True):
        want = expected_reads(part, last_batch, shuffle)
        if want is not None:
            assert read == want
        elif last_batch == "discard":
            assert len(read) == len(part) - len(part) % M
            assert len(set(read)) == len(read) and set(read) <= set(part)
        else:  # pad shuffled: each once; roll_over: each M times
            times = epochs_for(last_batch)
            assert sorted(read) == sorted(part * times)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((N, 6)).astype(np.float32)
    dense[rng.random((N, 6)) > 0.5] = 0
    dense[4] = 0  # an empty row
    return dense


@pytest.mark.parametrize("last_batch", ["pad", "discard", "roll_over"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_csriter_parts_read_every_row_once(data, last_batch, shuffle):
    x = jsr.csr_matrix(data)
    labels = np.arange(N, dtype=np.float32)
    for num_parts in (1, 2, 3, 4, N, N + 3):
        reads, holds = [], []
        for p in range(num_parts):
            it = CSRIter(
                x, labels, M, shuffle=shuffle, seed=3, last_batch=last_batch,
                num_parts=num_parts, part_index=p,
            )  # fmt: skip
            lo, hi = N * p // num_parts, N * (p + 1) // num_parts
            assert it.rows == range(lo, hi)
            epochs = [list(it) for _ in range(epochs_for(last_batch))]
            assert len(epochs[0]) == len(it) or last_batch == "roll_over"
            batches = [b for e in epochs for b in e]
            check_batch_data(batches, data)
            reads.append(rows_of(batches))
            holds.append(list(it.rows))
        sizes = [len(h) for h in holds]
        assert max(sizes) - min(sizes) <= 1  # near-equal
        check_parts_cover_rows(reads, holds, last_batch, shuffle)


def test_csriter_parts_shuffle_within_the_part_per_epoch(data):
    """Each part shuffles its own rows, in a new order every epoch, in an order
    of its own (two parts of equal size do not move in step), and one part is
    the iterator without parts."""
    x, labels = jsr.csr_matrix(data), np.arange(N, dtype=np.float32)
    a, b = (CSRIter(x, labels, 5, shuffle=True, num_parts=2, part_index=p) for p in (0, 1))
    epoch0_a, epoch0_b, epoch1_a = rows_of(a), rows_of(b), rows_of(a)
    assert sorted(epoch0_a) == sorted(epoch1_a) == list(range(5))
    assert sorted(epoch0_b) == list(range(5, 10))
    assert epoch1_a != epoch0_a
    assert epoch0_a != [r - 5 for r in epoch0_b]
    again = CSRIter(x, labels, 5, shuffle=True, num_parts=2, part_index=0)
    assert rows_of(again) == epoch0_a  # deterministic
    one = CSRIter(x, labels, N, shuffle=True, seed=0)
    whole = CSRIter(x, labels, N, shuffle=True, seed=0, num_parts=1, part_index=0)
    assert rows_of(one) == rows_of(whole)


# -- LibSVM files ---------------------------------------------------------------
def write_file(path, data, header=True, extra=True, crlf=False):
    """The rows of ``data`` with labels 0..N-1, as ``save_libsvm`` writes them,
    plus comment and blank lines between rows when ``extra``."""
    jsr.io.save_libsvm(path, jsr.csr_matrix(data), np.arange(data.shape[0]), header=header)
    lines = path.read_text().splitlines()
    if extra:
        lines[3:3] = ["# a comment line", ""]
        lines.insert(7, "   ")
    sep = "\r\n" if crlf else "\n"
    path.write_bytes((sep.join(lines) + sep).encode())
    return path.read_bytes()


def byte_range_oracle(raw: bytes, num_parts: int) -> list[list[int]]:
    """The labels of the rows whose line starts in each part's byte range."""
    size, start, out = len(raw), 0, [[] for _ in range(num_parts)]
    for line in raw.split(b"\n"):
        tokens = line.split(b"#")[0].split()
        if tokens:
            part = next(p for p in range(num_parts) if start < size * (p + 1) // num_parts)
            out[part].append(int(float(tokens[0])))
        start += len(line) + 1
    return out


@pytest.mark.parametrize("last_batch", ["pad", "discard", "roll_over"])
@pytest.mark.parametrize("chunk_bytes", [16, 4 << 20])
def test_libsvmiter_parts_read_every_row_once(tmp_path, data, last_batch, chunk_bytes):
    path = tmp_path / "d.svm"
    raw = write_file(path, data, crlf=chunk_bytes == 16)
    for num_parts in (1, 2, 3, 5, N + 3, len(raw) + 5):
        oracle = byte_range_oracle(raw, num_parts)
        reads = []
        for p in range(num_parts):
            it = LibSVMIter(
                path, M, 6, zero_based="auto", last_batch=last_batch, chunk_bytes=chunk_bytes,
                num_parts=num_parts, part_index=p,
            )  # fmt: skip
            batches = [b for _ in range(epochs_for(last_batch)) for b in it]
            check_batch_data(batches, data)
            reads.append(rows_of(batches))
        check_parts_cover_rows(reads, oracle, last_batch, shuffle=False)


def test_load_libsvm_parts_join_to_the_whole_file(tmp_path, data):
    path = tmp_path / "d.svm"
    raw = write_file(path, data)
    x, y = jsr.io.load_libsvm(path)
    for num_parts in (2, 3, N + 3):
        got = [
            jsr.io.load_libsvm(path, num_parts=num_parts, part_index=p) for p in range(num_parts)
        ]
        for (xp, yp), want in zip(got, byte_range_oracle(raw, num_parts), strict=True):
            assert xp.shape == (len(want), 6)
            np.testing.assert_array_equal(np.asarray(yp), want)
        np.testing.assert_array_equal(np.concatenate([np.asarray(yp) for _, yp in got]), y)
        dense = np.concatenate([xp.asnumpy() for xp, _ in got])
        np.testing.assert_array_equal(dense, x.asnumpy())


def test_a_part_parses_only_its_own_lines(tmp_path, data):
    """A bad token in the first half of the file fails part 0 only; one in the
    second half is named with the file's line number by the part reading it."""
    path = tmp_path / "d.svm"
    lines = write_file(path, data, extra=False).decode().splitlines()
    bad = list(lines)
    bad[1] = "0 1:oops"  # line 2: in part 0 of 2
    path.write_text("\n".join(bad) + "\n")
    assert rows_of(LibSVMIter(path, M, 6, num_parts=2, part_index=1))  # not parsed there
    with pytest.raises(ValueError, match=r"line 2: unexpected character 'o', got token '1:oops'"):
        list(LibSVMIter(path, M, 6, num_parts=2, part_index=0))
    bad = list(lines)
    bad[-2] = "8 9:1"  # line N (row 8): in the last part, id 9 > num_features
    path.write_text("\n".join(bad) + "\n")
    oracle = byte_range_oracle(path.read_bytes(), 3)
    assert 8 in oracle[2] and 8 not in oracle[1]
    assert rows_of(LibSVMIter(path, M, 6, num_parts=3, part_index=1)) == oracle[1]
    for chunk_bytes in (8, 4 << 20):
        it = LibSVMIter(path, M, 6, chunk_bytes=chunk_bytes, num_parts=3, part_index=2)
        with pytest.raises(ValueError, match=rf"d.svm, line {N}: feature id 9 is out of range"):
            list(it)
    with pytest.raises(ValueError, match=rf"d.svm, line {N}: feature id 9 is out of range"):
        jsr.io.load_libsvm(path, num_parts=3, part_index=2)
    bad[-2] = "8 :1"  # line N: a parse error
    path.write_text("\n".join(bad) + "\n")
    with pytest.raises(ValueError, match=rf"line {N}: expected a feature as `id:value`"):
        jsr.io.load_libsvm(path, num_parts=3, part_index=2)


def test_parts_take_the_base_and_the_column_count_from_the_header(tmp_path, data):
    path = tmp_path / "d.svm"
    write_file(path, data, header=False)
    with pytest.raises(
        ValueError, match=r'`zero_based="auto"` with `num_parts` = 2 .* records none'
    ):
        jsr.io.load_libsvm(path, num_parts=2, part_index=1)
    with pytest.raises(ValueError, match=r"`num_features=None` with `num_parts` = 2 .* Pass"):
        jsr.io.load_libsvm(path, zero_based=False, num_parts=2, part_index=1)
    x, _ = jsr.io.load_libsvm(path, 8, False, num_parts=2, part_index=1)
    assert x.shape[1] == 8
    for p in (0, 1):  # every part raises, also one without the first line
        it = LibSVMIter(path, M, 6, zero_based="auto", num_parts=N + 50, part_index=N + 40 + p)
        with pytest.raises(ValueError, match=r'`zero_based="auto"` takes the base'):
            list(it)
    write_file(path, data, header=True)
    with pytest.raises(ValueError, match=r"`zero_based=True` contradicts the header line"):
        list(LibSVMIter(path, M, 6, zero_based=True, num_parts=2, part_index=1))


def test_parts_need_a_regular_file(tmp_path):
    """A pipe has no size to split: refused before anything is read from it."""
    fifo = tmp_path / "pipe.svm"
    os.mkfifo(fifo)

    def write():
        try:
            fifo.write_text("1 1:2\n")
        except BrokenPipeError:  # the reader closed first
            pass

    for read in (
        lambda: jsr.io.load_libsvm(fifo, 6, False, num_parts=2, part_index=0),
        lambda: list(LibSVMIter(fifo, M, 6, num_parts=2, part_index=1)),
    ):
        writer = threading.Thread(target=write)
        writer.start()  # opening a pipe to read waits for a writer
        with pytest.raises(ValueError, match=r"`num_parts` = 2 splits .* needs a regular file"):
            read()
        writer.join()


BAD_PARTS = [
    ((2, 2), ValueError, r"`part_index` must be an int with 0 <= part_index < num_parts = 2 "
     r"\(parts are numbered from 0\), got 2\."),
    ((2, -1), ValueError, r"`part_index` must be an int with 0 <= part_index < num_parts = 2 .*"
     r"got -1\."),
    ((3, 1.0), TypeError, r"`part_index` must be an int .* got float 1\.0\."),
    ((3, True), TypeError, r"`part_index` must be an int .* got bool True\."),
    ((3, "1"), TypeError, r"`part_index` must be an int .* got str '1'\."),
    ((0, 0), ValueError, r"`num_parts` must be an int >= 1, got 0\."),
    ((True, 0), TypeError, r"`num_parts` must be an int >= 1, got bool True\."),
    ((2.0, 0), TypeError, r"`num_parts` must be an int >= 1, got float 2\.0\."),
]  # fmt: skip


@pytest.mark.parametrize("parts, exc, match", BAD_PARTS)
def test_bad_parts_are_named(tmp_path, data, parts, exc, match):
    path = tmp_path / "d.svm"
    write_file(path, data)
    kwargs = dict(zip(("num_parts", "part_index"), parts, strict=True))
    with pytest.raises(exc, match=match):
        CSRIter(jsr.csr_matrix(data), np.arange(N), M, **kwargs)
    with pytest.raises(exc, match=match):
        LibSVMIter(path, M, 6, **kwargs)
    with pytest.raises(exc, match=match):
        jsr.io.load_libsvm(path, **kwargs)


def test_numpy_ints_are_parts(data):
    it = CSRIter(
        jsr.csr_matrix(data), np.arange(N), M, num_parts=np.int64(3), part_index=np.int32(2)
    )
    assert it.rows == range(6, 10) and (it.num_parts, it.part_index) == (3, 2)
