"""The lattice of the axis analysis: where the tracked axis sits in one value.

    unknown (None)  <  AxisLoc(dim, inner)  <  CONFLICT

``AxisLoc(d, m)``: dimension ``d`` has size ``N * m`` with the axis as its major factor
(``m == 1``: the dimension *is* the axis). ``join`` is the least upper bound: two different
locations meet at ``CONFLICT``, the top, from which nothing propagates.
"""

from __future__ import annotations

from typing import NamedTuple


class AxisLoc(NamedTuple):
    """Where the tracked axis sits in one value: dimension ``dim`` has size ``N * inner``
    and the axis is its major factor (``inner == 1``: the dimension is the axis itself)."""

    dim: int
    inner: int = 1

    def describe(self) -> str:
        if self.inner == 1:
            return f"dimension {self.dim}"
        return f"dimension {self.dim} (major factor, x{self.inner})"


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
