"""Row-sparse gradients of dense tables from unmodified model code:
``jsr.grad`` / ``jsr.value_and_grad`` with ``sparse="auto"`` or explicit marks,
against jax's dense gradient, eagerly and under ``jax.jit``."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxpr_walk import big_values
from strategies import examples

import jaxsparse_rows as jsr


def _reduce(y):
    """A scalar of ``y`` that weighs every element differently (so a row sent
    to the wrong id, or a repeat summed twice, shows)."""
    w = jnp.arange(1, y.size + 1, dtype=jnp.float32).reshape(y.shape) / max(y.size, 1)
    return jnp.sum(jnp.sin(y.astype(jnp.float32)) * w)


def _scan_carry(t, i):
    def body(carry, x):
        table, acc = carry
        return (table, acc + _reduce(table[x])), None

    return jax.lax.scan(body, (t, 0.0), i.reshape(-1, 2))[0][1]


# Each pattern: (loss(table, ids), number of ids it looks up for ids [8]).
PATTERNS = {
    "getitem": (lambda t, i: _reduce(t[i]), 8),
    "getitem_2d_ids": (lambda t, i: _reduce(t[i.reshape(2, 4)]), 8),
    "getitem_column_ids": (lambda t, i: _reduce(t[i[:, None]]), 8),
    "take": (lambda t, i: _reduce(jnp.take(t, i, axis=0)), 8),
    "take_clip": (lambda t, i: _reduce(jnp.take(t, i, axis=0, mode="clip")), 8),
    "take_fill": (lambda t, i: _reduce(jnp.take(t, i, axis=0, mode="fill", fill_value=0)), 8),
    "take_wrap": (lambda t, i: _reduce(jnp.take(t, i, axis=0, mode="wrap")), 8),
    "at_get": (lambda t, i: _reduce(t.at[i].get()), 8),
    "at_get_fill": (lambda t, i: _reduce(t.at[i].get(mode="fill", fill_value=0)), 8),
    "at_get_clip": (lambda t, i: _reduce(t.at[i].get(mode="clip")), 8),
    "at_get_promise": (lambda t, i: _reduce(t.at[i].get(mode="promise_in_bounds")), 8),
    "scalar_id": (lambda t, i: _reduce(t[i[1]]), 1),
    "vmap": (lambda t, i: _reduce(jax.vmap(lambda j: t[j])(i)), 8),
    "vmap_take": (lambda t, i: _reduce(jax.vmap(lambda j: jnp.take(t, j, axis=0))(i)), 8),
    # equinox.nn.Embedding: `weight[x]` for a scalar x, vmapped over a batch twice
    "vmap_vmap": (lambda t, i: _reduce(jax.vmap(jax.vmap(lambda j: t[j]))(i.reshape(2, 4))), 8),
    "jit": (lambda t, i: _reduce(jax.jit(lambda a, b: a[b])(t, i)), 8),
    "remat": (lambda t, i: jax.checkpoint(lambda a, b: _reduce(a[b]))(t, i), 8),
    "remat_policy": (
        lambda t, i: jax.checkpoint(
            lambda a, b: _reduce(jnp.take(a, b, axis=0)),
            policy=jax.checkpoint_policies.nothing_saveable,
        )(t, i),
        8,
    ),
    "shared_table": (lambda t, i: _reduce(t[i]) + _reduce(t[i[::-1]] * 2), 16),
    "cond": (
        lambda t, i: jax.lax.cond(
            i[0] > 2, lambda: _reduce(t[i]), lambda: 2 * _reduce(jnp.take(t, i[:3], axis=0))
        ),
        11,
    ),
    "scan_closed_over": (
        lambda t, i: jax.lax.scan(lambda c, x: (c + _reduce(t[x]), None), 0.0, i.reshape(-1, 2))[0],
        8,
    ),
    "scan_carried": (_scan_carry, 8),
    "scan_reverse_unrolled": (
        lambda t, i: jax.lax.scan(
            lambda c, x: (c * 1.1 + _reduce(t[x]), None),
            0.0,
            i.reshape(-1, 2),
            reverse=True,
            unroll=2,
        )[0],
        8,
    ),
    "nested_scan": (
        lambda t, i: jax.lax.scan(
            lambda c, x: (
                c
                + jax.lax.scan(
                    lambda c2, y: (c2 * 0.9 + _reduce(jnp.take(t, y, axis=0)), None), 0.0, x
                )[0],
                None,
            ),
            0.0,
            i.reshape(2, 2, 2),
        )[0],
        8,
    ),
    "switch": (
        lambda t, i: jax.lax.switch(
            jnp.clip(i[0], 0, 2), [lambda: _reduce(t[i]), lambda: _reduce(t[i[:2]]), lambda: 0.0]
        ),
        10,
    ),
    "cond_in_scan": (
        lambda t, i: jax.lax.scan(
            lambda c, x: (c + jax.lax.cond(x[0] > 1, lambda: _reduce(t[x]), lambda: 1.0), None),
            0.0,
            i.reshape(4, 2),
        )[0],
        8,
    ),
    "fori_loop": (lambda t, i: jax.lax.fori_loop(0, 3, lambda k, c: c + _reduce(t[i[k]]), 0.0), 3),
}

V, D = 12, 3
# repeats, negative ids (numpy wraps them), ids past either end
IDS = np.array([1, 5, 1, -1, 15, -14, 11, 0], np.int32)


def _table(shape, dtype=jnp.float32, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _assert_canonical(g: jsr.RowSparse, capacity: int):
    """The RowSparse invariant: sorted unique real ids, then padding id V with zero rows."""
    assert g.capacity == capacity
    idx = np.asarray(g.indices)
    n = g.shape[0]
    real = idx[idx < n]
    assert np.all(np.diff(real) > 0), idx
    assert np.all(idx[len(real) :] == n), idx
    assert not np.any(np.asarray(g.data[len(real) :], np.float32))
    jsr.check(g)


def _assert_matches(g, dense, dtype=jnp.float32):
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(
        np.asarray(g.todense(), np.float32), np.asarray(dense, np.float32), **tol
    )


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_gets_the_dense_gradient_as_rowsparse(name, jit_mode):
    loss, n_ids = PATTERNS[name]
    table, ids = _table((V, D)), jnp.asarray(IDS)
    value, g = jit_mode(jsr.value_and_grad(loss, sparse="auto"))(table, ids)
    dense_value, dense = jit_mode(jax.value_and_grad(loss))(table, ids)
    assert isinstance(g, jsr.RowSparse) and g.shape == (V, D) and g.dtype == table.dtype
    _assert_canonical(g, n_ids)
    _assert_matches(g, dense)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_builds_nothing_table_sized(name, kernels):
    """Traced at V = 10^8 (never allocated): no value with V rows in the
    gradient, in any nested program and either form of the library's kernels."""
    loss, n_ids = PATTERNS[name]
    big = 10**8
    table = jax.ShapeDtypeStruct((big, 16), jnp.float32)
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    jaxpr = jax.make_jaxpr(jsr.grad(loss, sparse="auto"))(table, ids)
    found = big_values(jaxpr, big)
    if name == "scan_carried":  # the user's scan carries the table: its output, not a gradient
        found = [f for f in found if f != ("scan", (big, 16))]
    assert found == []
    assert [v.aval.shape for v in jaxpr.jaxpr.outvars] == [(n_ids, 16), (n_ids,)]


def test_the_dense_gradient_of_the_same_code_is_table_sized():
    """The oracle the structural test relies on: without `sparse`, [V, D]."""
    big = 10**8
    table = jax.ShapeDtypeStruct((big, 16), jnp.float32)
    ids = jax.ShapeDtypeStruct((8,), jnp.int32)
    jaxpr = jax.make_jaxpr(jsr.grad(PATTERNS["getitem"][0]))(table, ids)
    assert big_values(jaxpr, big)


# ------------------------------------------------------------ random ids

FORMS = ["getitem", "take", "take_clip", "take_fill", "at_get_fill", "at_get_clip", "vmap"]


@st.composite
def lookups(draw):
    n_rows = draw(st.integers(1, 9))
    trailing = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    ids_shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
    size = int(np.prod(ids_shape))
    ids = draw(
        st.lists(st.integers(-n_rows - 3, n_rows + 3), min_size=size, max_size=size)
        | st.lists(st.integers(0, 1), min_size=size, max_size=size)  # many repeats
    )
    return (
        (n_rows, *trailing),
        np.asarray(ids, np.int32).reshape(ids_shape),
        draw(st.sampled_from(FORMS)),
        draw(st.sampled_from([jnp.float32, jnp.bfloat16])),
        draw(st.booleans()),
        draw(st.integers(0, 2**31 - 1)),
        draw(st.sampled_from(["auto", True])),
    )


def _form(name):
    if name == "vmap":  # vmap over the leading ids axis
        return lambda t, i: _reduce(jax.vmap(lambda j: t[j])(i))
    return PATTERNS[name][0]


@settings(max_examples=examples(15))
@given(lookups())
def test_random_ids_match_the_dense_gradient(case):
    shape, ids, form, dtype, jitted, seed, sparse = case
    loss = _form(form)
    table = _table(shape, dtype, seed)
    wrap = jax.jit if jitted else (lambda f: f)
    g = wrap(jsr.grad(loss, sparse=sparse))(table, jnp.asarray(ids))
    dense = wrap(jax.grad(loss))(table, jnp.asarray(ids))
    if sparse == "auto" and ids.size == 0 and not isinstance(g, jsr.RowSparse):
        # jnp reads nothing of the table for an empty batch: jax's zero gradient
        np.testing.assert_array_equal(g, dense)
        return
    assert isinstance(g, jsr.RowSparse) and g.dtype == dtype
    _assert_canonical(g, ids.size)
    _assert_matches(g, dense, dtype)


# ------------------------------------------------------------ edge shapes


@pytest.mark.parametrize(
    "shape",
    [(7,), (7, 1), (7, 2, 3), (1, 4)],
    ids=["1d", "one_column", "3d", "one_row"],
)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_table_shapes_and_dtypes(shape, dtype, jit_mode):
    table = _table(shape, dtype)
    ids = jnp.array([0, 3, 3, 6, -1]) % shape[0]
    loss = PATTERNS["take"][0]
    g = jit_mode(jsr.grad(loss, sparse="auto"))(table, ids)
    _assert_canonical(g, 5)
    assert g.dtype == dtype and g.shape == shape
    _assert_matches(g, jit_mode(jax.grad(loss))(table, ids), dtype)


@pytest.mark.parametrize("name", ["getitem", "take_fill", "vmap", "scan_closed_over"])
def test_empty_batch(name, jit_mode):
    """A marked table always gets a RowSparse (here empty). Under "auto" a table
    that `fun` does not read (jnp skips the gather of an empty batch) gets
    jax's zero gradient."""
    loss = PATTERNS[name][0]
    table = _table((V, D))
    ids = jnp.zeros((0,), jnp.int32)
    g = jit_mode(jsr.grad(loss, sparse=True))(table, ids)
    assert isinstance(g, jsr.RowSparse) and g.capacity == 0
    np.testing.assert_array_equal(g.todense(), np.zeros((V, D)))
    g = jit_mode(jsr.grad(loss, sparse="auto"))(table, ids)
    np.testing.assert_array_equal(jsr.todense(g), np.zeros((V, D)))


def test_narrow_and_wide_id_dtypes(jit_mode):
    loss = PATTERNS["getitem"][0]
    cases = [
        (100, np.array([1, 99, -100, 1, -128, 127], np.int8)),
        (100, np.array([1, 99, 200], np.uint8)),
        (300, np.array([5, 2**31 - 1, 299], np.int64)),  # int32 without jax_enable_x64
    ]
    for n_rows, ids in cases:
        table, ids = _table((n_rows, 2)), jnp.asarray(ids)
        g = jit_mode(jsr.grad(loss, sparse="auto"))(table, ids)
        _assert_canonical(g, ids.size)
        _assert_matches(g, jax.grad(loss)(table, ids))


# ------------------------------------------------------------ models


def _word2vec(params, center, context, labels):
    """Center and context words looked up from one table, plus a dense bias."""
    u = params["emb"][center]  # [B, D]
    v = jnp.take(params["emb"], context, axis=0)  # [B, C, D]
    logits = jnp.einsum("bd,bcd->bc", u, v) + params["bias"][None, :]
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, labels))


def _w2v_batch(v=40, b=6, c=3, seed=0):
    rng = np.random.default_rng(seed)
    params = {"emb": _table((v, 4), seed=seed), "bias": jnp.zeros((c,))}
    center = jnp.asarray(rng.integers(0, v, b), jnp.int32)
    context = jnp.asarray(rng.integers(0, v, (b, c)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, 2, (b, c)), jnp.float32)
    return params, center, context, labels


def test_a_table_looked_up_twice_gets_one_rowsparse_over_the_union(jit_mode):
    params, center, context, labels = _w2v_batch()
    value, g = jit_mode(jsr.value_and_grad(_word2vec, sparse="auto"))(
        params, center, context, labels
    )
    dense_value, dense = jax.value_and_grad(_word2vec)(params, center, context, labels)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)
    _assert_canonical(g["emb"], center.size + context.size)
    union = np.union1d(np.asarray(center), np.asarray(context))
    np.testing.assert_array_equal(g["emb"].indices[: union.size], union)
    _assert_matches(g["emb"], dense["emb"])
    assert isinstance(g["bias"], jax.Array)
    np.testing.assert_allclose(g["bias"], dense["bias"], rtol=1e-6)


def _two_tables(params, user, item, y):
    u = params["users"][user]
    it = jnp.take(params["items"], item, axis=0)
    pred = jnp.sum(u * it, axis=-1) + params["b"]
    return jnp.mean((pred - y) ** 2) + 1e-3 * jnp.sum(params["proj"] ** 2), pred


def test_several_tables_dense_leaves_has_aux_and_argnums(jit_mode):
    rng = np.random.default_rng(1)
    params = {
        "users": _table((20, 4), seed=1),
        "items": _table((30, 4), seed=2),
        "b": jnp.float32(0.5),
        "proj": _table((4, 4), seed=3),
    }
    user = jnp.asarray(rng.integers(0, 20, 5), jnp.int32)
    item = jnp.asarray(rng.integers(0, 30, 5), jnp.int32)
    y = jnp.asarray(rng.standard_normal(5), jnp.float32)
    f = jsr.value_and_grad(_two_tables, argnums=(0, 3), has_aux=True, sparse="auto")
    (value, pred), (g, g_y) = jit_mode(f)(params, user, item, y)
    (dense_value, dense_pred), (dense, dense_y) = jax.value_and_grad(
        _two_tables, argnums=(0, 3), has_aux=True
    )(params, user, item, y)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)
    np.testing.assert_allclose(pred, dense_pred, rtol=1e-6)
    for name in ("users", "items"):
        assert isinstance(g[name], jsr.RowSparse)
        _assert_matches(g[name], dense[name])
    for name in ("b", "proj"):  # a scalar and a matrix used densely: jax's gradient
        assert not isinstance(g[name], jsr.RowSparse)
        np.testing.assert_allclose(g[name], dense[name], rtol=1e-6)
    np.testing.assert_allclose(g_y, dense_y, rtol=1e-6)
    g_only, aux = jsr.grad(_two_tables, has_aux=True, sparse="auto")(params, user, item, y)
    assert isinstance(g_only["users"], jsr.RowSparse)
    np.testing.assert_allclose(aux, dense_pred, rtol=1e-6)


def test_a_rowsparse_view_keeps_its_gradient_beside_auto_tables():
    params = {"emb": _table((10, 2)), "other": _table((8, 2), seed=1)}
    ids = jnp.array([3, 1, 3])
    view = {"emb": jsr.pull_rows(params["emb"], ids), "other": params["other"]}

    def loss(p):
        return jnp.sum(jsr.take(p["emb"], ids) ** 2) + jnp.sum(p["other"][ids] ** 3)

    g = jsr.grad(loss, sparse="auto")(view)
    np.testing.assert_array_equal(g["emb"].indices, view["emb"].indices)
    dense = jax.grad(lambda p: jnp.sum(p["emb"][ids] ** 2) + jnp.sum(p["other"][ids] ** 3))(params)
    _assert_matches(g["emb"], dense["emb"])
    _assert_matches(g["other"], dense["other"])


def test_tied_output_projection_gets_the_dense_gradient_under_auto():
    params = {"emb": _table((10, 3)), "other": _table((10, 3), seed=1)}
    ids = jnp.array([1, 4])

    def lm(p, ids):
        h = p["emb"][ids] + p["other"][ids]
        return jnp.sum(jax.nn.log_softmax(h @ p["emb"].T))  # tied

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an ordinary dense use: no warning
        g = jsr.grad(lm, sparse="auto")(params, ids)
    dense = jax.grad(lm)(params, ids)
    assert not isinstance(g["emb"], jsr.RowSparse)
    np.testing.assert_allclose(g["emb"], dense["emb"], rtol=1e-6)
    assert isinstance(g["other"], jsr.RowSparse)
    _assert_matches(g["other"], dense["other"])


def test_unused_and_integer_leaves_under_auto():
    params = {"emb": _table((10, 3)), "unused": _table((5, 2)), "count": jnp.int32(3)}

    def loss(p, ids):
        return jnp.sum(p["emb"][ids])

    g = jsr.grad(loss, sparse="auto", allow_int=True)(params, jnp.array([2]))
    dense = jax.grad(loss, allow_int=True)(params, jnp.array([2]))
    np.testing.assert_array_equal(g["unused"], dense["unused"])  # zeros, as jax gives
    assert g["count"].dtype == dense["count"].dtype  # float0
    assert isinstance(g["emb"], jsr.RowSparse)


# ------------------------------------------------------------ explicit marks


def _lm(p, ids):
    h = p["emb"][ids].sum(axis=0)
    return jnp.sum(h @ p["emb"].T) + jnp.sum(p["w"] * h)


def _lookup_and_w(p, ids):
    return jnp.sum(p["emb"][ids] @ p["w"])


def test_marks_as_a_prefix_of_bools_and_as_a_callable(jit_mode):
    params = {"emb": _table((10, 3)), "w": jnp.ones(3)}
    ids = jnp.array([2, 2, 7])
    dense = jax.grad(_lookup_and_w)(params, ids)
    for sparse in (
        {"emb": True, "w": False},
        lambda path, leaf: jax.tree_util.keystr(path) == "['emb']",
    ):
        g = jit_mode(jsr.grad(_lookup_and_w, sparse=sparse))(params, ids)
        _assert_canonical(g["emb"], 3)
        _assert_matches(g["emb"], dense["emb"])
        np.testing.assert_allclose(g["w"], dense["w"])
    g = jsr.grad(_lookup_and_w, argnums=(0,), sparse=({"emb": True, "w": False},))(params, ids)
    assert isinstance(g[0]["emb"], jsr.RowSparse)
    # an unmarked table keeps its dense gradient even where "auto" would not
    g = jsr.grad(_lookup_and_w, sparse=False)(params, ids)
    np.testing.assert_allclose(g["emb"], dense["emb"])


def test_a_marked_table_that_is_never_used_gets_an_empty_rowsparse():
    g = jsr.grad(lambda t, w: jnp.sum(w**2), sparse=(True, False), argnums=(0, 1))(
        _table((10, 3)), jnp.ones(2)
    )
    assert isinstance(g[0], jsr.RowSparse) and g[0].capacity == 0


@pytest.mark.parametrize(
    "loss, operation",
    [
        (_lm, "`transpose`"),
        (lambda p, ids: jnp.sum(p["emb"][ids]) + jnp.linalg.norm(p["emb"]), "inside `jit(norm)`"),
        (lambda p, ids: jnp.sum(p["emb"][ids, 0]) + jnp.sum(p["w"]), "not a lookup of whole rows"),
        (lambda p, ids: jnp.sum(p["emb"][:, 1]) + jnp.sum(p["w"]), "`"),
    ],
    ids=["tied_projection", "norm", "column_gather", "column_slice"],
)
def test_a_marked_table_used_otherwise_raises_naming_it_and_the_use(loss, operation):
    params = {"emb": _table((10, 3)), "w": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"`sparse` marks `p\['emb'\]`") as info:
        jsr.grad(loss, sparse={"emb": True, "w": False})(params, jnp.array([1, 2]))
    message = str(info.value)
    assert operation in message
    assert "x[ids]" in message and 'sparse="auto"' in message


def test_marks_that_cannot_apply_raise():
    params = {"emb": _table((10, 3)), "n": jnp.int32(2)}
    loss = lambda p, ids: jnp.sum(p["emb"][ids])  # noqa: E731
    ids = jnp.array([1])
    with pytest.raises(TypeError, match=r"`p\['n'\]`.*int32"):
        jsr.grad(loss, sparse=True, allow_int=True)(params, ids)
    with pytest.raises(ValueError, match="prefix"):
        jsr.grad(loss, sparse={"emb": True})(params, ids)
    with pytest.raises(TypeError, match="bool"):
        jsr.grad(loss, sparse={"emb": 1, "n": False})(params, ids)
    with pytest.raises(TypeError, match="must return a bool"):
        jsr.grad(loss, sparse=lambda path, leaf: None)(params, ids)
    with pytest.raises(ValueError, match='"auto"'):
        jsr.grad(loss, sparse="yes")(params, ids)


# ------------------------------------------------------------ fallbacks


@jax.custom_jvp
def _custom_lookup(t, i):
    return t[i]


_custom_lookup.defjvp(lambda p, t: (_custom_lookup(*p), jnp.zeros_like(_custom_lookup(*p))))


def _while_lookup(t, i):
    def body(c):
        k, acc = c
        return k + 1, acc + _reduce(t[i[k]])

    return jax.lax.while_loop(lambda c: c[0] < i.shape[0] // 2, body, (0, 0.0))[1]


def _changed_carry(t, i):
    def body(table, x):
        return table * 0.5, _reduce(table[x])

    return jnp.sum(jax.lax.scan(body, t, i.reshape(4, 2))[1])


@pytest.mark.parametrize(
    "loss, construct",
    [
        (lambda t, i: _reduce(_custom_lookup(t, i)), "custom_jvp_call"),
        (_changed_carry, "scan"),
    ],
    ids=["custom_jvp", "scan_changing_the_table"],
)
def test_auto_falls_back_with_a_warning_where_a_lookup_cannot_be_rewritten(loss, construct):
    table, ids = _table((V, D)), jnp.asarray(IDS % V)
    with pytest.warns(jsr.StorageFallbackWarning, match=rf"`t` gets a dense gradient.*{construct}"):
        g = jsr.grad(loss, sparse="auto")(table, ids)
    np.testing.assert_allclose(g, jax.grad(loss)(table, ids), rtol=1e-6)
    with pytest.raises(ValueError, match=rf"`t`.*{construct}"):
        jsr.grad(loss, sparse=True)(table, ids)


def test_a_lookup_in_a_while_loop_is_reported():
    """jax cannot differentiate a while_loop with respect to its closure at all;
    the explicit mark names the loop."""
    table, ids = _table((V, D)), jnp.asarray(IDS % V)
    with pytest.raises(ValueError, match=r"`t`.*inside `while`"):
        jsr.grad(_while_lookup, sparse=True)(table, ids)


# ------------------------------------------------------------ with the optimizers


def _model(params, ids, y):
    pooled = params["emb"][ids].sum(axis=1)
    return jnp.mean((pooled @ params["w"] - y) ** 2)


def _view_model(view, ids, y):
    pooled = jsr.take(view["emb"], ids).sum(axis=1)
    return jnp.mean((pooled @ view["w"] - y) ** 2)


@pytest.mark.parametrize("make_opt", [jsr.optim.lazy_adam, jsr.optim.lazy_sgd])
def test_auto_step_equals_the_hand_written_step_under_jit_with_donation(make_opt):
    opt = make_opt(0.05)

    def auto_step(params, state, ids, y):
        grads = jsr.grad(_model, sparse="auto")(params, ids, y)
        updates, state = opt.update(grads, state, params)
        return jsr.optim.apply_updates(params, updates), state

    def hand_step(params, state, ids, y):
        view = {**params, "emb": jsr.pull_rows(params["emb"], ids)}
        grads = jsr.grad(_view_model)(view, ids, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    rng = np.random.default_rng(0)
    batches = [
        (jnp.asarray(rng.integers(0, 30, (6, 3)), jnp.int32), jnp.asarray(rng.standard_normal(6)))
        for _ in range(3)
    ]
    results = []
    for step in (auto_step, hand_step):
        params = {"emb": _table((30, 4)), "w": jnp.ones(4)}
        state = opt.init(params)
        jitted = jax.jit(step, donate_argnums=(0, 1))
        for ids, y in batches:
            params, state = jitted(params, state, ids, y.astype(jnp.float32))
        assert jitted._cache_size() == 1  # new ids of the same shape compile nothing
        results.append(params)
    for name in ("emb", "w"):
        np.testing.assert_allclose(results[0][name], results[1][name], rtol=1e-5, atol=1e-6)


# ------------------------------------------------- tables cast before their lookups


def _scan_over_cast(t, i):
    e = t.astype(jnp.bfloat16)
    return jax.lax.scan(lambda c, x: (c + _reduce(e[x]), None), 0.0, i.reshape(4, 2))[0]


CAST_PATTERNS = {
    # flax's Embed(dtype=jnp.bfloat16) over a float32 table: cast, then take
    "take": (lambda t, i: _reduce(jnp.take(t.astype(jnp.bfloat16), i, axis=0)), 8),
    "in_jit": (lambda t, i: jax.jit(lambda e, i: _reduce(e[i]))(t.astype(jnp.float16), i), 8),
    "and_uncast": (lambda t, i: _reduce(t.astype(jnp.bfloat16)[i]) + _reduce(t[i[:3]]), 11),
    "scan": (_scan_over_cast, 8),
}


@pytest.mark.parametrize("name", sorted(CAST_PATTERNS))
def test_a_table_cast_to_another_float_dtype_then_looked_up(name, jit_mode):
    """The cast is not evaluated: the rows read are cast, and the gradient is a
    RowSparse of the table's dtype equal to the dense one (repeats summed in
    float32, so to the cast dtype's rounding)."""
    loss, n_ids = CAST_PATTERNS[name]
    table, ids = _table((V, D)), jnp.asarray(IDS)
    value, g = jit_mode(jsr.value_and_grad(loss, sparse="auto"))(table, ids)
    dense_value, dense = jit_mode(jax.value_and_grad(loss))(table, ids)
    assert isinstance(g, jsr.RowSparse) and g.dtype == jnp.float32
    _assert_canonical(g, n_ids)
    _assert_matches(g, dense, jnp.bfloat16)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)
    big = jax.ShapeDtypeStruct((10**8, 16), jnp.float32)
    jaxpr = jax.make_jaxpr(jsr.grad(loss, sparse="auto"))(
        big, jax.ShapeDtypeStruct((8,), jnp.int32)
    )
    assert big_values(jaxpr, 10**8) == []


CAST_CHAINS = {
    # mixed precision: parameters cast to bfloat16, a layer computing in float32
    "bf16_f32": lambda t: t.astype(jnp.bfloat16).astype(jnp.float32),
    "f16_bf16": lambda t: t.astype(jnp.float16).astype(jnp.bfloat16),
    "bf16": lambda t: t.astype(jnp.bfloat16),
}


@pytest.mark.parametrize("chain", sorted(CAST_CHAINS))
def test_the_rows_of_a_table_cast_several_times_are_rounded_by_every_cast(chain, jit_mode):
    """The rows read go through each cast in turn, and the cotangents back
    through them: with each id looked up once (no sums whose order could
    differ) the value and the gradient are jax's bit for bit. A fill value
    is given in the last dtype, as jax's gather of the cast table gives it."""
    cast = CAST_CHAINS[chain]

    def loss(t, i):
        rows = jnp.take(cast(t), i, axis=0, mode="fill", fill_value=0.1)
        return _reduce(rows * 3.3)

    table, ids = _table((V, D)), jnp.asarray([1, 5, 15, 0, 11])
    value, g = jit_mode(jsr.value_and_grad(loss, sparse="auto"))(table, ids)
    dense_value, dense = jit_mode(jax.value_and_grad(loss))(table, ids)
    assert isinstance(g, jsr.RowSparse) and g.dtype == jnp.float32
    np.testing.assert_array_equal(value, dense_value)
    np.testing.assert_array_equal(g.todense(), dense)


def test_an_auxiliary_output_holding_the_cast_table_is_cast(jit_mode):
    """A cast table that only lookups read in the loss, also returned as an
    auxiliary output: the loss reads cast rows, and the output is the whole
    cast table (the one use that evaluates the cast)."""

    def loss(t, i):
        e = t.astype(jnp.bfloat16).astype(jnp.float32)
        return _reduce(e[i]), e

    table, ids = _table((V, D)), jnp.asarray(IDS)
    (value, aux), g = jit_mode(jsr.value_and_grad(loss, sparse="auto", has_aux=True))(table, ids)
    (dense_value, dense_aux), dense = jit_mode(jax.value_and_grad(loss, has_aux=True))(table, ids)
    assert isinstance(g, jsr.RowSparse)
    assert aux.dtype == dense_aux.dtype == jnp.float32
    np.testing.assert_array_equal(aux, dense_aux)
    np.testing.assert_array_equal(value, dense_value)
    _assert_matches(g, dense, jnp.bfloat16)  # repeats are summed before jax's bfloat16 rounding


RETURNED_BY_A_CALL = {
    "jit": lambda t, i: jax.jit(lambda a, b: (a, _reduce(a[b])))(t, i)[1],
    "checkpoint": lambda t, i: jax.checkpoint(lambda a, b: (_reduce(a[b]), a))(t, i)[0],
    "jit_then_lookup": lambda t, i: _reduce(jax.jit(lambda a: a)(t)[i]),
    "cast_through_jit": lambda t, i: jax.jit(lambda a, b: (a, _reduce(a[b])))(
        t.astype(jnp.bfloat16).astype(jnp.float32), i
    )[1],
}


@pytest.mark.parametrize("name", sorted(RETURNED_BY_A_CALL))
def test_a_table_a_nested_program_returns_unchanged_is_still_the_table(name, jit_mode):
    """``nnx.jit`` and ``nnx.remat`` return the module's state from their
    program: a table passed through unchanged is the table outside it, not
    another use, so its gradient stays row-sparse."""
    loss = RETURNED_BY_A_CALL[name]
    table, ids = _table((V, D)), jnp.asarray(IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, g = jit_mode(jsr.value_and_grad(loss, sparse="auto"))(table, ids)
    dense_value, dense = jit_mode(jax.value_and_grad(loss))(table, ids)
    assert isinstance(g, jsr.RowSparse)
    _assert_canonical(g, 8)
    _assert_matches(g, dense, jnp.bfloat16 if "cast" in name else jnp.float32)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)


LIBRARY_LOOKUPS = {
    "take": lambda t, i: _reduce(jsr.take(t, i.reshape(2, 4))),
    "embedding_bag_mean": lambda t, i: _reduce(jsr.embedding_bag(t, i.reshape(2, 4))),
    "embedding_bag_max": lambda t, i: _reduce(jsr.embedding_bag(t, i.reshape(4, 2), mode="max")),
    "take_of_cast": lambda t, i: _reduce(jsr.take(t.astype(jnp.bfloat16), i)),
}


@pytest.mark.parametrize("name", sorted(LIBRARY_LOOKUPS))
def test_the_librarys_own_lookups_of_a_dense_table_are_lookups(name, jit_mode):
    """``jsr.take`` and ``jsr.embedding_bag`` on a dense table (the library's
    row gather, not a ``gather`` equation) are rewritten like ``x[ids]``:
    a RowSparse gradient equal to jax's, the padding id ``V`` reading zeros
    and getting none, and nothing table-sized."""
    loss = LIBRARY_LOOKUPS[name]
    table, ids = _table((V, D)), jnp.asarray(np.where(IDS < 0, V, IDS % (V + 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, g = jit_mode(jsr.value_and_grad(loss, sparse=True))(table, ids)
    dense_value, dense = jit_mode(jax.value_and_grad(loss))(table, ids)
    assert isinstance(g, jsr.RowSparse)
    _assert_canonical(g, 8)
    _assert_matches(g, dense, jnp.bfloat16 if "cast" in name else jnp.float32)
    np.testing.assert_allclose(value, dense_value, rtol=1e-6)
    big = jax.ShapeDtypeStruct((10**8, 16), jnp.float32)
    jaxpr = jax.make_jaxpr(jsr.grad(loss, sparse="auto"))(
        big, jax.ShapeDtypeStruct((8,), jnp.int32)
    )
    assert big_values(jaxpr, 10**8) == []


def test_a_cast_table_used_otherwise_keeps_the_dense_gradient():
    def loss(t, i):
        e = t.astype(jnp.bfloat16)
        return _reduce(e[i]) + jnp.sum(e).astype(jnp.float32)

    table, ids = _table((V, D)), jnp.asarray(IDS % V)
    g = jsr.grad(loss, sparse="auto")(table, ids)
    assert isinstance(g, jax.Array)
    np.testing.assert_allclose(g, jax.grad(loss)(table, ids), rtol=1e-6)
    with pytest.raises(ValueError, match=r"`t`.*reduce_sum"):
        jsr.grad(loss, sparse=True)(table, ids)
