"""Row maps along the axis: ``concatenate``, ``slice`` and ``rev`` along it (``jnp.roll``).

Each row of a concatenation along the axis comes from one row of one part, each row of a
slice from one row of its operand, each row of a reversal from one row of its operand: the
operands carry the axis as a *row map* (``AxisLoc.lo / span / rev / skip``, ``_lattice``),
which these rules derive in both directions:

- ``sub_loc``: the map of rows ``[a, b)`` of a value: its live rows among them (a part none
  of whose rows is read is *dead*: one row of it at a position no chunk holds, ``DEAD_LO``);
- ``super_loc``: a concatenation's map from one part's, the part's map extended over every
  row of the result (the other parts' rows at the positions next to it);
- a slice's operand lives on the slice's rows only (``skip`` more dead rows before them):
  the same positions as the slice, so it is computed per chunk on the slice's window.

Per chunk every mapped value holds its *window* (``EqnResize.window``). Windows of
sub-segments do not nest in their parent's (a window is clamped into its own positions), so
a value is never sliced from a window computed for other positions: a slice reads an operand
with exactly its positions (its window is the operand's, ``skip`` rows on), and where the
operand is needed whole elsewhere too the analysis meets a conflict, which ``_fanout``
resolves by copying the operand's equations per reader (recomputing the part from the
region's roots: a random draw draws any rows, an ``iota`` counts any) or, where it cannot (a
chunked input read whole and in part), stops the region. A concatenation's window is one
contiguous run of its parts' windows: each part's window holds the part's rows of the
result's window (a clamp into a sub-segment contains the sub-segment's share of the clamp into
the segment), so the run starts at ``sum_p clip(first_out - c_p - first_p, 0, rows_p)``
(``c_p`` the part's first row in the result; a dead part before the live rows counts its one
row). A reversal reverses its operand's window (windows are in the value's own row order).

Only ``inner == 1`` (the dimension is the positions themselves) is mapped; along another
dimension the primitives are positionwise (``SameShape``). A slice with a stride along the
axis stops the region (its rows are no segment).
"""

from __future__ import annotations

from collections.abc import Collection

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, positions
from jaxpr_accum._compat import Array, JaxprEqn
from jaxpr_accum._engine._table import register
from jaxpr_accum._engine._view import EqnResize, View
from jaxpr_accum._rules import blocks
from jaxpr_accum._rules.shape import SameShape, carried_loc, first_operand, replaced_at

#: the position of a dead part's one row: below every chunk (no cell holds it either)
DEAD_LO = -1


def dead(dim: int) -> AxisLoc:
    """The map of a part none of whose rows is read: one row, at ``DEAD_LO``."""
    return AxisLoc(dim, 1, 1, DEAD_LO, 1)


def sub_loc(loc: AxisLoc, size: int, a: int, b: int) -> AxisLoc:
    """Where the axis sits in rows ``[a, b)`` (along ``loc.dim``) of a value at ``loc``: its
    live rows among them, or (none) one dead row."""
    n = positions(loc, size)
    first, last = max(a, loc.skip), min(b, loc.skip + n)
    if first >= last:
        return dead(loc.dim)
    lo = loc.lo + loc.skip + n - last if loc.rev else loc.lo + first - loc.skip
    return AxisLoc(loc.dim, 1, 1, lo, last - first, loc.rev, first - a)


def super_loc(sub: AxisLoc, size: int, total: int, a: int) -> AxisLoc:
    """Where the axis sits in a value of ``total`` rows whose rows from ``a`` on are at
    ``sub``, every row live (the map extended over them)."""
    n = positions(sub, size)
    lo = sub.lo + sub.skip + a + n - total if sub.rev else sub.lo - sub.skip - a
    return AxisLoc(sub.dim, 1, 1, lo, total, sub.rev)


def slice_operand_loc(out: AxisLoc, size: int, a: int) -> AxisLoc:
    """Where the axis sits in the operand of a slice from row ``a`` whose result is at
    ``out``: the same positions, ``a`` more dead rows before them."""
    return out._replace(span=positions(out, size), skip=out.skip + a)


def reversed_loc(loc: AxisLoc, size: int, length: int) -> AxisLoc:
    """Where the axis sits in the reversal of a dimension of ``length`` at ``loc``."""
    n = positions(loc, size)
    if not loc.skip and n == length:
        return loc._replace(rev=not loc.rev)
    return loc._replace(span=n, rev=not loc.rev, skip=length - loc.skip - n)


def _all_live(loc: AxisLoc, size: int, length: int) -> bool:
    return not loc.skip and positions(loc, size) == length


def _concat_allowed(eqn: JaxprEqn, d: int) -> bool:
    return eqn.params["dimension"] != d


def _rev_allowed(eqn: JaxprEqn, d: int) -> bool:
    return d not in eqn.params["dimensions"]


def _clip(x: int | Array, lo: int, hi: int) -> int | Array:
    if isinstance(x, int):
        return min(max(x, lo), hi)
    return lax.clamp(lo, x, hi)


def _along(view: View, eqn: JaxprEqn, dims: Collection[int]) -> bool:
    """Whether a known position of the axis in ``eqn`` is one of ``dims``."""
    locs = [view.in_loc(i) for i in range(len(eqn.invars))] + [view.out_loc(0)]
    return any(loc is not None and loc.dim in dims for loc in locs)


def _unmappable(view: View, eqn: JaxprEqn) -> bool:
    locs = [view.in_loc(i) for i in range(len(eqn.invars))] + [view.out_loc(0)]
    if any(loc is not None and loc.inner != 1 for loc in locs):
        view.barrier(f"`{eqn.primitive.name}` along the axis merged with other dimensions")
        return True
    return False


def _every_part(eqn: JaxprEqn) -> list[int]:
    return list(range(len(eqn.invars)))


class Concatenate(SameShape):
    row_map_ok = True
    middle_factor_ok = True  # copies of the whole axis side by side (``blocks``)

    def __init__(self) -> None:
        super().__init__(_every_part, _concat_allowed, "")

    @staticmethod
    def _bounds(eqn: JaxprEqn) -> list[tuple[int, int]]:
        d, bounds, at = eqn.params["dimension"], [], 0
        for v in eqn.invars:
            rows = _compat.shape_of(v)[d]
            bounds.append((at, at + rows))
            at += rows
        return bounds

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        d = eqn.params["dimension"]
        if not _along(view, eqn, (d,)):
            super().propagate(eqn, view)
            return
        bounds = self._bounds(eqn)
        if blocks.concatenate(eqn, view, [b - a for a, b in bounds]) or _unmappable(view, eqn):
            return
        total = _compat.shape_of(eqn.outvars[0])[d]
        for i, (a, b) in enumerate(bounds):
            # a part all of whose rows live tells the result's map, unless the result is read
            # in part (then its parts live in part); a dead part, or one read in part, tells
            # nothing
            loc, out = view.in_loc(i), view.out_loc(0)
            if (
                loc is not None
                and _all_live(loc, view.size, b - a)
                and (out is None or _all_live(out, view.size, total))
            ):
                view.set_out(0, super_loc(loc, view.size, total, a))
        out = view.out_loc(0)
        if out is not None:
            for i, (a, b) in enumerate(bounds):
                view.set_in(i, sub_loc(out, view.size, a, b))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        out = r.out_locs[0]
        d = eqn.params["dimension"]
        if out is None or out.dim != d or out.outer > 1:  # copies: the parts' chunks joined
            return super().resize(eqn, r, invals)
        first, rows = r.window(out)
        offset: int | Array = 0
        for (a, _), loc in zip(self._bounds(eqn), r.in_locs, strict=True):
            first_p, rows_p = r.window(carried_loc(loc))  # every part maps the result's rows
            offset = offset + _clip(first - a - first_p, 0, rows_p)
        with _compat.user_context(eqn):
            (joined,) = _compat.bind(eqn, invals)
            return [lax.dynamic_slice_in_dim(joined, offset, rows, d)]


def keeps_all(eqn: JaxprEqn) -> bool:
    """Whether a ``slice`` keeps all of its operand."""
    v = eqn.invars[0]
    return (
        not isinstance(v, _compat.Literal)
        and not any(eqn.params["start_indices"])
        and tuple(eqn.params["limit_indices"]) == _compat.shape_of(v)
        and all(s == 1 for s in eqn.params.get("strides") or ())
    )


def is_root(eqn: JaxprEqn, view: View) -> bool:
    """Whether ``eqn`` is a *root*: a slice that keeps all of a top-level input (``_fanout``
    puts one between an input and each copy of the equations that read it at other rows).
    It carries no fact either way: it runs before the loop on the whole input, and its result
    takes the row map its readers need (its windows are read per chunk)."""
    return not view.ctx and keeps_all(eqn) and view.analysis.definition((), eqn.invars[0]) is None


class Slice(SameShape):
    """``slice``: along the axis with unit stride, a segment of rows whose operand lives on
    them only; elsewhere positionwise."""

    row_map_ok = True
    middle_factor_ok = True  # whole copies of the axis taken out of a concatenation (``blocks``)

    def __init__(self) -> None:
        super().__init__(first_operand, self._unit_stride, "slices along the axis with a stride")

    @staticmethod
    def _unit_stride(eqn: JaxprEqn, d: int) -> bool:
        strides = eqn.params.get("strides")
        return strides is None or strides[d] == 1

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        if is_root(eqn, view):
            if view.out_loc(0) is not None:
                view.hoist(
                    "an input whose rows a copy reads at other positions: taken whole before "
                    "the loop, each chunk reads its window"
                )
            return
        in_loc, out_loc = view.in_loc(0), view.out_loc(0)
        d = next((loc.dim for loc in (in_loc, out_loc) if loc is not None), None)
        if d is None:
            return
        if not self._unit_stride(eqn, d):
            view.barrier("`slice` slices along the axis with a stride")
            return
        if blocks.slice_copies(eqn, view, d):
            return
        if (in_loc is not None and out_loc is not None and in_loc.dim != out_loc.dim) or (
            _unmappable(view, eqn)
        ):
            view.barrier("operands of `slice` carry the axis at different places")
            return
        a, b = eqn.params["start_indices"][d], eqn.params["limit_indices"][d]
        if view.analysis.stop_slices and (a, b) != (0, _compat.shape_of(eqn.invars[0])[d]):
            view.barrier("`slice` takes part of the axis of a value read at two row maps")
            return
        if in_loc is not None:
            view.set_out(0, sub_loc(in_loc, view.size, a, b))
        out_loc = view.out_loc(0)
        if out_loc is not None:
            view.set_in(0, slice_operand_loc(out_loc, view.size, a))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        # the operand lives on the slice's positions (``slice_operand_loc``): its window is
        # the slice's, so along the axis the chunk keeps all of it
        loc = carried_loc(r.in_locs[0])
        d = loc.dim
        a, b = blocks.slice_bounds(eqn, r, loc) if loc.outer > 1 else (0, r.rows(loc))
        params = {
            **eqn.params,
            "start_indices": replaced_at(eqn.params["start_indices"], d, a),
            "limit_indices": replaced_at(eqn.params["limit_indices"], d, b),
        }
        with _compat.user_context(eqn):
            return _compat.bind(eqn, invals, params)


class Rev(SameShape):
    """``rev``: along the axis, the reversed row map (its window reversed); elsewhere
    positionwise."""

    row_map_ok = True

    def __init__(self) -> None:
        super().__init__(first_operand, _rev_allowed, "")

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        dims = eqn.params["dimensions"]
        if not _along(view, eqn, dims):
            super().propagate(eqn, view)
            return
        if _unmappable(view, eqn):
            return
        loc = view.in_loc(0)
        at = loc if loc is not None else view.out_loc(0)
        assert at is not None  # _along found the axis on an operand or the result
        length = _compat.shape_of(eqn.invars[0])[at.dim]
        if loc is not None:
            view.set_out(0, reversed_loc(loc, view.size, length))
        loc = view.out_loc(0)
        if loc is not None:
            view.set_in(0, reversed_loc(loc, view.size, length))


register("concatenate", Concatenate())
register("slice", Slice())
register("rev", Rev())
