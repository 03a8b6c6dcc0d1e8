"""Copies of the axis side by side: a concatenation of parts that each carry the whole axis.

DPO's concatenated forward (``concatenate([chosen, rejected])`` of two inputs chunked along
the pairs), two encodings of one batch joined (``concatenate([enc(x), enc(y)])``), or ``x``
and a value computed from it: each part holds every position of the axis, so the result holds
the axis ``outer`` times, one copy after another. That is the axis as a *middle factor*
(``AxisLoc.outer``, ``_lattice``): row ``(o * N + n) * inner + i`` of the dimension is
position ``n`` of copy ``o``, exactly as if the parts had been stacked and the stack reshaped.
Per chunk, every copy computes its own rows of the chunk's positions: the concatenation of the
parts' chunks, ``outer * k * inner`` rows, so the pairs that the program forms later between
the copies (row ``i`` with row ``B + i``) lie in one chunk.

A ``slice`` whose bounds along that dimension fall between copies takes whole copies
(``s[:B]``, ``s[B:]``), as do the pieces of a ``split`` (``jnp.split(s, 2)``): the result
holds the axis ``(b - a) / (N * inner)`` times, the plain axis for one copy. A slice or split
that cuts a copy stops the region. Every other equation meets the
middle factor as it meets one made by a reshape (``Rule.middle_factor_ok``).

Only an *unmapped* location (every position, in order: no row map, ``_rules/rows``) is a
copy; a concatenation whose parts are row maps (antithetic halves, a roll) stays with
``_rules/rows``. Each function returns whether it applied, so that rule falls back otherwise.
"""

from __future__ import annotations

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import JaxprEqn, Params
from jaxpr_accum._engine._table import register
from jaxpr_accum._engine._view import EqnResize, View
from jaxpr_accum._rules.shape import SameShape, carried_loc, first_operand, not_at_param


def copies(loc: AxisLoc | None, d: int) -> bool:
    """Whether ``loc`` holds whole copies of the axis at dimension ``d`` (one or more)."""
    return loc is not None and loc.dim == d and not is_mapped(loc)


def _located(d: int, inner: int, rows: int, unit: int) -> AxisLoc:
    """The place of the axis in a dimension of ``rows`` rows holding copies of ``unit``."""
    return AxisLoc(d, inner, rows // unit)


def concatenate(eqn: JaxprEqn, view: View, lengths: list[int]) -> bool:
    """Propagate a concatenation along the axis whose parts are whole copies of it (or whose
    result holds more than one copy). False where neither is known: the row-map rule applies."""
    d = eqn.params["dimension"]
    parts = [view.in_loc(i) for i in range(len(eqn.invars))]
    out = view.out_loc(0)
    known = [loc for loc in parts if loc is not None and copies(loc, d)]
    if out is not None and copies(out, d) and out.outer > 1:
        known.append(out)
    if not known:
        return False
    inner = known[0].inner
    unit = view.size * inner
    if any(n % unit for n in lengths):
        view.barrier(
            "`concatenate` joins a copy of the whole axis with rows that are not whole copies of it"
        )
        return True
    view.set_out(0, _located(d, inner, sum(lengths), unit))
    for i, n in enumerate(lengths):
        view.set_in(i, _located(d, inner, n, unit))
    return True


def slice_copies(eqn: JaxprEqn, view: View, d: int) -> bool:
    """Propagate a ``slice`` along dimension ``d`` of a value holding more than one copy of
    the axis (or whose result does). False where neither is known."""
    operand, out = view.in_loc(0), view.out_loc(0)
    if operand is not None and not copies(operand, d):
        return False  # a row map: ``_rules/rows``
    several = [loc for loc in (operand, out) if copies(loc, d) and loc is not None]
    if not any(loc.outer > 1 for loc in several):
        return False
    inner = several[0].inner
    unit = view.size * inner
    a, b = eqn.params["start_indices"][d], eqn.params["limit_indices"][d]
    length = _compat.shape_of(eqn.invars[0])[d]
    if a % unit or b % unit or length % unit:
        view.barrier("`slice` cuts a copy of the axis out of a concatenation of copies")
        return True
    view.set_out(0, _located(d, inner, b - a, unit))
    view.set_in(0, _located(d, inner, length, unit))
    return True


def split_copies(eqn: JaxprEqn, view: View, d: int) -> bool:
    """Propagate a ``split`` along dimension ``d`` of a value holding more than one copy of
    the axis (``jnp.split(logits, 2)``: each piece whole copies). False where no operand or
    piece is known to hold copies."""
    operand = view.in_loc(0)
    pieces = [view.out_loc(j) for j in range(len(eqn.outvars))]
    several = [loc for loc in (operand, *pieces) if copies(loc, d) and loc is not None]
    if not several or not any(loc.outer > 1 for loc in several):
        return False
    inner = several[0].inner
    unit = view.size * inner
    sizes = [int(n) for n in eqn.params["sizes"]]
    if any(n % unit for n in sizes):
        view.barrier("`split` cuts a copy of the axis out of a concatenation of copies")
        return True
    view.set_in(0, _located(d, inner, sum(sizes), unit))
    for j, n in enumerate(sizes):
        view.set_out(j, _located(d, inner, n, unit))
    return True


def split_sizes(eqn: JaxprEqn, r: EqnResize, loc: AxisLoc) -> tuple[int, ...]:
    """The chunk's piece sizes of a split of copies at ``loc`` (the operand's place)."""
    unit = r.analysis.size * loc.inner
    copy_rows = r.rows(loc._replace(outer=1))
    return tuple(int(n) // unit * copy_rows for n in eqn.params["sizes"])


def slice_bounds(eqn: JaxprEqn, r: EqnResize, loc: AxisLoc) -> tuple[int, int]:
    """The chunk's bounds of a slice of copies at ``loc`` (the operand's place): the copies
    it takes, each ``k * inner`` rows per chunk."""
    d = loc.dim
    unit = r.analysis.size * loc.inner
    copy_rows = r.rows(loc._replace(outer=1))
    a, b = eqn.params["start_indices"][d], eqn.params["limit_indices"][d]
    return a // unit * copy_rows, b // unit * copy_rows


class Split(SameShape):
    """``split``: pieces along ``axis``; the axis elsewhere is shared by every piece. Along
    the axis, only whole copies of it are split."""

    middle_factor_ok = True

    def __init__(self) -> None:
        super().__init__(first_operand, not_at_param("axis"), "splits the axis into pieces")

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        axis = eqn.params["axis"] % len(_compat.shape_of(eqn.invars[0]))
        if not split_copies(eqn, view, axis):
            super().propagate(eqn, view)

    def resize_params(self, eqn: JaxprEqn, r: EqnResize) -> Params:
        loc = carried_loc(r.in_locs[0])
        if loc.dim != eqn.params["axis"] % len(_compat.shape_of(eqn.invars[0])):
            return eqn.params
        return {**eqn.params, "sizes": split_sizes(eqn, r, loc)}


register("split", Split())
