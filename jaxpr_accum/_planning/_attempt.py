"""The values of one attempt of the planner (``_planner``): what it tries (``Attempt``), what
it built (``Built``) and what a call signature runs (``Prepared``). All three are frozen: an
attempt is described before it runs, and a new plan of a signature is a new ``Prepared``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax

from jaxpr_accum._analysis import _trace
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._analysis._stages import Stop
from jaxpr_accum._assembly._assemble import run_as_written
from jaxpr_accum._modes._mode import Mode
from jaxpr_accum._planning import _worth
from jaxpr_accum._report._plan import Plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attempt:
    """One attempt, from the widest: ``what`` it tries (as a fallback's warning names it),
    its ``passes`` (2: the two-pass plan of a program that pairs the axis with itself,
    ``_pairwise``; 1: one pass), whether normalisers are ``streamed``, the mode ``requested``,
    and ``weighs_pairs``: a one-pass plan of a program that pairs the axis is weighed as
    paired (``_worth.for_paired``)."""

    what: str
    passes: int
    streamed: bool
    requested: Mode
    weighs_pairs: bool = False


@dataclasses.dataclass(frozen=True)
class Built:
    """An attempt's program ``run``, as the call runs it (``jitted``: under ``jax.jit``, so
    what is measured is what the call compiles), and its ``plan``; ``estimate``: what
    ``_worth`` weighs (a ``Candidate``, or the ``TwoPass``); ``stops``: where the plan of a
    program that pairs the axis with itself stops (None: it pairs nothing)."""

    run: Callable
    jitted: jax.stages.Wrapped
    plan: Plan
    estimate: _worth.Estimate
    stops: tuple[Stop, ...] | None = None

    @classmethod
    def of(
        cls,
        run: Callable,
        plan: Plan,
        estimate: _worth.Estimate,
        stops: tuple[Stop, ...] | None = None,
    ) -> Built:
        return cls(run, jax.jit(run), plan, estimate, stops)


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
    """One call signature's trace, plan and runnable program: the chunked one, or the
    function as written (``as_written``: not expected to save memory, ``_worth``; or no plan
    at all, ``split`` None, after internal errors, ``_fallback``, which has warned). Not
    ``staged``: the trace cannot be differentiated (``Traced.unstageable``), the call runs the
    user's function itself. Made by ``of``; never changed: a new plan is a new ``Prepared``
    (``dataclasses.replace``), sharing the compiled program. What the calls of a signature
    record of it (the kinds of call compiled for, the original's memory ``explain`` measured)
    is kept beside it, keyed by it (``_api._calls.CallPlans``)."""

    traced: _trace.Traced
    split: Split | None
    plan: Plan
    run: Callable
    jitted: jax.stages.Wrapped
    as_written: bool = False

    @classmethod
    def of(
        cls, traced: _trace.Traced, split: Split | None, plan: Plan, built: Built | None = None
    ) -> Prepared:
        """The ``built`` program; without one, the function as written (``as_written``)."""
        if built is not None:
            return cls(traced, split, plan, built.run, built.jitted)
        run = functools.partial(run_as_written, traced.jaxpr)
        return cls(traced, split, plan, run, jax.jit(run), as_written=True)

    @classmethod
    def unchunked(cls, traced: _trace.Traced, why: str) -> Prepared:
        return cls.of(traced, None, Plan.unchunked(why))

    @property
    def staged(self) -> bool:
        return self.traced.unstageable is None
