"""Storage-fallback warnings and the verbose storage-inference log."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

from ._args import check_flag

logger = logging.getLogger("jaxsparse_rows")

_verbose = os.environ.get("JAXSPARSE_ROWS_VERBOSE", "0").strip().lower() not in ("", "0", "false")


class StorageFallbackWarning(UserWarning):
    """A sparse input was densified because no sparse kernel handles the call.

    The result is correct but costs as much as the dense computation. Silence it
    with ``warnings.simplefilter("ignore", jsr.StorageFallbackWarning)``.
    """


def set_verbose(enabled: bool = True) -> None:
    """Turns the storage-inference log on or off.

    When on, every storage-type decision (``multiply(row_sparse, scalar) ->
    row_sparse``) and
    every fallback is logged at INFO level on the ``"jaxsparse_rows"`` logger,
    like MXNet's ``MXNET_INFER_STORAGE_TYPE_VERBOSE_LOGGING``. The environment
    variable ``JAXSPARSE_ROWS_VERBOSE=1`` turns it on at import.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.set_verbose(True); jsr.is_verbose()
      True
      >>> jsr.set_verbose(False)
    """
    global _verbose
    _verbose = check_flag(enabled, "enabled")
    # A handler of our own only where no root handler shows INFO lines: with
    # one (``logging.basicConfig``), every line would print twice.
    shown = any(h.level <= logging.INFO for h in logging.getLogger().handlers)
    if _verbose and not logger.handlers and not shown:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[jaxsparse_rows] %(message)s"))
        logger.addHandler(handler)
    if _verbose:
        logger.setLevel(logging.INFO)


def is_verbose() -> bool:
    """Whether the storage-inference log is on (see :func:`set_verbose`).

    Example:
      >>> import jaxsparse_rows as jsr
      >>> jsr.is_verbose()
      False
    """
    return _verbose


@contextlib.contextmanager
def verbose(enabled: bool = True) -> Iterator[None]:
    """Context manager form of :func:`set_verbose`.

    Example:
      >>> import jaxsparse_rows as jsr
      >>> with jsr.verbose():
      ...     jsr.is_verbose()
      True
    """
    previous = _verbose
    set_verbose(enabled)
    try:
        yield
    finally:
        set_verbose(previous)


def log_inference(op: str, in_stypes: tuple[str, ...], out_stype: str) -> None:
    """Logs one storage-type inference decision when verbose mode is on."""
    if _verbose:
        logger.info("%s(%s) -> %s", op, ", ".join(in_stypes), out_stype)


def warn_fallback(op: str, in_stypes: tuple[str, ...]) -> None:
    """Emits :class:`StorageFallbackWarning` for ``op`` on the given input stypes."""
    message = (
        f"{op}({', '.join(in_stypes)}): no sparse implementation, the sparse inputs are "
        "densified and the result is dense (correct but as costly as the dense op)."
    )
    if _verbose:
        logger.info("fallback: %s", message)
    warnings.warn(message, StorageFallbackWarning, stacklevel=3)


if _verbose:
    set_verbose(True)
