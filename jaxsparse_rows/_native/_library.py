"""Finding, checking and loading the ``_kernels`` library that ``setup.py``
builds next to this file, and registering its handlers with XLA."""

from __future__ import annotations

import ctypes
import importlib.machinery
from pathlib import Path
from typing import Any

import jax

from . import _registry, _selftest

_library: Any = None  # the loaded ctypes library, kept alive for the process


def jaxlib_version() -> str:
    """The running jaxlib's version string."""
    from jaxlib import version

    return version.__version__


def library_path() -> Path | None:
    """The built kernel library next to this file, or None when it was not built."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_kernels{suffix}"
        if candidate.exists():
            return candidate
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"0.8.1"`` -> ``(0, 8, 1)``; stops at the first part that is not a number
    (``"0.9.0.dev20250101"`` -> ``(0, 9, 0)``)."""
    parts = []
    for part in version.split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def jaxlib_mismatch(built: str, running: str) -> str | None:
    """Why kernels compiled against jaxlib ``built`` must not be registered with
    jaxlib ``running``, or None when they may be.

    XLA accepts handlers of its own FFI API version or older, and refuses a
    newer one in a way that leaves the CPU backend unable to start. An older
    jaxlib at run time than at build time (e.g. ``pip install`` built the
    kernels in an isolated environment with the newest jaxlib) is therefore
    refused here, before anything is registered.

    Example:
      >>> from jaxsparse_rows._native._library import jaxlib_mismatch
      >>> jaxlib_mismatch("0.8.1", "0.10.2") is None
      True
      >>> print(jaxlib_mismatch("0.10.2", "0.8.1"))  # doctest: +ELLIPSIS
      the kernels were built against jaxlib 0.10.2 but jaxlib 0.8.1 is running; ...
    """
    b, r = _version_tuple(built), _version_tuple(running)
    if b and r and r >= b:
        return None
    return (
        f"the kernels were built against jaxlib {built} but jaxlib {running} is running; "
        "rebuild them with the running jaxlib: pip install --no-build-isolation "
        "--force-reinstall --no-deps jaxsparse_rows (from its source)"
    )


def load() -> str:
    """Loads the library, registers every declared kernel's target and runs
    the self-test; returns \"ok\" or why the kernels cannot be used."""
    global _library
    path = library_path()
    if path is None:
        return "the _kernels library was not built (it needs a C++17 compiler at install time)"
    try:
        _library = ctypes.cdll.LoadLibrary(str(path))
        built_with = _library.jsr_built_with_jaxlib
        built_with.restype = ctypes.c_char_p
        mismatch = jaxlib_mismatch(built_with().decode(), jaxlib_version())
        if mismatch:
            return mismatch
        jax.devices("cpu")  # start the backend first: a refused handler then fails alone
        for kernel in _registry.KERNELS:
            handler = jax.ffi.pycapsule(getattr(_library, kernel.symbol))
            jax.ffi.register_ffi_target(kernel.target, handler, platform="cpu")
        return _selftest.self_test()
    except Exception as err:  # any failure means: use the XLA path
        return f"{type(err).__name__}: {err}"
