"""The lattice of the axis analysis: where the tracked axis sits in one value.

    unknown (None)  <  AxisLoc(dim, inner, outer)  <  CONFLICT

``AxisLoc(d, m)``: dimension ``d`` has size ``N * m`` with the axis as its major factor
(``m == 1``: the dimension *is* the axis). ``AxisLoc(d, m, o)`` with ``o > 1``: dimension
``d`` has size ``o * N * m``, a reshape having merged the axis into the dimensions before it
(``[T, B, H] -> [T * B, H]``). A chunk of it is not a contiguous block of that dimension, so
only the rules that never index along it accept such a location (``Rule.middle_factor_ok``);
the analysis makes every other equation that meets one a barrier. ``join`` is the least
upper bound: two different locations meet at ``CONFLICT``, the top, from which nothing
propagates.
"""

from __future__ import annotations

from typing import NamedTuple


class AxisLoc(NamedTuple):
    """Where the tracked axis sits in one value: dimension ``dim`` has size
    ``outer * N * inner`` (``inner == outer == 1``: the dimension is the axis itself)."""

    dim: int
    inner: int = 1
    outer: int = 1

    def describe(self) -> str:
        if self.outer > 1:
            return f"dimension {self.dim} (a middle factor, {self.outer} x N x {self.inner})"
        if self.inner == 1:
            return f"dimension {self.dim}"
        return f"dimension {self.dim} (major factor, x{self.inner})"


def is_middle_factor(loc: AxisLoc | None) -> bool:
    """Whether ``loc`` holds the axis as a middle factor (``[T * B, H]``): a chunk of it is
    strided, not a block."""
    return loc is not None and loc.outer > 1


class Conflict:
    """The top of the lattice: a value the axis would occupy at two places."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CONFLICT"

    def __reduce__(self) -> str:
        return "CONFLICT"


CONFLICT = Conflict()

Fact = AxisLoc | Conflict | None


def join(a: Fact, b: Fact) -> Fact:
    """The least upper bound of two facts."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    return CONFLICT
