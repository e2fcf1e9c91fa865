"""RowSparse / CSR as pytrees: tree.map, jit arguments and outputs, device_put,
pickling, repr under tracing, hashing, vmap-free transforms."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from draw import random_csr, random_rowsparse

import jaxsparse_rows as jsr


def arrays(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return [
        random_rowsparse(rng, (6, 2), n_rows=2, capacity=3, dtype=dtype),
        random_rowsparse(rng, (4, 2, 3), n_rows=4, dtype=dtype),
        jsr.zeros("row_sparse", (0, 2), dtype=dtype),
        random_csr(rng, (4, 5), density=0.4, nse=9, dtype=dtype),
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


@pytest.mark.parametrize("index", [1, 3])
def test_mapping_row_ids_to_floats_is_refused(jit_mode, index):
    """A tree_map over every leaf (optax.scale, a whole-tree dtype cast) would
    build arrays with fractional row ids; unflattening refuses them."""
    x = arrays()[index]
    name = type(x).__name__
    with pytest.raises(TypeError, match=f"{name} `indices` must stay integer, got float32"):
        jit_mode(lambda t: jax.tree.map(lambda v: v * 0.5, t))(x)
    with pytest.raises(TypeError, match="must stay integer, got bfloat16"):
        jax.tree.map(lambda v: v.astype(jnp.bfloat16), x)


def test_non_array_and_float0_leaves_still_unflatten():
    """tree.map to shapes or None, eval_shape and float0 tangents (jvp of an
    integer leaf) are legitimate and keep working."""
    r, c = arrays()[0], arrays()[3]
    assert repr(jax.tree.map(jnp.shape, {"emb": r})) == (
        "{'emb': RowSparse(shape=(6, 2), data=(3, 2), indices=(3,))}"
    )
    assert repr(jax.tree.map(lambda v: None, c)) == (
        "CSR(shape=(4, 5), data=None, indices=None, indptr=None)"
    )
    assert repr(jax.eval_shape(lambda: r)) == "RowSparse(float32[6, 2], capacity=3)"
    tangent = jsr.RowSparse._make(
        jnp.ones_like(r.data), np.zeros(r.indices.shape, jax.dtypes.float0), r.shape
    )
    _, dout = jax.jvp(lambda x: x.todense(), (r,), (tangent,))
    expected = np.zeros(r.shape, np.float32)
    idx = np.asarray(r.indices)
    expected[idx[idx < r.shape[0]]] = 1.0
    np.testing.assert_array_equal(np.asarray(dout), expected)


def test_arrays_stacked_by_vmap_print_their_batch_and_refuse_todense():
    table_np = np.arange(20.0, dtype=np.float32).reshape(10, 2)
    ids = np.array([[1, 3], [2, 2]])
    table = jnp.asarray(table_np)
    batch = jax.vmap(lambda i: jsr.pull_rows(table, i))(jnp.asarray(ids))
    assert repr(batch) == "RowSparse(float32[10, 2], batch=(2,), capacity=2)"
    with pytest.raises(
        ValueError, match=r"todense needs one RowSparse, got a batch of shape \(2,\)"
    ):
        batch.todense()
    dense = jax.vmap(jsr.todense)(batch)
    expected = np.zeros((len(ids),) + table_np.shape, np.float32)
    for b, row_ids in enumerate(ids):  # the rows each batch element pulled, others zero
        expected[b, row_ids] = table_np[row_ids]
    np.testing.assert_array_equal(np.asarray(dense), expected)
    c = arrays()[3]
    stacked = jax.tree.map(lambda a: jnp.stack([a, a, a]), c)
    assert repr(stacked) == "CSR(float32[4, 5], batch=(3,), nse=9)"
    with pytest.raises(ValueError, match=r"todense needs one CSR, got a batch of shape \(3,\)"):
        stacked.todense()


def _stacks():
    """A RowSparse [4 x 10 x 3] and a CSR [4 x 3 x 10] stacked by jax.vmap
    (leading batch axis 4), and a dense [10, 3] and [3, 10] operand."""
    rng = np.random.default_rng(8)
    tables = jnp.asarray(rng.normal(size=(4, 10, 3)), jnp.float32)
    rsp = jax.vmap(jsr.pull_rows)(tables, jnp.asarray(rng.integers(0, 10, (4, 5))))
    dense = rng.normal(size=(3, 10)) * (rng.random((3, 10)) < 0.4)
    csr = jax.vmap(lambda d: jsr.CSR.fromdense(d, nse=12))(jnp.asarray(np.stack([dense] * 4)))
    return rsp, csr, jnp.ones((10, 3)), jnp.ones((3, 10))


STACKED_MISUSES = {
    "asnumpy": lambda r, c, x, y: r.asnumpy(),
    "np.asarray": lambda r, c, x, y: np.asarray(c),
    "plus dense": lambda r, c, x, y: r + x,
    "times dense": lambda r, c, x, y: c * y,
    "plus itself": lambda r, c, x, y: r + r,
    "divide by dense": lambda r, c, x, y: r / x,
    "sum": lambda r, c, x, y: jsr.sum(r),
    "sum axis 0": lambda r, c, x, y: jsr.sum(r, axis=0),
    "sum axis 1": lambda r, c, x, y: jsr.sum(c, axis=1),
    "norm": lambda r, c, x, y: jsr.norm(c),
    "square_sum": lambda r, c, x, y: jsr.square_sum(r),
    "dot": lambda r, c, x, y: jsr.dot(c, x),
    "dot transposed": lambda r, c, x, y: jsr.dot(r, x, transpose_a=True),
    "dense dot": lambda r, c, x, y: jsr.dot(y, r),
    "take": lambda r, c, x, y: jsr.take(r, jnp.array([1, 2])),
    "retain": lambda r, c, x, y: jsr.retain(r, jnp.array([1])),
    "embedding_bag": lambda r, c, x, y: jsr.embedding_bag(r, jnp.array([[1, 2]])),
    "with_capacity": lambda r, c, x, y: r.with_capacity(8),
    "cast_storage": lambda r, c, x, y: jsr.cast_storage(c, "row_sparse"),
    "to_bcoo": lambda r, c, x, y: jsr.to_bcoo(r),
    "row_ids": lambda r, c, x, y: c.row_ids(),
    "row slicing": lambda r, c, x, y: c[0:2],
    "check": lambda r, c, x, y: jsr.check(r),
}


@pytest.mark.parametrize("op", sorted(STACKED_MISUSES))
def test_ops_refuse_arrays_stacked_by_vmap_outside_it(op):
    """Outside vmap these would merge the batch (``asnumpy``, ``+ dense``,
    ``sum``), sum the wrong axis, return extra axes or fail with raw JAX
    errors; instead they say to map over the batch."""
    with pytest.raises(ValueError, match=r"needs one (RowSparse|CSR), got a batch of shape \(4,\)"):
        STACKED_MISUSES[op](*_stacks())


@pytest.mark.parametrize(
    "op",
    [
        lambda r: jsr.take(r, jnp.array([4])),
        lambda r: r.todense(),
        lambda r: jsr.retain(r, jnp.array([4])),
        lambda r: jsr.sum(r, axis=1),
        lambda r: r + jnp.ones((8, 3)),
    ],
    ids=["take", "todense", "retain", "sum", "plus dense"],
)
def test_vmap_over_the_rows_of_a_rowsparse_is_refused_by_name(op):
    """``jax.vmap`` over a RowSparse's rows (axis 0 of data and indices) does
    not apply (the docs say so): instead of an IndexError, "a batch of shape
    ()", or (``+ dense``) a wrong [3, 8, 3] result, the error says so."""
    v = jsr.pull_rows(jnp.ones((8, 3)), jnp.array([1, 4, 6]))
    with pytest.raises(ValueError, match=r"row ids are a scalar: jax.vmap over the rows"):
        jax.vmap(op)(v)


def test_ops_on_the_values_alone_take_stacked_arrays():
    """Scaling, unary maps and casts touch only ``data``: no batch needed."""
    r, c, _, _ = _stacks()
    for y, x in ((r * 2, r), (jsr.abs(c), c), (r.astype(jnp.float16), r), (c / 2, c)):
        assert y.data.shape == x.data.shape and y.indices.shape == x.indices.shape
    np.testing.assert_array_equal(np.asarray((r * 2).data), 2 * np.asarray(r.data))


def test_counts_of_stacked_arrays_are_per_element():
    """``nnz_rows`` of a stacked RowSparse was the total over the batch, and a
    stacked CSR's ``nnz`` was the last element's whole ``indptr``."""
    r, c, _, _ = _stacks()

    def element(x, i):
        return jax.tree.map(lambda a: a[i], x)

    want_rows = [int(element(r, i).nnz_rows) for i in range(4)]
    want_nnz = [int(element(c, i).nnz) for i in range(4)]
    np.testing.assert_array_equal(np.asarray(r.nnz_rows), want_rows)
    np.testing.assert_array_equal(np.asarray(c.nnz), want_nnz)
    assert r.nnz_rows.shape == c.nnz.shape == (4,)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda x: x.nnz_rows)(r)), want_rows)
    np.testing.assert_array_equal(np.asarray(jax.vmap(lambda x: x.nnz)(c)), want_nnz)


@pytest.mark.parametrize("jit", [False, True])
def test_grad_of_stacked_views_scanned_over(jit):
    """``jsr.grad`` with respect to views stacked by vmap and scanned over
    (one per micro-batch) masked the padding with a [S, K] mask reshaped as
    if it were [K]: the gradient's data came out [S, K, S, D]. For stacked
    CSR batches it read the last batch's whole ``indptr`` row as the entry
    count (a broadcasting error, or entries silently zeroed). Both now equal
    ``jax.grad`` on the data leaf."""
    from jax import lax

    table = jnp.arange(20.0).reshape(10, 2) / 10
    ids = jnp.array([[1, 2, 2], [10, 3, 3], [5, 1, 10]])  # 10: padding
    views = jax.vmap(lambda i: jsr.pull_rows(table, i))(ids)

    def loss_rows(vs):
        body = lambda c, b: (c + jnp.sum(jsr.take(b[0], b[1]) ** 2), None)  # noqa: E731
        return lax.scan(body, 0.0, (vs, ids))[0]

    wrap = jax.jit if jit else (lambda f: f)
    g = wrap(jsr.grad(loss_rows))(views)
    want = jax.grad(lambda d: loss_rows(jsr.RowSparse._make(d, views.indices, views.shape)))
    assert g.data.shape == views.data.shape and g.indices.shape == views.indices.shape
    np.testing.assert_allclose(np.asarray(g.data), np.asarray(want(views.data)), rtol=1e-6)

    # S = 5 batches of s + 1 entries in [4, 3] with nse = 5: S == M + 1 == nse,
    # where the wrong mask broadcast without an error.
    dense = []
    for s in range(5):
        d = np.zeros((4, 3), np.float32)
        for j in range(s + 1):
            d[j % 4, (2 * j + s) % 3] = j + 1.0
        dense.append(d)
    csrs = jax.tree.map(lambda *a: jnp.stack(a), *[jsr.CSR.fromdense(d, nse=5) for d in dense])
    w = jnp.arange(1.0, 4.0)

    def loss_csr(st):
        return lax.scan(lambda c, x: (c + jnp.sum(jsr.dot(x, w) ** 2), None), 0.0, st)[0]

    g = wrap(jsr.grad(loss_csr))(csrs)
    want = jax.grad(lambda d: loss_csr(jsr.CSR._make(d, csrs.indices, csrs.indptr, csrs.shape)))(
        csrs.data
    )
    np.testing.assert_allclose(np.asarray(g.data), np.asarray(want), rtol=1e-6)


@pytest.mark.parametrize("index", [0, 3])
def test_flags_mapped_over_leaves_still_unflatten(index):
    """Bool flags are not row ids: optax.zero_nans, chex's finiteness check and
    optax.tree.allclose map them over every leaf."""
    import chex

    x = arrays()[index]
    data, idx = np.asarray(x.data), np.asarray(x.indices)
    flags = jax.tree.map(jnp.isfinite, x)
    assert flags.indices.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(flags.data), np.isfinite(data))
    assert bool(jax.tree.map(lambda a: jnp.all(jnp.isfinite(a)), x).data)

    def rebuilt(new_data):  # x with other data, built from numpy children
        children = [new_data, idx] + ([np.asarray(x.indptr)] if x.stype == "csr" else [])
        return jax.tree.unflatten(jax.tree.structure(x), [jnp.asarray(c) for c in children])

    assert np.all(data.flat[:2] != 0)  # the first two slots are stored values
    close, moved = (data * (1 + 2e-6)).astype(data.dtype), data.copy()
    moved.flat[0] += 1.0
    assert np.any(close != data)  # within tree_allclose's rtol, not equal
    assert optax.tree_utils.tree_allclose(x, rebuilt(close))
    assert not optax.tree_utils.tree_allclose(x, rebuilt(moved))

    with_nan = data.copy()
    with_nan.flat[1] = np.nan
    chex.assert_tree_all_finite(x)
    with pytest.raises(AssertionError, match="finite"):
        chex.assert_tree_all_finite(rebuilt(with_nan))
    tx = optax.zero_nans()
    g = rebuilt(with_nan)
    out, _ = tx.update({"g": g}, tx.init({"g": g}))
    same(out["g"], rebuilt(np.where(np.isnan(with_nan), 0, with_nan).astype(data.dtype)))


REDUCTIONS = {
    "optax.tree.norm": lambda t: optax.tree.norm(t),
    "optax.tree.norm(ord=1)": lambda t: optax.tree.norm(t, ord=1),
    "optax.tree.norm(ord=inf)": lambda t: optax.tree.norm(t, ord=jnp.inf),
    "optax.tree.sum": lambda t: optax.tree.sum(t),
    "optax.tree.vdot": lambda t: optax.tree.vdot(t, t),
    "optax.clip_by_global_norm": lambda t: optax.clip_by_global_norm(1.0).update(t, ())[0],
    "tree.map(jnp.mean)": lambda t: jax.tree.map(jnp.mean, t),
}


@pytest.mark.parametrize("reduce", sorted(REDUCTIONS))
@pytest.mark.parametrize("index", [0, 3])
def test_reducing_every_leaf_is_refused_naming_the_replacement(index, reduce, jit_mode):
    """A reduction of every leaf reduces the row ids too, and a norm or sum over
    the leaves would count them as values: unflattening the 0-d ids is
    refused while tracing, naming the row-aware replacement."""
    x = arrays()[index]
    tree = {"emb": x, "w": jnp.ones(3)}
    name = type(x).__name__
    refused = rf"{name} `indices` must stay an index array, got a 0-d.*jsr.optim.global_norm"
    with pytest.raises(TypeError, match=refused):
        jit_mode(REDUCTIONS[reduce])(tree)
    # Mapped over the values only, the same reduction is the dense one's.
    got = jax.tree.map(lambda a: a.sum(), tree, is_leaf=jsr.is_sparse)
    np.testing.assert_allclose(float(got["emb"]), float(np.asarray(x.todense()).sum()), rtol=1e-5)


def test_key_paths_name_the_children():
    """Checkpoint libraries name leaves by key path: `.data`, `.indices`, `.indptr`."""
    tree = {
        "emb": jsr.RowSparse([[1.0]], [0], shape=(2, 1)),
        "x": jsr.csr_matrix(([1.0], [0], [0, 1]), shape=(1, 1)),
    }
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(tree)[0], strict=True)
    names = [jax.tree_util.keystr(p) for p in paths]
    assert names == [
        "['emb'].data",
        "['emb'].indices",
        "['x'].data",
        "['x'].indices",
        "['x'].indptr",
    ]
    assert all(a is b for a, b in zip(leaves, jax.tree.leaves(tree), strict=True))
    back = jax.tree_util.tree_map_with_path(lambda p, x: x, tree)
    jsr.testing.assert_allclose(back["emb"], tree["emb"])
