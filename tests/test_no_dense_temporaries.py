"""Structure that implies cost: tracing at V = 10^8 rows (never allocated) shows
no value with a dimension V in the gradient computation, in any nested program:
calls, control flow, custom derivatives, and both forms of the library's
kernels (the native CPU call and the XLA twin that runs on GPU and in exported
programs), whichever kernels setting traced it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import primitives as jex_primitives
from jaxpr_walk import big_values, primitive_names

import jaxsparse_rows as jsr
from jaxsparse_rows import _rowops
from jaxsparse_rows._kernel_call import kernel_call

# Every test runs with the native CPU kernels (where built) and with XLA's.
pytestmark = pytest.mark.usefixtures("kernels")

V = 10**8
D = 16


def _kernel_calls_seen(jaxpr, kernels):
    """With the kernels on, the id bookkeeping is a jsr_kernel_call (whose two
    forms the walk opens); with them off, XLA ops in place."""
    assert ("jsr_kernel_call" in primitive_names(jaxpr)) == (kernels == "native")


# ----------------------------------------------------- the walk reaches everywhere


def _temp(x):
    """``x`` plus a [V] temporary's sum (zero)."""
    return x + jnp.sum(jnp.zeros((V,), x.dtype))


def _no_temp(x):
    return x * 1


@jax.custom_jvp
def _custom_jvp(x):
    return _temp(x)


_custom_jvp.defjvp(lambda primals, tangents: (_custom_jvp(*primals), tangents[0]))


@jax.custom_vjp
def _custom_vjp(x):
    return _temp(x)


_custom_vjp.defvjp(lambda x: (_custom_vjp(x), None), lambda _, g: (g,))


def _closed_call(x):
    call_jaxpr = jax.make_jaxpr(_temp)(x)
    params = jex_primitives.closed_call_p.get_bind_params({"call_jaxpr": call_jaxpr})
    return jex_primitives.closed_call_p.bind(x, **params)[0]


HIDDEN = {
    "pjit": jax.jit(_temp),
    "closed_call": _closed_call,
    "custom_jvp": _custom_jvp,
    "custom_vjp": _custom_vjp,
    "remat": jax.checkpoint(_temp),
    "scan": lambda x: jax.lax.scan(lambda c, _: (_temp(c), None), x, None, length=2)[0],
    "cond_true_branch": lambda x: jax.lax.cond(x[0] > 0, _temp, _no_temp, x),
    "cond_false_branch": lambda x: jax.lax.cond(x[0] > 0, _no_temp, _temp, x),
    "while_body": lambda x: jax.lax.while_loop(lambda c: c[0] < 0, _temp, x),
    "while_cond": lambda x: jax.lax.while_loop(lambda c: _temp(c)[0] < 0, _no_temp, x),
    "kernel_call_native": lambda x: kernel_call(_temp, _no_temp, x),
    "kernel_call_xla": lambda x: kernel_call(_no_temp, _temp, x),
    "nested": jax.jit(
        lambda x: jax.lax.cond(x[0] > 0, lambda y: kernel_call(_no_temp, _temp, y), _no_temp, x)
    ),
}


@pytest.mark.parametrize("where", sorted(HIDDEN))
def test_the_walk_finds_a_temporary_in_every_nested_program(where):
    """The oracle the tests below rely on: a [V] temporary hidden in any nested
    program is found, though no top-level equation has it."""
    jaxpr = jax.make_jaxpr(HIDDEN[where])(jnp.ones(3))
    top_level = [o.aval.shape for e in jaxpr.jaxpr.eqns for o in e.outvars]
    assert (V,) not in top_level
    assert ("broadcast_in_dim", (V,)) in big_values(jaxpr, V)
    assert big_values(jax.make_jaxpr(_no_temp)(jnp.ones(3)), V) == []


def test_the_walk_opens_the_xla_form_of_the_row_primitives(monkeypatch):
    """jsr_gather_rows / jsr_sum_rows lower to a native kernel on CPU and to
    their XLA reference elsewhere: a temporary in the reference is found."""
    gather_ref, sum_ref = _rowops.gather_rows_xla, _rowops.sum_rows_xla
    monkeypatch.setattr(_rowops, "gather_rows_xla", lambda *a, **k: _temp(gather_ref(*a, **k)))
    monkeypatch.setattr(_rowops, "sum_rows_xla", lambda *a, **k: _temp(sum_ref(*a, **k)))
    rows = jax.ShapeDtypeStruct((4, 2), jnp.float32)
    ids = jax.ShapeDtypeStruct((4,), jnp.int32)
    for f in (lambda r, i: _rowops.gather_rows(r, i), lambda r, i: _rowops.sum_rows(r, i, 9)):
        jaxpr = jax.make_jaxpr(f)(rows, ids)
        assert [e.primitive.name for e in jaxpr.jaxpr.eqns][-1].startswith("jsr_")
        assert ("broadcast_in_dim", (V,)) in big_values(jaxpr, V)


# --------------------------------------------------------- the library's programs


def test_embedding_gradient_has_no_table_sized_intermediate(kernels):
    table = jax.ShapeDtypeStruct((V, D), jnp.float32)
    w = jax.ShapeDtypeStruct((D,), jnp.float32)
    ids = jax.ShapeDtypeStruct((1024, 4), jnp.int32)
    y = jax.ShapeDtypeStruct((1024,), jnp.float32)

    def loss(rows, w, ids, y):
        return jnp.mean((jnp.sum(jsr.take(rows, ids), axis=1) @ w - y) ** 2)

    def step(table, w, ids, y):
        rows = jsr.pull_rows(table, ids)
        return jsr.value_and_grad(loss, argnums=(0, 1))(rows, w, ids, y)

    jaxpr = jax.make_jaxpr(step)(table, w, ids, y)
    assert big_values(jaxpr, V) == []
    _kernel_calls_seen(jaxpr, kernels)
    # The row-sparse gradient is [K, D] with K = ids.size, not [V, D].
    out_shapes = [v.aval.shape for v in jaxpr.jaxpr.outvars]
    assert (1024 * 4, D) in out_shapes


def test_the_dense_path_does_have_one():
    """The oracle the test above relies on: plain jax.grad builds a [V, D] gradient."""
    table = jax.ShapeDtypeStruct((V, D), jnp.float32)
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda t, i: jnp.sum(t[i])))(table, ids)
    assert big_values(jaxpr, V), "dense jax.grad should materialise a [V, D] gradient"


def test_csr_gradients_have_no_table_sized_intermediate(kernels):
    x = jax.ShapeDtypeStruct((256,), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.int32)
    indptr = jax.ShapeDtypeStruct((33,), jnp.int32)
    w = jax.ShapeDtypeStruct((V, D), jnp.float32)
    y = jax.ShapeDtypeStruct((32, D), jnp.float32)

    def step(data, cols, indptr, w, y):
        batch = jsr.CSR._make(data, cols, indptr, (32, V))
        rows = jsr.pull_rows(w, batch.indices)
        return jsr.value_and_grad(lambda r: jnp.sum((jsr.dot(batch, r) - y) ** 2))(rows)

    jaxpr = jax.make_jaxpr(step)(*x, indptr, w, y)
    assert big_values(jaxpr, V) == []
    _kernel_calls_seen(jaxpr, kernels)


@pytest.mark.parametrize("bshape", [(64, 1), (1, V), (V,), (1, 1)])
def test_csr_times_a_broadcast_dense_operand_reads_only_the_entries(bshape):
    """csr * dense broadcast the dense operand to [M, K] before reading it at
    the entries: eagerly a per-row scale of a [64, 10**9] CSR ran out of
    memory allocating 256 GB."""
    data = jax.ShapeDtypeStruct((512,), jnp.float32)
    cols = jax.ShapeDtypeStruct((512,), jnp.int32)
    indptr = jax.ShapeDtypeStruct((65,), jnp.int32)
    scale = jax.ShapeDtypeStruct(bshape, jnp.float32)

    def f(data, cols, indptr, scale):
        return (jsr.CSR._make(data, cols, indptr, (64, V)) * scale).data

    jaxpr = jax.make_jaxpr(f)(data, cols, indptr, scale)
    # nothing larger than the operands: a [1, V] view of a [V] scale is fine,
    # the [64, V] broadcast is what ran out of memory
    assert big_values(jaxpr, 2 * V) == []


def test_transpose_dot_has_no_column_sized_intermediate(kernels):
    """dot(csr.T, dense) -> RowSparse over K = 10^8 columns without a [K, P] array."""
    data = jax.ShapeDtypeStruct((512,), jnp.float32)
    cols = jax.ShapeDtypeStruct((512,), jnp.int32)
    indptr = jax.ShapeDtypeStruct((65,), jnp.int32)
    rhs = jax.ShapeDtypeStruct((64, 8), jnp.float32)

    def f(data, cols, indptr, rhs):
        return jsr.dot(jsr.CSR._make(data, cols, indptr, (64, V)), rhs, transpose_a=True)

    jaxpr = jax.make_jaxpr(f)(data, cols, indptr, rhs)
    assert big_values(jaxpr, V) == []
    _kernel_calls_seen(jaxpr, kernels)
    lowered = jax.jit(f).lower(data, cols, indptr, rhs).as_text()
    exported = jax.export.export(jax.jit(f))(data, cols, indptr, rhs).mlir_module()
    for text in (lowered, exported):
        assert "tensor<512xi32>" in text  # sanity: the operands are in it
        assert f"{V}x" not in text


def test_row_sparse_step_lowers_without_table_sized_buffers_except_the_input(kernels):
    """Lowered for CPU (the kernels, where on) and exported (always XLA's ops,
    what other platforms get): the only tensor with V rows is the table."""
    table = jax.ShapeDtypeStruct((V, D), jnp.float32)
    ids = jax.ShapeDtypeStruct((64,), jnp.int32)

    def step(table, ids):
        rows = jsr.pull_rows(table, ids)
        return jsr.grad(lambda r: jnp.sum(jsr.take(r, ids) ** 2))(rows)

    lowered = jax.jit(step).lower(table, ids).as_text()
    exported = jax.export.export(jax.jit(step))(table, ids).mlir_module()
    assert ("stablehlo.custom_call" in lowered) == (kernels == "native")
    assert "stablehlo.custom_call" not in exported and "stablehlo.sort" in exported
    for text in (lowered, exported):
        occurrences = [line for line in text.splitlines() if f"{V}x" in line]
        assert any(f"tensor<{V}x{D}xf32>" in line for line in occurrences), "sanity: the table"
        assert all(
            f"tensor<{V}x{D}xf32>" in line and ("func.func" in line or "gather" in line)
            for line in occurrences
        ), occurrences
    assert np.prod((V, D)) > 10**9  # the table would need 6.4 GB: it is never allocated
