"""Planning: which axis, and which equations run before, inside and after the chunked loop.

Stages, assigned in one pass in program order (inputs are in the prologue):

- **prologue**: equations that do not carry the axis and read only prologue values (the
  encoder: hoisted, run once), and *hoisted* draws along the axis (exact on the full axis);
- **body**: equations that carry the axis, can run per chunk (``Analysis.blocker`` is None),
  and read only prologue values besides axis-carrying body values; reductions over the axis
  are body equations whose outputs are per-chunk partials;
- **epilogue**: everything else, which then runs on the full axis after the loop: equations
  that read a reduction over the whole axis (batch statistics, the max in logsumexp), the
  barriers, and everything downstream of them.

Body outputs that later stages read are *sums* (carried accumulators), other monoid
*partials* (stacked per chunk, combined after the loop) or *stacked* values that still carry
the axis. Body inputs are *invariant* (no axis: parameters, the encoder's output) or
*chunked* (sliced per chunk). This split is exact by construction: every equation computes
what it computed before, on the same values.

Candidates (when no ``argnums`` is given): each dimension of an input or intermediate value
at position ``axis`` whose size qualifies starts an analysis; values already reached by an
earlier candidate are skipped. The candidate whose plan has the lowest estimated memory is
chosen (ties: larger axis, then earlier born).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from jaxpr_accum import _compat
from jaxpr_accum._axes import Analysis
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Literal, Var
from jaxpr_accum._errors import SerializeError
from jaxpr_accum._rules import AxisLoc

PROLOGUE, BODY, EPILOGUE = "prologue", "body", "epilogue"


@dataclasses.dataclass
class Stop:
    """A place where the region had to stop: the equation and why."""

    eqn: JaxprEqn
    reason: str

    def __str__(self) -> str:
        return f"`{self.eqn.primitive.name}` at {_compat.source_line(self.eqn)}: {self.reason}"


@dataclasses.dataclass
class RegionPlan:
    jaxpr: Jaxpr
    analysis: Analysis
    size: int
    chunk: int
    born: str
    stages: list[str]
    invariants: list[Var]
    chunked: list[tuple[Var, AxisLoc]]
    sums: list[Var]
    partials: list[tuple[Var, str]]
    stacked: list[tuple[Var, AxisLoc]]
    stops: list[Stop]
    hoisted_draws: list[Stop]
    reductions: list[Stop]
    estimate: int  # bytes of all intermediates, less ``saving``
    saving: int  # bytes of the body's axis-carrying intermediates not held at full size
    stacked_bytes: int  # bytes of the body outputs stacked back to full size

    def not_worth_it(self) -> str | None:
        """Why this plan is not expected to save memory, or None."""
        if self.size == 0:
            return "the axis has size 0: the function runs as written"
        if self.stacked and self.saving <= self.stacked_bytes:
            return (
                "this plan is not expected to save memory: the region stacks "
                f"{format_bytes(self.stacked_bytes)} of outputs back to full size, at least "
                f"the {format_bytes(self.saving)} of per-chunk intermediates it avoids holding"
            )
        return None

    def indices(self, stage: str) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s == stage]

    @property
    def has_body(self) -> bool:
        return BODY in self.stages

    @property
    def usable(self) -> bool:
        """A plan to run: it chunks something, or there is nothing to chunk (an empty axis,
        or a function without outputs)."""
        return self.has_body or self.size == 0 or not self.jaxpr.outvars


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def nbytes(v: Any) -> int:
    aval = v.aval
    return math.prod(aval.shape) * getattr(aval.dtype, "itemsize", 4)


def _vars(vs: Any) -> list[Var]:
    return [v for v in vs if isinstance(v, Var) and not isinstance(v, Literal)]


def make_plan(jaxpr: Jaxpr, analysis: Analysis, chunk: int, born: str) -> RegionPlan:
    """The stages of ``jaxpr`` for ``analysis``'s axis (an empty axis: all prologue)."""
    if analysis.size == 0:
        analysis = Analysis(jaxpr, 0)  # nothing to chunk: no equation is treated as touching
    loc = analysis.loc
    used: set = set(_vars(jaxpr.outvars))
    for eqn in jaxpr.eqns:
        used.update(_vars(eqn.invars))

    stage: dict = {v: PROLOGUE for v in jaxpr.invars}
    stages: list[str] = []
    stops: list[Stop] = []
    hoisted: list[Stop] = []
    reductions: list[Stop] = []
    for idx, eqn in enumerate(jaxpr.eqns):
        ins = _vars(eqn.invars)
        all_prologue = all(stage[v] == PROLOGUE for v in ins)
        if not analysis.touches((), eqn):
            s = PROLOGUE if all_prologue else EPILOGUE
        else:
            blocked = analysis.blocker((), idx, eqn)
            key = ((), idx)
            reduced = analysis.reductions.get(key, {})
            if blocked is None:
                inputs_ok = all(
                    stage[v] == PROLOGUE or (stage[v] == BODY and loc((), v) is not None)
                    for v in ins
                )
                outputs_ok = all(
                    j in reduced or loc((), v) is not None or v not in used
                    for j, v in enumerate(eqn.outvars)
                )
                s = BODY if inputs_ok and outputs_ok else EPILOGUE
                frontier = all(stage[v] != EPILOGUE for v in ins if loc((), v) is not None)
                if s == EPILOGUE and frontier:
                    stops.append(
                        Stop(
                            eqn,
                            "needs a value reduced over the whole axis; runs after the loop "
                            "on the stacked values",
                        )
                    )
                if s == BODY and reduced:
                    reductions.append(
                        Stop(eqn, f"reduces the axis ({', '.join(reduced.values())})")
                    )
            elif key in analysis.hoists and key not in analysis.barriers and all_prologue:
                s = PROLOGUE
                hoisted.append(Stop(eqn, analysis.hoists[key]))
            else:
                s = EPILOGUE
                stops.append(Stop(*blocked))
        stages.append(s)
        for v in eqn.outvars:
            stage[v] = s

    invariants: list[Var] = []
    chunked: list[tuple[Var, AxisLoc]] = []
    seen: set = set()
    for idx in (i for i, s in enumerate(stages) if s == BODY):
        for v in _vars(jaxpr.eqns[idx].invars):
            if stage[v] == PROLOGUE and v not in seen:
                seen.add(v)
                where = loc((), v)
                if where is None:
                    invariants.append(v)
                else:
                    chunked.append((v, where))

    read_after: list[Var] = list(_vars(jaxpr.outvars))
    for idx, s in enumerate(stages):
        if s == EPILOGUE:
            read_after.extend(_vars(jaxpr.eqns[idx].invars))
    sums: list[Var] = []
    partials: list[tuple[Var, str]] = []
    stacked: list[tuple[Var, AxisLoc]] = []
    kinds = _reduction_kinds(jaxpr, analysis, stages)
    seen = set()
    for v in read_after:
        if stage.get(v) != BODY or v in seen:
            continue
        seen.add(v)
        where = loc((), v)
        if where is not None:
            stacked.append((v, where))
        elif kinds[v] == "sum":
            sums.append(v)
        else:
            partials.append((v, kinds[v]))

    size = analysis.size
    stacked_vars = {v for v, _ in stacked}
    per_chunk = sum(
        nbytes(v)
        for idx in (i for i, s in enumerate(stages) if s == BODY)
        for v in jaxpr.eqns[idx].outvars
        if loc((), v) is not None and v not in stacked_vars
    )
    saving = int(per_chunk * (1 - min(chunk, size) / size)) if size else 0
    estimate = _total_bytes(jaxpr) - saving
    return RegionPlan(
        jaxpr=jaxpr,
        analysis=analysis,
        size=size,
        chunk=chunk,
        born=born,
        stages=stages,
        invariants=invariants,
        chunked=chunked,
        sums=sums,
        partials=partials,
        stacked=stacked,
        stops=stops,
        hoisted_draws=hoisted,
        reductions=reductions,
        estimate=estimate,
        saving=saving,
        stacked_bytes=sum(nbytes(v) for v in stacked_vars),
    )


@functools.lru_cache(maxsize=8)
def _total_bytes(jaxpr: Jaxpr) -> int:
    return sum(nbytes(v) for e in jaxpr.eqns for v in e.outvars)


def _reduction_kinds(jaxpr: Jaxpr, analysis: Analysis, stages: list[str]) -> dict:
    kinds = {}
    for idx, s in enumerate(stages):
        if s != BODY:
            continue
        for j, kind in analysis.reductions.get(((), idx), {}).items():
            kinds[jaxpr.eqns[idx].outvars[j]] = kind
    return kinds


def describe_origin(jaxpr: Jaxpr, v: Var, dim: int, arg_names: dict) -> str:
    if v in arg_names:
        return f"dimension {dim} of {arg_names[v]}"
    for eqn in jaxpr.eqns:
        if v in eqn.outvars:
            return f"dimension {dim} of `{eqn.primitive.name}` at {_compat.source_line(eqn)}"
    return f"dimension {dim} of {v}"  # pragma: no cover


def origins(jaxpr: Jaxpr) -> list[Var]:
    """Every top-level value in program order: inputs, then equation results."""
    out = list(jaxpr.invars)
    for eqn in jaxpr.eqns:
        out.extend(v for v in eqn.outvars if not isinstance(v, _compat.DropVar))
    return out


def find_candidates(
    jaxpr: Jaxpr, chunk: int, axis: int | None, size: int | None, arg_names: dict
) -> list[RegionPlan]:
    """Plans for every distinct candidate axis, in order of birth."""
    values = origins(jaxpr)
    order = {v: i for i, v in enumerate(values)}
    covered: set = set()
    plans = []
    for v in values:
        shape = v.aval.shape
        for d, n in enumerate(shape):
            if size is not None and n != size:
                continue
            if size is None and n <= chunk:
                continue
            if axis is not None and d != axis % max(len(shape), 1):
                continue
            if (v, d) in covered:
                continue
            analysis = Analysis(jaxpr, n).run([(v, AxisLoc(d))])
            reached = [(u, loc) for (ctx, u), loc in analysis.locs.items() if ctx == ()]
            covered.update((u, loc.dim) for u, loc in reached if loc.inner == 1)
            first, first_loc = min(reached, key=lambda p: order.get(p[0], len(order)))
            if axis is not None and (first_loc.dim != d or first_loc.inner != 1):
                continue
            born = describe_origin(jaxpr, first, first_loc.dim, arg_names)
            plans.append(make_plan(jaxpr, analysis, chunk, born))
    return plans


def choose(plans: list[RegionPlan]) -> RegionPlan:
    return min(enumerate(plans), key=lambda ip: (ip[1].estimate, -ip[1].size, ip[0]))[1]


def nothing_chunkable(plans: list[RegionPlan], what: str) -> SerializeError:
    lines = [f"nothing can be chunked along {what}."]
    for plan in plans:
        lines.append(f"axis of size {plan.size} born at {plan.born}:")
        lines.extend(f"  stopped by {stop}" for stop in plan.stops[:3])
        if not plan.stops:
            lines.append("  no equation carries it per chunk")
    return SerializeError("\n".join(lines))
