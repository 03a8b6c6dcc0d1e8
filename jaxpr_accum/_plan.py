"""The split of a program for one axis: which equations run before, inside and after the loop.

Words used across the package: a *split* (``Split``) is this module's result for one
candidate axis; the *region* is the chunked part of the program (the body, run by the chunk
loop, ``_loop``); the *plan* (``Plan``, ``_report``) is what ``explain`` reports.

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
*chunked* (sliced per chunk). A value that holds the axis as a middle factor of a merged
dimension (``[T * B, H]``, ``AxisLoc.outer``) is never one of them: a chunk of it is strided,
not a block, so an equation that would read one from before the loop, or produce one read
after it, runs after the loop instead (to a fixpoint, like undone streaming). This split is
exact by construction: every equation computes what it computed before, on the same values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpr_accum import _compat, _cost, _stream
from jaxpr_accum._axes import Analysis
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Literal, Var
from jaxpr_accum._cost import nbytes
from jaxpr_accum._lattice import AxisLoc, is_middle_factor

PROLOGUE, BODY, EPILOGUE = "prologue", "body", "epilogue"


@dataclasses.dataclass
class Stop:
    """A place where the region had to stop: the equation and why."""

    eqn: JaxprEqn
    reason: str
    cause: Stop | None = None  # the stop that made this one retreat, where it is not its own

    def __str__(self) -> str:
        return f"`{self.eqn.primitive.name}` at {_compat.source_line(self.eqn)}: {self.reason}"

    @property
    def root(self) -> Stop:
        """The stop that forced this one (itself when nothing else did)."""
        return self if self.cause is None else self.cause.root


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """The stages of every top-level equation, and the region's inputs and outputs: program
    structure, the same at every chunk size (``_cost.Candidate`` is a split at a chunk)."""

    jaxpr: Jaxpr
    analysis: Analysis
    size: int
    born: str
    stages: tuple[str, ...]
    invariants: tuple[Var, ...]
    chunked: tuple[tuple[Var, AxisLoc], ...]
    sums: tuple[Var, ...]
    partials: tuple[tuple[Var, str], ...]
    stacked: tuple[tuple[Var, AxisLoc], ...]
    stops: tuple[Stop, ...]
    hoisted_draws: tuple[Stop, ...]
    reductions: tuple[Stop, ...]
    stacked_bytes: int  # bytes of the body outputs stacked back to full size
    body_bytes: int  # bytes of the body's axis-carrying intermediates at full size
    held_bytes: int  # the materialised ones among them (``_cost``), at full size
    sinks: tuple = ()  # streamed sums (``_stream.Sink``)
    streamed: frozenset = frozenset()  # indices of the equations that run streamed
    deferred: frozenset = frozenset()  # values reduced over the axis that they read

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


def _vars(vs: Any) -> list[Var]:
    return [v for v in vs if isinstance(v, Var) and not isinstance(v, Literal)]


def make_split(jaxpr: Jaxpr, analysis: Analysis, born: str, stream: bool = True) -> Split:
    """The stages of ``jaxpr`` for ``analysis``'s axis (an empty axis: all prologue);
    ``stream=False``: no equation is streamed (``_fallback``'s narrower plan)."""
    if analysis.size == 0:
        analysis = Analysis(jaxpr, 0)  # nothing to chunk: no equation is treated as touching
    loc = analysis.loc
    order = {v: i for i, v in enumerate(_defined_in_order(jaxpr))}
    used: set = set(_vars(jaxpr.outvars))
    for eqn in jaxpr.eqns:
        used.update(_vars(eqn.invars))

    # Streaming is undone where a streamed value has a reader outside the algebra (``_stream``)
    # and the region ends before a value that holds the axis as a middle factor would have to
    # be stacked (``unstackable``); both only move equations out of the loop, so this ends.
    excluded: set[int] = set()
    unstacked: dict[int, Stop] = {}  # equation -> the stop that needs its result whole
    while True:
        draft = _Stages(jaxpr, analysis, used, excluded, unstacked, stream)
        misused = draft.misused()
        if misused:
            excluded |= misused
            continue
        unstackable = draft.unstackable()
        if not unstackable:
            break
        unstacked.update(unstackable)
    stage, stages = draft.stage, draft.stages

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
    # the combination of streamed sums reads the deferred values after the loop too
    read_after.extend(sorted(draft.deferred, key=lambda v: order[v]))
    sums: list[Var] = []
    partials: list[tuple[Var, str]] = []
    stacked: list[tuple[Var, AxisLoc]] = []
    kinds = _reduction_kinds(jaxpr, analysis, stages)
    seen = {sink.var for sink in draft.sinks}
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
    used_sinks = [sink for sink in draft.sinks if sink.var in set(read_after)]

    size = analysis.size
    stacked_vars = {v for v, _ in stacked}
    body = [i for i, s in enumerate(stages) if s == BODY]
    carrying = _cost.carrying_bytes(analysis, (), jaxpr.eqns, body, stacked_vars)
    held = _cost.carrying_bytes(analysis, (), jaxpr.eqns, body, stacked_vars, True)
    return Split(
        jaxpr=jaxpr,
        analysis=analysis,
        size=size,
        born=born,
        stages=tuple(stages),
        invariants=tuple(invariants),
        chunked=tuple(chunked),
        sums=tuple(sums),
        partials=tuple(partials),
        stacked=tuple(stacked),
        stops=tuple(draft.stops),
        hoisted_draws=tuple(draft.hoisted),
        reductions=tuple(draft.reductions),
        stacked_bytes=sum(nbytes(v) for v in stacked_vars),
        body_bytes=carrying,
        held_bytes=held,
        sinks=tuple(used_sinks),
        streamed=frozenset(draft.streamed_eqns),
        deferred=frozenset(draft.deferred),
    )


class _Stages:
    """One pass in program order: the stage of every equation, with streaming (``_stream``)
    tried where an equation reads a value reduced over the whole axis, except ``excluded``."""

    def __init__(
        self,
        jaxpr: Jaxpr,
        analysis: Analysis,
        used: set,
        excluded: set[int],
        unstacked: dict[int, Stop],
        stream: bool,
    ):
        self.jaxpr, self.analysis, self.excluded, self.stream = jaxpr, analysis, excluded, stream
        self.unstacked = unstacked
        self.stage: dict = {v: PROLOGUE for v in jaxpr.invars}
        self.stages: list[str] = []
        self.stops: list[Stop] = []
        self.hoisted: list[Stop] = []
        self.reductions: list[Stop] = []
        self.values: dict[Var, _stream.Streamed] = {}  # streamed values that carry the axis
        self.producer: dict[Var, int] = {}
        self.streamed_eqns: set[int] = set()
        self.sinks: list[_stream.Sink] = []
        self.deferred: set[Var] = set()
        for idx, eqn in enumerate(jaxpr.eqns):
            s = self._stage(idx, eqn, used)
            self.stages.append(s)
            for v in eqn.outvars:
                self.stage[v] = s

    def _stage(self, idx: int, eqn: JaxprEqn, used: set) -> str:
        analysis, stage = self.analysis, self.stage
        loc = analysis.loc
        ins = _vars(eqn.invars)
        if not analysis.touches((), eqn):
            return PROLOGUE if all(stage[v] == PROLOGUE for v in ins) else EPILOGUE
        blocked = analysis.blocker((), idx, eqn)
        key = ((), idx)
        if blocked is not None:
            hoist = key in analysis.hoists and key not in analysis.barriers
            if hoist and all(stage[v] == PROLOGUE for v in ins):
                self.hoisted.append(Stop(eqn, analysis.hoists[key]))
                return PROLOGUE
            self.stops.append(Stop(*blocked))
            return EPILOGUE
        if idx in self.unstacked:
            root = self.unstacked[idx].root
            why = f"it cannot be stacked per chunk, and {_named(root.eqn)} needs it whole"
            self.stops.append(Stop(eqn, _MIDDLE_FACTOR + why, root))
            return EPILOGUE
        if any(stage[v] == PROLOGUE and is_middle_factor(loc((), v)) for v in ins):
            self.stops.append(Stop(eqn, _MIDDLE_INPUT))
            return EPILOGUE
        reduced = analysis.reductions.get(key, {})
        inputs_ok = all(
            stage[v] == PROLOGUE
            or (stage[v] == BODY and loc((), v) is not None and v not in self.values)
            for v in ins
        )
        outputs_ok = all(
            j in reduced or loc((), v) is not None or v not in used
            for j, v in enumerate(eqn.outvars)
        )
        if inputs_ok and outputs_ok:
            if reduced:
                self.reductions.append(
                    Stop(eqn, f"reduces the axis ({', '.join(reduced.values())})")
                )
            return BODY
        if self.stream and idx not in self.excluded and self._stream(idx, eqn, reduced):
            return BODY
        if all(stage[v] != EPILOGUE for v in ins if loc((), v) is not None):
            self.stops.append(Stop(eqn, _why_after(inputs_ok, eqn, reduced, loc, used)))
        return EPILOGUE

    def _kind(self, v: Var, value: Any = None) -> _stream.Operand:
        if v in self.values:
            return self.values[v]
        carries = self.analysis.loc((), v) is not None
        if self.stage[v] == PROLOGUE or (self.stage[v] == BODY and carries):
            return _stream.Plain(None)
        if carries:
            raise _stream.NotStreamable("a value stacked after the loop")
        return _stream.Deferred(v)

    def _stream(self, idx: int, eqn: JaxprEqn, reduced: dict) -> bool:
        """Whether ``eqn`` runs in the loop as a streamed equation (recorded if so)."""
        if any(is_middle_factor(self.analysis.loc((), v)) for v in (*eqn.invars, *eqn.outvars)):
            return False
        out_loc = self.analysis.loc((), eqn.outvars[0]) if eqn.outvars else None
        sink = out_loc is None
        if sink and reduced != {0: "sum"}:
            return False
        try:
            ops = _stream.operands(eqn, self._kind)
            if not any(isinstance(op, _stream.Streamed | _stream.Deferred) for op in ops):
                return False
            result = _stream.apply(_stream.Emitter(eqn, sink), ops, None if sink else out_loc.dim)
        except _stream.NotStreamable:
            return False
        self.streamed_eqns.add(idx)
        self.deferred.update(op.var for op in ops if isinstance(op, _stream.Deferred))
        if sink:
            var = eqn.outvars[0]
            shape = var.aval.shape if result.shape is None else result.shape
            self.sinks.append(_stream.Sink(var, idx, result.terms, shape, result.later))
            self.reductions.append(Stop(eqn, "reduces the axis (a streamed sum)"))
        else:
            self.values[eqn.outvars[0]] = result
            self.producer[eqn.outvars[0]] = idx
        return True

    def unstackable(self) -> dict[int, Stop]:
        """Body equations whose result holds the axis as a middle factor and is read after
        the loop (stacking chunks of it would interleave them wrongly), each with the stop of
        the first equation after the loop that reads it."""
        reader: dict = {}
        for idx, eqn in enumerate(self.jaxpr.eqns):
            if self.stages[idx] == EPILOGUE:
                for v in _vars(eqn.invars):
                    reader.setdefault(v, idx)
        stop_of = {id(stop.eqn): stop for stop in self.stops}
        found = {}
        for idx, eqn in enumerate(self.jaxpr.eqns):
            if self.stages[idx] != BODY:
                continue
            for v in eqn.outvars:
                if not is_middle_factor(self.analysis.loc((), v)):
                    continue
                if v in reader:
                    user = self.jaxpr.eqns[reader[v]]
                    found[idx] = stop_of.get(id(user)) or Stop(user, "runs after the loop")
                elif v in _vars(self.jaxpr.outvars):
                    found[idx] = Stop(eqn, "an output of the function")
        return found

    def misused(self) -> set[int]:
        """Streamed equations whose result is read by anything but another streamed
        equation (or is an output): they must run after the loop after all."""
        bad = {self.producer[v] for v in _vars(self.jaxpr.outvars) if v in self.values}
        for idx, eqn in enumerate(self.jaxpr.eqns):
            if idx in self.streamed_eqns:
                continue
            bad.update(self.producer[v] for v in _vars(eqn.invars) if v in self.values)
        return bad


def _why_after(inputs_ok: bool, eqn: JaxprEqn, reduced: dict, loc: Any, used: set) -> str:
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


def _defined_in_order(jaxpr: Jaxpr) -> list[Var]:
    return [*jaxpr.invars, *(v for e in jaxpr.eqns for v in e.outvars)]


def _reduction_kinds(jaxpr: Jaxpr, analysis: Analysis, stages: list[str]) -> dict:
    kinds = {}
    for idx, s in enumerate(stages):
        if s != BODY:
            continue
        for j, kind in analysis.reductions.get(((), idx), {}).items():
            kinds[jaxpr.eqns[idx].outvars[j]] = kind
    return kinds


def _named(eqn: JaxprEqn) -> str:
    return f"`{eqn.primitive.name}` at {_compat.source_line(eqn)}"


_MIDDLE_FACTOR = "its result holds the axis as a middle factor of a merged dimension: "
_MIDDLE_INPUT = (
    "reads a value computed before the loop that holds the axis as a middle factor of a "
    "merged dimension: it cannot be sliced per chunk"
)
