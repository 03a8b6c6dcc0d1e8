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
*chunked* (sliced per chunk; a row-mapped one, ``_lattice``, is passed whole as an invariant
and the body takes its windows, which may overlap). A value that holds the axis as a middle
factor of a merged dimension (``[T * B, H]``, ``AxisLoc.outer``) is never one of them: a chunk
of it is strided, not a block, so an equation that would read one from before the loop, or
produce one read after it, runs after the loop instead (to a fixpoint, like undone streaming).
This split is exact by construction: every equation computes what it computed before, on the
same values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import is_float
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._conv import is_conv
from jaxpr_accum._planning import _cost
from jaxpr_accum._planning._cost import nbytes
from jaxpr_accum._planning._stages import BODY, EPILOGUE, PROLOGUE, Stages, Stop, variables

__all__ = ["BODY", "EPILOGUE", "PROLOGUE", "Split", "Stop", "make_split"]


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
    invariant_bytes: int  # the floating invariants (each gets a gradient accumulator)
    input_bytes: int  # every floating input of the region, invariant or chunked
    epilogue_bytes: int  # the epilogue's materialised results (``_cost``)
    outside_bytes: int  # every result of the prologue and the epilogue (computed once)
    gradient_sums: tuple[bool, ...]  # which sums carry gradients (``_gradient_sums``)
    sinks: tuple = ()  # streamed sums (``_stream.Sink``)
    streamed: frozenset = frozenset()  # indices of the equations that run streamed
    deferred: frozenset = frozenset()  # values reduced over the axis that they read

    @functools.cached_property
    def custom_vjp_in_body(self) -> str | None:
        """The name of a custom VJP that the body calls (at any depth), or None (searched
        once: auto's choice and every linearization of the region read it)."""
        found = self._first_in_body(_compat.is_custom_vjp_call)
        return None if found is None else _compat.custom_call_identity(found)[0]

    @functools.cached_property
    def custom_rule_in_body(self) -> str | None:
        """The name of a custom VJP or JVP that the body calls (at any depth), or None
        (searched once)."""
        found = self._first_in_body(_compat.is_custom_rule_call)
        return None if found is None else _compat.custom_call_identity(found)[0]

    @functools.cached_property
    def may_convolve(self) -> bool:
        """Whether a chunk's pullback may hold a convolution (``_conv.canonicalize``): the
        body convolves (at any depth) or calls a custom rule, whose derivative is not seen."""
        return self.custom_rule_in_body is not None or self._first_in_body(is_conv) is not None

    def _first_in_body(self, is_match: Callable[[JaxprEqn], bool]) -> JaxprEqn | None:
        def search(eqns: Any) -> JaxprEqn | None:
            for eqn in eqns:
                if is_match(eqn):
                    return eqn
                for _, sub in _compat.sub_jaxprs(eqn.params):
                    found = search(_compat.open_jaxpr(sub).eqns)
                    if found is not None:
                        return found
            return None

        return search([self.jaxpr.eqns[i] for i in self.indices(BODY)])

    def indices(self, stage: str) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s == stage]

    @property
    def gradient_width(self) -> int:
        """Entries of the sums that carry gradients (the fused mode's Jacobian rows)."""
        flags = zip(self.sums, self.gradient_sums, strict=True)
        return sum(math.prod(_compat.shape_of(v)) for v, g in flags if g)

    @property
    def has_body(self) -> bool:
        return BODY in self.stages

    @property
    def usable(self) -> bool:
        """A plan to run: it chunks something, or there is nothing to chunk (an empty axis,
        or a function without outputs)."""
        return self.has_body or self.size == 0 or not self.jaxpr.outvars


def make_split(jaxpr: Jaxpr, analysis: Analysis, born: str, stream: bool = True) -> Split:
    """The stages of ``jaxpr`` for ``analysis``'s axis (an empty axis touches no equation,
    ``_fanout``: all prologue); ``stream=False``: no equation is streamed (``_fallback``'s
    narrower plan)."""
    stages = _stages_to_fixpoint(jaxpr, analysis, stream)
    places = {v: loc for (ctx, v), loc in analysis.locs.items() if ctx == ()}  # at the top
    invariants, chunked = _region_inputs(jaxpr, places, stages)
    read_after = _read_after_the_loop(jaxpr, stages)
    kinds = _reduction_kinds(jaxpr, analysis, stages.stages)
    sums, partials, stacked = _region_outputs(places, kinds, stages, read_after)
    stacked_vars = {v for v, _ in stacked}
    body = [i for i, s in enumerate(stages.stages) if s == BODY]
    carrying = _cost.carrying_bytes(analysis, (), jaxpr.eqns, body, exclude=stacked_vars)
    held = _cost.carrying_bytes(
        analysis, (), jaxpr.eqns, body, exclude=stacked_vars, materialised_only=True
    )
    invariant_bytes = _cost.float_bytes(invariants)
    return Split(
        jaxpr=jaxpr,
        analysis=analysis,
        size=analysis.size,
        born=born,
        stages=tuple(stages.stages),
        invariants=tuple(invariants),
        chunked=tuple(chunked),
        sums=tuple(sums),
        partials=tuple(partials),
        stacked=tuple(stacked),
        stops=tuple(stages.stops),
        hoisted_draws=tuple(stages.hoisted),
        reductions=tuple(stages.reductions),
        stacked_bytes=sum(nbytes(v) for v in stacked_vars),
        body_bytes=carrying,
        held_bytes=held,
        invariant_bytes=invariant_bytes,
        input_bytes=invariant_bytes + _cost.float_bytes(v for v, _ in chunked),
        epilogue_bytes=_cost.materialised_bytes(
            jaxpr.eqns[i] for i, s in enumerate(stages.stages) if s == EPILOGUE
        ),
        outside_bytes=sum(
            nbytes(v)
            for e, s in zip(jaxpr.eqns, stages.stages, strict=True)
            if s != BODY
            for v in e.outvars
        ),
        gradient_sums=_gradient_sums(jaxpr, body, [*invariants, *(v for v, _ in chunked)], sums),
        sinks=tuple(sink for sink in stages.sinks if sink.var in set(read_after)),
        streamed=frozenset(stages.streamed_eqns),
        deferred=frozenset(stages.deferred),
    )


def _gradient_sums(
    jaxpr: Jaxpr, body: list[int], inputs: list[Var], sums: list[Var]
) -> tuple[bool, ...]:
    """Which of the region's ``sums`` carry gradients: computed from a floating input of the
    region through floating values only, never through ``stop_gradient``. A token count made
    from integer labels, an accuracy (through ``argmax`` and a comparison), or a sum of
    stopped values carries none (its Jacobian rows would be zeros)."""
    dependent = {v for v in inputs if is_float(v)}
    for i in body:
        eqn = jaxpr.eqns[i]
        if eqn.primitive.name == "stop_gradient":
            continue
        if any(v in dependent for v in variables(eqn.invars)):
            dependent.update(v for v in eqn.outvars if is_float(v))
    return tuple(v in dependent for v in sums)


def _stages_to_fixpoint(jaxpr: Jaxpr, analysis: Analysis, stream: bool) -> Stages:
    """Streaming is undone where a streamed value has a reader outside the algebra, and the
    region ends before a value that holds the axis as a middle factor would have to be
    stacked; both only move equations out of the loop, so this ends."""
    used: set = set(variables(jaxpr.outvars))
    for eqn in jaxpr.eqns:
        used.update(variables(eqn.invars))
    excluded: set[int] = set()
    unstacked: dict[int, Stop] = {}  # equation -> the stop that needs its result whole
    while True:
        draft = Stages(jaxpr, analysis, used, excluded, unstacked, stream)
        misused = draft.misused()
        if misused:
            excluded |= misused
            continue
        unstackable = draft.unstackable()
        if not unstackable:
            return draft
        unstacked.update(unstackable)


def _region_inputs(jaxpr: Jaxpr, places: dict[Var, AxisLoc], stages: Stages) -> tuple[list, list]:
    """``(invariants, chunked with their axis positions)``: the prologue values the body
    reads, in order of first reading (``places``: where the axis sits in top-level values)."""
    invariants: list[Var] = []
    chunked: list[tuple[Var, AxisLoc]] = []
    seen: set = set()
    for idx in (i for i, s in enumerate(stages.stages) if s == BODY):
        for v in variables(jaxpr.eqns[idx].invars):
            if stages.stage[v] == PROLOGUE and v not in seen:
                seen.add(v)
                where = places.get(v)
                if where is None or is_mapped(where):  # a mapped one: its windows, in the body
                    invariants.append(v)
                else:
                    chunked.append((v, where))
    return invariants, chunked


def _read_after_the_loop(jaxpr: Jaxpr, stages: Stages) -> list[Var]:
    """The values read after the loop: by the outputs, the epilogue, and the combination of
    streamed sums (the deferred values), in program order within each."""
    order = {v: i for i, v in enumerate(_defined_in_order(jaxpr))}
    read_after: list[Var] = list(variables(jaxpr.outvars))
    for idx, s in enumerate(stages.stages):
        if s == EPILOGUE:
            read_after.extend(variables(jaxpr.eqns[idx].invars))
    read_after.extend(sorted(stages.deferred, key=lambda v: order[v]))
    return read_after


def _region_outputs(
    places: dict[Var, AxisLoc], kinds: dict, stages: Stages, read_after: list[Var]
) -> tuple[list, list, list]:
    """``(sums, partials with their monoid, stacked with their axis positions)``: the body
    values read after the loop (a streamed sum is an output of its own kind; ``kinds``: the
    monoid of each reduction over the axis)."""
    sums: list[Var] = []
    partials: list[tuple[Var, str]] = []
    stacked: list[tuple[Var, AxisLoc]] = []
    seen = {sink.var for sink in stages.sinks}
    for v in read_after:
        if stages.stage.get(v) != BODY or v in seen:
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
