"""Shared test configuration: a strict numpy environment, hypothesis profiles,
the `jit_mode` fixture that runs a test eagerly and under `jax.jit`, and the
`kernels` fixture that runs a module with the native kernels on and off."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from kernel_switch import kernels_set

import jaxsparse_rows as jsr

jax.config.update("jax_numpy_rank_promotion", "raise")
# Oracles compute at full precision on every device: a GPU's default float32
# matmul (TF32) would miss the suite's tolerances by itself.
jax.config.update("jax_default_matmul_precision", "highest")

settings.register_profile(
    "default",
    # 15 keeps CI's run well inside its time limit (each example of most
    # properties compiles a new program); HYPOTHESIS_MAX_EXAMPLES=300 runs a
    # deeper search locally (tests with their own count take the larger of
    # the two, see strategies.examples). Runs are derandomized, so CI always
    # draws the same examples; HYPOTHESIS_DERANDOMIZE=0 draws new ones (pass
    # --hypothesis-seed=N to repeat a run).
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=os.environ.get("HYPOTHESIS_DERANDOMIZE", "1") != "0",
    print_blob=True,
)
settings.load_profile("default")


@pytest.fixture(params=["eager", "jit"])
def jit_mode(request):
    """Returns ``wrap(f)``: ``f`` itself eagerly, ``jax.jit(f)`` under jit.

    Example::

        def test_x(jit_mode):
            out = jit_mode(lambda a: a * 2)(a)
    """
    if request.param == "eager":
        return lambda f, **kw: f
    return lambda f, **kw: jax.jit(f, **kw)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="module", params=["native", "xla"])
def kernels(request):
    """Runs the tests that use it twice: with the native CPU kernels (where they
    were built) and with the pure-XLA implementation used elsewhere. A module
    opts in with ``pytestmark = pytest.mark.usefixtures("kernels")``."""
    if request.param == "native" and not jsr.native_kernels_available():
        pytest.skip("native kernels not built here")
    with kernels_set(request.param == "native"):
        yield request.param


def pytest_collection_modifyitems(config, items):
    """``JSR_TEST_SHARD=i/n`` keeps every n-th test from the i-th: ``make test``
    runs two shards at once, one per core of CI's 2-core machine (pytest-xdist
    is not a test dependency). Round-robin over the collected order keeps the
    shards' work even; together they run every test exactly once."""
    shard = os.environ.get("JSR_TEST_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    if not 0 <= index < count:
        raise pytest.UsageError(f"JSR_TEST_SHARD must be i/n with 0 <= i < n, got {shard!r}")
    kept = items[index::count]
    config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i % count != index])
    items[:] = kept
