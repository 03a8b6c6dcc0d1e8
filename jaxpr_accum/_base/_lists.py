"""Picking and placing the entries of flat lists by flags and indices (a pass's inputs and
outputs among all of a region's)."""

from __future__ import annotations

from collections.abc import Sequence


def select(values: Sequence, flags: Sequence[bool]) -> list:
    """The ``values`` whose flag is set."""
    return [x for x, f in zip(values, flags, strict=True) if f]


def pick(values: Sequence, indices: Sequence[int]) -> list:
    """The ``values`` at ``indices``."""
    return [values[i] for i in indices]


def spread(values: Sequence, indices: Sequence[int], n: int) -> list:
    """``values`` at ``indices`` of a length-``n`` list, None elsewhere."""
    out: list = [None] * n
    for i, x in zip(indices, values, strict=True):
        out[i] = x
    return out
