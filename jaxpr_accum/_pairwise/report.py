"""What ``explain`` shows of a two-pass plan: both passes, what is stacked between them, the
pairings that made the second pass necessary (primitive and user source line) and the
equations that read a per-row value at the pairs' columns (``k @ z``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import nbytes
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._pairwise.detect import Use
from jaxpr_accum._pairwise.plan import TwoPass, describe_value
from jaxpr_accum._report._plan import Plan
from jaxpr_accum._report._plan_text import PlanStop


def pairs(two: TwoPass, names: dict) -> list[str]:
    """One line per pairing equation (where it is, and which values give its rows and
    columns), then one per read of a per-row value at the pairs' columns (``reads``)."""
    pairing = two.pairing
    out = []
    for read in pairing.rewired:
        eqn = pairing.jaxpr.eqns[read.index]
        columns = describe_value(pairing, read.col_root, names)
        rows = "the pairs"
        if isinstance(read, Use):
            rows = describe_value(pairing, read.row_root, names)
        out.append(
            f"`{eqn.primitive.name}` at {_compat.source_line(eqn)}: rows of {rows} chunked, "
            f"columns of {columns} whole"
        )
    return out


def plan_of(two: TwoPass, decisions: Sequence[Decision], names: dict) -> Plan:
    """The ``Plan`` of the two passes (``decisions``: each pass's): pass 1's (or, without
    one, pass 2's) with the pairings, what pass 1 stacks and pass 2's plan as ``second``; its
    ``stops`` are both passes'."""
    plans = [Plan.from_decision(d, [d.candidate]) for d in decisions]
    second = None
    if len(plans) == 2:
        stops = [PlanStop(s, pass_=2, repeats=s.repeats) for s in plans[1].stops]
        second = dataclasses.replace(plans[1], warning=None, stops=stops)
    return dataclasses.replace(
        plans[0],
        stops=plans[0].stops + ([] if second is None else second.stops),
        warning=two.warning(),
        pairs=pairs(two, names),
        between=[(str(v.aval), nbytes(v)) for v in two.stacked],
        second=second,
        savings=(two.net_saving, two.single.net_saving),
    )
