"""Boolean flags must be booleans: a string such as "false" is truthy, and was
taken to mean the opposite of what it says."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsparse_rows as jsr

A = jsr.row_sparse_array(([[1.0, 2.0]], [1]), shape=(3, 2))
C = jsr.csr_matrix(np.array([[1.0, 2.0], [0.0, 3.0]], np.float32))

CALLS = {
    "transpose_a": lambda v: jsr.dot(C, jnp.ones((2, 2)), transpose_a=v),
    "transpose_b": lambda v: jsr.dot(C, jnp.ones((2, 2)), transpose_b=v),
    "keepdims": lambda v: jsr.sum(A, axis=0, keepdims=v),
    "keepdims ": lambda v: jsr.sum(jnp.ones((2, 2)), axis=0, keepdims=v),  # dense input too
    "keepdims  ": lambda v: jsr.square_sum(A, axis=1, keepdims=v),
    "enabled": lambda v: jsr.set_verbose(v),
    "enabled ": lambda v: jsr.set_native_kernels(v),
    "nesterov": lambda v: jsr.optim.lazy_sgd(0.1, momentum=0.9, nesterov=v),
    "nesterov ": lambda v: jsr.optim.lazy_sgd(0.1, momentum=0.9, nesterov=v, lazy="exact"),
    "lazy": lambda v: jsr.optim.add_decayed_weights(0.1, lazy=v),
    "flip_sign": lambda v: jsr.optim.scale_by_learning_rate(0.1, flip_sign=v),
}


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, np.array([True])])
def test_non_bool_flags_are_refused_by_name(name, value):
    with pytest.raises(TypeError, match=rf"`{name.strip()}` must be True or False, got"):
        CALLS[name](value)


@pytest.mark.parametrize("name", CALLS)
def test_every_flag_is_refused_with_the_same_message(name):
    """The optimizers' flags (`nesterov`, `lazy`, `flip_sign`) had a check of
    their own, which worded the refusal differently ("got 'no' (str)")."""
    with pytest.raises(TypeError) as info:
        CALLS[name]("no")
    assert str(info.value) == f"`{name.strip()}` must be True or False, got str 'no'."


def test_bools_and_numpy_bools_still_work():
    previous = (jsr.is_verbose(), jsr.native_kernels_enabled())
    try:
        for call in CALLS.values():
            for value in (False, True, np.bool_(False)):
                call(value)
    finally:
        jsr.set_verbose(previous[0])
        jsr.set_native_kernels(previous[1])
    np.testing.assert_array_equal(
        jsr.todense(jsr.dot(C, jnp.ones((2, 2)), transpose_a=np.bool_(True))),
        np.array([[1.0, 2.0], [0.0, 3.0]]).T @ np.ones((2, 2)),
    )
    assert jsr.sum(A, axis=0, keepdims=np.bool_(True)).shape == (1, 2)
