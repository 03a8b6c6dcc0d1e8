"""The split of a program for one axis: which equations run before, inside and after the loop.

Words used across the package: a *split* (``Split``) is this module's result for one
candidate axis; the *region* is the chunked part of the program (the body, run by the chunk
loop, ``_loop``); the *plan* (``Plan``, ``_plan``) is what ``explain`` reports.

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

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import (
    CONTRACTIONS,
    carrying_bytes,
    carrying_sizes,
    float_bytes,
    fuses_into_readers,
    materialised_bytes,
    nbytes,
)
from jaxpr_accum._analysis._order import around_the_loop, between_the_body
from jaxpr_accum._analysis._stages import (
    BODY,
    EPILOGUE,
    PROLOGUE,
    Stages,
    Stop,
    variables,
)
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._conv import is_conv

__all__ = ["BODY", "EPILOGUE", "PROLOGUE", "Split", "Stop", "make_split"]


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """The stages of every top-level equation, and the region's inputs and outputs: program
    structure, the same at every chunk size (``_estimate.Candidate`` is a split at a chunk), and
    the byte figures the cost model reads off them."""

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
    sinks: tuple = ()  # streamed sums (``_stream.Sink``)
    streamed: frozenset = frozenset()  # indices of the equations that run streamed
    deferred: frozenset = frozenset()  # values reduced over the axis that they read
    copies: int = 1  # ``size=`` named ``copies`` side by side of this axis (``_candidates``)

    # -- what the cost model reads, each computed once from the stages (``_cost``) ---------
    @functools.cached_property
    def stacked_bytes(self) -> int:
        """Bytes of the body outputs stacked back to full size."""
        return sum(nbytes(v) for v, _ in self.stacked)

    @functools.cached_property
    def held_bytes(self) -> int:
        """Bytes of the body's materialised axis-carrying intermediates at full size."""
        stacked = {v for v, _ in self.stacked}
        eqns, body = self.jaxpr.eqns, self.indices(BODY)
        return carrying_bytes(
            self.analysis, (), eqns, body, exclude=stacked, materialised_only=True
        )

    @functools.cached_property
    def largest_held_bytes(self) -> int:
        """Bytes of the largest of the body's materialised axis-carrying intermediates at
        full size (one value, not the sum of ``held_bytes``)."""
        stacked = {v for v, _ in self.stacked}
        eqns, body = self.jaxpr.eqns, self.indices(BODY)
        sizes = carrying_sizes(
            self.analysis, (), eqns, body, exclude=stacked, materialised_only=True
        )
        return max((size for size, _ in sizes), default=0)

    @functools.cached_property
    def per_example_layers(self) -> bool:
        """Whether the body has layers written per example and ``vmap``-ped: a contraction
        that puts the axis after the weights' dimensions (``W @ x`` under ``vmap``, as
        Equinox's ``Linear``) reads a value computed from another contraction's result by
        equations XLA fuses into their readers only (``fuses_into_readers``: a ReLU, a bias),
        which ``held_bytes`` does not count though XLA materialises it for the contraction."""
        eqns, body = self.jaxpr.eqns, self.indices(BODY)
        contracted: set[Var] = set()
        between: set[Var] = set()
        for i in body:
            eqn = eqns[i]
            read = set(variables(eqn.invars))
            if eqn.primitive in CONTRACTIONS:
                locs = [self.analysis.loc((), v) for v in eqn.outvars]
                if read & between and any(loc is not None and loc.dim > 0 for loc in locs):
                    return True
                contracted.update(eqn.outvars)
            elif fuses_into_readers(eqn) and read & (contracted | between):
                between.update(eqn.outvars)
        return False

    @functools.cached_property
    def invariant_bytes(self) -> int:
        """Bytes of the floating invariants (each gets a gradient accumulator)."""
        return float_bytes(self.invariants)

    @functools.cached_property
    def input_bytes(self) -> int:
        """Bytes of every floating input of the region, invariant or chunked."""
        return self.invariant_bytes + float_bytes(v for v, _ in self.chunked)

    @functools.cached_property
    def epilogue_bytes(self) -> int:
        """Bytes of the epilogue's materialised results."""
        return materialised_bytes(self.jaxpr.eqns[i] for i in self.indices(EPILOGUE))

    @functools.cached_property
    def epilogue_result_bytes(self) -> int:
        """Bytes of every result of the epilogue, fused or not: what its backward may hold
        (XLA materialises broadcast pairs there that the forward fuses)."""
        return sum(nbytes(v) for i in self.indices(EPILOGUE) for v in self.jaxpr.eqns[i].outvars)

    @functools.cached_property
    def outside_bytes(self) -> int:
        """Bytes of every result of the prologue and the epilogue (computed once)."""
        outside = zip(self.jaxpr.eqns, self.stages, strict=True)
        return sum(nbytes(v) for e, s in outside if s != BODY for v in e.outvars)

    @functools.cached_property
    def gradient_sums(self) -> tuple[bool, ...]:
        """Which of the ``sums`` carry gradients: computed from a floating input of the
        region through floating values only, never through ``stop_gradient``. A token count
        made from integer labels, an accuracy (through ``argmax`` and a comparison), or a sum
        of stopped values carries none (its Jacobian rows would be zeros)."""
        dependent = {
            v for v in (*self.invariants, *(v for v, _ in self.chunked)) if has_float_dtype(v)
        }
        for i in self.indices(BODY):
            eqn = self.jaxpr.eqns[i]
            if eqn.primitive.name == "stop_gradient":
                continue
            if any(v in dependent for v in variables(eqn.invars)):
                dependent.update(v for v in eqn.outvars if has_float_dtype(v))
        return tuple(v in dependent for v in self.sums)

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
        return _compat.first_eqn([self.jaxpr.eqns[i] for i in self.indices(BODY)], is_match)

    def indices(self, stage: str) -> list[int]:
        return [i for i, s in enumerate(self.stages) if s == stage]

    @functools.cached_property
    def around_the_loop(self) -> tuple[list[int], list[int]]:
        """The equations outside the body run before the loop and after it (``_order``)."""
        return around_the_loop(self.jaxpr, self.stages)

    @functools.cached_property
    def between_the_body(self) -> dict[int, int]:
        """The equations after the loop that come before the body's last (``_order``)."""
        return between_the_body(self.around_the_loop[1], self.stages)

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
    invariants, chunked = stages.region_inputs()
    read_after = stages.read_after_the_loop()
    sums, partials, stacked = stages.region_outputs(read_after)
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
        sinks=tuple(sink for sink in stages.sinks if sink.var in set(read_after)),
        streamed=frozenset(stages.streamed_eqns),
        deferred=frozenset(stages.deferred),
    )


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
