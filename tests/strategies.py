"""Small hypothesis strategies for RowSparse / CSR arrays (built on draw.py)."""

from __future__ import annotations

import os

import numpy as np
from draw import random_csr, random_rowsparse
from hypothesis import strategies as st

from jaxsparse_rows import testing as jsrt


def examples(n: int) -> int:
    """A test's own example count ``n``, or HYPOTHESIS_MAX_EXAMPLES where that
    asks for more (a deeper local search; see conftest.py)."""
    return max(n, int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "0")))


trailing_dims = st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple)


@st.composite
def rowsparse(draw, *, shape=None, dtype=np.float32, max_n=8, max_pad=2):
    """A canonical RowSparse with random N, trailing dims, stored rows and padding."""
    if shape is None:
        shape = (draw(st.integers(0, max_n)),) + draw(trailing_dims)
    n_rows = draw(st.integers(0, shape[0]))
    pad = draw(st.integers(0, max_pad))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return random_rowsparse(rng, shape, n_rows=n_rows, capacity=n_rows + pad, dtype=dtype)


@st.composite
def rowsparse_pair(draw, *, dtype=np.float32, max_n=8):
    """Two RowSparse arrays of the same shape (independent rows and capacities)."""
    shape = (draw(st.integers(0, max_n)),) + draw(trailing_dims)
    return draw(rowsparse(shape=shape, dtype=dtype)), draw(rowsparse(shape=shape, dtype=dtype))


@st.composite
def csr(draw, *, shape=None, dtype=np.float32, max_dim=6, max_pad=3):
    """A canonical CSR with random shape, density and padding."""
    if shape is None:
        shape = (draw(st.integers(0, max_dim)), draw(st.integers(0, max_dim)))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = random_csr(rng, shape, density=density, dtype=dtype)
    pad = draw(st.integers(0, max_pad))
    if pad:
        x = random_csr(
            np.random.default_rng(seed), shape, density=density, nse=x.nse + pad, dtype=dtype
        )
    return x


@st.composite
def csr_pair(draw, *, dtype=np.float32, max_dim=6):
    shape = (draw(st.integers(0, max_dim)), draw(st.integers(0, max_dim)))
    return draw(csr(shape=shape, dtype=dtype)), draw(csr(shape=shape, dtype=dtype))


@st.composite
def coo_triplets(draw, *, max_n=8, max_d=3, max_k=10):
    """Unsorted, possibly duplicated ``(data, ids, shape)`` row triplets (numpy)."""
    n = draw(st.integers(1, max_n))
    d = draw(st.integers(0, max_d))
    k = draw(st.integers(0, max_k))
    ids = np.asarray(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)), np.int64)
    seed = draw(st.integers(0, 2**32 - 1))
    data = jsrt.random_dense(np.random.default_rng(seed), (k, d))
    return data, ids, (n, d)
