"""RowSparse / CSR as pytrees: tree.map, jit arguments and outputs, device_put,
pickling, repr under tracing, hashing, vmap-free transforms."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows import testing as jsrt


def arrays(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return [
        jsrt.random_rowsparse(rng, (6, 2), n_rows=2, capacity=3, dtype=dtype),
        jsrt.random_rowsparse(rng, (4, 2, 3), n_rows=4, dtype=dtype),
        jsr.zeros("row_sparse", (0, 2), dtype=dtype),
        jsrt.random_csr(rng, (4, 5), density=0.4, nse=9, dtype=dtype),
        jsr.zeros("csr", (2, 3), dtype=dtype),
    ]


def same(a, b):
    assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb, strict=True):
        assert isinstance(v, jax.Array) and u.dtype == v.dtype
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tree_map_flatten_unflatten(dtype):
    for x in arrays(dtype):
        same(x, jax.tree.map(lambda v: v, x))
        leaves, treedef = jax.tree.flatten(x)
        assert len(leaves) == (2 if x.stype == "row_sparse" else 3)
        same(x, jax.tree.unflatten(treedef, leaves))
        # the static shape is aux data: trees with equal shapes share a structure
        assert jax.tree.structure(x) == jax.tree.structure(x.copy())
        doubled = jax.tree.map(lambda v: v * 2 if v.dtype == dtype else v, x)
        np.testing.assert_array_equal(np.asarray(doubled), np.asarray(x) * 2)


def test_jit_arguments_and_outputs():
    tree = {"r": arrays()[0], "c": arrays()[3]}
    out = jax.jit(lambda t: t)(tree)
    for k in tree:
        same(tree[k], out[k])
    for x in arrays():
        same(x, jax.jit(lambda v: v)(x))
        same(x, jax.jit(lambda v: v.copy())(x))
    # a second call with the same structure does not retrace
    g = jax.jit(lambda v: v * 2)
    a = arrays()[0]
    g(a)
    n = g._cache_size()
    g(a.copy())
    assert g._cache_size() == n


def test_repr_under_tracing():
    seen = []

    @jax.jit
    def f(r, c):
        seen.extend([repr(r), repr(c)])
        return r

    r, c = arrays()[0], arrays()[3]
    f(r, c)
    assert seen == ["RowSparse(float32[6, 2], capacity=3)", "CSR(float32[4, 5], nse=9)"]
    assert repr(r) == "RowSparse(float32[6, 2], rows=2, capacity=3)"


def test_device_put():
    dev = jax.devices()[0]
    for x in arrays():
        y = jax.device_put(x, dev)
        same(x, y)
        assert all(leaf.devices() == {dev} for leaf in jax.tree.leaves(y))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_pickle(dtype):
    for x in arrays(dtype):
        y = pickle.loads(pickle.dumps(x))
        same(x, y)
        np.testing.assert_array_equal(np.asarray(y * 2), np.asarray(x) * 2)


def test_unhashable():
    for x in arrays():
        assert type(x).__hash__ is None
        with pytest.raises(TypeError, match="unhashable"):
            hash(x)


def test_scan_and_grad_carry():
    r = arrays()[0]

    def body(carry, _):
        return carry * 2.0, jsr.sum(carry)

    out, sums = jax.lax.scan(body, r, None, length=3)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(r) * 8)
    np.testing.assert_allclose(np.asarray(sums), float(jsr.sum(r)) * np.array([1, 2, 4]))
    # plain jax.grad needs allow_int for the integer indices (jsr.grad handles this)
    g = jax.grad(lambda rr: jsr.sum(rr * rr), allow_int=True)(r)
    assert isinstance(g, jsr.RowSparse)
    np.testing.assert_allclose(np.asarray(g.data), 2 * np.asarray(r.data))
