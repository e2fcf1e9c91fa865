"""The README's code example runs and trains (at a smaller table size)."""

from __future__ import annotations

import pathlib
import re

import jax.numpy as jnp
import numpy as np

import jaxsparse_rows as jsr

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs_and_lowers_the_loss():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    code = blocks[0].replace("1_000_000", "1_000")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    params, state, step = namespace["params"], namespace["state"], namespace["step"]
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 1000, size=(32, 4)), jnp.int32)
    y = jnp.asarray(rng.standard_normal(32).astype(np.float32))
    emb_before = np.asarray(params["emb"]).copy()
    losses = []
    for _ in range(20):
        params, state, loss = step(params, state, ids, y)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    changed = np.nonzero(np.any(np.asarray(params["emb"]) != emb_before, axis=1))[0]
    np.testing.assert_array_equal(changed, np.unique(np.asarray(ids)))  # only touched rows
    assert isinstance(jsr.pull_rows(params["emb"], ids), jsr.RowSparse)
