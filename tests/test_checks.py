"""jsr.check: eager ValueErrors and checkify errors under jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from draw import random_csr, random_rowsparse
from jax.experimental import checkify

import jaxsparse_rows as jsr


def rsp(data, idx, shape):
    return jsr.RowSparse._make(jnp.asarray(data, jnp.float32), jnp.asarray(idx, jnp.int32), shape)


def csr(data, idx, ptr, shape):
    return jsr.CSR._make(
        jnp.asarray(data, jnp.float32),
        jnp.asarray(idx, jnp.int32),
        jnp.asarray(ptr, jnp.int32),
        shape,
    )


BAD = [
    (rsp([[1.0], [1.0]], [3, 1], (4, 1)), "must be sorted ascending without duplicates"),
    (rsp([[1.0], [1.0]], [1, 1], (4, 1)), "must be sorted ascending without duplicates"),
    (rsp([[0.0], [1.0]], [4, 1], (4, 1)), "padding \\(id N\\) only at the end"),
    (rsp([[1.0]], [-1], (4, 1)), "must be >= 0"),
    (rsp([[1.0]], [5], (4, 1)), "must be <= N = 4"),
    (rsp([[1.0], [2.0]], [1, 4], (4, 1)), "padding slots must hold zero `data`"),
    (csr([1.0], [0], [1, 1], (1, 2)), r"`indptr\[0\]` must be 0"),
    (csr([1.0, 1.0], [0, 1], [0, 2, 1], (2, 2)), "must be non-decreasing"),
    (csr([1.0], [0], [0, 2], (1, 2)), r"`indptr\[-1\]` must not exceed"),
    (csr([1.0], [3], [0, 1], (1, 2)), r"column ids must lie in \[0, 2\)"),
    (csr([1.0, 1.0], [1, 0], [0, 2], (1, 2)), "sorted ascending without duplicates in each row"),
    (csr([1.0, 1.0], [0, 2], [0, 1], (1, 2)), "padding slots must carry column id 2"),
]


@pytest.mark.parametrize("x,match", BAD, ids=[m for _, m in BAD])
def test_check_rejects_eagerly(x, match):
    with pytest.raises(ValueError, match=match):
        jsr.check(x)


@pytest.mark.parametrize("x,match", BAD, ids=[m for _, m in BAD])
def test_check_under_jit_with_checkify(x, match):
    err, _ = checkify.checkify(jax.jit(jsr.check))(x)
    with pytest.raises(checkify.JaxRuntimeError, match=match):
        err.throw()


def test_check_accepts_valid_arrays(jit_mode):
    """Eagerly ``check`` returns None; under jit its checkify errors are empty."""
    rng = np.random.default_rng(0)
    good = [
        random_rowsparse(rng, (6, 2), n_rows=3, capacity=5),
        random_rowsparse(rng, (0, 2), n_rows=0, capacity=2),
        random_rowsparse(rng, (3, 2, 2), n_rows=3),
        random_rowsparse(rng, (4, 0), n_rows=2, capacity=3),  # D = 0
        jsr.zeros("row_sparse", (4,)),
        random_csr(rng, (4, 5), density=0.5, nse=15),
        random_csr(rng, (3, 0), nse=2),  # (M, 0), padding only
        jsr.zeros("csr", (0, 3)),
    ]
    check = jit_mode(jsr.check)
    for x in good:
        if check is jsr.check:
            assert jsr.check(x) is None
        else:
            err, _ = checkify.checkify(check)(x)
            assert err.get() is None, err.get()


def test_check_inside_a_jitted_function():
    @jax.jit
    def step(x):
        jsr.check(x)
        return x * 2

    checked = checkify.checkify(step)
    err, out = checked(random_rowsparse(np.random.default_rng(1), (5, 2), n_rows=2))
    err.throw()
    err, _ = checked(BAD[0][0])
    with pytest.raises(checkify.JaxRuntimeError, match="sorted ascending"):
        err.throw()


def test_check_bad_type():
    with pytest.raises(TypeError, match="`x` must be a RowSparse or CSR, got ArrayImpl"):
        jsr.check(jnp.ones(2))


@pytest.mark.parametrize("bad", [-1, 5, 2**20])
def test_check_ids_rejects_eagerly_and_through_checkify(bad):
    ids = jnp.array([[0, 4], [bad, 1]])
    with pytest.raises(ValueError, match=rf"`ids` must lie in \[0, 4\).*got {bad}"):
        jsr.check_ids(ids, 4)
    table = jnp.ones((4, 2))

    def lookup(i):
        jsr.check_ids(i, table.shape[0])
        return jsr.take(table, i)

    err, out = checkify.checkify(jax.jit(lookup))(ids)
    with pytest.raises(checkify.JaxRuntimeError, match=r"`ids` must lie in \[0, 4\)"):
        err.throw()
    # Without the check the same jitted lookup reads the bad id as padding.
    np.testing.assert_array_equal(np.asarray(out)[1, 0], [0.0, 0.0])


def test_check_ids_accepts_valid_ids_and_the_padding_id(jit_mode):
    def lookup(i):
        jsr.check_ids(i, 4)
        return jsr.take(jnp.ones((4, 2)), i)

    for ids in (jnp.array([0, 3, 4]), jnp.zeros((0,), jnp.int32), jnp.array([[2]])):
        err, out = checkify.checkify(jit_mode(lookup))(ids)
        err.throw()
        assert out.shape == ids.shape + (2,)


def test_check_ids_bad_arguments():
    with pytest.raises(TypeError, match="`ids` must have an integer dtype"):
        jsr.check_ids(jnp.array([0.0]), 4)
    with pytest.raises(TypeError, match="`num_rows` must be an int or a RowSparse, got 4.0"):
        jsr.check_ids(jnp.array([0]), 4.0)
    with pytest.raises(ValueError, match="`num_rows` must be >= 0, got -1"):
        jsr.check_ids(jnp.array([0]), -1)


def test_check_takes_ids_whose_dtype_cannot_hold_the_padding_id():
    """int8 ids of a 300-row RowSparse: the padding id 300 wrapped to 44 in
    the comparison, so valid ids were refused as "> N". The conditions are
    shared with ``apply_updates``' eager check, which already handled it."""
    ok = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([3, 100], jnp.int8), (300, 1))
    jsr.check(ok)
    bad = jsr.RowSparse._make(jnp.ones((2, 1)), jnp.array([100, 3], jnp.int8), (300, 1))
    with pytest.raises(ValueError, match="sorted ascending without duplicates"):
        jsr.check(bad)
