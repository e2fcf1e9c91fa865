"""The library's ops inside ``jax.shard_map`` (``check_vma=True``) on 4 host
devices: values and gradients equal the same computation written with
``jnp`` ops (see ``shard_map_cases.py``, run in a subprocess because the
device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Every case the script must report (a case that silently disappeared from
# it would otherwise pass).
LOOKUPS = (
    "take_dense",
    "take_view",
    "take_dense_eager",
    "take_view_eager",
    "embedding_bag_sum_dense",
    "embedding_bag_mean_dense",
    "embedding_bag_sum_view",
    "embedding_bag_mean_view",
    "jvp_take",
    "take_invariant_table",
    "take_auto_sparse",
)
DOTS = tuple(
    f"dot_{kind}_{v}_csr"
    for kind in (
        "csr_dense",
        "csr_t_dense",
        "csr_rsp",
        "csr_t_rsp",
        "rsp_dense",
        "rsp_t_dense",
        "dense_csr",
        "dense_rsp",
    )
    for v in ("varying", "invariant")
)
OPTIMIZERS = (
    "lazy_sgd",
    "lazy_sgd_momentum",
    "lazy_sgd_nesterov",
    "lazy_adam",
    "lazy_adamw",
    "lazy_adagrad",
    "lazy_rowwise_adagrad",
    "lazy_ftrl",
    "apply_updates",
)


def test_ops_inside_shard_map_match_jnp():
    """A table sharded by rows over the devices, ids replicated and mapped to
    each shard's local ids (ids of other shards become its padding id); the
    loss sums the lookups over the devices with ``psum``. Every lookup,
    ``embedding_bag`` (dense table and ``pull_rows`` view), ``dot`` in each
    storage combination (with the CSR varying over the devices and
    invariant), a JVP, a replicated table looked up by varying ids (its
    gradient is the ``psum`` over devices), the lazy optimizers and
    ``apply_updates`` give the values and gradients of the ``jnp`` version:
    a gradient as many times too large as there are devices, or a cotangent
    whose type lacks the varying axis, fails here."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "shard_map_cases.py"), "4"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == sorted(LOOKUPS + DOTS + OPTIMIZERS)
    failed = {k: v for k, v in results.items() if isinstance(v, str) or v > 1e-5}
    assert not failed, failed
