"""The native CPU kernel behind ``jsr.dot(csr, dense)``: built, used, and equal to
the XLA path and to a numpy oracle, with autodiff, vmap and malformed input."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import jax.extend
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_switch import REQUIRED, kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native
from jaxsparse_rows._dot import (
    _csr_dense_native,
    _csr_dense_xla,
    _csr_t_dense_native,
    _csr_t_dense_xla,
)

TARGET = _native.CSR_DENSE.target
T_TARGET = _native.CSR_T_DENSE.target


def test_kernels_built_where_required():
    """CI sets JAXSPARSE_ROWS_REQUIRE_NATIVE=1, so there the kernels must load."""
    if not REQUIRED:
        pytest.skip("JAXSPARSE_ROWS_REQUIRE_NATIVE is not set")
    assert _native.native_kernels_status() == "ok", _native.native_kernels_status()
    assert _native.library_path() is not None


def _oracle(vals, cols, indptr, table):
    """float64 numpy product; ids outside [0, K) read a zero row (0 * value)."""
    vals, table = np.asarray(vals, np.float64), np.asarray(table, np.float64)
    m, k = len(indptr) - 1, table.shape[0]
    out = np.zeros((m,) + table.shape[1:])
    for r in range(m):
        for j in range(indptr[r], indptr[r + 1]):
            row = table[cols[j]] if 0 <= cols[j] < k else np.zeros(table.shape[1:])
            out[r] += vals[j] * row
    return out


def _random_problem(rng, m, k, d, max_row, pad, dtype=np.float32, idtype=np.int32):
    lengths = rng.integers(0, max_row + 1, size=m)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(idtype)
    nnz = int(indptr[-1])
    cols = rng.integers(0, max(k, 1), size=nnz + pad).astype(idtype)
    cols[nnz:] = k  # padding slots, as CSR pads them
    vals = rng.standard_normal(nnz + pad).astype(dtype)
    shape = (k,) if d is None else (k, d)
    table = rng.standard_normal(shape).astype(dtype)
    return vals, cols, indptr, table


def _seed_csr(dtype=jnp.float32):
    """The 3x5 csr [[7, 0, 8, 0, 0], [0] * 5, [0, 9, 0, 0, 0]] and its numpy form."""
    x = jsr.csr_matrix(([7.0, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5), dtype=dtype)
    dense = np.zeros((3, 5))
    dense[[0, 0, 2], [0, 2, 1]] = [7.0, 8, 9]
    return x, dense


def _both_paths(vals, cols, indptr, table):
    args = tuple(jnp.asarray(a) for a in (vals, cols, indptr, table))
    native = jax.jit(_csr_dense_native)(*args)
    xla = jax.jit(_csr_dense_xla)(*args)
    return np.asarray(native), np.asarray(xla)


@needs_kernels
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 30),
    d=st.sampled_from([None, 1, 3, 64]),
    max_row=st.integers(0, 12),
    pad=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_native_matches_oracle_and_xla(m, k, d, max_row, pad, seed):
    rng = np.random.default_rng(seed)
    vals, cols, indptr, table = _random_problem(rng, m, k, d, max_row, pad)
    if vals.size == 0:
        vals, cols = np.ones(1, np.float32), np.full(1, k, np.int32)  # one padding slot
    native, xla = _both_paths(vals, cols, indptr, table)
    expected = _oracle(vals, cols, indptr, table)
    np.testing.assert_allclose(native, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(native, xla, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
def test_native_dtypes(rng, dtype, idtype):
    with jax.enable_x64(True):
        vals, cols, indptr, table = _random_problem(rng, 30, 20, 5, 6, 2, dtype, idtype)
        args = tuple(jnp.asarray(a) for a in (vals, cols, indptr, table))
        assert _native.supports(args[0], args[3], args[1], args[2])
        hlo = jax.jit(_csr_dense_native).lower(*args).as_text()
        assert TARGET in hlo
        out = jax.jit(_csr_dense_native)(*args)
        assert out.dtype == dtype
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(
            np.asarray(out), _oracle(vals, cols, indptr, table), rtol=tol, atol=tol
        )


@needs_kernels
def test_threaded_path_is_correct_and_deterministic(rng):
    """Work above the threading threshold splits rows over XLA's pool; every row
    is still summed in entry order by one thread, so repeated calls agree bitwise."""
    vals, cols, indptr, table = _random_problem(rng, 700, 5000, 64, 60, 5)
    assert vals.size * 64 > 1 << 16
    f = jax.jit(_csr_dense_native)
    args = tuple(jnp.asarray(a) for a in (vals, cols, indptr, table))
    first = np.asarray(f(*args))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(*args)), first)
    np.testing.assert_allclose(first, _oracle(vals, cols, indptr, table), rtol=1e-4, atol=1e-4)


@needs_kernels
def test_dot_uses_the_kernel_only_when_enabled():
    x, dense = _seed_csr()
    y = jnp.arange(10.0).reshape(5, 2)
    expected = dense @ np.asarray(y)
    assert jsr.native_kernels_enabled()
    assert TARGET in jax.jit(lambda a, b: jsr.dot(a, b)).lower(x, y).as_text()
    np.testing.assert_allclose(jsr.dot(x, y), expected)
    with kernels_set(False):
        assert not jsr.native_kernels_enabled()
        assert TARGET not in jax.jit(lambda a, b: jsr.dot(a, b)).lower(x, y).as_text()
        np.testing.assert_allclose(jsr.dot(x, y), expected)
    assert jsr.native_kernels_enabled()


@needs_kernels
def test_unsupported_dtypes_use_xla():
    x, dense = _seed_csr(jnp.float16)
    y = np.arange(10).reshape(5, 2).astype(np.float16)
    hlo = jax.jit(lambda a, b: jsr.dot(a, b)).lower(x, jnp.asarray(y)).as_text()
    assert TARGET not in hlo
    out = jsr.dot(x, jnp.asarray(y))
    assert out.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(out, np.float64), dense @ y)  # exact in float16


@needs_kernels
def test_rowsparse_rhs_missing_rows_read_zero_and_propagate_nan():
    """Ids absent from a RowSparse rhs read a zero row: 0 adds nothing, but a
    non-finite CSR value times that zero row is NaN, as in the dense product."""
    x = jsr.csr_matrix(([1.0, np.inf, 2.0], [0, 1, 3], [0, 2, 3]), shape=(2, 4))
    rhs = jsr.row_sparse_array(([[1.0, 2.0], [3.0, 4.0]], [0, 3]), shape=(4, 2))
    with np.errstate(invalid="ignore"):
        expected = x.asnumpy() @ rhs.asnumpy()
    for fn in (jsr.dot, jax.jit(jsr.dot)):
        out = np.asarray(fn(x, rhs))
        np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
        np.testing.assert_allclose(out[1], expected[1])
    assert TARGET in jax.jit(jsr.dot).lower(x, rhs).as_text()


@needs_kernels
def test_gradients_match_the_xla_path(rng):
    vals, cols, indptr, table = _random_problem(rng, 6, 9, 3, 4, 2)
    args = tuple(jnp.asarray(a) for a in (vals, cols, indptr, table))

    def loss(fn):
        return lambda v, t: jnp.sum(jnp.sin(fn(v, args[1], args[2], t)))

    g_native = jax.jit(jax.grad(loss(_csr_dense_native), argnums=(0, 1)))(args[0], args[3])
    g_xla = jax.jit(jax.grad(loss(_csr_dense_xla), argnums=(0, 1)))(args[0], args[3])
    for a, b in zip(g_native, g_xla, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    jax.test_util.check_grads(
        lambda v, t: _csr_dense_native(v, args[1], args[2], t),
        (args[0], args[3]),
        order=1,
        modes=["fwd", "rev"],
        atol=1e-2,
        rtol=1e-2,
    )


@needs_kernels
def test_gradient_wrt_table_gathers_nothing_from_it():
    """The table gradient's program gathers only from the [M, D] cotangent,
    never from the [K, D] table (the native product is the only forward pass)."""
    k, d = 1000, 8
    x = jsr.csr_matrix(([1.0, 2.0, 3.0], [4, 7, 999], [0, 2, 3]), shape=(2, k))
    table = jnp.ones((k, d))
    grad = jax.grad(lambda t: jnp.sum(jsr.dot(x, t) ** 2))
    hlo = jax.jit(grad).lower(table).as_text()
    operands = re.findall(r"\"stablehlo\.gather\".*? : \((tensor<[^>]*>)", hlo)
    assert operands, "expected the cotangent gather"
    assert f"tensor<{k}x{d}xf32>" not in operands, operands
    assert TARGET in hlo  # the primal product (needed for the square) runs natively
    g_ref = jax.grad(lambda t: jnp.sum((jnp.asarray(x.asnumpy()) @ t) ** 2))(table)
    np.testing.assert_allclose(grad(table), g_ref, rtol=1e-6)


@needs_kernels
def test_jvp_in_the_table_alone_skips_the_values_term():
    """Symbolic-zero tangents: a JVP in the table alone computes no XLA product
    of the (zero) value tangents, which would gather from the [K, D] table."""
    x = jsr.csr_matrix(([1.0, 2.0, 3.0], [4, 7, 99], [0, 2, 3]), shape=(2, 100))
    table = jnp.ones((100, 8))
    closed = jax.make_jaxpr(lambda t, dt: jax.jvp(lambda u: jsr.dot(x, u), (t,), (dt,)))(
        table, table
    )
    t_var, dt_var = closed.jaxpr.invars
    sources = [e.invars[0] for e in closed.jaxpr.eqns if e.primitive.name == "gather"]
    assert dt_var in sources
    assert t_var not in sources


@needs_kernels
def test_vmap_runs_the_kernel_per_batch_element(rng):
    vals, cols, indptr, _ = _random_problem(rng, 5, 7, 2, 4, 1)
    tables = jnp.asarray(rng.standard_normal((3, 7, 2)).astype(np.float32))
    f = jax.jit(jax.vmap(lambda t: _csr_dense_native(vals, cols, indptr, t)))
    out = f(tables)
    for b in range(3):
        np.testing.assert_allclose(
            out[b], _oracle(vals, cols, indptr, np.asarray(tables[b])), rtol=1e-5, atol=1e-5
        )


@needs_kernels
@pytest.mark.parametrize(
    "cols,indptr",
    [
        ([0, 1, 2, 3], [0, 3, 1]),  # decreasing indptr
        ([0, 1, 2, 3], [2, 9, 40]),  # indptr past nse
        ([-5, 1, 2**30, 3], [0, 2, 4]),  # negative and huge column ids
        ([0, 1, 2, 3], [-7, 2, 4]),  # negative indptr
    ],
)
def test_malformed_input_is_memory_safe(cols, indptr):
    """Under jit the values are not checked (``jsr.check`` does that); the kernel
    clamps every index it reads, so malformed input gives some values, no crash."""
    vals = jnp.ones(4)
    table = jnp.arange(12.0).reshape(4, 3)
    out = jax.jit(_csr_dense_native)(
        vals, jnp.asarray(cols, jnp.int32), jnp.asarray(indptr, jnp.int32), table
    )
    assert out.shape == (len(indptr) - 1, 3)
    assert np.isfinite(np.asarray(out)).all()


def test_missing_library_falls_back_to_xla(monkeypatch):
    """Without the built library the status says why and dot runs its XLA path."""
    monkeypatch.setattr(_native, "_status", None)
    monkeypatch.setattr(_native._library, "library_path", lambda: None)
    assert not jsr.native_kernels_available()
    assert "not built" in _native.native_kernels_status()
    x, dense = _seed_csr()
    y = np.arange(10.0, dtype=np.float32).reshape(5, 2)
    assert TARGET not in jax.jit(lambda a, b: jsr.dot(a, b)).lower(x, y).as_text()
    np.testing.assert_allclose(jsr.dot(x, jnp.asarray(y)), dense @ y)


@needs_kernels
def test_kernels_built_for_a_newer_jaxlib_are_not_registered(monkeypatch):
    """Kernels compiled against a newer jaxlib than the running one are refused
    before any handler is registered (XLA would reject their FFI version and
    fail to start its CPU backend); the status says how to rebuild them."""
    monkeypatch.setattr(_native._library, "jaxlib_version", lambda: "0.4.1")
    registered = []
    monkeypatch.setattr(jax.ffi, "register_ffi_target", lambda *a, **k: registered.append(a))
    status = _native._library.load()
    assert status.startswith("the kernels were built against jaxlib ")
    assert "but jaxlib 0.4.1 is running" in status and "--no-build-isolation" in status
    assert registered == []
    monkeypatch.setattr(_native._library, "jaxlib_version", lambda: "99.0")
    assert _native._library.load() == "ok" and len(registered) == len(_native.TARGETS)


def test_environment_variable_turns_the_kernels_off():
    code = "import jaxsparse_rows as jsr; print(jsr.native_kernels_enabled())"
    env = dict(os.environ, JAXSPARSE_ROWS_NATIVE="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@needs_kernels
def test_first_use_inside_jit_loads_the_kernels():
    """The lazy load and self-test run when the first product is traced inside
    ``jax.jit``; nothing of the self-test may leak into that trace."""
    code = (
        "import jax, jax.numpy as jnp, jaxsparse_rows as jsr\n"
        "from jaxsparse_rows import _native\n"
        "x = jsr.csr_matrix(([7.0, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))\n"
        "lowered = jax.jit(jsr.dot).lower(x, jnp.ones((5, 2)))\n"
        "print(_native.native_kernels_status(), _native.CSR_DENSE.target in lowered.as_text())\n"
        "print(jax.jit(jsr.dot)(x, jnp.ones((5, 2))).tolist())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAXSPARSE_ROWS_NATIVE"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "ok True"
    assert out[1] == "[[15.0, 15.0], [0.0, 0.0], [9.0, 9.0]]"


@needs_kernels
def test_mixed_dtypes_run_in_xla_without_casting_the_table():
    """float32 values times a bfloat16 table: the kernel would need a float32 copy
    of the whole [K, D] table, so XLA runs it and casts only the gathered rows."""
    k, d = 500, 4
    x = jsr.csr_matrix(([1.5, -2.0, 3.0], [4, 7, 499], [0, 2, 3]), shape=(2, k))
    table = jnp.asarray(np.random.default_rng(0).standard_normal((k, d)), jnp.bfloat16)
    hlo = jax.jit(jsr.dot).lower(x, table).as_text()
    assert TARGET not in hlo
    assert f"tensor<{k}x{d}xf32>" not in hlo
    out = jsr.dot(x, table)
    assert out.dtype == jnp.float32
    expected = x.asnumpy() @ np.asarray(table, np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@needs_kernels
def test_out_of_range_ids_match_xla_exactly():
    """Negative and too-large column ids read a zero row in both paths, so a
    finite value adds nothing and a non-finite one gives NaN, bit for bit."""
    vals = np.array([1.0, np.inf, 2.0, -np.inf, np.nan, 3.0], np.float32)
    cols = np.array([-1, -3, 2**30, 5, 0, 1], np.int32)
    indptr = np.array([0, 1, 2, 3, 4, 6], np.int32)
    table = np.arange(15.0, dtype=np.float32).reshape(5, 3)
    native, xla = _both_paths(vals, cols, indptr, table)
    np.testing.assert_array_equal(native, xla)
    assert np.isnan(native[1]).all() and np.isnan(native[3]).all() and np.isnan(native[4]).all()
    np.testing.assert_array_equal(native[0], 0)
    np.testing.assert_array_equal(native[2], 0)


@needs_kernels
def test_toggling_retraces_jitted_functions():
    """set_native_kernels clears the caches, so an already-jitted function
    retraces and takes the other path."""
    traces = []

    def f(a, b):
        traces.append(jsr.native_kernels_enabled())
        return jsr.dot(a, b)

    g = jax.jit(f)
    x = jsr.csr_matrix(([7.0, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    y = jnp.ones((5, 2))
    first = g(x, y)
    g(x, y)
    with kernels_set(False):
        second = g(x, y)
    assert traces == [True, False]
    np.testing.assert_array_equal(first, second)


@needs_kernels
def test_malformed_input_on_the_threaded_path(rng):
    """Garbage indptr and ids, with enough work to split rows over threads."""
    m, nse, k, d = 400, 6000, 300, 64
    vals = jnp.asarray(rng.standard_normal(nse).astype(np.float32))
    cols = jnp.asarray(rng.integers(-(2**31), 2**31 - 1, nse, dtype=np.int64).astype(np.int32))
    indptr = jnp.asarray(rng.integers(-50, nse + 50, m + 1).astype(np.int32))
    table = jnp.asarray(rng.standard_normal((k, d)).astype(np.float32))
    assert nse * d > 1 << 16
    out = jax.jit(_csr_dense_native)(vals, cols, indptr, table)
    assert out.shape == (m, d)
    assert np.isfinite(np.asarray(out)).all()


@needs_kernels
def test_second_order_and_vmap_of_grad(rng):
    vals, cols, indptr, table = _random_problem(rng, 5, 7, 3, 4, 1)
    args = tuple(jnp.asarray(a) for a in (vals, cols, indptr, table))

    def loss(fn, v, t):
        return jnp.sum(jnp.tanh(fn(v, args[1], args[2], t)))

    h_native = jax.hessian(lambda v: loss(_csr_dense_native, v, args[3]))(args[0])
    h_xla = jax.hessian(lambda v: loss(_csr_dense_xla, v, args[3]))(args[0])
    np.testing.assert_allclose(h_native, h_xla, rtol=1e-5, atol=1e-6)
    tables = jnp.stack([args[3], 2 * args[3], -args[3]])
    g_native = jax.vmap(jax.grad(lambda t: loss(_csr_dense_native, args[0], t)))(tables)
    g_xla = jax.vmap(jax.grad(lambda t: loss(_csr_dense_xla, args[0], t)))(tables)
    np.testing.assert_allclose(g_native, g_xla, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------- transposed product


def _t_oracle(vals, cols, rows, table, k):
    """Sorted distinct valid columns and float64 sums of vals[j] * table[rows[j]]."""
    vals, table = np.asarray(vals, np.float64), np.asarray(table, np.float64)
    sums = {}
    for j in range(len(vals)):
        c = int(cols[j])
        if not 0 <= c < k:
            continue
        r = int(rows[j])
        row = table[r] if 0 <= r < table.shape[0] else np.zeros(table.shape[1:])
        sums[c] = sums.get(c, 0.0) + vals[j] * row
    idx = np.array(sorted(sums), np.int64)
    data = np.array([sums[c] for c in idx]).reshape((len(idx),) + table.shape[1:])
    return idx, data


def _t_problem(rng, nse, k, t_rows, d, dtype=np.float32, idtype=np.int32):
    cols = rng.integers(-2, k + 2, nse).astype(idtype)  # some ids out of range
    rows = rng.integers(-1, t_rows + 1, nse).astype(idtype)  # some rows missing
    vals = rng.standard_normal(nse).astype(dtype)
    table = rng.standard_normal((t_rows,) if d is None else (t_rows, d)).astype(dtype)
    return vals, cols, rows, table


def _check_t(vals, cols, rows, table, k, tol=1e-5):
    args = tuple(jnp.asarray(a) for a in (vals, cols, rows, table))
    idx_n, data_n = jax.jit(_csr_t_dense_native, static_argnums=4)(*args, k)
    idx_x, data_x = jax.jit(_csr_t_dense_xla, static_argnums=4)(*args, k)
    np.testing.assert_array_equal(idx_n, idx_x)
    np.testing.assert_allclose(data_n, data_x, rtol=tol, atol=tol)
    idx_o, data_o = _t_oracle(vals, cols, rows, table, k)
    n = len(idx_o)
    cap = min(len(vals), k)
    assert idx_n.shape == (cap,) and data_n.shape[0] == cap
    np.testing.assert_array_equal(np.asarray(idx_n)[:n], idx_o)
    np.testing.assert_array_equal(np.asarray(idx_n)[n:], k)
    np.testing.assert_allclose(np.asarray(data_n)[:n], data_o, rtol=tol, atol=tol)
    np.testing.assert_array_equal(np.asarray(data_n)[n:], 0)


@needs_kernels
@given(
    nse=st.integers(1, 60),
    k=st.integers(1, 3000),
    t_rows=st.integers(1, 12),
    d=st.sampled_from([None, 1, 5]),
    seed=st.integers(0, 2**16),
)
def test_transposed_kernel_matches_oracle_and_xla(nse, k, t_rows, d, seed):
    """Column ids up to 3000 take two radix passes; ids and rows out of range."""
    _check_t(*_t_problem(np.random.default_rng(seed), nse, k, t_rows, d), k)


@needs_kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("idtype", [np.int32, np.int64])
def test_transposed_kernel_dtypes_and_wide_ids(rng, dtype, idtype):
    """Column ids near 2**30 take three radix passes."""
    with jax.enable_x64(True):
        k = 2**30 + 5
        vals, cols, rows, table = _t_problem(rng, 200, 50, 7, 3, dtype, idtype)
        cols = (cols.astype(np.int64) * (2**24) + 3).astype(idtype)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        _check_t(vals, cols, rows, table, k, tol)


@needs_kernels
def test_transposed_dot_uses_the_kernel_and_keeps_padding_out(rng):
    """Padding slots (past indptr[-1], column id K) add no row; the result
    equals the dense product and the XLA path's, indices included."""
    base = jsr.csr_matrix(([7.0, 8, 9], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 5))
    x = jsr.CSR._make(
        jnp.concatenate([base.data, jnp.full((3,), 4.0)]),
        jnp.concatenate([base.indices, jnp.full((3,), 5, base.indices.dtype)]),
        base.indptr,
        base.shape,
    )
    y = jnp.asarray(rng.standard_normal((3, 2)).astype(np.float32))
    f = jax.jit(lambda a, b: jsr.dot(a, b, transpose_a=True))
    assert T_TARGET in f.lower(x, y).as_text()
    out = f(x, y)
    assert out.indices.shape == (5,)
    np.testing.assert_array_equal(out.indices, [0, 1, 2, 5, 5])
    np.testing.assert_allclose(out.todense(), base.asnumpy().T @ np.asarray(y), rtol=1e-6)
    with kernels_set(False):
        ref = f(x, y)
    np.testing.assert_array_equal(out.indices, ref.indices)
    np.testing.assert_allclose(out.data, ref.data, rtol=1e-6)


@needs_kernels
def test_transposed_kernel_non_finite_values(rng):
    """A non-finite value in a missing row gives NaN in its column, as in XLA."""
    vals = np.array([np.inf, 1.0, -np.inf, 2.0], np.float32)
    cols = np.array([3, 3, 1, 0], np.int32)
    rows = np.array([9, 0, 1, 1], np.int32)  # row 9 is outside the 2-row table
    table = np.ones((2, 2), np.float32)
    args = tuple(jnp.asarray(a) for a in (vals, cols, rows, table))
    idx_n, data_n = jax.jit(_csr_t_dense_native, static_argnums=4)(*args, 4)
    idx_x, data_x = jax.jit(_csr_t_dense_xla, static_argnums=4)(*args, 4)
    np.testing.assert_array_equal(idx_n, idx_x)
    np.testing.assert_array_equal(data_n, data_x)
    np.testing.assert_array_equal(idx_n, [0, 1, 3, 4])
    assert np.isnan(np.asarray(data_n)[2]).all() and np.isinf(np.asarray(data_n)[1]).all()


@needs_kernels
def test_transposed_gradients_match_the_xla_path(rng):
    vals, cols, rows, table = _t_problem(rng, 30, 12, 5, 3)
    args = tuple(jnp.asarray(a) for a in (vals, cols, rows, table))

    def loss(fn):
        def f(v, t):
            _, data = fn(v, args[1], args[2], t, 12)
            return jnp.sum(jnp.sin(data) * jnp.arange(data.size).reshape(data.shape))

        return f

    g_native = jax.jit(jax.grad(loss(_csr_t_dense_native), argnums=(0, 1)))(args[0], args[3])
    g_xla = jax.jit(jax.grad(loss(_csr_t_dense_xla), argnums=(0, 1)))(args[0], args[3])
    for a, b in zip(g_native, g_xla, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    jax.test_util.check_grads(
        lambda v, t: _csr_t_dense_native(v, args[1], args[2], t, 12)[1],
        (args[0], args[3]),
        order=2,
        modes=["fwd", "rev"],
        atol=1e-2,
        rtol=1e-2,
    )
    tables = jnp.stack([args[3], -2 * args[3]])
    out = jax.vmap(lambda t: _csr_t_dense_native(args[0], args[1], args[2], t, 12)[1])(tables)
    for b in range(2):
        _, ref = _t_oracle(vals, cols, rows, np.asarray(tables[b]), 12)
        np.testing.assert_allclose(np.asarray(out[b])[: len(ref)], ref, rtol=1e-5, atol=1e-5)


@needs_kernels
def test_transposed_kernel_large_output(rng):
    """An output above the huge-page advice threshold (4 MB), written by both
    threads, is correct and the same bit for bit on every call."""
    nse, k, d = 40000, 10**6, 32
    vals, cols, rows, table = _t_problem(rng, nse, k, 100, d)
    _check_t(vals, cols, rows, table, k, tol=1e-4)
    f = jax.jit(_csr_t_dense_native, static_argnums=4)
    args = tuple(jnp.asarray(a) for a in (vals, cols, rows, table))
    first = [np.asarray(a) for a in f(*args, k)]
    for _ in range(3):
        again = f(*args, k)
        np.testing.assert_array_equal(again[0], first[0])
        np.testing.assert_array_equal(again[1], first[1])


@needs_kernels
def test_transposed_vmap_of_grad_and_indices(rng):
    vals, cols, rows, table = _t_problem(rng, 25, 9, 4, 2)
    args = tuple(jnp.asarray(a) for a in (vals, cols, rows, table))

    def loss(fn, t):
        _, data = fn(args[0], args[1], args[2], t, 9)
        return jnp.sum(jnp.cos(data))

    tables = jnp.stack([args[3], 3 * args[3], -args[3]])
    g_native = jax.jit(jax.vmap(jax.grad(lambda t: loss(_csr_t_dense_native, t))))(tables)
    g_xla = jax.jit(jax.vmap(jax.grad(lambda t: loss(_csr_t_dense_xla, t))))(tables)
    np.testing.assert_allclose(g_native, g_xla, rtol=1e-5, atol=1e-6)
    idx = jax.vmap(lambda t: _csr_t_dense_native(args[0], args[1], args[2], t, 9)[0])(tables)
    expected_idx, _ = _t_oracle(vals, cols, rows, table, 9)
    for b in range(3):
        n = len(expected_idx)
        np.testing.assert_array_equal(np.asarray(idx[b])[:n], expected_idx)
        np.testing.assert_array_equal(np.asarray(idx[b])[n:], 9)


@needs_kernels
@pytest.mark.parametrize("transpose_a", [False, True])
def test_rowsparse_rhs_matches_xla_through_dot(rng, transpose_a):
    """dot(csr, rsp) and dot(csr, rsp, transpose_a=True): kernels on and off."""
    m, k, p = 7, 9, 3
    dense = rng.standard_normal((m, k)) * (rng.random((m, k)) < 0.4)
    x = jsr.CSR.fromdense(jnp.asarray(dense.astype(np.float32)))
    n_rhs = m if transpose_a else k
    rows = np.sort(rng.choice(n_rhs, 3, replace=False)).astype(np.int32)
    rhs = jsr.row_sparse_array(
        (rng.standard_normal((3, p)).astype(np.float32), rows), shape=(n_rhs, p)
    ).with_capacity(5)
    f = jax.jit(lambda a, b: jsr.dot(a, b, transpose_a=transpose_a))
    target = T_TARGET if transpose_a else TARGET
    assert target in f.lower(x, rhs).as_text()
    out = f(x, rhs)
    with kernels_set(False):
        ref = f(x, rhs)
    if transpose_a:
        np.testing.assert_array_equal(out.indices, ref.indices)
        out, ref = out.data, ref.data
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    lhs = dense.T if transpose_a else dense
    expected = lhs.astype(np.float32) @ rhs.asnumpy()
    got = jsr.dot(x, rhs, transpose_a=transpose_a)
    np.testing.assert_allclose(
        got.asnumpy() if transpose_a else got, expected, rtol=1e-5, atol=1e-5
    )


def test_transposed_column_count_beyond_the_index_dtype_stays_in_xla(monkeypatch):
    """K above int32's range (x64 off) cannot pad int32 indices. The kernel is
    not used (the trace raises, so there is no program to inspect: a spy on the
    kernel's entry point sees no call); the XLA path reports the overflow, with
    the kernels on or off. At K = int32 max the kernel still runs, and agrees
    with XLA."""
    from jaxsparse_rows import _dot

    calls = []
    real = _dot._csr_t_dense_native

    def spy(*args):
        calls.append(args[-1])
        return real(*args)

    monkeypatch.setattr(_dot, "_csr_t_dense_native", spy)

    def csr_with_columns(k):  # entries (0, 0) = 2 and (1, 5) = 3
        cols, indptr = jnp.array([0, 5], jnp.int32), jnp.array([0, 1, 2], jnp.int32)
        return jsr.CSR._make(jnp.array([2.0, 3.0]), cols, indptr, (2, k))

    f = jax.jit(lambda a, b: jsr.dot(a, b, transpose_a=True))
    y = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    for enabled in (True, False):
        with kernels_set(enabled), pytest.raises(OverflowError):
            f(csr_with_columns(2**31 + 10), jnp.asarray(y))
    assert calls == []

    k_max = int(np.iinfo(np.int32).max)
    results = []
    for enabled in (True, False):
        calls.clear()
        with kernels_set(enabled):
            hlo = f.lower(csr_with_columns(k_max), jnp.asarray(y)).as_text()
            uses_kernel = enabled and jsr.native_kernels_available()
            assert (T_TARGET in hlo) == uses_kernel
            assert bool(calls) == uses_kernel
            results.append(f(csr_with_columns(k_max), jnp.asarray(y)))
    for out in results:  # column 0 is 2 * y[0], column 5 is 3 * y[1]
        assert out.shape == (k_max, 3)
        np.testing.assert_array_equal(out.indices, [0, 5])
        np.testing.assert_array_equal(out.data, [2 * y[0], 3 * y[1]])


@needs_kernels
def test_self_test_catches_a_wrong_kernel(monkeypatch):
    """The load-time self-test passes on the real kernels and fails on wrong ones."""
    assert _native._selftest.self_test() == "ok"
    real = _native.csr_dense_call
    monkeypatch.setattr(_native._registry, "csr_dense_call", lambda *a: 2 * real(*a))
    assert "product differed" in _native._selftest.self_test()
    monkeypatch.setattr(_native._registry, "csr_dense_call", real)
    real_t = _native.csr_t_dense_call

    def shifted(vals, cols, rows, table, k):
        idx, data = real_t(vals, cols, rows, table, k)
        return idx, data + 1

    monkeypatch.setattr(_native._registry, "csr_t_dense_call", shifted)
    assert "transposed product differed" in _native._selftest.self_test()
