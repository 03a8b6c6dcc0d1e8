"""Why the region stops where it does: the texts of ``Stages``' stops (a row map or a middle
factor that cannot be stacked, an input held as a middle factor, an equation that runs after
the loop), and the stop's ``prim at file:line`` name."""

from __future__ import annotations

from collections.abc import Callable

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import JaxprEqn, Var

Loc = Callable[[tuple, Var], AxisLoc | None]  # where a variable carries the axis, in a context


def why_after(inputs_ok: bool, eqn: JaxprEqn, reduced: dict, loc: Loc, used: set) -> str:
    """Why an equation that carries the axis runs after the loop (it is no barrier)."""
    if inputs_ok:
        kept = [
            v.aval.str_short()
            for j, v in enumerate(eqn.outvars)
            if j not in reduced and loc((), v) is None and v in used
        ]
        return (
            f"one of its results ({', '.join(kept)}) is read later but neither carries the axis "
            "nor reduces it; runs after the loop on the stacked values"
        )
    return "needs a value reduced over the whole axis; runs after the loop on the stacked values"


def named(eqn: JaxprEqn) -> str:
    return f"`{eqn.primitive.name}` at {_compat.source_line(eqn)}"


MIDDLE_FACTOR = "its result holds the axis as a middle factor of a merged dimension: "
ROW_MAP = "its result holds a concatenated, sliced or reversed part of the axis: "
MIDDLE_INPUT = (
    "reads a value computed before the loop that holds the axis as a middle factor of a "
    "merged dimension: it cannot be sliced per chunk"
)
