"""The "kernel on CPU, XLA elsewhere" primitive: eager calls, jit, vmap,
export, each against the XLA function it stands for."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.sparse.linalg import gmres
from kernel_switch import kernels_set, needs_kernels

import jaxsparse_rows as jsr
from jaxsparse_rows import _native, _rowops
from jaxsparse_rows._kernel_call import _jitted_bind, _one_device, kernel_call

pytestmark = needs_kernels


def _unique(ids):
    return kernel_call(
        _native.unique_ids_call, _rowops._unique_with_slots_xla, ids, n_rows=8, capacity=4
    )


def _want(ids):
    return _rowops._unique_with_slots_xla(jnp.asarray(ids), 8, 4)


def _same(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)
        assert g.dtype == w.dtype


def test_eager_calls_reuse_one_program():
    ids = jnp.array([5, 1, 5, 9, -1, 7, 2, 0], jnp.int32)
    _same(_unique(ids), _want(ids))  # compiled here
    before = _jitted_bind.cache_info()
    for shift in range(3):
        _same(_unique(ids + shift), _want(ids + shift))
    after = _jitted_bind.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 3)


def test_jit_calls_the_kernel_and_matches_xla():
    ids = jnp.array([3, 3, 0, 8, 6, 2, 1], jnp.int32)
    assert _native.UNIQUE_IDS.target in jax.jit(_unique).lower(ids).as_text()
    _same(jax.jit(_unique)(ids), _want(ids))


def test_vmap_runs_the_xla_function_batched():
    ids = jnp.array([[3, 3, 0, 9], [7, 1, 7, 7], [-2, 4, 4, 2]], jnp.int32)
    got = jax.jit(jax.vmap(_unique))(ids)
    assert _native.UNIQUE_IDS.target not in jax.jit(jax.vmap(_unique)).lower(ids).as_text()
    for i in range(ids.shape[0]):
        _same(jax.tree.map(lambda a, i=i: a[i], got), _want(ids[i]))


def test_export_lowers_to_the_xla_function():
    from jax import export

    ids = jnp.array([4, 2, 4, 0], jnp.int32)
    exported = export.export(jax.jit(_unique))(ids)
    assert _native.UNIQUE_IDS.target not in exported.mlir_module()
    _same(exported.call(ids), _want(ids))


def test_linear_transpose_and_krylov_solvers_through_kernel_products():
    """``jax.linear_transpose`` inlines the kernel calls of ``dot(csr, dense)``
    and of ``dense + RowSparse`` (a scatter-add); they had no transpose rule,
    so it and the solvers that transpose their matvec (gmres, bicgstab)
    failed with kernels on (the default, as in the solve below). The rule
    transposes the XLA twin."""
    x = jsr.csr_matrix(([1.0, 2.0, 3.0], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 3))
    xd = np.asarray(x.todense())
    w, y = jnp.ones((3, 2)), jnp.arange(6.0).reshape(3, 2)
    ids = jnp.array([0, 2])
    for on in (True, False):
        with kernels_set(on):
            got = jax.linear_transpose(lambda v: jsr.dot(x, v), w)(y)[0]
            np.testing.assert_allclose(got, xd.T @ np.asarray(y), rtol=1e-6)
            got = jax.linear_transpose(lambda d: w + jsr.RowSparse(d, ids, (3, 2)), y[:2])(y)[0]
            np.testing.assert_array_equal(got, np.asarray(y)[[0, 2]])
    # gmres transposes its matvec even in a plain forward solve (kernels on).
    sol = gmres(lambda v: jsr.dot(x, v) + v, jnp.ones(3))[0]
    want = np.linalg.solve(xd + np.eye(3), np.ones(3))
    np.testing.assert_allclose(sol, want, rtol=1e-4, atol=1e-5)


def test_linear_transpose_of_the_transposed_product():
    """``dot(csr, dense, transpose_a=True)`` returns its row ids from the same
    kernel call as its values. Under ``jax.linear_transpose`` with the kernels
    on, the ids are computed from the column ids alone, as known values, so a
    ``todense`` scatter can index with them (linear, unknown ids could not).
    Checked against the dense transpose ``X @ ct``
    (for the dense operand) and the entries' ``(x_col . ct) * d_row`` sums
    (for the values), with a padding entry past ``indptr[-1]`` and a repeated
    column, eagerly and under jit."""
    x = jsr.CSR(
        jnp.array([1.0, 2.0, 3.0, 4.0, 0.0]),
        jnp.array([0, 4, 1, 4, 6], jnp.int32),
        jnp.array([0, 2, 2, 4], jnp.int32),
        (3, 6),
    )
    xd = np.asarray(x.todense())
    rng = np.random.default_rng(0)
    d = jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)
    ct = rng.standard_normal((6, 2)).astype(np.float32)

    def wrt_dense(v):
        return jsr.dot(x, v, transpose_a=True).todense()

    def wrt_values(vals):
        return jsr.dot(jsr.CSR(vals, x.indices, x.indptr, x.shape), d, transpose_a=True).todense()

    rows = np.repeat(np.arange(3), np.diff(np.asarray(x.indptr)))
    cols = np.asarray(x.indices)[: len(rows)]
    want_vals = np.zeros(5, np.float32)
    want_vals[: len(rows)] = np.sum(ct[cols] * np.asarray(d)[rows], axis=1)
    for on in (True, False):
        with kernels_set(on):
            for wrap in (lambda f: f, jax.jit):
                got = wrap(lambda c: jax.linear_transpose(wrt_dense, d)(c)[0])(jnp.asarray(ct))
                np.testing.assert_allclose(got, xd @ ct, rtol=1e-5, atol=1e-6)
                got = wrap(lambda c: jax.linear_transpose(wrt_values, x.data)(c)[0])(
                    jnp.asarray(ct)
                )
                np.testing.assert_allclose(got, want_vals, rtol=1e-5, atol=1e-6)


# ------------------------------------------------- derivatives and the device rule


def _tripled_sin_xla(x, *, scale):
    return jnp.sin(x) * scale


def _tripled_sin_native(x, *, scale):  # a stand-in "kernel": another program, same values
    return jnp.sin(x * 1.0) * scale


def _scaled_xla(x, ids, *, scale):
    return x[ids] * scale


def _scaled_native(x, ids, *, scale):
    return jnp.take(x, ids, axis=0) * scale


def test_a_call_differentiates_through_its_xla_function():
    x = jnp.linspace(-1.0, 1.0, 5)

    def f(x):
        return jnp.sum(kernel_call(_tripled_sin_native, _tripled_sin_xla, x, scale=3.0))

    np.testing.assert_allclose(jax.grad(f)(x), 3 * jnp.cos(x), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(x), 3 * jnp.cos(x), rtol=1e-6)
    _, tangent = jax.jvp(f, (x,), (jnp.ones(5),))
    np.testing.assert_allclose(tangent, 3 * jnp.sum(jnp.cos(x)), rtol=1e-6)


def test_a_linear_call_is_its_own_tangent_and_transposes():
    """Declared linear in its first operand: the tangent is the same call (a
    second kernel call in the program), its transpose the XLA function's."""
    x = jnp.arange(6.0)
    ids = jnp.array([4, 0, 4], jnp.int32)

    def f(x):
        return kernel_call(_scaled_native, _scaled_xla, x, ids, linear=(0,), scale=2.0)

    _, tangent = jax.jvp(f, (x,), (jnp.ones(6),))
    np.testing.assert_array_equal(tangent, [2.0, 2.0, 2.0])
    jaxpr = jax.make_jaxpr(lambda x, t: jax.jvp(f, (x,), (t,)))(x, x)
    calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "jsr_kernel_call"]
    assert len(calls) == 2
    (ct,) = jax.linear_transpose(f, x)(jnp.array([1.0, 10.0, 100.0]))
    np.testing.assert_array_equal(ct, [20.0, 0, 0, 0, 202.0, 0])
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(f(x)))(x), [2, 0, 0, 0, 4, 0])


class _Mesh:
    def __init__(self, shape):
        self.shape = shape


class _Manual:
    def __init__(self, shape, manual):
        self.mesh, self.manual_axes = _Mesh(shape), frozenset(manual)


class _Devices:
    def __init__(self, n):
        self.num_devices = n


def test_kernels_run_in_programs_for_one_device():
    """The kernel runs where the program holds one device's values: a
    one-device program, a shard_map body manual over every axis of size > 1;
    a program XLA partitions gets the XLA function."""
    assert _one_device(_Devices(1))
    assert not _one_device(_Devices(8))
    assert _one_device(_Manual({"x": 4}, {"x"}))
    assert _one_device(_Manual({"x": 4, "y": 1}, {"x"}))
    assert not _one_device(_Manual({"x": 4, "y": 2}, {"x"}))
