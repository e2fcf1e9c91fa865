"""The dtypes the library computes in: the index dtype of row ids and the
accumulation dtype of sums."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def index_dtype() -> np.dtype:
    """The default index dtype: int32, or int64 when ``jax_enable_x64`` is on."""
    return jnp.dtype(jax.dtypes.canonicalize_dtype(jnp.int64))


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype sums of ``dtype`` run in: float32 for float16 and bfloat16
    (as ``jnp.sum`` and ``jnp.dot`` accumulate them; a bfloat16 running sum of
    ones stops at 256), else ``dtype`` itself."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return jnp.dtype(jnp.float32)
    return dtype
