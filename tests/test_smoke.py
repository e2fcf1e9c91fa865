import jax.numpy as jnp
import numpy as np

import jaxsparse_rows as jsr


def test_rowsparse_roundtrip(jit_mode):
    a = jsr.row_sparse_array(([[1.0, 2.0], [3.0, 4.0]], [1, 4]), shape=(6, 2))
    out = jit_mode(lambda x: (x * 2).todense())(a)
    expected = np.zeros((6, 2), np.float32)
    expected[[1, 4]] = [[2, 4], [6, 8]]
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert jnp.asarray(out).dtype == jnp.float32
