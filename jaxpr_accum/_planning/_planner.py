"""Planning one call signature: attempts from the widest plan to the function as written.

``Planner.prepare(traced, inputs, key, pattern)`` makes a ``Prepared``: the trace, the ``Plan``
``explain`` returns and the program to run. ``Planner.attempts`` lists the attempts, each a
frozen ``Attempt`` (``_attempt``) made with keywords: the plan in two passes where the program
pairs the axis with itself (``_pairwise``; where it does not, the attempt answers
``DoesNotApply`` and one pass is the plan as chosen), in one pass, without streamed
normalisers, with native gradients. ``_fallback.first_that_works`` runs them through one
method, ``_attempt``. Each is one straight pipeline of frozen values: the axis
(``_candidates``), the mode (``_choice``, by the estimate for what the caller
differentiates, at ``chunk=``, or with ``memory=`` at the whole axis; nothing is compiled to
choose it; the two-pass pipeline chooses each pass's mode with the same function) and the
chunk (``chunk=``, or the search of ``_budget`` for that mode and what the caller
differentiates, cached per signature; ``_gather`` where sharded parameters are gathered
under ``gather="auto"``) as a ``Decision``, the program built from it (``_assemble``), its
forward and backward passes validated, and the plan weighed against the function as written
(``_worth``). What the attempts share (the axis, the two-pass plan, the programs measured) is
made once: ``Planning``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable

from jaxpr_accum import _pairwise
from jaxpr_accum._analysis import _candidates, _trace
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._assembly._assemble import build, run_as_written
from jaxpr_accum._base._errors import stage, warn
from jaxpr_accum._base._lru import LRU
from jaxpr_accum._base._settings import Settings
from jaxpr_accum._build import _layout
from jaxpr_accum._modes import _choice
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._modes._mode import AUTO, NATIVE, Mode, mode_named
from jaxpr_accum._planning import _budget, _fallback, _gather, _worth
from jaxpr_accum._planning._attempt import Attempt, Built, Prepared
from jaxpr_accum._planning._fallback import DoesNotApply
from jaxpr_accum._report._plan import Plan
from jaxpr_accum._report._plan_text import planned_for_text

CACHE_SIZE = 64  # call signatures whose plans a SerializedFunction keeps (least recent out)


class Planning:
    """The call signature being planned (its trace, inputs, cache ``key`` and the inputs
    ``diff`` its caller differentiates), with what every attempt shares, made once: the axis
    per ``stream`` (``_candidates``), the two-pass plan, the measured programs."""

    def __init__(
        self,
        traced: _trace.Traced,
        inputs: list,
        key: Hashable | None,
        diff: list[int],
        *,
        specs: list,
    ):
        self.traced, self.inputs, self.key, self.specs = traced, inputs, key, specs
        self.measure = _budget.Measure(inputs, diff)
        self.axes: dict[bool, tuple[Candidate, list[Candidate]]] = {}
        self.pairings: dict[bool, _pairwise.TwoPass | None] = {}

    def axis(self, settings: Settings, stream: bool) -> tuple[Candidate, list[Candidate]]:
        """``(the chosen candidate, every usable one)``."""
        if stream not in self.axes:
            with stage("planning"):
                self.axes[stream] = _candidates.choose_split(self.traced, settings, stream)
        return self.axes[stream]

    def pairing(self, chosen: Candidate, stream: bool) -> _pairwise.TwoPass | None:
        """The two-pass plan of ``chosen``'s program, or None where nothing pairs the axis."""
        if stream not in self.pairings:
            with stage("planning two passes for a pairing of the axis with itself"):
                self.pairings[stream] = _pairwise.plan(chosen, self.names, stream)
        return self.pairings[stream]

    @functools.cached_property
    def names(self) -> dict:
        return _candidates.input_names(self.traced)


class Planner:
    """Plans call signatures under ``settings`` (the mode requested, parsed once:
    ``requested``); ``chunks``: the budget searches' decisions."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.requested = mode_named(settings.grad)
        self.chunks = LRU(CACHE_SIZE)

    def prepare(
        self,
        traced: _trace.Traced,
        inputs: list,
        key: Hashable | None,
        pattern: tuple | None = None,
        *,
        specs: list | None = None,
    ) -> Prepared:
        """The widest plan that plans, builds and validates (``_fallback``): in two passes,
        in one, without streamed normalisers, with native gradients."""
        why = traced.why_unstageable()
        if why is not None:
            warn(why)
            return Prepared.unchunked(traced, why)
        specs = specs or [None] * len(inputs)  # ``param_specs``, one per input
        call = Planning(traced, inputs, key, traced.differentiated(inputs, pattern), specs=specs)
        prepared = self._attempts(call)
        if self.requested is AUTO or self.settings.memory is not None:  # they measure ``diff``
            names = [call.names[call.traced.jaxpr.invars[i]] for i in call.measure.diff]
            planned_for = planned_for_text(names, pattern is not None)
            plan = dataclasses.replace(prepared.plan, planned_for=planned_for)
            return dataclasses.replace(prepared, plan=plan)
        return prepared

    def attempts(self) -> list[Attempt]:
        """The attempts, from the widest plan to the narrowest (``_fallback``)."""
        requested = self.requested
        return [
            Attempt(what="the plan as chosen", passes=2, streamed=True, requested=requested),
            Attempt(what="the plan in one pass", passes=1, streamed=True, requested=requested,
                    weighs_pairs=True),
            Attempt(what="the plan without streamed normalisers", passes=1, streamed=False,
                    requested=requested),
            *([] if requested is NATIVE else [
                Attempt(what="the plan with native gradients", passes=1, streamed=False,
                        requested=NATIVE),
            ]),
        ]  # fmt: skip

    def _attempts(self, call: Planning) -> Prepared:
        """The first of the attempts that plans, builds and validates (``_fallback``)."""
        return _fallback.first_that_works(
            self.attempts(),
            functools.partial(self._attempt, call),
            lambda why: Prepared.unchunked(call.traced, why),
        )

    def _attempt(self, call: Planning, attempt: Attempt) -> Prepared | DoesNotApply:
        """One attempt's plan, built, validated and weighed."""
        if attempt.passes == 2:
            return self._two_passes(call, attempt)
        return self._one_pass(call, attempt)

    def _two_passes(self, call: Planning, attempt: Attempt) -> Prepared | DoesNotApply:
        """The two-pass plan (``_pairwise``), where it is expected to save more than one pass
        (elsewhere it does not apply: one pass is the plan as chosen)."""
        if self.settings.chunk is None:
            return DoesNotApply("the chunk is searched under a memory budget")
        chosen, _ = call.axis(self.settings, attempt.streamed)
        layout = self._layout(call, chosen, chosen.chunk)
        if isinstance(layout, _layout.ShardedLayout):
            return DoesNotApply("the axis is sharded")
        two = call.pairing(chosen, attempt.streamed)
        if two is None:
            return DoesNotApply("nothing pairs the axis with itself")
        if two.net_saving <= chosen.net_saving:
            return DoesNotApply("two passes are not expected to save more than one")
        run, decisions = _pairwise.choose_and_build(
            two, attempt.requested, layout, call.measure.diff, accum_dtype=self.settings.accum_dtype
        )
        plan = _pairwise.plan_of(two, decisions, call.names)
        return self._weigh(call, attempt, chosen, Built.of(run, plan, two, two.stops))

    def _one_pass(self, call: Planning, attempt: Attempt) -> Prepared:
        """Axis, the decision (mode and chunk: fixed, or the budget's), build; then
        ``_weigh``."""
        chosen, usable = call.axis(self.settings, attempt.streamed)
        decision = self._chunk(call, chosen, attempt.requested)
        with stage("building"):
            run = build(decision, self.settings.accum_dtype)
        usable = [decision.candidate if c is chosen else c for c in usable]
        built = Built.of(run, Plan.from_decision(decision, usable), decision.candidate)
        if decision.budget is not None:  # the search compiled this program: never again
            call.measure.record(built.jitted, decision.budget.measured)
        sharded = isinstance(decision.layout, _layout.ShardedLayout)
        if attempt.weighs_pairs and decision.budget is None and not sharded:  # one pass taken
            two = call.pairing(chosen, attempt.streamed)
            if two is not None and two.net_saving <= chosen.net_saving:
                built = dataclasses.replace(built, stops=chosen.split.stops)
        return self._weigh(call, attempt, chosen, built)

    def _layout(self, call: Planning, chosen: Candidate, chunk: int) -> _layout.Layout:
        mesh_axis, gather = self.settings.mesh_axis, self.settings.gather
        return _layout.detect(chosen.split, call.inputs, call.specs, mesh_axis, chunk, gather)

    def _chunk(self, call: Planning, chosen: Candidate, requested: Mode) -> Decision:
        """The decision at the chunk: the mode ``_choice`` picks (by the estimate, for what
        the caller differentiates) at ``chunk=``; with ``memory=``, its pick at the whole
        axis, for which the budget search chooses the chunk (``_fit_budget``)."""
        fixed = self.settings.chunk
        layout = self._layout(call, chosen, chosen.split.size if fixed is None else chosen.chunk)
        with stage("choosing the gradient mode"):
            decision = _choice.choose(chosen, requested, layout, call.measure.diff)
        if fixed is not None:
            return decision
        with stage("the memory budget search"):
            return self._fit_budget(call, decision, requested)

    def _weigh(self, call: Planning, attempt: Attempt, chosen: Candidate, built: Built) -> Prepared:
        """Validate ``built``'s forward and backward passes, and weigh it against the
        function as written (``_worth``)."""
        traced, run, plan, requested = call.traced, built.run, built.plan, attempt.requested
        original = functools.partial(run_as_written, traced.jaxpr)
        with stage("tracing the forward and backward passes"):
            _fallback.validate(run, call.inputs, original, call.measure.diff)
        with stage("weighing the plan against the function as written"):
            programs = _worth.Programs(built.jitted, original, call.measure)
            why = _worth.as_written_instead(built.estimate, requested, programs)
            if built.stops is not None:
                why = _worth.for_paired(why, built.stops, requested, programs)
            short = None if why is not None else _worth.for_advised(chosen.advice, programs)
        if short is not None and requested is AUTO:
            why = f"{short}; the function runs as written{chosen.advice}"
        elif short is not None:  # the mode requested runs its loop, with the warning
            plan = dataclasses.replace(plan, warning=f"{short}{chosen.advice}")
        if why is not None:
            plan = dataclasses.replace(
                plan, grad="none", grad_reason=why, warning=why, runs_as_written=True
            )
            return Prepared.of(traced, chosen.split, plan)
        if built.estimate.warning() is not None and requested is AUTO:
            plan = dataclasses.replace(plan, warning=None)  # measured to save after all
        return Prepared.of(traced, chosen.split, plan, built)

    def _fit_budget(self, call: Planning, first: Decision, requested: Mode) -> Decision:
        """The decision for ``memory=`` (``first``: ``requested``'s at the whole axis): the search
        of ``_budget``, once per call signature (later calls, and calls under ``jit`` or
        ``grad`` with the same avals, reuse it)."""
        candidate = first.candidate

        def layout_for(k: int) -> _layout.Layout:
            return self._layout(call, candidate, k)

        cached = self.chunks.get(call.key) if call.key is not None else None
        if cached is not None:
            k = cached.budget.chunk
            layout = _gather.carried(cached, layout_for(k))
            return dataclasses.replace(cached, candidate=candidate.at(k), layout=layout)
        assert self.settings.memory is not None
        diff, names = call.measure.diff, call.names
        wrt = ", ".join(names[call.traced.jaxpr.invars[i]] for i in diff) or "nothing (the forward)"
        request = _budget.Request(
            limit=_budget.resolve(self.settings.memory),
            requested=self.settings.memory,
            inputs=call.inputs,
            diff=diff,
            wrt=wrt,
            accum_dtype=self.settings.accum_dtype,
            auto=requested is AUTO,
        )
        decision = _gather.fit(first, layout_for, request, self.settings.gather)
        if call.key is not None:
            self.chunks.put(call.key, decision)
        return decision
