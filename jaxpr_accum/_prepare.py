"""Planning one call signature: attempts from the widest plan to the function as written.

``Planner.plan(traced, inputs, key, pattern)`` makes a ``Prepared``: the trace, the ``Plan``
``explain`` returns and the program to run. Each attempt (``_fallback``) chooses the axis and
its chunk (``_candidates``; with ``memory=``, the chunk search of ``_budget`` for what the
caller differentiates, its choice cached per signature), the gradient mode (``_choice``) and
the layout (``_layout``), builds the program (``_assemble``), validates its forward and
backward passes, and weighs it against the function as written (``_worth``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from jaxpr_accum import (
    _budget,
    _candidates,
    _choice,
    _compat,
    _fallback,
    _interpret,
    _layout,
    _pairwise,
    _trace,
    _worth,
)
from jaxpr_accum._assemble import build
from jaxpr_accum._cost import Candidate
from jaxpr_accum._dtypes import is_float
from jaxpr_accum._plan import Split
from jaxpr_accum._report import Plan
from jaxpr_accum._settings import Settings

CACHE_SIZE = 64  # call signatures whose plans a SerializedFunction keeps (least recent out)


class LRU(collections.OrderedDict):
    """A dict that keeps the ``size`` most recently used entries."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class Prepared:
    """One call signature's trace, plan and runnable program: the chunked one, or the
    function as written (``as_written``: not expected to save memory, ``_worth``; or no plan
    at all, ``split`` None, after internal errors, ``_fallback``, which has warned)."""

    def __init__(
        self,
        traced: _trace.Traced,
        split: Split | None,
        plan: Plan,
        as_written: bool = False,
        run: Callable | None = None,
    ):
        self.traced, self.split, self.plan, self.as_written = traced, split, plan, as_written
        self.run = run if run is not None else functools.partial(run_as_written, traced.jaxpr)
        self.jitted = jax.jit(self.run)
        self.ready: set[bool] = set()  # the kinds of call compiled for (``_fallback.ready``)
        self.warned = split is None

    @classmethod
    def unchunked(cls, traced: _trace.Traced, why: str) -> Prepared:
        return cls(traced, None, Plan.unchunked(why), as_written=True)


class Planner:
    """Plans call signatures under ``settings``; ``chunks``: the budget searches' choices."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.chunks = LRU(CACHE_SIZE)

    def plan(
        self, traced: _trace.Traced, inputs: list, key: Any, pattern: tuple | None = None
    ) -> Prepared:
        """The widest plan that plans, builds and validates (``_fallback``)."""

        paired: list[bool] = []  # set when the first attempt plans two passes

        def attempt(stream: bool, grad: str, pairs: list | None = None) -> Callable[[], Prepared]:
            return lambda: self._attempt(traced, inputs, key, stream, grad, pattern, pairs)

        def attempts() -> Iterator[tuple[str, Callable[[], Prepared]]]:
            yield ("the plan as chosen", attempt(True, self.settings.grad, paired))
            if paired:  # the pairs after the loop, on the full axis
                yield ("the plan in one pass", attempt(True, self.settings.grad))
            yield ("the plan without streamed normalisers", attempt(False, self.settings.grad))
            if self.settings.grad != "native":
                yield ("the plan with native gradients", attempt(False, "native"))

        return _fallback.first_that_works(attempts(), lambda why: Prepared.unchunked(traced, why))

    def _attempt(
        self,
        traced: _trace.Traced,
        inputs: list,
        key: Any,
        stream: bool,
        requested: str,
        pattern: tuple | None,
        paired: list | None = None,
    ) -> Prepared:
        """One attempt; ``paired``: a list to which a two-pass plan (``_pairwise``) appends
        (None: one pass only)."""
        stage = _fallback.stage
        with stage("planning"):
            chosen, usable = _candidates.choose_split(traced, self.settings, stream)
        budget, pairs = None, False  # pairs: the program pairs the axis with itself
        measure = _budget.Measure(inputs, differentiated_inputs(traced, inputs, pattern))
        two = None
        if self.settings.chunk is not None:
            layout = _layout.detect(
                traced, chosen.split, inputs, self.settings.mesh_axis, self.settings.chunk
            )
            if paired is not None and not isinstance(layout, _layout.ShardedLayout):
                two, pairs = self._two_passes(
                    traced, chosen, layout, requested, stream, measure, paired
                )
            if two is None:
                with stage("choosing the gradient mode"):
                    grad, reason = _choice.choose(chosen, requested)
        else:
            with stage("the memory budget search"):
                fitted, grad, reason, layout, budget = self._fit_budget(
                    traced, chosen, inputs, key, requested, pattern
                )
            usable = [fitted if c is chosen else c for c in usable]
            chosen = fitted
        if two is None:
            run, grad, reason = self._one_pass(chosen, grad, reason, requested, layout, measure)
            if budget is not None:  # the search compiled this program: never again
                measure.record(run, budget.measured)
            plan = Plan.from_candidate(chosen, usable, grad, reason, layout, budget)
            estimate: _worth.Estimate = chosen
        else:
            run, plan, estimate = two
        original = functools.partial(run_as_written, traced.jaxpr)
        with stage("tracing the forward and backward passes"):
            _fallback.validate(run, inputs, original, measure.diff)
        with stage("weighing the plan against the function as written"):
            why = _worth.as_written_instead(estimate, requested, run, original, measure)
            if pairs:
                stops = chosen.split.stops if two is None else two[2].stops
                why = _worth.for_paired(why, stops, requested, run, original, measure)
        if why is not None:
            plan = dataclasses.replace(plan, grad="none", grad_reason=why, warning=why)
            return Prepared(traced, chosen.split, plan, as_written=True)
        if estimate.warning() is not None and requested == "auto":
            plan = dataclasses.replace(plan, warning=None)  # measured to save after all
        return Prepared(traced, chosen.split, plan, run=run)

    def _one_pass(
        self,
        chosen: Candidate,
        grad: str,
        reason: str,
        requested: str,
        layout: _layout.Layout,
        measure: _budget.Measure,
    ) -> tuple[Callable, str, str]:
        """``(run, grad, why)``: the one-pass plan built; auto's pick of fused is confirmed by
        measuring both modes (``_choice.confirm_fused``) where the estimate does not decide
        alone (``_choice.estimate_decides``), and not under a memory budget, which measured
        its own choice."""
        accum = self.settings.accum_dtype
        with _fallback.stage("building"):
            run = build(chosen.split, chosen.chunk, grad, accum, layout)
        budgeted = self.settings.chunk is None
        if requested != "auto" or grad != "fused" or budgeted or not measure.diff:
            return run, grad, reason
        if _choice.estimate_decides(chosen, measure.diff):
            grad, reason = _choice.by_estimate(reason)
        else:
            with _fallback.stage("measuring fused against remat"):
                remat = build(chosen.split, chosen.chunk, "remat", accum, layout)
                grad, reason = _choice.confirm_fused(reason, measure(run), measure(remat))
                run = remat if grad == "remat" else run
        return run, grad, reason

    def _two_passes(
        self,
        traced: _trace.Traced,
        chosen: Candidate,
        layout: _layout.Layout,
        requested: str,
        stream: bool,
        measure: _budget.Measure,
        paired: list,
    ) -> tuple[tuple[Callable, Plan, _pairwise.TwoPass] | None, bool]:
        """``((run, plan, estimate) of the two-pass plan, or None, whether the program pairs
        the axis with itself)``: the plan (``_pairwise``) where two passes are expected to
        save more than one. Auto's pick of fused for a pass is confirmed by measurement, as in
        one. ``paired`` is appended to once two passes are taken: a later failure runs one
        pass."""
        with _fallback.stage("planning two passes for a pairing of the axis with itself"):
            names = _candidates.input_names(traced)
            two = _pairwise.plan(chosen, names, stream)
        if two is None or two.net_saving <= chosen.net_saving:
            return None, two is not None
        paired.append(True)  # from here on, a failure falls back to the one-pass plan
        run, grads = _pairwise.choose_and_build(
            two, requested, self.settings.accum_dtype, measure if measure.diff else None
        )
        plan = _pairwise.plan_of(two, grads, layout, names)
        return (run, plan, two), True

    def _fit_budget(
        self,
        traced: _trace.Traced,
        candidate: Candidate,
        inputs: list,
        key: Any,
        requested: str,
        pattern: tuple | None,
    ) -> tuple:
        """``(the candidate at the chosen chunk, grad, why, layout, Budget)`` for
        ``memory=``: the search of ``_budget``, once per call signature (later calls, and
        calls under ``jit`` or ``grad`` with the same avals, reuse its choice)."""

        def layout_for(k: int) -> _layout.Layout:
            return _layout.detect(traced, candidate.split, inputs, self.settings.mesh_axis, k)

        cached = self.chunks.get(key) if key is not None else None
        if cached is not None:
            grad, reason, budget = cached
            k = budget.chunk
            return candidate.at(k), grad, reason, layout_for(k), budget
        grad, reason = _choice.choose(candidate, requested)
        modes = [(grad, reason)]
        if requested == "auto" and grad == "fused":
            modes.append(
                ("remat", "auto: fused applies, but its parameter-sized Jacobian accumulator "
                 "does not fit the memory budget at any chunk")
            )  # fmt: skip
        assert self.settings.memory is not None
        limit = _budget.resolve(self.settings.memory)
        diff = differentiated_inputs(traced, inputs, pattern)
        names = _candidates.input_names(traced)
        wrt = ", ".join(names[traced.jaxpr.invars[i]] for i in diff) or "nothing (the forward)"
        chosen, grad, reason, layout, budget = _budget.choose_chunk(
            candidate,
            modes,
            self.settings.accum_dtype,
            layout_for,
            inputs,
            diff,
            limit,
            self.settings.memory,
            wrt,
        )
        if key is not None:
            self.chunks.put(key, (grad, reason, budget))
        return chosen, grad, reason, layout, budget


def run_as_written(jaxpr: Any, *flat: Any) -> list:
    """The traced program evaluated as written (no region)."""
    return _interpret.eval_jaxpr(jaxpr, flat)


def differentiated_inputs(traced: _trace.Traced, inputs: list, pattern: tuple | None) -> list:
    """Indices in ``inputs`` of what the caller differentiates: the floating arguments the
    ``pattern`` marks and the closed-over values an outer ``jax.grad`` traces; every floating
    argument when the pattern is not known (a plain call, or one under ``jax.jit``)."""
    if pattern is None:
        return float_arguments(traced, inputs)
    nc = traced.n_consts
    consts = [i for i in range(nc) if is_float(inputs[i])]
    consts = [i for i in consts if _compat.differentiated(inputs[i])]
    args = [nc + j for j, p in enumerate(pattern) if p and is_float(inputs[nc + j])]
    return consts + args


def float_arguments(traced: _trace.Traced, inputs: list) -> list[int]:
    """Indices in ``inputs`` of the floating arguments (closed-over constants excluded)."""
    nc = traced.n_consts
    return [i for i, x in enumerate(inputs) if i >= nc and is_float(x)]
