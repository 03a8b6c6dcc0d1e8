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

**Row maps.** ``lo``, ``span`` and ``rev`` say which positions of the axis the rows of the
dimension are: row ``j`` is position ``lo + j`` (``rev``: ``lo + span - 1 - j``), for ``span``
rows (``0``: the whole axis, ``N``). A concatenation along the axis gives each part the
segment of positions its rows become, a slice the segment it keeps, ``rev`` the reversed map
(``jnp.roll`` is two slices and a concatenation). ``skip``: the rows before the mapped ones,
so rows ``skip .. skip + span - 1`` are the positions and the others (before them, and after
them up to the dimension's length) are *dead*: nothing reads them, no chunk computes them (the
operand of a slice that takes part of the axis lives only where the slice reads it). A
row-mapped value is computed per chunk on its *window* (``window``): the chunk's positions
clamped into its own, ``min(k, span)`` rows, so consecutive windows may overlap. That is exact
for positionwise equations (``Rule.row_map_ok``), never for a reduction over the axis, and a
mapped value is never stacked after the loop. Windows of a segment and of its sub-segments do
*not* nest (a sub-segment's window is clamped into it, so it may reach rows beyond its
parent's window): a value is only ever computed from values with the same positions
(positionwise equations, a slice's operand living on the slice's rows only), or from the
windows of values whose positions contain its own (a concatenation of parts: each part's
window holds the part's rows of the result's window, ``_rules/rows``); a value needed at two
row maps is copied per reader (``_fanout``) or stops the region. Where every boundary of every
row map is a multiple of the chunk,
each chunk lies in one *cell* between them, and the values whose positions miss it are computed
on no rows (``_build._cells.by_cell``): the chunk does the work of its own part only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class AxisLoc(NamedTuple):
    """Where the tracked axis sits in one value: dimension ``dim`` has size
    ``outer * N * inner`` (``inner == outer == 1``: the dimension is the axis itself)."""

    dim: int
    inner: int = 1
    outer: int = 1
    lo: int = 0
    span: int = 0
    rev: bool = False
    skip: int = 0

    def describe(self) -> str:
        if is_mapped(self):
            order = "reversed " if self.rev else ""
            rows = f"rows {self.skip} .. {self.skip + self.span - 1}: " if self.skip else ""
            last = self.lo + self.span - 1
            return f"dimension {self.dim} ({rows}{order}positions {self.lo} .. {last})"
        if self.outer > 1:
            return f"dimension {self.dim} (a middle factor, {self.outer} x N x {self.inner})"
        if self.inner == 1:
            return f"dimension {self.dim}"
        return f"dimension {self.dim} (major factor, x{self.inner})"


def is_middle_factor(loc: AxisLoc | None) -> bool:
    """Whether ``loc`` holds the axis as a middle factor (``[T * B, H]``): a chunk of it is
    strided, not a block."""
    return loc is not None and loc.outer > 1


def is_mapped(loc: AxisLoc | None) -> bool:
    """Whether ``loc``'s rows are not the axis positions in order (a segment, or reversed)."""
    return loc is not None and (loc.span != 0 or loc.lo != 0 or loc.rev or loc.skip != 0)


def positions(loc: AxisLoc, size: int) -> int:
    """How many axis positions the rows at ``loc`` are (``span``, or the whole axis)."""
    return loc.span or size


def canonical(loc: AxisLoc, size: int, length: int) -> AxisLoc:
    """``loc`` with a segment that is the whole axis, on a dimension of ``length`` with no
    dead rows, written as the whole axis."""
    whole = length == loc.outer * size * loc.inner
    if loc.lo == 0 and loc.span == size and loc.skip == 0 and whole:
        return loc._replace(span=0)
    return loc


def fits(loc: AxisLoc, size: int, length: int) -> bool:
    """Whether a dimension of ``length`` can hold the axis at ``loc``: exactly, or (a row map
    of the dimension itself) with dead rows around the mapped ones."""
    n = positions(loc, size)
    if is_mapped(loc) and loc.inner == loc.outer == 1:
        return loc.skip >= 0 and loc.skip + n <= length
    return loc.skip == 0 and loc.outer * n * loc.inner == length


def window(
    loc: AxisLoc, size: int, k: int, start: int | jax.Array, cell: tuple[int, int] | None = None
) -> tuple[int | jax.Array, int]:
    """``(first row, rows)`` of the value at ``loc`` that chunk ``[start, start + k)`` computes,
    in the value's own row order (rows of the axis; ``inner`` not applied): the chunk clamped
    into the value's positions, ``min(k, span)`` rows, after its ``skip`` dead ones. The whole
    axis: the chunk itself.
    ``cell``: positions ``[a, b)`` known to hold the chunk, which every row map of the program
    holds or misses whole (``_build._cells.by_cell``); a value that misses it has no rows."""
    if not is_mapped(loc):
        return start, k
    n = positions(loc, size)
    if cell is not None and (loc.lo >= cell[1] or loc.lo + n <= cell[0]):
        return 0, 0
    w = min(k, n)
    if isinstance(start, int):
        first: Any = min(max(start - loc.lo, 0), n - w)
    else:
        first = jnp.clip(start - loc.lo, 0, n - w)
    return loc.skip + (n - w - first if loc.rev else first), w


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


def not_a_block(loc: AxisLoc | None) -> bool:
    """Whether a chunk of a value at ``loc`` is not its block of rows ``[start, start + k)``
    (a middle factor, or a row-mapped axis whose windows may overlap): never stacked or
    streamed."""
    return is_middle_factor(loc) or is_mapped(loc)
