"""Shared by the tests of the native CPU kernels: whether CI requires them, a
marker that skips where they were not built, and a switch that restores the
previous setting."""

from __future__ import annotations

import contextlib
import os

import pytest

import jaxsparse_rows as jsr
from jaxsparse_rows import _native

REQUIRED = os.environ.get("JAXSPARSE_ROWS_REQUIRE_NATIVE", "0") == "1"

needs_kernels = pytest.mark.skipif(
    not REQUIRED and not _native.native_kernels_available(),
    reason=f"native kernels not built here: {_native.native_kernels_status()}",
)


@contextlib.contextmanager
def kernels_set(enabled: bool):
    """Turns the native kernels on or off inside the block, then restores them."""
    previous = _native._enabled
    jsr.set_native_kernels(enabled)
    try:
        yield
    finally:
        jsr.set_native_kernels(previous)
