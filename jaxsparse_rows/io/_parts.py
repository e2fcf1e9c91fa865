"""Data-parallel input: which part of a dataset one process (or device) reads.

A dataset of ``N`` rows (or a file of ``N`` bytes) split into ``num_parts``
parts gives part ``p`` the contiguous range ``[N * p // num_parts,
N * (p + 1) // num_parts)``: the parts cover every row once, in order, and
their sizes differ by at most one.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import numpy as np

from .._args import check_static_int


def check_parts(num_parts: Any, part_index: Any) -> tuple[int, int]:
    """``(num_parts, part_index)`` as ints with ``0 <= part_index < num_parts``.

    Raises:
      TypeError: either is not an int (a bool, a float or a traced value is
        refused), naming the argument.
      ValueError: ``num_parts < 1``, or ``part_index`` outside
        ``[0, num_parts)``, naming the argument and the range.

    Example:
      >>> from jaxsparse_rows.io._parts import check_parts
      >>> check_parts(4, 3)
      (4, 3)
      >>> check_parts(4, 4)
      Traceback (most recent call last):
        ...
      ValueError: `part_index` must be an int with 0 <= part_index < num_parts = 4 (...), got 4.
    """
    num_parts = check_static_int(num_parts, "num_parts", minimum=1)
    expected = (
        f"`part_index` must be an int with 0 <= part_index < num_parts = {num_parts} "
        "(parts are numbered from 0)"
    )
    if isinstance(part_index, jax.core.Tracer):
        raise TypeError(f"{expected}, got a traced value: pass a Python int.")
    try:
        if isinstance(part_index, bool | np.bool_):
            raise TypeError
        index = operator.index(part_index)
    except TypeError:
        raise TypeError(f"{expected}, got {type(part_index).__name__} {part_index!r}.") from None
    if not 0 <= index < num_parts:
        raise ValueError(f"{expected}, got {index}.")
    return num_parts, index


def part_bounds(total: int, num_parts: int, part_index: int) -> tuple[int, int]:
    """``[lo, hi)``: part ``part_index`` of ``range(total)`` split into
    ``num_parts`` contiguous ranges of near-equal size (they differ by at most
    one; with more parts than items, some parts are empty).

    Example:
      >>> from jaxsparse_rows.io._parts import part_bounds
      >>> [part_bounds(10, 4, p) for p in range(4)]
      [(0, 2), (2, 5), (5, 7), (7, 10)]
      >>> [part_bounds(2, 3, p) for p in range(3)]
      [(0, 0), (0, 1), (1, 2)]
    """
    return total * part_index // num_parts, total * (part_index + 1) // num_parts
