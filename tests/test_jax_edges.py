"""Where RowSparse and CSR meet JAX itself: jax.numpy functions refuse them
with the jsr function to use, ``.T``, printing and ``jax.debug.print``,
``jax.grad`` over a function of a RowSparse, fixed-capacity sums for
``lax.scan`` carries and ``lax.cond`` branches, and the sum of a batch of
per-example RowSparse gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify
from jaxpr_walk import big_values

import jaxsparse_rows as jsr

V, D = 8, 3


def _rsp():
    return jsr.RowSparse(jnp.arange(6.0).reshape(2, D) + 1, jnp.array([1, 5]), (V, D))


def _csr():
    return jsr.csr_matrix(([1.0, 2.0, 3.0], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 4))


JNP_FUNCTIONS = {
    "sum": jnp.sum,
    "exp": jnp.exp,
    "where": lambda a: jnp.where(True, a, 0),
    "concatenate": lambda a: jnp.concatenate([a, a]),
    "linalg.norm": jnp.linalg.norm,
    "nn.relu": jax.nn.relu,
    "asarray": jnp.asarray,
}


@pytest.mark.parametrize("make", [_rsp, _csr], ids=["RowSparse", "CSR"])
@pytest.mark.parametrize("name", sorted(JNP_FUNCTIONS))
def test_jnp_functions_refuse_sparse_arrays_naming_the_jsr_ops(name, make):
    """JAX's own message named neither the type nor a replacement; none of
    them densifies a table silently (``jnp.asarray`` did, through numpy)."""
    x = make()
    for fn in (JNP_FUNCTIONS[name], jax.jit(JNP_FUNCTIONS[name])):
        with pytest.raises(TypeError, match=f"do not take a {type(x).__name__}.*jsr.sum"):
            fn(x)
    np.testing.assert_array_equal(np.asarray(x), x.todense())  # numpy's densify is explicit


@pytest.mark.parametrize("make", [_rsp, _csr], ids=["RowSparse", "CSR"])
def test_transpose_is_a_clear_error(make):
    with pytest.raises(TypeError, match=r"transpose_a=True.*todense\(\)\.T"):
        _ = make().T


def test_print_and_debug_print_show_the_values(capsys):
    x = _rsp()
    text = str(x)
    assert text.startswith("RowSparse(float32[8, 3], rows=2)")
    assert "indices=[1 5]" in text and "[4. 5. 6.]" in text
    assert repr(x) == "RowSparse(float32[8, 3], rows=2)"
    jax.debug.print("{}", x)
    jax.jit(lambda r: jax.debug.print("jit {}", r))(x)
    jax.effects_barrier()
    out = capsys.readouterr().out
    assert out.count("indices=[1 5]") == 2 and "jit RowSparse" in out
    assert "indptr=[0 2 2 3]" in str(_csr())
    # Under a trace the values are unknown: the summary only.
    assert str(jax.jit(lambda r: (print(r), r)[1])(x)) == str(x)


def test_jax_grad_with_allow_int_gives_a_float0_cotangent_that_prints():
    """``jax.grad(..., allow_int=True)`` differentiates ``data`` and gives the
    ids a float0 cotangent; its data equals ``jsr.grad``'s and it prints."""
    x = _rsp()
    ids = jnp.array([5, 1, 5])

    def f(r):
        return jnp.sum(jsr.take(r, ids) ** 2)

    for grad in (jax.grad(f, allow_int=True), jax.jit(jax.grad(f, allow_int=True))):
        g = grad(x)
        assert g.indices.dtype == jax.dtypes.float0
        np.testing.assert_allclose(g.data, jsr.grad(f)(x).data)
        assert repr(g) == "RowSparse(float32[8, 3], capacity=2, indices=float0)"
        assert "data=" in str(g)


def _gradients(batches):
    table = jnp.ones((V, D))
    return [
        jsr.grad(lambda r, i=i: jnp.sum(jsr.take(r, i) * 2.0))(jsr.pull_rows(table, i))
        for i in map(jnp.asarray, batches)
    ]


@pytest.mark.parametrize("jit", [False, True])
def test_add_with_a_capacity_keeps_a_scan_carry_and_cond_branches_typed(jit):
    """``jsr.add(acc, g, capacity=k)`` from ``jsr.zeros(..., capacity=k)``:
    the carry keeps ``k`` slots, so ``lax.scan`` and ``lax.cond`` take it; the
    sum equals the dense one."""
    batches = jnp.array([[0, 1], [1, 7], [7, 7]])
    k = 4

    def run(batches):
        def step(acc, ids):
            g = jsr.grad(lambda r: jnp.sum(jsr.take(r, ids) * 2.0))(
                jsr.pull_rows(jnp.ones((V, D)), ids)
            )
            acc = jax.lax.cond(
                ids[0] == 1,
                lambda a: jsr.add(a, g, capacity=k),
                lambda a: jsr.add(a, g * 0.5, capacity=k),
                acc,
            )
            return acc, None

        return jax.lax.scan(step, jsr.zeros("row_sparse", (V, D), capacity=k), batches)[0]

    acc = (jax.jit(run) if jit else run)(batches)
    assert acc.capacity == k
    jsr.check(acc)
    want = np.zeros((V, D))
    for ids, scale in ((batches[0], 0.5), (batches[1], 1.0), (batches[2], 0.5)):
        np.add.at(want, np.asarray(ids), 2.0 * scale)
    np.testing.assert_allclose(acc.todense(), want)


def test_add_capacity_overflow_is_reported():
    a, b = _gradients([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="more distinct rows than `capacity` = 3"):
        jsr.add(a, b, capacity=3)
    err, out = checkify.checkify(
        jax.jit(lambda a, b: jsr.add(a, b, capacity=3)), errors=checkify.user_checks
    )(a, b)
    assert "more distinct rows" in err.get()
    assert out.capacity == 3
    np.testing.assert_array_equal(jsr.add(a, b, capacity=4).indices, [0, 1, 2, 3])
    with pytest.raises(TypeError, match="`capacity` sets the row slots"):
        jsr.add(a, jnp.ones((V, D)), capacity=4)
    with pytest.raises(TypeError, match="`capacity` must be an int"):
        jsr.add(a, b, capacity=2.5)


def test_zeros_with_a_capacity_is_all_padding():
    z = jsr.zeros("row_sparse", (V, D), capacity=3)
    jsr.check(z)
    np.testing.assert_array_equal(z.indices, [V, V, V])
    c = jsr.zeros("csr", (3, 4), capacity=2)
    jsr.check(c)
    assert c.nse == 2 and not np.asarray(c.todense()).any()
    with pytest.raises(ValueError, match="`capacity` applies to sparse storage"):
        jsr.zeros("default", (2,), capacity=1)
    for stype in ("row_sparse", "csr", "default"):
        with pytest.raises(TypeError, match=r"`dtype` must be a dtype .*got 'foo'"):
            jsr.zeros(stype, (3, 2), dtype="foo")


@pytest.mark.parametrize("jit", [False, True])
def test_sum_stacked_adds_per_example_gradients(jit):
    """Per-example gradients from ``jax.vmap`` (a stacked RowSparse) summed
    into one RowSparse: equal to the sum of the dense gradients; nothing of
    shape [V, ...] built (a [B, V, ...] stack least of all)."""
    table = jnp.arange(V * D, dtype=jnp.float32).reshape(V, D)
    ids = jnp.array([[1, 3, 3], [3, 7, V], [0, 1, 1], [2, 2, 2]])

    def per_example(i):
        return jsr.grad(lambda r: jnp.sum(jsr.take(r, i) ** 2))(jsr.pull_rows(table, i))

    def total(ids):
        return jsr.sum_stacked(jax.vmap(per_example)(ids))

    got = (jax.jit(total) if jit else total)(ids)
    jsr.check(got)
    want = sum(
        np.asarray(
            jax.grad(lambda t, i=i: jnp.sum(jnp.take(t, i, axis=0, mode="fill") ** 2))(table)
        )
        for i in ids
    )
    np.testing.assert_allclose(got.todense(), want, rtol=1e-6)
    assert got.capacity == ids.size
    two_axes = jax.vmap(jax.vmap(per_example))(ids.reshape(2, 2, 3))
    np.testing.assert_allclose(jsr.sum_stacked(two_axes).todense(), want, rtol=1e-6)
    # No [V, ...] value at V = 10**8 (the table is the only one, an input).
    big = 10**8

    def traced(table, ids):
        def one(i):
            return jsr.grad(lambda r: jnp.sum(jsr.take(r, i) ** 2))(jsr.pull_rows(table, i))

        return jsr.sum_stacked(jax.vmap(one)(ids))

    jaxpr = jax.make_jaxpr(traced)(jax.ShapeDtypeStruct((big, D), jnp.float32), ids)
    assert big_values(jaxpr.jaxpr, big) == []


def test_sum_stacked_capacity_and_arguments():
    stacked = jax.vmap(lambda i: _gradients([[0, 0]])[0] * i)(jnp.arange(3.0))
    out = jsr.sum_stacked(stacked, capacity=1)
    np.testing.assert_array_equal(out.indices, [0])
    with pytest.raises(ValueError, match="more distinct rows than `capacity` = 1"):
        jsr.sum_stacked(
            jax.vmap(lambda i: jsr.pull_rows(jnp.ones((V, D)), i))(jnp.eye(2, dtype=int)),
            capacity=1,
        )
    single = _gradients([[2]])[0]
    assert jsr.sum_stacked(single) is single
    with pytest.raises(TypeError, match="must be a \\(stacked\\) RowSparse"):
        jsr.sum_stacked(jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="jsr.sum_stacked"):
        stacked.todense()
