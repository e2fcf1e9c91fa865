"""LibSVM text format: a vectorised parser (numpy over the whole byte buffer)
and a writer.

A LibSVM line is ``label id:value id:value ...``; ``#`` starts a comment,
blank lines are skipped. A first line ``# jaxsparse_rows libsvm key=value ...``
(written by :func:`save_libsvm`) records the base of the ids and the column
count. Parsing never loops over tokens in Python: token
boundaries, line numbers and the ``id:value`` structure come from numpy
operations on the bytes, and every number is converted by one
``numpy.fromstring`` call. Python only looks at single tokens to word an
error message.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._args import check_flag, check_static_int
from .._csr import CSR
from .._dtypes import index_dtype
from ._parts import check_parts, part_bounds

PathLike = str | os.PathLike

_NEWLINE, _CR, _HASH, _COLON, _LOWER_I, _UPPER_I = 10, 13, 35, 58, 105, 73
# ASCII whitespace (what ``bytes.split()`` splits on) separates tokens; any
# other control byte (a NUL, say) is part of a token and refused there.
_WHITESPACE = b" \t\n\r\x0b\x0c"
_IS_SEPARATOR = np.zeros(256, bool)
_IS_SEPARATOR[list(_WHITESPACE)] = True
# Bytes that may appear in the text: whitespace, then inside a token digits,
# sign, dot, exponent, ':' and the letters of nan / inf / infinity.
_ALLOWED_BYTES = _WHITESPACE + b"0123456789+-.eE:nNaAiIfFtTyY"
# Magic numbers of compressed files, for a useful error.
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
# bytes.translate table: separators and ':' become ' ', so that every number is
# a whitespace-separated field for numpy.fromstring.
_TO_FIELDS = bytes(32 if (b <= 32 or b == _COLON) else b for b in range(256))
# The header line save_libsvm writes first: its fields are ``key=value``.
_HEADER_TAG = "# jaxsparse_rows libsvm"
_HEADER = re.compile(rb"#[ \t]*jaxsparse_rows[ \t]+libsvm(?=[ \t\r\n]|$)([^\r\n]*)")
# A carriage return with a token after it on the same line: a CR-only line end.
_CR_THEN_TOKEN = re.compile(rb"\r[ \t\r\x0b\x0c]*[^\s]")


class Header(NamedTuple):
    """What the header line of a file written by :func:`save_libsvm` records
    (``None``: not recorded)."""

    zero_based: bool | None
    num_features: int | None


class Parsed(NamedTuple):
    """Host-side result of parsing a block of LibSVM text (file ids as written)."""

    labels: np.ndarray  # [R] float64
    indptr: np.ndarray  # [R + 1] int64
    ids: np.ndarray  # [nnz] int64, sorted within each row
    values: np.ndarray  # [nnz] float64
    row_lines: np.ndarray  # [R] 1-based line number of each row
    header: Header | None = None  # the header line, when the block holds line 1


def _name(path: Any) -> str:
    return os.fspath(path) if path is not None else "<bytes>"


_LINE_HINT = "A LibSVM line is `label id:value id:value ...`."


def _error(path: Any, line: int, token: bytes, what: str, hint: str = _LINE_HINT) -> ValueError:
    text = token.decode("utf-8", "replace")
    return ValueError(f"{_name(path)}, line {line}: {what}, got token {text!r}. {hint}")


def _cr_only_error(path: Any, line: int) -> ValueError:
    return ValueError(
        f"{_name(path)}, line {line}: a carriage return ('\\r') without a '\\n' after it ends "
        "a line here: the file uses CR-only line endings (classic Mac OS). LibSVM lines end "
        "with '\\n' (or '\\r\\n'); a lone '\\r' is read as a space, which would join the lines. "
        "Convert the line endings to '\\n' first, e.g. `tr '\\r' '\\n' < in.svm > out.svm`."
    )


def _read_header(raw: bytes, path: Any) -> Header | None:
    """The header line (``# jaxsparse_rows libsvm key=value ...``) when it is
    the first line of ``raw``; fields other than ``zero_based`` and
    ``num_features`` are ignored."""
    match = _HEADER.match(raw)
    if match is None:
        return None
    zero_based = num_features = None
    for field in match.group(1).split():
        key, _, value = field.decode("utf-8", "replace").partition("=")
        if key == "zero_based":
            if value not in ("0", "1"):
                raise ValueError(
                    f"{_name(path)}, line 1: the `{_HEADER_TAG}` header line must record "
                    f"`zero_based=0` or `zero_based=1`, got {field.decode('utf-8', 'replace')!r}. "
                    "Correct the header line or delete it."
                )
            zero_based = value == "1"
        elif key == "num_features":
            if not (value.isascii() and value.isdigit()):
                raise ValueError(
                    f"{_name(path)}, line 1: the `{_HEADER_TAG}` header line must record "
                    "`num_features=K` with an int K >= 0, got "
                    f"{field.decode('utf-8', 'replace')!r}. Correct the header line or delete it."
                )
            num_features = int(value)
    return Header(zero_based, num_features)


def _too_large(kind: str, value: float, requested: np.dtype, dt: np.dtype) -> tuple[str, str]:
    """The error text (what, hint) for a finite number that ``dt`` turns into inf."""
    top = float(jnp.finfo(dt).max)
    what = (
        f"the {kind} does not fit the dtype {dt.name} (largest finite value {top:.8g}): "
        "it would become inf"
    )
    if dt != requested:
        what += f" (`dtype` {requested.name} is {dt.name} while 64-bit mode is off)"
    with np.errstate(over="ignore"):
        fits32 = bool(np.isfinite(np.float32(value)))
    if dt.itemsize < 4 and fits32:
        return what, "Load the file with a wider `dtype`, e.g. `dtype=jnp.float32`."
    if np.isfinite(value):
        return what, (
            "Load the file with a wider `dtype`: `dtype=jnp.float64`, with 64-bit mode on "
            "(`jax.config.update('jax_enable_x64', True)`)."
        )
    return what, "No floating dtype holds it: correct the number in the file."


def _overflowing(
    buf: np.ndarray, nums: np.ndarray, starts: np.ndarray, ends: np.ndarray, dt: np.dtype
) -> np.ndarray:
    """Tokens whose number ``dt`` turns into inf although it is not written
    as an infinity (``inf``, ``infinity``: the only spellings with an ``i``)."""
    cand = np.flatnonzero(np.abs(nums) > float(jnp.finfo(dt).max))  # (nan: False)
    if cand.size == 0:
        return cand
    with np.errstate(over="ignore"):
        cand = cand[np.isinf(nums[cand].astype(dt))]
    if cand.size == 0:
        return cand
    lens = ends[cand] - starts[cand]
    chars = buf[_id_positions(starts[cand], ends[cand])]
    spelled = np.add.reduceat((chars == _LOWER_I) | (chars == _UPPER_I), np.cumsum(lens) - lens)
    return cand[spelled == 0]


def _blank_comments(buf: np.ndarray, nl_pos: np.ndarray) -> np.ndarray:
    """A copy of ``buf`` with every ``#``-to-end-of-line run replaced by spaces."""
    hashes = np.flatnonzero(buf == _HASH)
    if hashes.size == 0:
        return buf
    line = np.searchsorted(nl_pos, hashes)
    first = np.concatenate([[True], line[1:] != line[:-1]])
    hashes, line = hashes[first], line[first]
    ends = np.append(nl_pos, buf.size)[line]
    delta = np.zeros(buf.size + 1, np.int8)
    delta[hashes] = 1
    delta[ends] -= 1
    out = buf.copy()
    out[np.cumsum(delta[:-1], dtype=np.int8).view(bool)] = 32
    return out


def _first_bad_number(raw: bytes, starts, ends, order) -> int | None:
    """Slow path for the error message only: the first token whose fields fail ``float``."""
    for t in order:
        for part in raw[starts[t] : ends[t]].split(b":"):
            try:
                float(part)
            except ValueError:
                return int(t)
    return None


_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _id_positions(fstart: np.ndarray, colons: np.ndarray) -> np.ndarray:
    """Byte positions of every feature-id character (``fstart[i]:colons[i]``)."""
    lens = colons - fstart
    offsets = np.cumsum(lens) - lens
    return np.repeat(fstart - offsets, lens) + np.arange(int(lens.sum()))


def _check_digits(chars: np.ndarray, lens: np.ndarray, fail) -> np.ndarray:
    """The digit values of the ids' characters (``lens`` per id); names the
    first id with another character. (uint8 arithmetic: a byte below '0'
    wraps above 9.)"""
    digits = chars - np.uint8(48)
    if np.any(digits > 9):
        first = int(np.searchsorted(np.cumsum(lens), np.argmax(digits > 9), side="right"))
        raise fail(first, "feature ids must be integers >= 0 written with digits only")
    return digits


def _parse_ids(buf: np.ndarray, fstart: np.ndarray, colons: np.ndarray, fail):
    """Vectorised decimal parse of the feature ids (the bytes before each colon).

    Returns ``(ids, positions)``: the ids and the byte positions they occupy
    (leading zeros included).
    """
    lens = colons - fstart
    if fstart.size == 0:
        return np.zeros((0,), np.int64), np.zeros((0,), np.int64)
    written = None
    if lens.max() > 18:
        # Ids written with more than 18 characters are read when the extra
        # leading characters are zeros (as sklearn reads them); their digits
        # start 18 characters before the colon. Every id's characters are
        # checked first, so a non-digit is named as such wherever it is.
        written = _id_positions(fstart, colons)
        _check_digits(buf[written], lens, fail)
        long = np.flatnonzero(lens > 18)
        head = buf[_id_positions(fstart[long], colons[long] - 18)]
        nonzero = head != np.uint8(48)
        if np.any(nonzero):
            owner = np.repeat(np.arange(long.size), lens[long] - 18)
            raise fail(int(long[owner[np.argmax(nonzero)]]), "feature id is larger than 10**18 - 1")
        fstart = fstart.copy()
        fstart[long] = colons[long] - 18
        lens = colons - fstart
    pos = _id_positions(fstart, colons)
    digits = _check_digits(buf[pos], lens, fail)
    place = np.repeat(colons, lens) - 1 - pos
    ids = np.add.reduceat(digits * _POW10[place], np.cumsum(lens) - lens)
    return ids, pos if written is None else written


def parse_libsvm_bytes(
    raw: bytes, path: Any = None, first_line: int = 1, dtype: Any = None
) -> Parsed:
    """Parses LibSVM text held in memory.

    Args:
      raw: the bytes of whole lines.
      path: named in error messages.
      first_line: line number of the first line of ``raw`` (for streaming);
        when it is 1, the header line written by :func:`save_libsvm` is read.
      dtype: the floating dtype the labels and values will be cast to (its
        canonical JAX dtype is checked), or ``None`` for no check. A number
        written as a finite value that it would turn into ``inf`` raises.

    Returns:
      A :class:`Parsed` with file feature ids (not shifted) sorted within rows.

    Raises:
      ValueError: naming the file, the line number and the bad token; or the
        line where CR-only line endings join lines (a ``\\r`` followed by more
        tokens on its line, where those tokens fail to parse or a comment
        would hide them).
    """
    header = _read_header(raw, path) if first_line == 1 else None
    orig = np.frombuffer(raw, np.uint8)
    nl_pos = np.flatnonzero(orig == _NEWLINE)
    buf = _blank_comments(orig, nl_pos)
    if buf is not orig and b"\r" in raw:
        for match in _CR_THEN_TOKEN.finditer(raw):
            if buf[match.start()] != _CR:  # inside a comment, which would hide the tokens
                raise _cr_only_error(path, first_line + int(np.searchsorted(nl_pos, match.start())))
    text = raw if buf is orig else buf.tobytes()
    residue = text.translate(None, _ALLOWED_BYTES)
    # Bytes above ' ' are token bytes. Only text with a byte outside the
    # allowed set (which fails below) can hold a control byte that is not
    # whitespace, a token byte too, so the error names its token.
    nonsep = ~_IS_SEPARATOR[buf] if residue else buf > 32
    edges = np.flatnonzero(nonsep[1:] != nonsep[:-1]) + 1
    if buf.size and nonsep[0]:
        edges = np.concatenate([[0], edges])
    if buf.size and nonsep[-1]:
        edges = np.append(edges, buf.size)
    starts, ends = edges[0::2], edges[1::2]
    tok_line = np.searchsorted(nl_pos, starts)  # 0-based line of every token
    is_label = np.ones(starts.size, bool)
    is_label[1:] = tok_line[1:] != tok_line[:-1]

    def fail(t: int, what: str, hint: str = _LINE_HINT) -> ValueError:
        line = int(tok_line[t])
        line_start = int(nl_pos[line - 1]) + 1 if line else 0
        if b"\r" in raw[line_start : starts[t]]:  # a lone CR before the token
            return _cr_only_error(path, first_line + line)
        return _error(path, first_line + line, raw[starts[t] : ends[t]], what, hint)

    if residue:
        pos = text.find(residue[:1])
        t = int(np.searchsorted(starts, pos, side="right") - 1)
        if raw[starts[t] : ends[t]].startswith(b"qid:"):
            raise fail(
                t,
                "`qid:` (the query ids of ranking data) is not supported; remove those "
                "tokens first (e.g. `sed -E 's/ qid:[^ ]+//'`)",
            )
        raise fail(t, f"unexpected character {chr(residue[0])!r}")
    is_colon = buf == _COLON
    colons = np.flatnonzero(is_colon)
    if starts.size:
        n_colon = np.add.reduceat(is_colon, starts, dtype=np.int64)
    else:
        n_colon = np.zeros((0,), np.int64)
    edge_colon = (buf[starts] == _COLON) | (buf[ends - 1] == _COLON)
    bad = (is_label & (n_colon != 0)) | (~is_label & (n_colon != 1))
    bad |= edge_colon
    if np.any(bad):
        t = int(np.flatnonzero(bad)[0])
        if is_label[t]:
            raise fail(t, "expected a label (a number) as the first token of the line")
        raise fail(t, "expected a feature as `id:value`")

    feat_tok = np.flatnonzero(~is_label)
    ids, id_pos = _parse_ids(buf, starts[feat_tok], colons, lambda i, w: fail(int(feat_tok[i]), w))
    # Every remaining field (labels and values) is a float: one numpy.fromstring.
    fields = buf.copy() if buf is orig else buf
    fields[id_pos] = 32
    nums: np.ndarray | None = np.zeros((0,), np.float64)
    if starts.size:  # (numpy reads whitespace-only text as [-1.])
        try:
            nums = np.fromstring(fields.tobytes().translate(_TO_FIELDS), np.float64, sep=" ")
        except ValueError:
            nums = None
    if nums is None or nums.size != starts.size:
        t = _first_bad_number(raw, starts, ends, range(starts.size))
        if t is None:  # pragma: no cover - fromstring and float disagree
            raise ValueError(f"{path}: could not parse the LibSVM data.")
        raise fail(t, "not a number")
    if dtype is not None:
        requested = np.dtype(dtype)
        dt = np.dtype(jax.dtypes.canonicalize_dtype(requested))
        over = _overflowing(buf, nums, starts, ends, dt)
        if over.size:
            t = int(over[0])
            kind = "label" if is_label[t] else "value"
            raise fail(t, *_too_large(kind, float(nums[t]), requested, dt))
    labels, values = nums[is_label], nums[~is_label]
    rows = np.cumsum(is_label) - 1
    feat_row = rows[~is_label]
    n_rows = int(is_label.sum())
    indptr = np.zeros(n_rows + 1, np.int64)
    np.cumsum(np.bincount(feat_row, minlength=n_rows), out=indptr[1:])
    same_row = feat_row[1:] == feat_row[:-1]
    if np.any(same_row & (ids[1:] <= ids[:-1])):
        order = np.lexsort((ids, feat_row))
        ids, values, feat_tok = ids[order], values[order], feat_tok[order]
        dup = np.flatnonzero(same_row & (ids[1:] == ids[:-1]))
        if dup.size:
            raise fail(
                int(feat_tok[dup[0] + 1]),
                f"feature id {int(ids[dup[0]])} appears twice on the line; merge the "
                "duplicates (e.g. sum their values) before loading",
            )
    row_lines = first_line + tok_line[is_label]
    return Parsed(labels, indptr, ids, values, row_lines, header)


def _check_not_compressed(head: bytes, path: Any) -> None:
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise ValueError(
                f"{path} looks {kind}-compressed (it starts with {magic!r}); LibSVM files are "
                "read as plain text: decompress it first."
            )


def _line_start(f: Any, pos: int, size: int) -> int:
    """The byte offset of the first line that starts at or after ``pos``
    (``size`` when none does): a line starts at 0 and after every ``\\n``."""
    if pos <= 0:
        return 0
    if pos >= size:
        return size
    at = pos - 1
    f.seek(at)
    while block := f.read(1 << 16):
        newline = block.find(b"\n")
        if newline >= 0:
            return at + newline + 1
        at += len(block)
    return size


def part_byte_range(f: Any, path: Any, num_parts: int, part_index: int) -> tuple[int, int]:
    """``[start, stop)``: the bytes of part ``part_index`` of ``num_parts`` of
    the open file ``f``.

    The file's ``size`` bytes are cut into the ranges ``[size * p //
    num_parts, size * (p + 1) // num_parts)``, and part ``p`` holds the lines
    that start in its range (as MXNet's ``LibSVMIter`` splits a file): every
    line belongs to one part, and a part finds its lines by reading from its
    own range on, up to the end of its last line.
    """
    size = _regular_size(f, path, num_parts)
    lo, hi = part_bounds(size, num_parts, part_index)
    return _line_start(f, lo, size), _line_start(f, hi, size)


def _regular_size(f: Any, path: Any, num_parts: int) -> int:
    """The size of the open file ``f``, which must be a regular file to be
    split into parts (checked before anything is read from it)."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"`num_parts` = {num_parts} splits {_name(path)} into byte ranges of its size, which "
            "needs a regular file; it is not one (a pipe?). Read it whole (`num_parts=1`), or "
            "copy it to a file first."
        )
    return st.st_size


def read_chunks(
    path: PathLike, chunk_bytes: int, num_parts: int = 1, part_index: int = 0
) -> Iterator[tuple[bytes, int, int]]:
    """Whole-line pieces (about ``chunk_bytes`` each) of part ``part_index``
    of ``num_parts`` of a file (:func:`part_byte_range`; the whole file for
    one part): yields ``(text, line, offset)``, the piece, the number of its
    first line and its byte offset.

    A part that starts at byte 0 has the file's line numbers. Another one
    numbers its first line 2 (never 1, which would be read as the header
    line): counting the lines before it would read the file up to the part;
    :func:`parse_part` counts them only to name the line of an error.
    """
    line, pending = 1, []  # pending: the pieces of the unfinished last line
    with open(path, "rb") as f:
        left = None  # bytes of the part still to read (None: up to the end)
        if num_parts > 1:
            start, stop = part_byte_range(f, path, num_parts, part_index)
            f.seek(0)
            _check_not_compressed(f.read(8), path)
            f.seek(start)
            left, line = stop - start, 1 if start == 0 else 2
        offset = 0 if left is None else start

        def read(n: int) -> bytes:
            nonlocal left
            if left is None:
                return f.read(n)
            out = f.read(min(n, left))
            left -= len(out)
            return out

        # The first read holds a compressed file's magic number (no seeking
        # back to check it: a pipe cannot).
        chunk = read(max(chunk_bytes, 8))
        if offset == 0:
            _check_not_compressed(chunk, path)
        while chunk:
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:  # a line longer than the chunk: keep reading
                pending.append(chunk)
            else:
                text = b"".join([*pending, chunk[:cut]])
                pending = [chunk[cut:]]
                yield text, line, offset
                line += text.count(b"\n")
                offset += len(text)
            chunk = read(chunk_bytes)
        text = b"".join(pending)  # a last line without a newline
        if text:
            yield text, line, offset


def file_line(path: PathLike, offset: int) -> int:
    """The number of the line that starts at byte ``offset`` of the file
    (reads the file up to there)."""
    count, left = 0, offset
    with open(path, "rb") as f:
        while left > 0 and (block := f.read(min(left, 1 << 20))):
            count += block.count(b"\n")
            left -= len(block)
    return count + 1


def read_header(path: PathLike, num_parts: int) -> Header | None:
    """The header line of the file (see :func:`save_libsvm`), read alone by
    each of ``num_parts`` parts (which may not hold line 1)."""
    with open(path, "rb") as f:
        _regular_size(f, path, num_parts)
        head = f.read(8)
        _check_not_compressed(head, path)
        if not head.startswith(b"#"):
            return None
        f.seek(0)
        return _read_header(f.readline(), path)


def parse_part(
    path: PathLike,
    chunk_bytes: int,
    dtype: Any = None,
    convert: Callable[[Parsed], Any] | None = None,
    num_parts: int = 1,
    part_index: int = 0,
) -> Iterator[Any]:
    """Parses part ``part_index`` of ``num_parts`` of a file chunk by chunk
    (:func:`read_chunks`), yielding ``convert(parsed)`` (default: the
    :class:`Parsed`) of every chunk.

    Errors, from the parser or from ``convert``, name the file's line
    numbers: in a part that does not start at byte 0, the chunk that failed
    is parsed and converted again with its lines counted from the start of
    the file.
    """
    convert = (lambda parsed: parsed) if convert is None else convert
    part_start = None
    for text, line, offset in read_chunks(path, chunk_bytes, num_parts, part_index):
        if part_start is None:
            part_start = offset
        try:
            out = convert(parse_libsvm_bytes(text, path, line, dtype))
        except ValueError:
            if part_start == 0:
                raise
            exact = line - 2 + file_line(path, part_start)
            convert(parse_libsvm_bytes(text, path, exact, dtype))  # raises, naming the line
            raise  # pragma: no cover - the same text and checks raised above
        yield out


def parse_libsvm_file(
    path: PathLike,
    chunk_bytes: int = 4 << 20,
    dtype: Any = None,
    num_parts: int = 1,
    part_index: int = 0,
    check: Callable[[Parsed], Any] | None = None,
) -> Parsed:
    """Parses a whole file (or one part of it, see :func:`part_byte_range`)
    chunk by chunk (bounded temporaries), then joins. ``dtype`` is checked as
    in :func:`parse_libsvm_bytes`; ``check(parsed)`` runs on every chunk, its
    errors naming the file's line numbers (see :func:`parse_part`)."""

    def convert(parsed: Parsed) -> Parsed:
        if check is not None:
            check(parsed)
        return parsed

    parts = list(parse_part(path, chunk_bytes, dtype, convert, num_parts, part_index))
    if not parts:
        return parse_libsvm_bytes(b"", path)
    if len(parts) == 1:
        return parts[0]
    offsets = np.cumsum([0] + [int(p.indptr[-1]) for p in parts[:-1]])
    indptr = np.concatenate([[0]] + [p.indptr[1:] + o for p, o in zip(parts, offsets, strict=True)])
    return Parsed(
        np.concatenate([p.labels for p in parts]),
        indptr,
        np.concatenate([p.ids for p in parts]),
        np.concatenate([p.values for p in parts]),
        np.concatenate([p.row_lines for p in parts]),
        parts[0].header,
    )


def header_zero_based(zero_based: bool | str, header: Header | None, path: Any) -> bool | str:
    """``zero_based`` after the file's header: ``"auto"`` becomes the recorded
    base; an explicit base that contradicts it raises (it would shift every
    column by one). Without a recorded base, ``zero_based`` unchanged."""
    if header is None or header.zero_based is None:
        return zero_based
    if isinstance(zero_based, str):
        return header.zero_based
    if bool(zero_based) != header.zero_based:
        base = 0 if header.zero_based else 1
        raise ValueError(
            f"`zero_based={zero_based!r}` contradicts the header line of {_name(path)} (line 1, "
            f"written by `save_libsvm`), which records `zero_based={1 - base}`: its ids count "
            f"from {base}, and reading them from {1 - base} would shift every column by one. "
            f'Pass `zero_based="auto"` (or {header.zero_based}) to read the file as written.'
        )
    return bool(zero_based)


def shift_ids(parsed: Parsed, zero_based: bool, path: Any) -> np.ndarray:
    """File ids -> 0-based column ids; one-based files must not use id 0."""
    if zero_based:
        return parsed.ids
    if parsed.ids.size and parsed.ids.min() == 0:
        pos = int(np.flatnonzero(parsed.ids == 0)[0])
        row = int(np.searchsorted(parsed.indptr, pos, side="right") - 1)
        raise ValueError(
            f"{path}, line {int(parsed.row_lines[row])}: feature id 0 in a one-based file "
            "(`zero_based=False`). Pass `zero_based=True` if the file counts features "
            "from 0."
        )
    return parsed.ids - 1


def check_num_features(
    parsed: Parsed,
    cols: np.ndarray,
    num_features: int,
    path: Any,
    base: int,
    idt: Any = None,
    from_header: bool = False,
):
    """Raises if a column id is ``>= num_features`` (naming the line); with
    ``idt``, ``num_features`` is that index dtype's limit, not the user's; with
    ``from_header``, it is the count the file's header line records."""
    if cols.size and cols.max() >= num_features:
        pos = int(np.argmax(cols >= num_features))
        row = int(np.searchsorted(parsed.indptr, pos, side="right") - 1)
        where = f"{path}, line {int(parsed.row_lines[row])}: feature id {int(cols[pos]) + base}"
        if idt is not None:
            raise ValueError(
                f"{where} does not fit the index dtype {idt} (column ids must be below "
                f"{num_features}); enable 64-bit indices with "
                "`jax.config.update('jax_enable_x64', True)`."
            )
        if from_header:
            raise ValueError(
                f"{where} is out of range for `num_features={num_features}` recorded in the "
                f"header line (line 1; ids counted from {base}): the file does not match its "
                "header. Pass `num_features` to override it, or correct the header line."
            )
        raise ValueError(
            f"{where} is out of range for `num_features` = {num_features} (ids counted from "
            f"{base}). Pass a larger `num_features`, or None to infer it."
        )


def check_feature_count(num_features: Any, name: str = "num_features") -> int:
    """A column count: an int >= 0 whose column ids (and the padding id ``K``)
    fit the index dtype."""
    num_features = check_static_int(num_features, name)
    if num_features > np.iinfo(index_dtype()).max:
        raise ValueError(
            f"`{name}` = {num_features} does not fit the index dtype {index_dtype()} (at "
            f"most {np.iinfo(index_dtype()).max}); enable 64-bit indices with "
            "`jax.config.update('jax_enable_x64', True)`."
        )
    return num_features


def check_value_dtype(dtype: Any) -> np.dtype:
    """``dtype`` of loaded values and labels: a floating dtype. An integer one
    would truncate ``0.5`` to 0 and wrap ``3e9``, silently."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(
            "`dtype` must be a floating dtype (float32, float64, float16 or bfloat16), got "
            f"{dtype!r}: LibSVM values and labels are real numbers, which an integer, bool or "
            "complex dtype would truncate or wrap. Load as floats and cast the arrays."
        )
    return dt


def _header_feature_count(header: Header, path: Any) -> int:
    """The column count the header line records, which must fit the index dtype."""
    num_features = header.num_features
    limit = np.iinfo(index_dtype()).max
    if num_features > limit:
        raise ValueError(
            f"{_name(path)}, line 1: the header line records `num_features={num_features}`, "
            f"which does not fit the index dtype {index_dtype()} (at most {limit}); enable "
            "64-bit indices with `jax.config.update('jax_enable_x64', True)`."
        )
    return num_features


def _load_whole(
    path: PathLike, num_features: Any, zero_based: bool | str, dtype: np.dtype
) -> tuple[Parsed, np.ndarray, int]:
    """The whole file: ``(parsed, 0-based column ids, column count)``, where
    ``"auto"`` and an absent count may be inferred from every id."""
    parsed = parse_libsvm_file(path, dtype=dtype)
    header = parsed.header
    zero_based = header_zero_based(zero_based, header, path)
    if zero_based == "auto":
        zero_based = bool(parsed.ids.size and parsed.ids.min() == 0)
    cols = shift_ids(parsed, bool(zero_based), path)
    base = 0 if zero_based else 1
    if num_features is None and header is not None and header.num_features is not None:
        num_features = _header_feature_count(header, path)
        check_num_features(parsed, cols, num_features, path, base, from_header=True)
    elif num_features is None:
        limit = np.iinfo(index_dtype()).max
        if cols.size and cols.max() >= limit:  # the inferred K = max id + 1 would not fit
            check_num_features(parsed, cols, limit, path, base, index_dtype())
        num_features = int(cols.max()) + 1 if cols.size else 0
    else:
        num_features = check_feature_count(num_features)
        check_num_features(parsed, cols, num_features, path, base)
    return parsed, cols, num_features


def _load_part(
    path: PathLike,
    num_features: Any,
    zero_based: bool | str,
    dtype: np.dtype,
    num_parts: int,
    part_index: int,
) -> tuple[Parsed, np.ndarray, int]:
    """One part of the file, as :func:`_load_whole`; the base of the ids and
    the column count come from the arguments or the header line, never from
    the ids of the part (every part must agree on them)."""
    header = read_header(path, num_parts)
    zero_based = header_zero_based(zero_based, header, path)
    if zero_based == "auto":
        raise ValueError(
            f'`zero_based="auto"` with `num_parts` = {num_parts} takes the base of the ids from '
            f"the header line that `jsr.io.save_libsvm` writes, and {_name(path)} records none "
            "(each part would guess it from its own ids, and the parts could disagree). Pass "
            "`zero_based=True` or `False`."
        )
    from_header = num_features is None
    if not from_header:
        num_features = check_feature_count(num_features)
    elif header is not None and header.num_features is not None:
        num_features = _header_feature_count(header, path)
    else:
        raise ValueError(
            f"`num_features=None` with `num_parts` = {num_parts} takes the column count from the "
            f"header line that `jsr.io.save_libsvm` writes, and {_name(path)} records none (each "
            "part would infer it from its own ids, and the parts could disagree). Pass "
            "`num_features`."
        )
    base = 0 if zero_based else 1

    def check(parsed: Parsed) -> None:
        cols = shift_ids(parsed, bool(zero_based), path)
        check_num_features(parsed, cols, num_features, path, base, from_header=from_header)

    parsed = parse_libsvm_file(
        path, dtype=dtype, num_parts=num_parts, part_index=part_index, check=check
    )
    return parsed, shift_ids(parsed, bool(zero_based), path), num_features


def load_libsvm(
    path: PathLike,
    num_features: int | None = None,
    zero_based: bool | str = "auto",
    dtype: Any = jnp.float32,
    *,
    num_parts: int = 1,
    part_index: int = 0,
) -> tuple[CSR, jax.Array]:
    """Reads a LibSVM / svmlight text file into a CSR matrix and a label vector.

    Comments (``#`` to end of line), blank lines, any whitespace, ``\\n`` or
    ``\\r\\n`` line ends and unsorted feature ids within a line are accepted;
    ids are sorted per row. A malformed line raises ``ValueError`` naming the
    file, the line number and the bad token. Parsing is vectorised (numpy over
    the whole file).

    A first line ``# jaxsparse_rows libsvm zero_based=0 num_features=K`` (the
    header :func:`save_libsvm` writes) gives the base of the ids and the
    column count, so a saved matrix reads back with its shape and columns
    even when its first or last columns are empty.

    Args:
      path: the file.
      num_features: the column count ``K``; default: the header's, else the
        largest id + 1. An explicit value is used even when the header
        records another.
      zero_based: whether ids count from 0. ``"auto"`` (default): the
        header's base; without a header, zero-based when some id is 0, else
        one-based (the LibSVM convention). ``True`` or ``False`` must agree
        with the header's base when there is one.
      dtype: dtype of the CSR data and of the labels, a floating dtype. A
        number written as a finite value that it cannot hold (``1e39`` in
        float32, ``70000`` in float16) raises; ``inf`` and ``nan`` written as
        such are read as they are.
      num_parts: the number of parts the file is split into for data-parallel
        input (one per process, say); default 1, the whole file.
      part_index: which part to read, ``0 <= part_index < num_parts``. The
        parts are contiguous ranges of lines of near-equal size in bytes: the
        file's bytes are cut into ``num_parts`` equal ranges and a part holds
        the lines that start in its range (MXNet's ``LibSVMIter``
        ``num_parts`` / ``part_index``), so every row is in exactly one
        part, parts hold near-equal row counts only when the lines have
        near-equal lengths, and a part may be empty. Reading a part seeks to
        its range and parses only its lines. With several parts, the base of
        the ids and the column count come from the arguments or the header
        line (``"auto"`` and ``None`` without a header raise: each part
        would guess them from its own ids), and ``path`` must be a regular
        file.

    Returns:
      ``(x, y)``: a :class:`~jaxsparse_rows.CSR` of shape ``(rows, K)`` with no
      padding, and the ``[rows]`` labels (of the part's rows with several
      parts).

    Raises:
      ValueError: a malformed line (naming the file, the line and the token),
        a number too large for ``dtype`` (naming the same), a compressed
        file, CR-only line endings, an id past ``num_features``, a
        ``zero_based`` that contradicts the header; ``num_parts < 1`` or a
        ``part_index`` outside ``[0, num_parts)``; with several parts, no
        known base or column count, or a path that is not a regular file.
      TypeError: ``dtype`` is not floating; ``num_parts`` or ``part_index``
        is not an int (bools are refused).

    Example:
      >>> import pathlib, tempfile, jaxsparse_rows as jsr
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "toy.svm"
      >>> _ = path.write_text("1 3:0.5 1:2  # a comment\\n\\n-1 2:1.5\\n")
      >>> x, y = jsr.io.load_libsvm(path)
      >>> x, y
      (CSR(float32[2, 3], nnz=3), Array([ 1., -1.], dtype=float32))
      >>> x.asnumpy()
      array([[2. , 0. , 0.5],
             [0. , 1.5, 0. ]], dtype=float32)

      One part of two, as process 1 of 2 would read it:

      >>> jsr.io.load_libsvm(path, 3, False, num_parts=2, part_index=1)[1]
      Array([-1.], dtype=float32)
    """
    if zero_based not in (True, False, "auto"):
        raise ValueError(f'`zero_based` must be True, False or "auto", got {zero_based!r}.')
    dtype = check_value_dtype(dtype)
    num_parts, part_index = check_parts(num_parts, part_index)
    if num_parts > 1:
        parsed, cols, num_features = _load_part(
            path, num_features, zero_based, dtype, num_parts, part_index
        )
    else:
        parsed, cols, num_features = _load_whole(path, num_features, zero_based, dtype)
    idt = index_dtype()
    shape = (parsed.labels.size, num_features)
    x = CSR._make(
        jnp.asarray(parsed.values, dtype),
        jnp.asarray(cols.astype(idt)),
        jnp.asarray(parsed.indptr.astype(idt)),
        shape,
    )
    return x, jnp.asarray(parsed.labels, dtype)


def _fmt(dtype: np.dtype) -> str:
    return "%.17g" if np.dtype(dtype).itemsize >= 8 else "%.9g"


def _is_real(dtype: np.dtype) -> bool:
    """Bool, integer or real floating (bfloat16 too: its numpy kind is 'V')."""
    return dtype == np.bool_ or any(
        jnp.issubdtype(dtype, kind) for kind in (jnp.integer, jnp.floating)
    )


def save_libsvm(
    path: PathLike, csr: CSR, labels: Any, zero_based: bool = False, header: bool = True
) -> None:
    """Writes a CSR matrix and labels as a LibSVM text file.

    Every stored entry is written (explicit zeros too), with enough digits to
    read back the same float32 / float64 values. The first line is a comment,
    ``# jaxsparse_rows libsvm zero_based=0 num_features=K``, from which
    :func:`load_libsvm` and :class:`~jaxsparse_rows.io.LibSVMIter` take the
    base of the ids and the column count: the file reads back with the same
    shape and columns, also when the first or last columns are empty.

    Args:
      path: the file to write.
      csr: a :class:`~jaxsparse_rows.CSR` ``[rows, K]``.
      labels: ``[rows]`` real numbers (bool, int or float).
      zero_based: ``True`` to write ids counting from 0; default ``False`` (the
        LibSVM convention, ids from 1).
      header: ``False`` to leave out the header line, for programs that refuse
        comment lines (LIBSVM's and LIBLINEAR's ``svm-train`` / ``train``);
        readers that skip ``#`` comments (scikit-learn's
        ``load_svmlight_file``, for one) ignore it. Without it
        :func:`load_libsvm` reads a one-based file back correctly, but
        ``"auto"`` takes a zero-based file whose column 0 is empty as
        one-based, and the column count is the largest id + 1 unless
        ``num_features`` is passed.

    Raises:
      TypeError: if ``csr`` is not a CSR, the data or labels are not real
        numbers, or ``zero_based`` or ``header`` is not a bool.
      ValueError: if ``labels`` does not have shape ``[rows]``.

    Example:
      >>> import pathlib, tempfile, jaxsparse_rows as jsr
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "out.svm"
      >>> x = jsr.csr_matrix(([2., 0.5, 1.5], [0, 2, 1], [0, 2, 3]), shape=(2, 3))
      >>> jsr.io.save_libsvm(path, x, [1, -1])
      >>> print(path.read_text(), end="")
      # jaxsparse_rows libsvm zero_based=0 num_features=3
      1 1:2 3:0.5
      -1 2:1.5
      >>> jsr.io.save_libsvm(path, x, [1, -1], zero_based=True, header=False)
      >>> print(path.read_text(), end="")
      1 0:2 2:0.5
      -1 1:1.5
    """
    if not isinstance(csr, CSR):
        raise TypeError(f"`csr` must be a jsr.CSR, got {type(csr).__name__}.")
    labels = np.asarray(labels)
    for name, dt in (("csr", csr.dtype), ("labels", labels.dtype)):
        if jnp.issubdtype(dt, jnp.complexfloating):
            raise TypeError(
                f"`{name}` is complex ({np.dtype(dt).name}); LibSVM holds real numbers. "
                "Save the real and imaginary parts as separate features or files."
            )
    if not _is_real(labels.dtype):
        what = {"U": "strings", "S": "bytes", "O": "Python objects"}.get(labels.dtype.kind)
        raise TypeError(
            f"`labels` must hold real numbers (bool, int or float), got dtype {labels.dtype}"
            f"{f' ({what})' if what else ''}. Map class names to numbers before saving."
        )
    zero_based = check_flag(zero_based, "zero_based")
    header = check_flag(header, "header")
    m = csr.shape[0]
    if labels.shape != (m,):
        raise ValueError(f"`labels` must have shape ({m},) to match `csr`, got {labels.shape}.")
    indptr = np.asarray(csr.indptr).astype(np.int64)
    nnz = int(indptr[-1])
    data = np.asarray(csr.data)[:nnz]
    cols = np.asarray(csr.indices)[:nnz].astype(np.int64) + (0 if zero_based else 1)
    # Integers (and bools) are written exactly, not through float64 and "%.9g".
    exact = np.issubdtype(data.dtype, np.integer) or data.dtype == np.bool_
    vfmt = "%d" if exact else _fmt(data.dtype)
    lfmt = "%d" if np.issubdtype(labels.dtype, np.integer) else _fmt(labels.dtype)
    vals = data.tolist() if exact else data.astype(np.float64).tolist()
    feats = [f"{c}:{vfmt % v}" for c, v in zip(cols.tolist(), vals, strict=True)]
    lines = []
    if header:
        lines.append(f"{_HEADER_TAG} zero_based={int(zero_based)} num_features={csr.shape[1]}")
    ptr = indptr.tolist()
    for r, lab in enumerate(labels.tolist()):
        lines.append(" ".join([lfmt % lab, *feats[ptr[r] : ptr[r + 1]]]))
    with open(path, "w") as f:
        f.write("\n".join(lines) + ("\n" if lines else ""))
