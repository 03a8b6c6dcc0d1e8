"""The stages of a program's equations for one axis, assigned in one pass in program order.

``Stages`` gives every top-level equation a stage (see ``_split``): prologue, body or
epilogue, streams what the normaliser algebra can (``_stream``), and records where and why
the region stops (``Stop``, with the stop that forced it where a retreat is not its own).
``_split.make_split`` runs it to a fixpoint: streaming undone where a streamed value has a
reader outside the algebra (``misused``), and equations whose result holds the axis as a
middle factor moved after the loop where that result is read there (``unstackable``); the
stages it ends with give the region's inputs and outputs (``region_inputs``,
``region_outputs``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable

from jaxpr_accum import _compat, _stream
from jaxpr_accum._analysis import _stop_reasons as reasons
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, is_middle_factor, not_a_block
from jaxpr_accum._compat import Atom, Jaxpr, JaxprEqn, Literal, Var
from jaxpr_accum._engine._axes import Analysis

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


def variables(vs: Iterable[Atom]) -> list[Var]:
    """The variables among ``vs`` (literals left out)."""
    return [v for v in vs if isinstance(v, Var) and not isinstance(v, Literal)]


class Stages:
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
        self.constant: dict[Var, int] = {}  # value computed from literals alone -> producer
        for idx, eqn in enumerate(jaxpr.eqns):
            s = self._stage(idx, eqn, used)
            self.stages.append(s)
            for v in eqn.outvars:
                self.stage[v] = s
            if self._is_constant(idx, eqn):
                self.constant.update((v, idx) for v in eqn.outvars)

    def _is_constant(self, idx: int, eqn: JaxprEqn) -> bool:
        """Whether ``eqn`` computes its values from literals alone, before the loop or in
        its body as a plain equation (no reduction, nothing streamed)."""
        return (
            _compat.is_pure(eqn)
            and all(v in self.constant for v in variables(eqn.invars))
            and self.stages[idx] in (PROLOGUE, BODY)
            and ((), idx) not in self.analysis.reductions
            and idx not in self.streamed_eqns
        )

    def _to_prologue(self, vs: list[Var]) -> None:
        """The constants among ``vs`` computed before the loop (with what they are computed
        from): a hoisted draw reads them as the original's compiler sees them, constants
        (a draw's bits may depend on it: ``_compat.called_only``)."""
        for v in vs:
            if self.stage[v] != PROLOGUE:
                idx = self.constant[v]
                eqn = self.jaxpr.eqns[idx]
                self._to_prologue(variables(eqn.invars))
                self.stages[idx] = PROLOGUE
                self.stage.update((w, PROLOGUE) for w in eqn.outvars)

    def _stage(self, idx: int, eqn: JaxprEqn, used: set) -> str:
        analysis, stage = self.analysis, self.stage
        loc = analysis.loc
        ins = variables(eqn.invars)
        if not analysis.touches((), eqn):
            return PROLOGUE if all(stage[v] == PROLOGUE for v in ins) else EPILOGUE
        blocked = analysis.blocker((), idx, eqn)
        key = ((), idx)
        if blocked is not None:
            hoist = key in analysis.hoists and key not in analysis.barriers
            if hoist and all(stage[v] == PROLOGUE or v in self.constant for v in ins):
                self._to_prologue(ins)
                self.hoisted.append(Stop(eqn, analysis.hoists[key]))
                return PROLOGUE
            self.stops.append(Stop(*blocked))
            return EPILOGUE
        if idx in self.unstacked:
            root = self.unstacked[idx].root
            why = f"it cannot be stacked per chunk, and {reasons.named(root.eqn)} needs it whole"
            mapped = any(is_mapped(loc((), v)) for v in eqn.outvars)
            self.stops.append(
                Stop(eqn, (reasons.ROW_MAP if mapped else reasons.MIDDLE_FACTOR) + why, root)
            )
            return EPILOGUE
        if any(stage[v] == PROLOGUE and is_middle_factor(loc((), v)) for v in ins):
            self.stops.append(Stop(eqn, reasons.MIDDLE_INPUT))
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
            self.stops.append(Stop(eqn, reasons.why_after(inputs_ok, eqn, reduced, loc, used)))
        return EPILOGUE

    def _kind(self, v: Var, value: object = None) -> _stream.Operand:
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
        if any(not_a_block(self.analysis.loc((), v)) for v in (*eqn.invars, *eqn.outvars)):
            return False
        out_loc = self.analysis.loc((), eqn.outvars[0]) if eqn.outvars else None
        sink = out_loc is None
        if sink and reduced != {0: "sum"}:
            return False
        try:
            ops = _stream.operands(eqn, self._kind)
            if not any(isinstance(op, _stream.Streamed | _stream.Deferred) for op in ops):
                return False
            axis = None if out_loc is None else out_loc.dim
            result = _stream.apply(_stream.Emitter(eqn, sink), ops, axis)
        except _stream.NotStreamable:
            return False
        self.streamed_eqns.add(idx)
        self.deferred.update(op.var for op in ops if isinstance(op, _stream.Deferred))
        if sink:
            var = eqn.outvars[0]
            shape = _compat.shape_of(var) if result.shape is None else result.shape
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
                for v in variables(eqn.invars):
                    reader.setdefault(v, idx)
        stop_of = {id(stop.eqn): stop for stop in self.stops}
        found = {}
        for idx, eqn in enumerate(self.jaxpr.eqns):
            if self.stages[idx] != BODY:
                continue
            for v in eqn.outvars:
                if not not_a_block(self.analysis.loc((), v)):
                    continue
                if v in reader:
                    user = self.jaxpr.eqns[reader[v]]
                    found[idx] = stop_of.get(id(user)) or Stop(user, "runs after the loop")
                elif v in variables(self.jaxpr.outvars):
                    found[idx] = Stop(eqn, "an output of the function")
        return found

    def misused(self) -> set[int]:
        """Streamed equations whose result is read by anything but another streamed
        equation (or is an output): they must run after the loop after all."""
        bad = {self.producer[v] for v in variables(self.jaxpr.outvars) if v in self.values}
        for idx, eqn in enumerate(self.jaxpr.eqns):
            if idx in self.streamed_eqns:
                continue
            bad.update(self.producer[v] for v in variables(eqn.invars) if v in self.values)
        return bad

    # -- the region's inputs and outputs, as these stages place them -----------------------
    @functools.cached_property
    def places(self) -> dict[Var, AxisLoc]:
        """Where the axis sits in the top-level values."""
        return {v: loc for (ctx, v), loc in self.analysis.locs.items() if ctx == ()}

    def region_inputs(self) -> tuple[list, list]:
        """``(invariants, chunked with their axis positions)``: the prologue values the body
        reads, in order of first reading."""
        places = self.places
        invariants: list[Var] = []
        chunked: list[tuple[Var, AxisLoc]] = []
        seen: set = set()
        for idx in (i for i, s in enumerate(self.stages) if s == BODY):
            for v in variables(self.jaxpr.eqns[idx].invars):
                if self.stage[v] == PROLOGUE and v not in seen:
                    seen.add(v)
                    where = places.get(v)
                    if where is None or is_mapped(where):  # a mapped one: its windows, in the body
                        invariants.append(v)
                    else:
                        chunked.append((v, where))
        return invariants, chunked

    def read_after_the_loop(self) -> list[Var]:
        """The values read after the loop: by the outputs, the epilogue, and the combination
        of streamed sums (the deferred values), in program order within each."""
        jaxpr = self.jaxpr
        defined = [*jaxpr.invars, *(v for e in jaxpr.eqns for v in e.outvars)]
        order = {v: i for i, v in enumerate(defined)}
        read_after: list[Var] = list(variables(jaxpr.outvars))
        for idx, s in enumerate(self.stages):
            if s == EPILOGUE:
                read_after.extend(variables(jaxpr.eqns[idx].invars))
        read_after.extend(sorted(self.deferred, key=lambda v: order[v]))
        return read_after

    def region_outputs(self, read_after: list[Var]) -> tuple[list, list, list]:
        """``(sums, partials with their monoid, stacked with their axis positions)``: the body
        values read after the loop (``read_after``; a streamed sum is an output of its own
        kind)."""
        places, kinds = self.places, self._reduction_kinds()
        sums: list[Var] = []
        partials: list[tuple[Var, str]] = []
        stacked: list[tuple[Var, AxisLoc]] = []
        seen = {sink.var for sink in self.sinks}
        for v in read_after:
            if self.stage.get(v) != BODY or v in seen:
                continue
            seen.add(v)
            where = places.get(v)
            if where is not None:
                stacked.append((v, where))
            elif kinds[v] == "sum":
                sums.append(v)
            else:
                partials.append((v, kinds[v]))
        return sums, partials, stacked

    def _reduction_kinds(self) -> dict:
        """The monoid of each reduction over the axis in the body."""
        kinds = {}
        for idx, s in enumerate(self.stages):
            if s != BODY:
                continue
            for j, kind in self.analysis.reductions.get(((), idx), {}).items():
                kinds[self.jaxpr.eqns[idx].outvars[j]] = kind
        return kinds
