"""Shared test configuration: a strict numpy environment, hypothesis profiles,
and the `jit_mode` fixture that runs a test eagerly and under `jax.jit`."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_numpy_rank_promotion", "raise")

settings.register_profile(
    "default",
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
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
