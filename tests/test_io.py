"""jsr.io: LibSVM reading/writing against a plain-Python oracle, and the
fixed-shape batch iterators (shapes, buckets, last-batch policies, streaming,
compile counts)."""

from __future__ import annotations

import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import jaxsparse_rows as jsr
from jaxsparse_rows.io import Batch, CSRIter, LibSVMIter, nnz_bucket, stack_batches


# -- a deliberately naive oracle parser ---------------------------------------
def oracle_parse(text: str, one_based: bool, num_features: int):
    rows, labels = [], []
    for line in text.split("\n"):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        labels.append(float(line[0]))
        row = {}
        for tok in line[1:]:
            i, v = tok.split(":")
            row[int(i) - one_based] = float(v)
        rows.append(row)
    dense = np.zeros((len(rows), num_features))
    for r, row in enumerate(rows):
        for c, v in row.items():
            dense[r, c] = v
    return dense, np.array(labels)


def random_csr_np(rng, m, k, density, dtype=np.float32):
    dense = rng.standard_normal((m, k)).astype(dtype)
    dense[rng.random((m, k)) > density] = 0
    return dense


def dense_np(x: jsr.CSR) -> np.ndarray:
    """Host-side densify (avoids compiling a scatter for every shape)."""
    ptr = np.asarray(x.indptr)
    rows = np.repeat(np.arange(x.shape[0]), np.diff(ptr))
    out = np.zeros(x.shape, np.float64)
    out[rows, np.asarray(x.indices)[: ptr[-1]]] = np.asarray(x.data)[: ptr[-1]].astype(np.float64)
    return out


def assert_canonical(x: jsr.CSR):
    """Re-validates with the strict constructor (sorted ids, padding rules)."""
    jsr.CSR(x.data, x.indices, x.indptr, x.shape)


# -- LibSVM ---------------------------------------------------------------------
line_strategy = st.lists(
    st.tuples(
        st.integers(-3, 3),
        st.dictionaries(st.integers(1, 12), st.integers(-99, 99).map(lambda v: v / 4), max_size=6),
        st.sampled_from(["", "  ", "\t", " # note: 1:2"]),
        st.booleans(),
    ),
    max_size=8,
)


@given(line_strategy, st.randoms(use_true_random=False))
def test_load_matches_oracle(tmp_path_factory, lines, rnd):
    parts = []
    for label, feats, trail, blank_after in lines:
        items = list(feats.items())
        rnd.shuffle(items)  # unsorted ids within a line
        seps = [rnd.choice([" ", "  ", "\t"]) for _ in items]
        body = "".join(f"{s}{i}:{v}" for s, (i, v) in zip(seps, items, strict=True))
        parts.append(f"{label}{body}{trail}")
        if blank_after:
            parts.append(rnd.choice(["", "   ", "# a comment line"]))
    text = "\r\n".join(parts) if rnd.random() < 0.3 else "\n".join(parts)
    path = tmp_path_factory.mktemp("svm") / "data.svm"
    path.write_text(text)
    x, y = jsr.io.load_libsvm(path, num_features=12, zero_based=False)
    dense, labels = oracle_parse(text.replace("\r", ""), True, 12)
    assert x.shape == dense.shape
    np.testing.assert_array_equal(dense_np(x), dense.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(y), labels.astype(np.float32))
    assert_canonical(x)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("zero_based", [False, True])
def test_save_load_roundtrip(tmp_path, rng, dtype, zero_based):
    dense = random_csr_np(rng, 13, 9, 0.3)
    dense[:, -1] = 0  # an empty last column: num_features must be passed
    dense[4] = 0  # an empty row
    x = jsr.csr_matrix(dense).astype(dtype)
    labels = rng.integers(0, 3, 13)
    path = tmp_path / "rt.svm"
    jsr.io.save_libsvm(path, x, labels, zero_based=zero_based)
    x2, y2 = jsr.io.load_libsvm(path, num_features=9, zero_based="auto", dtype=dtype)
    assert x2.dtype == dtype and y2.dtype == dtype
    np.testing.assert_array_equal(dense_np(x2), dense_np(x))
    np.testing.assert_array_equal(np.asarray(y2), labels.astype(np.float32))
    assert_canonical(x2)


def test_roundtrip_float32_exact_and_inferred_features(tmp_path, rng):
    x = jsr.random.csr(jax.random.key(1), (50, 30), 0.2, minval=-1e3, maxval=1e3)
    path = tmp_path / "f32.svm"
    jsr.io.save_libsvm(path, x, np.linspace(-1, 1, 50, dtype=np.float32))
    x2, y2 = jsr.io.load_libsvm(path)
    n_feat = int(np.asarray(x.indices).max()) + 1
    assert x2.shape == (50, n_feat)
    np.testing.assert_array_equal(dense_np(x2), dense_np(x)[:, :n_feat])
    np.testing.assert_array_equal(np.asarray(y2), np.linspace(-1, 1, 50, dtype=np.float32))


def test_zero_based_modes(tmp_path):
    path = tmp_path / "z.svm"
    path.write_text("1 0:1 2:3\n0 1:2\n")
    x, _ = jsr.io.load_libsvm(path)  # auto: a 0 id means zero-based
    np.testing.assert_array_equal(dense_np(x), [[1, 0, 3], [0, 2, 0]])
    x, _ = jsr.io.load_libsvm(path, zero_based=True, num_features=5)
    assert x.shape == (2, 5)
    with pytest.raises(ValueError, match=r"z\.svm, line 1: feature id 0 in a one-based"):
        jsr.io.load_libsvm(path, zero_based=False)
    path.write_text("1 1:1 3:3\n")
    x, _ = jsr.io.load_libsvm(path)  # auto without a 0 id: one-based
    np.testing.assert_array_equal(dense_np(x), [[1, 0, 3]])
    with pytest.raises(ValueError, match="zero_based"):
        jsr.io.load_libsvm(path, zero_based="yes")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.svm"
    path.write_text("\n  \n# nothing\n")
    x, y = jsr.io.load_libsvm(path, num_features=4)
    assert x.shape == (0, 4) and y.shape == (0,)


@pytest.mark.parametrize(
    "text, line, token",
    [
        ("1 2:3\n1 2:3 x:4\n", 2, "x:4"),
        ("1 2:3\n\n1 :3\n", 3, ":3"),
        ("1 2:3:4\n", 1, "2:3:4"),
        ("1:2 3:4\n", 1, "1:2"),
        ("1 2:3 2:5\n", 1, "2:5"),
        ("1 2.5:1\n", 1, "2.5:1"),
        ("1 -2:1\n", 1, "-2:1"),
        ("# c\n1 2:1e\n", 2, "2:1e"),
        ("1 2:--1\n", 1, "2:--1"),
        ("1,2 3:4\n", 1, "1,2"),
        ("1 2: 3\n", 1, "2:"),
        ("1 2 3:1\n", 1, "2"),
        ("1 2:1\nabc 1:1\n", 2, "abc"),
        # control bytes are not whitespace (a NUL-padded file loaded silently)
        ("1 2:1\n-1 3:1\n" + "\x00" * 8, 3, "\x00" * 8),
        ("1 2:1\x002:3\n", 1, "2:1\x002:3"),
        ("1 2:1\x1f3:3\n", 1, "2:1\x1f3:3"),
    ],
)
def test_malformed_line_names_file_line_token(tmp_path, text, line, token):
    path = tmp_path / "bad.svm"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        jsr.io.load_libsvm(path)
    msg = str(err.value)
    assert "bad.svm" in msg and f"line {line}:" in msg and repr(token) in msg, msg


def test_all_ascii_whitespace_separates_tokens(tmp_path):
    """Tabs, CR, vertical tab and form feed separate like spaces (as
    ``bytes.split`` does); only the other control bytes are refused."""
    path = tmp_path / "ws.svm"
    path.write_bytes(b"1\t2:1\x0b3:2\x0c \r\n-1  1:5\r\n")
    x, y = jsr.io.load_libsvm(path, num_features=3)
    np.testing.assert_array_equal(dense_np(x), [[0, 1, 2], [5, 0, 0]])
    np.testing.assert_array_equal(np.asarray(y), [1, -1])


@pytest.mark.parametrize(
    "magic, kind", [(b"\x1f\x8b", "gzip"), (b"BZh9", "bzip2"), (b"\xfd7zXZ\x00", "xz")]
)
def test_a_compressed_file_is_named_as_such(tmp_path, magic, kind):
    """It failed with "unexpected character '\\x8b'" and no hint."""
    path = tmp_path / "a.svm.gz"
    path.write_bytes(magic + b"\x00\x01rest")
    with pytest.raises(ValueError, match=rf"a.svm.gz looks {kind}-compressed.*decompress"):
        jsr.io.load_libsvm(path)
    with pytest.raises(ValueError, match=rf"looks {kind}-compressed"):
        next(iter(LibSVMIter(path, 2, num_features=3)))


@pytest.mark.parametrize("dtype", [jnp.int32, np.int8, np.uint8, bool, jnp.complex64, "foo"])
def test_a_non_floating_dtype_is_refused(tmp_path, dtype):
    """``dtype=jnp.int32`` truncated 0.5 to 0 and wrapped 3e9 to -2**31, with
    only numpy's RuntimeWarning."""
    path = tmp_path / "a.svm"
    path.write_text("1.5 1:0.5 2:2.7 3:3000000000\n")
    with pytest.raises(TypeError, match=r"`dtype` must be a floating dtype.*got"):
        jsr.io.load_libsvm(path, dtype=dtype)
    with pytest.raises(TypeError, match=r"`dtype` must be a floating dtype"):
        LibSVMIter(path, 2, num_features=3, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint32, np.bool_])
def test_integer_data_is_saved_exactly(tmp_path, dtype):
    """Integer data went through float64 and "%.9g": 1234567891 came back as
    1234567890 and 2**31 - 1 as 2147483650."""
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    big = [1, 0] if info is None else [1234567891 % (int(info.max) + 1), int(info.max)]
    data = np.array(big, dtype)
    x = jsr.CSR(data, np.array([0, 2]), np.array([0, 1, 2]), (2, 3))
    path = tmp_path / "int.svm"
    jsr.io.save_libsvm(path, x, np.array([1, 2]), header=False)
    tokens = path.read_text().split()
    assert tokens[1] == f"1:{int(big[0])}" and tokens[3] == f"3:{int(big[1])}", tokens


def test_a_line_longer_than_many_chunks_is_read_whole(tmp_path):
    """The unfinished line is kept in pieces rather than re-joined and
    re-searched on every read (quadratic in its length). Same result."""
    path = tmp_path / "long.svm"
    feats = " ".join(f"{i}:{i % 7 + 1}" for i in range(1, 3001))
    path.write_text(f"1 {feats}\n-1 2:5\n")
    it = LibSVMIter(path, 2, num_features=3000, chunk_bytes=7)
    (batch,) = list(it)
    want = np.zeros((2, 3000))
    want[0] = [i % 7 + 1 for i in range(1, 3001)]
    want[1, 1] = 5
    np.testing.assert_array_equal(np.asarray(batch.x.todense()), want)


def test_load_from_a_pipe(tmp_path):
    """Checking for a compressed file must not seek: a pipe (``/dev/stdin``,
    ``<(zcat f.gz)``) cannot, and reading one failed."""
    import os
    import threading

    fifo = tmp_path / "pipe.svm"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("1 1:2\n-1 3:4\n"))
    writer.start()
    x, y = jsr.io.load_libsvm(fifo, num_features=3)
    writer.join()
    np.testing.assert_array_equal(dense_np(x), [[2, 0, 0], [0, 0, 4]])
    np.testing.assert_array_equal(np.asarray(y), [1, -1])


def test_num_features_too_small(tmp_path):
    path = tmp_path / "nf.svm"
    path.write_text("1 1:1\n1 7:1\n")
    with pytest.raises(ValueError, match=r"line 2: feature id 7 is out of range"):
        jsr.io.load_libsvm(path, num_features=5)


def test_save_errors(tmp_path):
    x = jsr.csr_matrix(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError, match="labels"):
        jsr.io.save_libsvm(tmp_path / "a", x, [1, 2])
    with pytest.raises(TypeError, match="csr"):
        jsr.io.save_libsvm(tmp_path / "a", np.eye(3), [1, 2, 3])


def test_complex_data_or_labels_are_refused_not_truncated(tmp_path):
    """`save_libsvm` wrote the real part of complex data (0 for 1j) silently."""
    x = jsr.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(TypeError, match=r"`csr` is complex \(complex64\)"):
        jsr.io.save_libsvm(tmp_path / "c.svm", x.astype(jnp.complex64) * 1j, [1, 2])
    with pytest.raises(TypeError, match=r"`labels` is complex"):
        jsr.io.save_libsvm(tmp_path / "c.svm", x, np.array([1j, 2]))
    assert not (tmp_path / "c.svm").exists()


@pytest.mark.parametrize(
    "num_features, exc, match",
    [
        (30.7, TypeError, r"`num_features` must be an int >= 0, got float 30.7"),
        (30.0, TypeError, r"`num_features` must be an int >= 0, got float 30.0"),
        ("30", TypeError, r"`num_features` must be an int >= 0, got str '30'"),
        (True, TypeError, r"`num_features` must be an int >= 0, got bool True"),
        (-1, ValueError, r"`num_features` must be an int >= 0, got -1"),
        (2**31, ValueError, r"`num_features` = 2147483648 does not fit the index dtype int32"),
    ],
)
def test_num_features_is_checked_by_load_and_iter(tmp_path, num_features, exc, match):
    """load_libsvm truncated 30.7 to 30 and took "30"; LibSVMIter took a K
    past int32 and then failed on its first batch."""
    path = tmp_path / "a.svm"
    path.write_text("1 1:2 3:1\n")
    with pytest.raises(exc, match=match):
        jsr.io.load_libsvm(path, num_features=num_features)
    with pytest.raises(exc, match=match):
        jsr.io.LibSVMIter(path, 1, num_features=num_features)


def test_the_largest_int32_column_count_round_trips(tmp_path):
    """K = 2**31 - 1 fits (ids up to K - 1, padding id K): load_libsvm refused
    it (an off-by-one), so what save_libsvm wrote could not be read back."""
    k = 2**31 - 1
    x = jsr.csr_matrix(([1.0, 2.0], [0, k - 1], [0, 1, 2]), shape=(2, k))
    jsr.io.save_libsvm(tmp_path / "w.svm", x, [1, -1])
    for nf in (k, None):
        back, y = jsr.io.load_libsvm(tmp_path / "w.svm", num_features=nf)
        assert back.shape == (2, k)
        np.testing.assert_array_equal(np.asarray(back.indices), [0, k - 1])
        np.testing.assert_array_equal(np.asarray(y), [1, -1])


def test_an_id_past_the_index_dtype_names_the_line_and_id(tmp_path):
    path = tmp_path / "big.svm"
    path.write_text("1 1:2\n-1 3:1 4000000000:1\n")
    with pytest.raises(ValueError, match=r"line 2: feature id 4000000000 does not fit .*int32"):
        jsr.io.load_libsvm(path)


def test_ids_written_with_leading_zeros_past_18_characters(tmp_path):
    """Ids longer than 18 characters were refused even when their value was
    small; sklearn reads them. Their leading characters must be zeros."""
    path = tmp_path / "zeros.svm"
    path.write_text(f"1 {'0' * 30}7:2 3:1\n-1 {'0' * 40}1:5 {'0' * 17}12:1\n")
    x, y = jsr.io.load_libsvm(path, zero_based=True)
    assert x.shape == (2, 13)
    np.testing.assert_array_equal(np.asarray(x.indices), [3, 7, 1, 12])
    np.testing.assert_array_equal(np.asarray(x.data), [1, 2, 5, 1])
    np.testing.assert_array_equal(np.asarray(y), [1, -1])


@pytest.mark.parametrize(
    "token, what",
    [
        ("1" + "0" * 18, "feature id is larger than 10\\*\\*18 - 1"),
        ("12345678901234567890", "feature id is larger than 10\\*\\*18 - 1"),
        ("0" * 18 + "-1", "feature ids must be integers >= 0 written with digits only"),
        ("0" * 25 + "a1", "feature ids must be integers >= 0 written with digits only"),
        # a non-digit past the leading characters of a long id with another
        # leading digit was named "larger than 10**18 - 1"
        ("1.00000000000000000", "feature ids must be integers >= 0 written with digits only"),
        ("1" + "0" * 17 + "a", "feature ids must be integers >= 0 written with digits only"),
    ],
)
def test_long_ids_that_are_not_leading_zeros_are_refused(tmp_path, token, what):
    path = tmp_path / "long.svm"
    path.write_text(f"1 1:2\n-1 3:1 {token}:1\n")
    with pytest.raises(ValueError, match=rf"line 2: {what}, got token '{token}:1'"):
        jsr.io.load_libsvm(path)


def test_qid_tokens_get_their_own_message(tmp_path):
    path = tmp_path / "rank.svm"
    path.write_text("1 1:2\n2 qid:7 1:1\n")
    with pytest.raises(ValueError, match=r"line 2: `qid:` .* not supported.*got token 'qid:7'"):
        jsr.io.load_libsvm(path)


@pytest.mark.parametrize(
    "text, dtype, line, token",
    [
        ("1 1:2\n1 2:1e39\n", jnp.float32, 2, "2:1e39"),
        ("1 1:2\n-3.5e38 2:1\n", jnp.float32, 2, "-3.5e38"),
        ("70000 2:1\n", jnp.float16, 1, "70000"),
        ("1 1:65520\n", jnp.float16, 1, "1:65520"),
        ("1 3:3.4e38\n", jnp.bfloat16, 1, "3:3.4e38"),
        # float64 is float32 while 64-bit mode is off
        ("1 1:1e300\n", jnp.float64, 1, "1:1e300"),
        # too large for float64 too: numpy parses it as inf
        ("1 1:2 2:1e309\n", jnp.float32, 1, "2:1e309"),
    ],
)
def test_a_number_too_large_for_the_dtype_is_refused(tmp_path, text, dtype, line, token):
    """A finite number the dtype cannot hold is an error naming the token, not inf."""
    path = tmp_path / "big.svm"
    path.write_text(text)
    match = rf"big\.svm, line {line}: the (label|value) does not fit the dtype .*it would become "
    match += rf"inf.*got token '{re.escape(token)}'\. .*(wider `dtype`|correct the number)"
    with pytest.raises(ValueError, match=match):
        jsr.io.load_libsvm(path, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        list(LibSVMIter(path, 2, num_features=3, dtype=dtype, chunk_bytes=4))


def test_numbers_that_round_to_the_largest_finite_value_and_written_infinities_load(tmp_path):
    path = tmp_path / "edge.svm"
    path.write_text("65519 1:-65519 2:inf\n-inf 1:nan 2:-Infinity 3:INF\n")
    x, y = jsr.io.load_libsvm(path, dtype=jnp.float16)
    np.testing.assert_array_equal(np.asarray(y), np.array([65504, -np.inf], np.float16))
    data = np.asarray(x.data).astype(np.float64)
    np.testing.assert_array_equal(data, [-65504, np.inf, np.nan, -np.inf, np.inf])
    (batch,) = list(LibSVMIter(path, 2, num_features=3, dtype=jnp.float16))
    np.testing.assert_array_equal(np.asarray(batch.y), np.asarray(y))


def test_float64_with_64_bit_mode_holds_what_float32_cannot(tmp_path):
    path = tmp_path / "wide.svm"
    path.write_text("1e39 1:-1e300\n")
    with jax.enable_x64(True):
        x, y = jsr.io.load_libsvm(path, dtype=jnp.float64)
        assert x.dtype == jnp.float64
        np.testing.assert_array_equal(np.asarray(x.data), [-1e300])
        np.testing.assert_array_equal(np.asarray(y), [1e39])


def _empty_edge_columns(rng, k=7):
    dense = random_csr_np(rng, 9, k, 0.5)
    dense[:, 0] = 0  # an empty first column
    dense[:, -1] = 0  # an empty last column
    dense[3] = 0  # an empty row
    return dense


@pytest.mark.parametrize("zero_based", [True, False])
def test_round_trip_with_empty_first_and_last_columns_by_default(tmp_path, rng, zero_based):
    """The header keeps a zero-based file with an empty column 0 from being
    read one column to the left, and keeps the empty last columns."""
    dense = _empty_edge_columns(rng)
    labels = np.arange(9.0, dtype=np.float32)
    path = tmp_path / "rt.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), labels, zero_based=zero_based)
    first = path.read_text().split("\n", 1)[0]
    assert first == f"# jaxsparse_rows libsvm zero_based={int(zero_based)} num_features=7"
    x, y = jsr.io.load_libsvm(path)
    assert x.shape == (9, 7)
    np.testing.assert_array_equal(dense_np(x), dense)
    np.testing.assert_array_equal(np.asarray(y), labels)
    assert_canonical(x)
    x, _ = jsr.io.load_libsvm(path, zero_based=zero_based, num_features=10)  # agrees: read
    assert x.shape == (9, 10)
    np.testing.assert_array_equal(dense_np(x)[:, :7], dense)
    for zb in ("auto", zero_based):
        batches = list(LibSVMIter(path, 4, num_features=7, zero_based=zb, chunk_bytes=16))
        np.testing.assert_array_equal(batches_to_dense(batches, 7)[0], dense)
        np.testing.assert_array_equal(batches_to_dense(batches, 7)[1], labels)


@pytest.mark.parametrize("zero_based", [True, False])
def test_a_zero_based_argument_that_contradicts_the_header_is_refused(tmp_path, zero_based):
    path = tmp_path / "h.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(np.eye(3, dtype=np.float32)), [1, 2, 3], zero_based)
    match = (
        rf"`zero_based={not zero_based}` contradicts the header line of .*h\.svm .*records "
        rf'`zero_based={int(zero_based)}`.*Pass `zero_based="auto"` \(or {zero_based}\)'
    )
    with pytest.raises(ValueError, match=match):
        jsr.io.load_libsvm(path, zero_based=not zero_based)
    with pytest.raises(ValueError, match=match):
        list(LibSVMIter(path, 2, num_features=3, zero_based=not zero_based))


def test_without_the_header_files_read_as_before(tmp_path):
    """``header=False`` writes plain LibSVM lines; ``"auto"`` then looks for a
    0 id and the column count is the largest id + 1."""
    dense = np.array([[0, 1, 0, 0], [0, 0, 2, 0]], np.float32)
    path = tmp_path / "plain.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), [1, -1], zero_based=True, header=False)
    assert path.read_text() == "1 1:1\n-1 2:2\n"
    x, _ = jsr.io.load_libsvm(path)  # no 0 id: taken as one-based
    np.testing.assert_array_equal(dense_np(x), [[1, 0], [0, 2]])
    x, _ = jsr.io.load_libsvm(path, zero_based=True, num_features=4)
    np.testing.assert_array_equal(dense_np(x), dense)


def test_the_header_of_an_empty_matrix_keeps_its_shape(tmp_path):
    path = tmp_path / "none.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(np.zeros((0, 5), np.float32)), np.zeros(0))
    x, y = jsr.io.load_libsvm(path)
    assert x.shape == (0, 5) and y.shape == (0,)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "# jaxsparse_rows libsvm zero_based=yes\n1 1:1\n",
            r"h\.svm, line 1: the `# jaxsparse_rows libsvm` header line must record "
            r"`zero_based=0` or `zero_based=1`, got 'zero_based=yes'",
        ),
        (
            "# jaxsparse_rows libsvm num_features=-3\n1 1:1\n",
            r"line 1: .*must record `num_features=K` with an int K >= 0, got 'num_features=-3'",
        ),
        (
            "# jaxsparse_rows libsvm zero_based=0 num_features=2\n1 1:1\n-1 3:1\n",
            r"line 3: feature id 3 is out of range for `num_features=2` recorded in the header",
        ),
        (
            "# jaxsparse_rows libsvm num_features=3000000000\n1 1:1\n",
            r"line 1: the header line records `num_features=3000000000`, which does not fit",
        ),
    ],
)
def test_a_header_line_that_does_not_fit_is_named(tmp_path, text, match):
    path = tmp_path / "h.svm"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        jsr.io.load_libsvm(path)


def test_the_header_is_read_on_the_first_line_only_and_passes_unknown_fields(tmp_path):
    path = tmp_path / "h.svm"
    path.write_text("# jaxsparse_rows libsvm zero_based=1 num_features=4 extra=x\r\n1 0:2\r\n")
    x, _ = jsr.io.load_libsvm(path)
    assert x.shape == (1, 4)
    x, _ = jsr.io.load_libsvm(path, num_features=2)  # an explicit count is used
    assert x.shape == (1, 2)
    path.write_text("1 1:2\n# jaxsparse_rows libsvm zero_based=1 num_features=4\n")
    x, _ = jsr.io.load_libsvm(path)  # a comment like any other
    np.testing.assert_array_equal(dense_np(x), [[2]])


def test_the_header_is_a_comment_for_sklearn(tmp_path, rng):
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    dense = _empty_edge_columns(rng)
    path = tmp_path / "sk.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), np.arange(9), zero_based=True)
    x, y = sklearn_datasets.load_svmlight_file(
        str(path), n_features=7, dtype=np.float32, zero_based=True
    )
    np.testing.assert_array_equal(x.toarray(), dense)
    np.testing.assert_array_equal(y, np.arange(9))


@pytest.mark.parametrize(
    "raw, line",
    [
        (b"1 1:2\r-1 2:3\r", 1),
        # a comment would run to the end of the file and hide every line
        (b"# made on a Mac\r1 1:2\r-1 2:3\r", 1),
        (b"# jaxsparse_rows libsvm zero_based=0 num_features=3\r1 1:2\r", 1),
        # CR-only lines after "\n" lines
        (b"1 1:2\n-1 2:3\r1 3:1\r", 2),
        (b"1 1:2\n-1 2:3\r1 3:1\n", 2),
        (b"1 1:2\n\n# note\r-1 2:3\r1 3:1\n", 3),
        (b"1\r-1\r1\r", 1),
    ],
)
def test_cr_only_line_endings_are_named(tmp_path, raw, line):
    path = tmp_path / "mac.svm"
    path.write_bytes(raw)
    match = rf"mac\.svm, line {line}: .*the file uses CR-only line endings.*Convert the line "
    match += r"endings to '\\n' first"
    with pytest.raises(ValueError, match=match):
        jsr.io.load_libsvm(path)
    for chunk_bytes in (4, 1 << 20):
        with pytest.raises(ValueError, match=match):
            list(LibSVMIter(path, 2, num_features=3, chunk_bytes=chunk_bytes))


def test_crlf_line_endings_load_and_stream(tmp_path, rng):
    dense = _empty_edge_columns(rng)
    path = tmp_path / "dos.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), np.arange(9), zero_based=True)
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    x, y = jsr.io.load_libsvm(path)  # the header line ends with "\r\n" too
    np.testing.assert_array_equal(dense_np(x), dense)
    np.testing.assert_array_equal(np.asarray(y), np.arange(9))
    for chunk_bytes in (5, 1 << 20):
        it = LibSVMIter(path, 4, num_features=7, zero_based="auto", chunk_bytes=chunk_bytes)
        np.testing.assert_array_equal(batches_to_dense(list(it), 7)[0], dense)
    path.write_bytes(b"1 1:2\r")  # one line ended by "\r" alone
    x, y = jsr.io.load_libsvm(path)
    np.testing.assert_array_equal(dense_np(x), [[2]])
    path.write_bytes(b"1 1:2 # note\r\r\n-1 2:1\r 3:1 \r\n")  # a "\r" within a line: a space
    x, y = jsr.io.load_libsvm(path)
    np.testing.assert_array_equal(dense_np(x), [[2, 0, 0], [0, 1, 1]])


# -- buckets and batches ---------------------------------------------------------
def test_nnz_bucket():
    assert [nnz_bucket(n) for n in (0, 1, 16, 17, 1000)] == [16, 16, 16, 32, 1024]
    assert nnz_bucket(5, minimum=1) == 8
    assert nnz_bucket(50, buckets=(64, 256)) == 64
    assert nnz_bucket(300, buckets=(64, 256)) == 512  # never loses entries


def test_nnz_bucket_takes_buckets_in_any_order_and_as_numpy():
    assert nnz_bucket(50, buckets=[256, 64, 64]) == 64
    assert nnz_bucket(np.int64(50), buckets=np.array([256, 64])) == 64
    assert nnz_bucket(256, buckets=(256, 64)) == 256
    assert nnz_bucket(0, buckets=[8]) == 8
    assert nnz_bucket(3, minimum=np.int32(4)) == 4


@pytest.mark.parametrize(
    "args,kwargs,exc,match",
    [
        ((5,), {"buckets": 8}, TypeError, r"`buckets` must be None or a sequence.*got int 8"),
        ((5,), {"buckets": "64"}, TypeError, r"`buckets` must be None or a sequence.*got str"),
        ((5,), {"buckets": {64}}, TypeError, r"`buckets` must be None or a sequence.*got set"),
        ((5,), {"buckets": []}, ValueError, r"`buckets` must be None .* or a non-empty seq"),
        ((5,), {"buckets": [[64]]}, ValueError, r"`buckets` must be a flat sequence"),
        ((5,), {"buckets": [64, 0]}, ValueError, r"`buckets\[1\]` must be an int >= 1, got 0"),
        ((5,), {"buckets": [64.0]}, TypeError, r"`buckets\[0\]` must be an int >= 1, got float"),
        ((5,), {"buckets": [True]}, TypeError, r"`buckets\[0\]` must be an int >= 1, got bool"),
        ((-1,), {}, ValueError, r"`nnz` must be an int >= 0, got -1"),
        ((True,), {}, TypeError, r"`nnz` must be an int >= 0, got bool True"),
        ((2.5,), {}, TypeError, r"`nnz` must be an int >= 0, got float 2.5"),
        (("5",), {}, TypeError, r"`nnz` must be an int >= 0, got str '5'"),
        ((5,), {"minimum": 0}, ValueError, r"`minimum` must be an int >= 1, got 0"),
        ((5,), {"minimum": None}, TypeError, r"`minimum` must be an int >= 1, got NoneType"),
        ((5,), {"minimum": np.bool_(True)}, TypeError, r"`minimum` must be an int >= 1, got"),
    ],
)
def test_nnz_bucket_checks_its_arguments(args, kwargs, exc, match):
    """`buckets=8` raised "'int' object is not iterable", `nnz=-1` and
    `minimum=0` were accepted, and `buckets=[]` meant None."""
    with pytest.raises(exc, match=match):
        nnz_bucket(*args, **kwargs)


def batches_to_dense(batches, k):
    xs, ys = [], []
    for b in batches:
        n = int(b.num_rows)
        xs.append(dense_np(b.x)[:n])
        ys.append(np.asarray(b.y)[:n])
        # padded rows are empty and carry zero labels
        assert not dense_np(b.x)[n:].any() and not np.asarray(b.y)[n:].any()
    return np.concatenate(xs) if xs else np.zeros((0, k)), np.concatenate(ys) if ys else None


def check_batch(b: Batch, m: int, k: int, buckets=None):
    assert b.x.shape == (m, k)
    nnz = int(b.x.nnz)
    assert b.x.nse == nnz_bucket(nnz, buckets)
    assert_canonical(b.x)
    assert b.num_rows.dtype == jnp.int32 and b.y.shape[0] == m


@pytest.mark.parametrize("m", [1, 4, 7])
def test_csriter_pad_covers_everything(rng, m):
    dense = random_csr_np(rng, 23, 11, 0.3)
    labels = rng.standard_normal((23, 2)).astype(np.float32)  # n-d labels
    it = CSRIter(jsr.csr_matrix(dense), labels, m, last_batch="pad")
    batches = list(it)
    assert len(batches) == len(it) == -(-23 // m)
    for b in batches:
        check_batch(b, m, 11)
    got_x, got_y = batches_to_dense(batches, 11)
    np.testing.assert_array_equal(got_x, dense)
    np.testing.assert_array_equal(got_y, labels)
    np.testing.assert_array_equal(batches[-1].mask, np.arange(m) < 23 - (len(batches) - 1) * m)


def test_csriter_discard_and_roll_over(rng):
    dense = random_csr_np(rng, 10, 5, 0.5)
    labels = np.arange(10.0, dtype=np.float32)
    x = jsr.csr_matrix(dense)
    disc = list(CSRIter(x, labels, 4, last_batch="discard"))
    assert len(disc) == 2 and all(int(b.num_rows) == 4 for b in disc)
    np.testing.assert_array_equal(batches_to_dense(disc, 5)[0], dense[:8])
    it = CSRIter(x, labels, 4, last_batch="roll_over")
    ep1 = [np.asarray(b.y) for b in it]
    ep2 = [np.asarray(b.y) for b in it]
    np.testing.assert_array_equal(np.concatenate(ep1), labels[:8])
    # rows 8, 9 roll over to the start of the next epoch
    np.testing.assert_array_equal(np.concatenate(ep2), np.r_[8, 9, labels][:12])


def test_csriter_shuffle_deterministic_and_complete(rng):
    dense = random_csr_np(rng, 30, 6, 0.4)
    labels = np.arange(30.0, dtype=np.float32)
    x = jsr.csr_matrix(dense)
    a, b = CSRIter(x, labels, 5, shuffle=True, seed=3), CSRIter(x, labels, 5, shuffle=True, seed=3)
    ep_a1 = np.concatenate([np.asarray(t.y) for t in a])
    ep_b1 = np.concatenate([np.asarray(t.y) for t in b])
    ep_a2 = np.concatenate([np.asarray(t.y) for t in a])
    np.testing.assert_array_equal(ep_a1, ep_b1)  # same seed, same order
    assert not np.array_equal(ep_a1, labels) and not np.array_equal(ep_a1, ep_a2)
    np.testing.assert_array_equal(np.sort(ep_a1), labels)
    got_x = np.concatenate([dense_np(t.x) for t in CSRIter(x, labels, 5, shuffle=True, seed=3)])
    np.testing.assert_array_equal(got_x, dense[ep_a1.astype(int)])


def test_csriter_argument_errors(rng):
    x = jsr.csr_matrix(np.eye(4, dtype=np.float32))
    with pytest.raises(ValueError, match="labels"):
        CSRIter(x, np.zeros(3), 2)
    with pytest.raises(ValueError, match="last_batch"):
        CSRIter(x, np.zeros(4), 2, last_batch="wrap")
    with pytest.raises(ValueError, match="batch_size"):
        CSRIter(x, np.zeros(4), 0)
    with pytest.raises(ValueError, match="nnz_buckets"):
        CSRIter(x, np.zeros(4), 2, nnz_buckets=[])


def test_user_buckets_and_overflow_moves_up(rng):
    dense = np.zeros((6, 40), np.float32)
    dense[0, :3] = 1
    dense[2:4, :] = 2  # 80 entries in the second batch
    batches = list(CSRIter(jsr.csr_matrix(dense), np.zeros(6), 2, nnz_buckets=[4, 8]))
    assert [b.x.nse for b in batches] == [4, 128, 4]
    for b in batches:
        check_batch(b, 2, 40, buckets=(4, 8))
    np.testing.assert_array_equal(batches_to_dense(batches, 40)[0], dense)


def test_jitted_step_compiles_once_per_bucket(rng):
    dense = random_csr_np(rng, 64, 50, 0.1)
    dense[8:16] = rng.standard_normal((8, 50))  # one much denser batch
    x = jsr.csr_matrix(dense)
    w = jnp.ones((50,))

    @jax.jit
    def step(w, batch):
        pred = jsr.dot(batch.x, w)
        return jnp.sum(jnp.where(batch.mask, (pred - batch.y) ** 2, 0.0)) / batch.num_rows

    seen = set()
    total = 0.0
    for epoch in range(2):
        for batch in CSRIter(x, np.zeros(64, np.float32), 8, shuffle=True, seed=epoch):
            seen.add(batch.x.nse)
            total += float(step(w, batch))
    assert len(seen) >= 2
    assert step._cache_size() == len(seen)
    np.testing.assert_allclose(total, 2 * np.sum((dense @ np.ones(50)) ** 2) / 8, rtol=1e-4)


def test_stack_batches_scan(rng):
    dense = random_csr_np(rng, 12, 7, 0.4)
    dense[0] = 1.0  # first batch lands in a larger bucket than the others
    labels = rng.standard_normal(12).astype(np.float32)
    batches = list(CSRIter(jsr.csr_matrix(dense), labels, 3, min_nnz=1))
    assert len({b.x.nse for b in batches}) > 1
    stacked = stack_batches(batches)

    def body(acc, b):
        return acc + jsr.dot(b.x, jnp.arange(7.0)) * b.mask, None

    out, _ = jax.lax.scan(body, jnp.zeros(3), stacked)
    np.testing.assert_allclose(out, (dense @ np.arange(7.0)).reshape(4, 3).sum(0), rtol=1e-5)
    with pytest.raises(ValueError, match="empty"):
        stack_batches([])


# -- streaming ----------------------------------------------------------------------
@pytest.mark.parametrize("chunk_bytes", [5, 64, 1 << 20])
@pytest.mark.parametrize("last_batch", ["pad", "discard"])
def test_libsvmiter_matches_in_memory(tmp_path, rng, chunk_bytes, last_batch):
    dense = random_csr_np(rng, 37, 15, 0.3)
    labels = rng.integers(-1, 2, 37)
    path = tmp_path / "stream.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), labels)
    it = LibSVMIter(path, 8, num_features=15, last_batch=last_batch, chunk_bytes=chunk_bytes)
    for _epoch in range(2):  # re-iterable: one pass per epoch
        batches = list(it)
        ref = list(
            CSRIter(jsr.csr_matrix(dense), labels.astype(np.float32), 8, last_batch=last_batch)
        )
        assert len(batches) == len(ref)
        for b, r in zip(batches, ref, strict=True):
            check_batch(b, 8, 15)
            np.testing.assert_array_equal(dense_np(b.x), dense_np(r.x))
            np.testing.assert_array_equal(b.y, r.y)
            assert int(b.num_rows) == int(r.num_rows) and b.x.nse == r.x.nse


def test_libsvmiter_roll_over(tmp_path):
    path = tmp_path / "ro.svm"
    path.write_text("".join(f"{i} 1:{i}\n" for i in range(5)))
    it = LibSVMIter(path, 2, num_features=1, last_batch="roll_over", chunk_bytes=7)
    assert [b.y.tolist() for b in it] == [[0, 1], [2, 3]]
    assert [b.y.tolist() for b in it] == [[4, 0], [1, 2], [3, 4]]


def test_libsvmiter_errors_name_the_right_line(tmp_path):
    path = tmp_path / "err.svm"
    path.write_text("".join(f"1 {i + 1}:1\n" for i in range(50)) + "1 3:1e\n")
    with pytest.raises(ValueError, match=re.escape("err.svm, line 51: not a number")):
        list(LibSVMIter(path, 4, num_features=60, chunk_bytes=32))
    with pytest.raises(ValueError, match=r"line 7: feature id 7 is out of range"):
        list(LibSVMIter(path, 4, num_features=6, chunk_bytes=32))
    with pytest.raises(ValueError, match=r'`zero_based="auto"` takes the base .* records none'):
        list(LibSVMIter(path, 4, num_features=60, zero_based="auto", chunk_bytes=32))
    with pytest.raises(ValueError, match=r'`zero_based` must be True, False or "auto"'):
        LibSVMIter(path, 4, num_features=6, zero_based="yes")
    with pytest.raises(FileNotFoundError):
        LibSVMIter(tmp_path / "missing.svm", 4, num_features=6)


def test_chunked_parse_matches_whole_file(tmp_path, rng):
    from jaxsparse_rows.io._libsvm import parse_libsvm_bytes, parse_libsvm_file

    dense = random_csr_np(rng, 40, 30, 0.2)
    path = tmp_path / "chunks.svm"
    jsr.io.save_libsvm(path, jsr.csr_matrix(dense), rng.integers(0, 5, 40), header=False)
    path.write_text("# header\n\n" + path.read_text().replace("\n", "  # c\n", 3))
    whole = parse_libsvm_bytes(path.read_bytes(), path)
    for chunk in (7, 100, 1 << 20):
        parts = parse_libsvm_file(path, chunk)
        for a, b in zip(parts, whole, strict=True):
            np.testing.assert_array_equal(a, b)
    path.write_text(path.read_text() + "1 3:4 3:5\n")
    with pytest.raises(ValueError, match=r"line 43: feature id 3 appears twice"):
        parse_libsvm_file(path, 50)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"shuffle": "no"}, TypeError, r"`shuffle` must be True or False, got str 'no'"),
        ({"shuffle": 1}, TypeError, r"`shuffle` must be True or False"),
        ({"seed": None}, TypeError, r"`seed` must be an int >= 0.*got NoneType None"),
        ({"seed": 1.5}, TypeError, r"`seed` must be an int >= 0.*got float 1.5"),
        ({"seed": -1}, ValueError, r"`seed` must be an int >= 0, got -1"),
        ({"nnz_buckets": 8}, TypeError, r"`nnz_buckets` must be None or a sequence.*got int 8"),
        ({"nnz_buckets": "16"}, TypeError, r"`nnz_buckets` must be None or a sequence"),
        ({"nnz_buckets": [16.5]}, TypeError, r"`nnz_buckets\[0\]` must be an int >= 1"),
        ({"nnz_buckets": [16, -2]}, ValueError, r"`nnz_buckets\[1\]` must be an int >= 1"),
    ],
)
def test_csriter_checks_shuffle_seed_and_buckets_at_construction(kwargs, exc, match):
    """`shuffle="no"` shuffled; a bad seed or bucket list failed (without the
    argument's name) only when iteration began."""
    x = jsr.csr_matrix(np.eye(4, dtype=np.float32))
    with pytest.raises(exc, match=match):
        CSRIter(x, np.zeros(4), 2, **kwargs)
    ok = CSRIter(x, np.zeros(4), 2, shuffle=np.bool_(True), seed=np.int64(3), nnz_buckets=(16,))
    assert len(list(ok)) == 2


def test_stack_batches_refuses_mixed_dtypes_and_shapes():
    """Batches were cast to the first batch's data dtype without a word."""
    eye = np.eye(4, dtype=np.float32)
    f32 = list(CSRIter(jsr.csr_matrix(eye), np.zeros(4, np.float32), 2))
    f16 = list(CSRIter(jsr.csr_matrix(eye.astype(np.float16)), np.zeros(4, np.float32), 2))
    int_y = list(CSRIter(jsr.csr_matrix(eye), np.zeros(4, np.int32), 2))
    wide_y = list(CSRIter(jsr.csr_matrix(eye), np.zeros((4, 3), np.float32), 2))
    match = r"`batches\[2\]\.x` has dtype float16, but `batches\[0\]\.x` has dtype float32"
    with pytest.raises(TypeError, match=match):
        stack_batches(f32 + f16)
    with pytest.raises(TypeError, match=r"`batches\[2\]\.y` has dtype int32.*float32"):
        stack_batches(f32 + int_y)
    with pytest.raises(ValueError, match=r"`batches\[2\]\.y` has shape \(2, 3\).*\(2,\)"):
        stack_batches(f32 + wide_y)
    with pytest.raises(TypeError, match=r"`batches\[1\]` must be a jsr.io.Batch, got tuple"):
        stack_batches([f32[0], (1, 2)])
    assert stack_batches(f16).x.dtype == jnp.float16  # one dtype: stacked as it is


def test_save_libsvm_refuses_non_numeric_labels_and_flag(tmp_path):
    x = jsr.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(TypeError, match=r"`labels` must hold real numbers.*dtype <U3 \(strings\)"):
        jsr.io.save_libsvm(tmp_path / "s.svm", x, ["cat", "dog"])
    with pytest.raises(TypeError, match=r"`labels` must hold real numbers.*object"):
        jsr.io.save_libsvm(tmp_path / "s.svm", x, [1, None])
    with pytest.raises(TypeError, match=r"`zero_based` must be True or False, got str 'yes'"):
        jsr.io.save_libsvm(tmp_path / "s.svm", x, [1, 0], zero_based="yes")
    with pytest.raises(TypeError, match=r"`header` must be True or False, got int 1"):
        jsr.io.save_libsvm(tmp_path / "s.svm", x, [1, 0], header=1)
    jsr.io.save_libsvm(tmp_path / "s.svm", x, np.array([True, False]))
    header = "# jaxsparse_rows libsvm zero_based=0 num_features=2\n"
    assert (tmp_path / "s.svm").read_text() == header + "1 1:1\n0 2:1\n"


def test_csriter_refuses_labels_that_int32_would_wrap():
    """With x64 off int64 labels became int32: 2**40 became 0."""
    x = jsr.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError, match=r"`labels` must fit in int32"):
        jsr.io.CSRIter(x, np.array([2**40, 1]), batch_size=2)
    with pytest.raises(TypeError, match=r"`labels` must hold numbers or bools"):
        jsr.io.CSRIter(x, np.array(["a", "b"]), batch_size=2)
    batch = next(iter(jsr.io.CSRIter(x, np.array([2**31 - 1, 1]), batch_size=2)))
    np.testing.assert_array_equal(batch.y, [2**31 - 1, 1])
