"""Structure that implies cost: tracing at V = 10^8 rows (never allocated) shows
no value with a leading dimension V in the gradient computation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

import jaxsparse_rows as jsr

V = 10**8
D = 16


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _params_jaxprs(eqn):
            yield from _all_eqns(sub)


def _params_jaxprs(eqn):
    for value in eqn.params.values():
        values = value if isinstance(value, tuple | list) else (value,)
        for v in values:
            if isinstance(v, jex_core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jex_core.Jaxpr):
                yield v


def _big_values(closed_jaxpr, n_rows=V):
    """(primitive, shape) of every equation output whose leading dim is `n_rows`."""
    found = []
    for eqn in _all_eqns(closed_jaxpr.jaxpr):
        for var in eqn.outvars:
            shape = getattr(var.aval, "shape", ())
            if shape and shape[0] == n_rows:
                found.append((eqn.primitive.name, shape))
    return found


def test_embedding_gradient_has_no_table_sized_intermediate():
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
    assert _big_values(jaxpr) == []
    # The row-sparse gradient is [K, D] with K = ids.size, not [V, D].
    out_shapes = [v.aval.shape for v in jaxpr.jaxpr.outvars]
    assert (1024 * 4, D) in out_shapes


def test_the_dense_path_does_have_one():
    """The oracle the test above relies on: plain jax.grad builds a [V, D] gradient."""
    table = jax.ShapeDtypeStruct((V, D), jnp.float32)
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    jaxpr = jax.make_jaxpr(jax.grad(lambda t, i: jnp.sum(t[i])))(table, ids)
    assert _big_values(jaxpr), "dense jax.grad should materialise a [V, D] gradient"


def test_csr_gradients_have_no_table_sized_intermediate():
    x = jax.ShapeDtypeStruct((256,), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.int32)
    indptr = jax.ShapeDtypeStruct((33,), jnp.int32)
    w = jax.ShapeDtypeStruct((V, D), jnp.float32)
    y = jax.ShapeDtypeStruct((32, D), jnp.float32)

    def step(data, cols, indptr, w, y):
        batch = jsr.CSR._make(data, cols, indptr, (32, V))
        rows = jsr.pull_rows(w, batch.indices)
        return jsr.value_and_grad(lambda r: jnp.sum((jsr.dot(batch, r) - y) ** 2))(rows)

    jaxpr = jax.make_jaxpr(step)(*x, indptr, w, y)
    assert _big_values(jaxpr) == []


def test_transpose_dot_has_no_column_sized_intermediate():
    """dot(csr.T, dense) -> RowSparse over K = 10^8 columns without a [K, P] array."""
    data = jax.ShapeDtypeStruct((512,), jnp.float32)
    cols = jax.ShapeDtypeStruct((512,), jnp.int32)
    indptr = jax.ShapeDtypeStruct((65,), jnp.int32)
    rhs = jax.ShapeDtypeStruct((64, 8), jnp.float32)

    def f(data, cols, indptr, rhs):
        return jsr.dot(jsr.CSR._make(data, cols, indptr, (64, V)), rhs, transpose_a=True)

    jaxpr = jax.make_jaxpr(f)(data, cols, indptr, rhs)
    assert _big_values(jaxpr) == []
    lowered = jax.jit(f).lower(data, cols, indptr, rhs).as_text()
    assert f"{V}x" not in lowered


def test_row_sparse_step_lowers_without_table_sized_buffers_except_the_input():
    table = jax.ShapeDtypeStruct((V, D), jnp.float32)
    ids = jax.ShapeDtypeStruct((64,), jnp.int32)

    def step(table, ids):
        rows = jsr.pull_rows(table, ids)
        return jsr.grad(lambda r: jnp.sum(jsr.take(r, ids) ** 2))(rows)

    text = jax.jit(step).lower(table, ids).as_text()
    # The only tensor with V rows is the table parameter itself.
    occurrences = [line for line in text.splitlines() if f"tensor<{V}x{D}xf32>" in line]
    assert occurrences, "sanity: the table parameter appears in the module"
    assert all("func.func" in line or "gather" in line for line in occurrences), occurrences
    assert np.prod((V, D)) > 10**9  # the table would need 6.4 GB: it is never allocated
