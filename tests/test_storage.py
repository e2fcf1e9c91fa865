"""Storage types: stype, cast_storage between all pairs (eager and under jit),
zeros, the dense fallback warning and the verbose inference log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt

DENSE = np.array([[0.0, 1.5, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, -3.0], [0.0, 0.0, 0.0]])


def as_stype(stype, dtype=jnp.float32):
    x = jnp.asarray(DENSE, dtype)
    return x if stype == "default" else jsr.cast_storage(x, stype)


def test_stype_and_is_sparse():
    for s in ("default", "row_sparse", "csr"):
        x = as_stype(s)
        assert jsr.stype(x) == s and jsr.is_sparse(x) == (s != "default")
    assert jsr.stype(np.ones(2)) == "default" and jsr.stype(3.0) == "default"
    assert jsr.todense(jnp.ones(2)).shape == (2,)


@pytest.mark.parametrize("src", ["default", "row_sparse", "csr"])
@pytest.mark.parametrize("dst", ["default", "row_sparse", "csr"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cast_storage_all_pairs(src, dst, dtype, jit_mode):
    x = as_stype(src, dtype)
    f = lambda v: jsr.cast_storage(v, dst)
    g = lambda v: v.tostype(dst) if jsr.is_sparse(v) else jsr.cast_storage(v, dst)
    traced_dense_to_sparse = src == "default" and dst != "default"
    if traced_dense_to_sparse and jit_mode(f) is not f:
        with pytest.raises(ValueError, match="needs a static capacity"):
            jit_mode(f)(x)
        return
    for fn in (f, g):
        out = jit_mode(fn)(x)
        jsrt.assert_allclose(out, DENSE, stype=dst, dtype=dtype)
    if src == dst:
        assert f(x) is x


def _pattern(rng, shape, dtype, row_density=0.6, density=0.7):
    """A numpy array of ``shape``: some all-zero rows, some zeros inside rows."""
    keep_row = rng.random(shape[:1]) < row_density
    keep = (rng.random(shape) < density) & keep_row.reshape((-1,) + (1,) * (len(shape) - 1))
    return np.where(keep, jsrt.random_dense(rng, shape, dtype), np.zeros((), dtype))


def _nonzero_rows(dense):
    return np.flatnonzero(dense.any(axis=tuple(range(1, dense.ndim))))


def _rsp_of(dense, pad):
    """A RowSparse storing the non-zero rows of the numpy ``dense`` (built in
    numpy), plus ``pad`` padding slots."""
    n = dense.shape[0]
    rows = _nonzero_rows(dense)
    idx = np.concatenate([rows, np.full(pad, n)]).astype(np.int32)
    data = np.concatenate([dense[rows], np.zeros((pad,) + dense.shape[1:], dense.dtype)])
    return jsr.RowSparse(jnp.asarray(data), jnp.asarray(idx), dense.shape)


def _csr_of(dense, pad):
    """A CSR of the non-zeros of the 2-D numpy ``dense`` (built in numpy), plus
    ``pad`` padding slots; and its (indices, indptr) without the padding."""
    m, k = dense.shape
    r, c = np.nonzero(dense)
    data = np.concatenate([dense[r, c], np.zeros(pad, dense.dtype)])
    cols = np.concatenate([c, np.full(pad, k)]).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=m))]).astype(np.int32)
    x = jsr.CSR(jnp.asarray(data), jnp.asarray(cols), jnp.asarray(indptr), (m, k))
    return x, (c, indptr)


# (shape, density, padding slots, dtype): empty, zero-width, all-zero, padded
# and n-d inputs.
CAST_CASES = [
    ((5, 4), 0.7, 0, np.float32),
    ((5, 4), 0.7, 2, np.float32),
    ((0, 3), 0.7, 0, np.float32),  # (0, K)
    ((0, 3), 0.7, 2, np.float32),
    ((4, 0), 0.7, 0, np.float32),  # (M, 0)
    ((4, 0), 0.7, 1, np.float32),
    ((3, 4), 0.0, 0, np.float32),  # nnz = 0: capacity 0
    ((3, 4), 0.0, 2, np.float32),  # nnz = 0, padding only
    ((4, 2, 3), 0.7, 1, np.float32),  # n-d rows (no csr form)
] + [((5, 4), 0.7, 2, d) for d in (jnp.bfloat16, np.float16, np.int32, np.bool_)]


@pytest.mark.parametrize(
    "shape,density,pad,dtype",
    CAST_CASES,
    ids=lambda v: np.dtype(v).name if isinstance(v, type) else str(v),
)
def test_cast_storage_grid(shape, density, pad, dtype, jit_mode):
    """row_sparse <-> csr <-> dense against numpy, eagerly (exact: only rows and
    entries holding a non-zero) and under jit (every stored entry kept)."""
    rng = np.random.default_rng(len(shape) * 7 + pad)
    dense = _pattern(rng, shape, dtype, density=density)
    nz_rows = _nonzero_rows(dense)
    jitted = jit_mode(jsr.stype) is not jsr.stype
    rsp = _rsp_of(dense, pad)
    if len(shape) != 2:  # row_sparse <-> dense only
        jsrt.assert_allclose(jit_mode(jsr.todense)(rsp), dense, stype="default", dtype=dtype)
        if not jitted:
            out = jsr.cast_storage(jnp.asarray(dense), "row_sparse")
            jsrt.assert_allclose(out, dense, stype="row_sparse", dtype=dtype)
            np.testing.assert_array_equal(out.indices, nz_rows)
        return
    csr, (cols, indptr) = _csr_of(dense, pad)

    def casts(rsp, csr):  # one program under jit
        c = jsr.cast_storage
        return c(rsp, "default"), c(csr, "default"), c(rsp, "csr"), c(csr, "row_sparse")

    rsp_d, csr_d, to_csr, to_rsp = jit_mode(casts)(rsp, csr)
    jsrt.assert_allclose(rsp_d, dense, stype="default", dtype=dtype)
    jsrt.assert_allclose(csr_d, dense, stype="default", dtype=dtype)
    jsrt.assert_allclose(to_csr, dense, stype="csr", dtype=dtype)
    jsrt.assert_allclose(to_rsp, dense, stype="row_sparse", dtype=dtype)
    if jitted:  # every stored entry, padding slots included, is kept
        assert to_csr.nse == rsp.capacity * shape[1]
        assert to_rsp.capacity <= min(csr.nse, shape[0])
        return
    # Eagerly the conversions are exact: only the non-zeros are stored; a dense
    # input converts too (under jit it needs a capacity).
    to_rsp2 = jsr.cast_storage(jnp.asarray(dense), "row_sparse")
    to_csr2 = jsr.cast_storage(jnp.asarray(dense), "csr")
    jsrt.assert_allclose(to_rsp2, dense, stype="row_sparse", dtype=dtype)
    jsrt.assert_allclose(to_csr2, dense, stype="csr", dtype=dtype)
    for out in (to_csr, to_csr2):
        np.testing.assert_array_equal(out.indices, cols)
        np.testing.assert_array_equal(out.indptr, indptr)
    for out in (to_rsp, to_rsp2):
        np.testing.assert_array_equal(out.indices, nz_rows)


def test_cast_storage_exact_and_under_jit_keeps_entries():
    rsp = jsr.cast_storage(jnp.asarray(DENSE), "row_sparse")
    assert rsp.indices.tolist() == [0, 2]  # exact: only non-zero rows
    csr = jsr.cast_storage(rsp, "csr")
    assert csr.nse == 3
    # under jit every stored entry of the row_sparse input is kept
    csr_j = jax.jit(lambda r: r.tostype("csr"))(rsp)
    assert csr_j.nse == rsp.capacity * 3
    jsrt.assert_allclose(csr_j, DENSE, stype="csr")
    rsp_j = jax.jit(lambda c: c.tostype("row_sparse"))(csr)
    jsrt.assert_allclose(rsp_j, DENSE, stype="row_sparse")
    assert rsp_j.capacity == min(csr.nse, DENSE.shape[0])


def test_cast_storage_bad_input():
    with pytest.raises(ValueError, match=r"`stype` must be one of .*got 'dense'"):
        jsr.cast_storage(jnp.ones((2, 2)), "dense")
    with pytest.raises(ValueError, match="only 2-D row_sparse arrays convert to csr"):
        jsr.cast_storage(jsr.zeros("row_sparse", (2, 2, 2)), "csr")
    with pytest.raises(ValueError, match="needs a 2-D `x`"):
        jsr.cast_storage(jnp.ones(3), "csr")
    with pytest.raises(ValueError, match=r"`stype` must be one of"):
        jsr.zeros("coo", (2, 2))


def test_zeros_default():
    z = jsr.zeros("default", (2, 3), dtype=jnp.float16)
    assert isinstance(z, jax.Array) and z.dtype == jnp.float16 and not np.any(np.asarray(z))


def test_apply_dense_warns_and_names_the_function(jit_mode):
    a = jsr.cast_storage(jnp.asarray(DENSE), "row_sparse")
    with pytest.warns(jsr.StorageFallbackWarning, match=r"^log\(row_sparse\): .*densified"):
        out = jit_mode(lambda a: jsr.apply_dense(jnp.log, a))(a)
    assert jsr.stype(out) == "default"
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.log(DENSE.astype(np.float32))
    np.testing.assert_allclose(np.asarray(out), expected)
    with pytest.warns(jsr.StorageFallbackWarning, match=r"maximum\(row_sparse, default\)"):
        out = jsr.apply_dense(jnp.maximum, a, 1.0)
    np.testing.assert_array_equal(np.asarray(out), np.maximum(DENSE, 1.0))


def test_verbose_logs_inference_and_fallback(caplog):
    a = jsr.cast_storage(jnp.asarray(DENSE), "row_sparse")
    caplog.set_level(logging.INFO, logger="jaxsparse_rows")
    assert not jsr.is_verbose()
    _ = a * 2
    assert not caplog.records  # off by default
    with jsr.verbose():
        assert jsr.is_verbose()
        _ = a * 2
        _ = a + jnp.ones(DENSE.shape)
        _ = a.tostype("csr")
        _ = jax.jit(lambda a: -a)(a)
        with pytest.warns(jsr.StorageFallbackWarning):
            jsr.apply_dense(jnp.exp, a)
    assert not jsr.is_verbose()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:4] == [
        "multiply(row_sparse, scalar) -> row_sparse",
        "add(row_sparse, default) -> default",
        "cast_storage(row_sparse) -> csr",
        "negative(row_sparse) -> row_sparse",
    ]
    assert messages[4].startswith("fallback: exp(row_sparse)")
    assert all(r.name == "jaxsparse_rows" for r in caplog.records)
    jsr.set_verbose(True)
    try:
        assert jsr.is_verbose()
    finally:
        jsr.set_verbose(False)


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("", False)])
def test_verbose_env_var_read_at_import(value, expected):
    code = (
        "import jax.numpy as jnp, jaxsparse_rows as jsr\n"
        "print(jsr.is_verbose())\n"
        "a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))\n"
        "b = a * 2\n"
    )
    env = dict(os.environ, JAXSPARSE_ROWS_VERBOSE=value, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == str(expected)
    logged = "[jaxsparse_rows] multiply(row_sparse, scalar) -> row_sparse" in proc.stderr
    assert logged == expected


_ROOT_HANDLERS = {
    "none": "",
    "basicConfig": "logging.basicConfig(format='%(name)s: %(message)s')\n",
    "warnings only": (
        "h = logging.StreamHandler(); h.setLevel(logging.WARNING)\n"
        "logging.getLogger().addHandler(h)\n"
    ),
}


@pytest.mark.parametrize("root", sorted(_ROOT_HANDLERS))
def test_verbose_lines_print_once_with_or_without_logging_configured(root):
    """With ``logging.basicConfig`` (a root handler) every line printed twice:
    once by the library's own handler and once by the root's. A root handler
    that hides INFO lines must not silence the log either."""
    configured = root == "basicConfig"
    code = (
        "import logging, jaxsparse_rows as jsr\n" + _ROOT_HANDLERS[root] + "jsr.set_verbose(True)\n"
        "a = jsr.row_sparse_array(([[1., 2.]], [1]), shape=(3, 2))\n"
        "b = a * 2\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "multiply(row_sparse, scalar)" in ln]
    prefix = "jaxsparse_rows: " if configured else "[jaxsparse_rows] "
    assert lines == [prefix + "multiply(row_sparse, scalar) -> row_sparse"], proc.stderr


def test_docs_storage_page_carries_the_inference_table():
    import pathlib
    import re

    from jaxsparse_rows import _elementwise

    doc_rows = []
    for line in (_elementwise.__doc__ or "").splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\S.*)$", line)
        if m and not line.startswith("=") and m.group(1) != "expression":
            doc_rows.append((m.group(1).replace("``", "`"), m.group(2)))
    assert len(doc_rows) == 12
    page = pathlib.Path(__file__).resolve().parents[1] / "docs" / "storage.md"
    text = page.read_text()
    md_rows = re.findall(r"^\| (.+?) \| (.+?) \|$", text, flags=re.M)
    for row in doc_rows:
        assert row in md_rows, row
    section = text.split("### Zero-preserving unary functions", 1)[1].split("##", 1)[0]
    for name in jsr.ZERO_PRESERVING_UNARY:
        assert f"`{name}`" in section or f"`jsr.{name}`" in section, name


def test_api_page_lists_every_zero_preserving_unary_function():
    """The factory-built unary functions have runtime docstrings that
    mkdocstrings cannot see, so api.md lists them in a table of its own."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    listed = re.findall(r"^\| `jsr\.(\w+)\(x\)` \|", text, re.MULTILINE)
    assert listed == list(jsr.ZERO_PRESERVING_UNARY)
    for name in listed:
        assert getattr(jsr, name).__doc__.startswith("Elementwise ")
