"""``Plan``: what the rewriter decided and why, as data and as a readable report."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxpr_accum import _compat, _stream
from jaxpr_accum._analysis._cost import format_bytes, nbytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._analysis._split import BODY, EPILOGUE, PROLOGUE, Split
from jaxpr_accum._build import _layout
from jaxpr_accum._compat import Atom, Eqn
from jaxpr_accum._modes._decision import Budget, Decision
from jaxpr_accum._report import _html
from jaxpr_accum._report._plan_text import (
    CandidateAxis,
    PlanStop,
    gradient_mode_lines,
    once_each,
)


def _streamed(split: Split) -> list[str]:
    def definition(v: Atom) -> Eqn | None:
        return split.analysis.definition((), v)

    def where(eqn: Eqn) -> str:
        return f"`{eqn.primitive.name}` at {_compat.source_line(eqn)}"

    return [
        f"{where(split.jaxpr.eqns[s.index])}: {_stream.describe(s, definition, where)}"
        for s in split.sinks
    ]


def _described(layout: _layout.Layout, split: Split, chunk: int) -> str:
    """Where the axis lives, for the report."""
    if not isinstance(layout, _layout.ShardedLayout):
        return "one device, contiguous chunks"
    per = chunk // layout.devices
    shards = layout.described(split)
    return (
        f"sharded over mesh axis {layout.axes} ({layout.devices} devices): each device scans its "
        f"own shard of {split.size // layout.devices} in chunks of {per} (chunk i takes {per} "
        "rows from every shard); accumulators are summed across devices once, after the loop"
        + (f"; {shards}" if shards else "")
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the rewriter decided for one call signature, and why: ``SerializedFunction.explain``.

    ``str(plan)`` is the readable report (the chosen axis, the gradient mode, what is hoisted,
    chunked and left after the loop, what is stacked, and every place the region stopped, with
    your source lines); in a notebook a plan displays as an HTML table. The fields are the same
    facts as data. A plan is frozen: build one with ``explain``, never directly.

    Attributes:
        axis_size: Length ``N`` of the serialized axis (0 when nothing is chunked).
        chunk: Chunk length ``k``.
        born: Where the axis first appears: an argument, or an equation and its source line.
        grad: The gradient mode that runs (``"remat"``, ``"fused"``, ``"native"``; ``"none"``
            when the function runs as written: see ``runs_as_written``).
        grad_reason: Why that mode (for example why fused does not apply).
        planned_for: The differentiation the plan was made for, under ``grad="auto"`` or
            ``memory=`` (which measure that gradient; "" otherwise): which arguments'
            gradient. ``explain`` plans for every floating argument;
            ``explain(..., grad_argnums=...)`` for the arguments a ``jax.grad`` of the call
            differentiates, as the call plans for them.
        n_chunks: Number of chunks, the remainder's included.
        remainder: Length of the last chunk when ``k`` does not divide ``N``, else 0.
        reduced_at: The reductions over the axis, with source lines.
        counts: Equations ``"prologue"`` (run on the full axis before the loop), ``"body"``
            (chunked) and ``"epilogue"`` (left after the loop): ``Split.around_the_loop``.
        stacked: Outputs of the region that still carry the axis, with their bytes: memory
            the rewrite did not save.
        accumulated: Accumulators carried across chunks, with their monoid.
        stops: Every place the region had to stop: primitive, source line, reason; each
            once, with a count where one repeats (``PlanStop.repeats``).
        hoisted: Random draws computed before the loop on the full axis, and why.
        candidates: Every candidate axis, a ``CandidateAxis`` (a named tuple: ``size``,
            ``born``, ``saved_bytes``, the estimated bytes saved, and ``chosen``).
        layout: One device, or sharded over mesh axes with the per-device chunk.
        streamed: The streamed normalisers (sums over the axis computed chunk by chunk).
        warning: Why the plan is not expected to save memory, or ``None``; also the report's
            first line and a ``PlanWarning`` on the first call.
        budget: With ``memory=``: the chunk search (what was compiled and measured).
        pairs: For a program that pairs the axis with itself: the pairing equations.
        between: What pass 1 stacks for pass 2, with bytes (two-pass plans).
        second: Pass 2's plan (two-pass plans), else ``None``.
        savings: Estimated bytes saved by these passes and by the one pass they replace.
        runs_as_written: True when the function runs as written, with no loop (nothing is
            chunked, or chunking was not expected to save); ``grad`` is then ``"none"``.

    Examples:
        >>> import jax.numpy as jnp
        >>> import jaxpr_accum as ja
        >>> def loss(w, x):
        ...     return jnp.mean(jnp.tanh(x @ w) ** 2)
        >>> sf = ja.serialize_axis(loss, chunk=4, argnums=1)
        >>> plan = sf.explain(jnp.ones((8, 3)), jnp.ones((10, 8)))
        >>> plan.axis_size, plan.chunk, plan.n_chunks, plan.remainder, plan.stops
        (10, 4, 3, 2, [])
    """

    axis_size: int
    chunk: int
    born: str
    grad: str
    grad_reason: str
    n_chunks: int
    remainder: int
    reduced_at: list[str]
    counts: dict[str, int]
    stacked: list[tuple[str, int]]
    accumulated: list[str]
    stops: list[PlanStop]  # every stop of every pass, each with its ``pass_``
    hoisted: list[str]
    candidates: list[CandidateAxis]
    layout: str
    streamed: list[str] = dataclasses.field(default_factory=list)  # the streamed normalisers
    warning: str | None = None  # why this plan is not expected to save memory, if it is not
    budget: Budget | None = None  # with ``memory=``: the chunk search
    # A program that pairs the axis with itself, in two passes (``_pairwise``): this plan is
    # pass 1's and ``second`` pass 2's (None: the paired values are inputs, one pass by rows);
    # ``pairs``: the pairing equations; ``between``: what pass 1 stacks for pass 2.
    pairs: list[str] = dataclasses.field(default_factory=list)
    between: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    second: Plan | None = None
    savings: tuple[int, int] | None = None  # estimated: (these passes, the one pass replaced)
    planned_for: str = ""  # the differentiation planned for (``Planner.prepare`` fills it)
    runs_as_written: bool = False  # no loop: the function as written (``grad`` is "none")

    @classmethod
    def from_decision(cls, decision: Decision, candidates: Sequence[Candidate]) -> Plan:
        """The plan that runs ``decision`` (the library's constructor; plans come from
        explain); ``candidates``: every candidate axis, the decision's among them."""
        chosen = decision.candidate
        split, chunk = chosen.split, chosen.chunk
        n_full, rem = divmod(split.size, chunk)
        counts = {s: split.stages.count(s) for s in (PROLOGUE, BODY, EPILOGUE)}
        if split.has_body:  # where they run (``Split.around_the_loop``)
            counts[PROLOGUE], counts[EPILOGUE] = map(len, split.around_the_loop)
        return cls(
            axis_size=split.size,
            chunk=chunk,
            born=split.born,
            grad=decision.mode.name,
            grad_reason=decision.reason,
            n_chunks=n_full + (1 if rem else 0),
            remainder=rem,
            reduced_at=[str(s) for s in split.reductions],
            counts=counts,
            stacked=[(str(v.aval), nbytes(v)) for v, _ in split.stacked],
            accumulated=[f"{v.aval} (sum)" for v in split.sums]
            + [f"{v.aval} ({kind})" for v, kind in split.partials],
            stops=once_each(split.stops),
            hoisted=[str(s) for s in split.hoisted_draws],
            candidates=[
                CandidateAxis(c.split.size, c.split.born, c.net_saving, c is chosen)
                for c in candidates
            ],
            layout=_described(decision.layout, split, chunk),
            streamed=_streamed(split),
            warning=chosen.warning(),
            budget=decision.budget,
        )

    @classmethod
    def unchunked(cls, why: str) -> Plan:
        """The plan of a call that runs the original as written; ``why`` is its warning."""
        return cls(
            axis_size=0,
            chunk=0,
            born="(nothing is chunked)",
            grad="none",
            grad_reason="the original function runs unchunked",
            n_chunks=0,
            remainder=0,
            reduced_at=[],
            counts={PROLOGUE: 0, BODY: 0, EPILOGUE: 0},
            stacked=[],
            accumulated=[],
            stops=[],
            hoisted=[],
            candidates=[],
            layout="as written",
            warning=why,
            runs_as_written=True,
        )

    def _repr_html_(self) -> str:
        return _html.plan_html(self)

    def __str__(self) -> str:
        lines = [] if self.warning is None else [f"note: {self.warning}"]
        if not self.pairs:
            return "\n".join(lines + self._lines("jaxpr_accum plan: "))
        lines += self._pairs_lines()
        if self.second is None:
            return "\n".join(lines + self._lines("one pass by rows: "))
        lines += self._lines("pass 1, the per-example part: ")
        lines += self.second._lines("pass 2, the pairs by rows: ", pass_=2)
        return "\n".join(lines)

    def _pairs_lines(self) -> list[str]:
        two = self.second is not None
        lines = [
            "jaxpr_accum plan in "
            + ("two passes" if two else "one pass by rows")
            + ": the program pairs the axis with itself at:",
            *(f"    {p}" for p in self.pairs),
        ]
        if two:
            total = sum(b for _, b in self.between)
            lines.append(
                f"  stacked by pass 1 for pass 2 ({format_bytes(total)} in all; pass 2 reads "
                "them as chunked rows and, whole, as the columns):"
            )
            lines.extend(f"    {a}: {format_bytes(b)}" for a, b in self.between)
        else:
            lines.append("  the paired values are inputs: their columns are the inputs, whole")
        if self.savings is not None:
            lines.append(
                f"  estimated saving: {_html.saved_text(self.savings[0])} (in one pass, with the "
                f"pairs after the loop on the full axis: {_html.saved_text(self.savings[1])})"
            )
        return lines

    def chunks_text(self) -> str:
        """How the axis is cut.

        Returns:
            The chunks, as the report writes them: ``3 chunks, the last of 2``.
        """
        if self.n_chunks == 1 and self.remainder:  # one chunk, shorter than ``chunk``
            return f"1 chunk of {self.remainder}"
        plural = "s" if self.n_chunks != 1 else ""
        last = f", the last of {self.remainder}" if self.remainder else ""
        return f"{self.n_chunks} chunk{plural}{last}"

    def equations_text(self) -> str:
        """Where the program's equations run.

        Returns:
            Their counts: ``4 hoisted before the loop, 15 chunked, 1 left after the loop``.
        """
        counts = self.counts
        before, body, after = counts[PROLOGUE], counts[BODY], counts[EPILOGUE]
        if self.axis_size == 0:
            return f"{before + body + after}, all run as written (no loop)"
        if self.runs_as_written:
            return (
                f"{before + body + after}, all run as written (no loop; the loop would hoist "
                f"{before}, chunk {body} and leave {after} after it)"
            )
        return f"{before} hoisted before the loop, {body} chunked, {after} left after the loop"

    def _lines(self, title: str, pass_: int = 1) -> list[str]:
        """The section of one pass; of ``stops``, those of pass ``pass_`` (a plain string: 1)."""
        stops = [s for s in self.stops if getattr(s, "pass_", 1) == pass_]
        lines = [
            f"{title}axis of size {self.axis_size} in chunks of {self.chunk} "
            f"({self.chunks_text()})",
            f"  born at: {self.born}",
            *gradient_mode_lines(self.grad, self.grad_reason),
            *([f"  planned for: {self.planned_for}"] if self.planned_for else []),
            *([] if self.budget is None else self.budget.lines()),
            f"  layout: {self.layout}",
            f"  equations: {self.equations_text()}",
        ]
        if self.reduced_at:
            lines.append("  reduced at:")
            lines.extend(f"    {r}" for r in self.reduced_at)
        if self.streamed:
            lines.append("  streamed normalisers (sums over the axis computed chunk by chunk):")
            lines.extend(f"    {s}" for s in self.streamed)
        if self.accumulated:
            lines.append("  accumulated across chunks: " + ", ".join(self.accumulated))
        if self.stacked:
            total = sum(b for _, b in self.stacked)
            lines.append(f"  stacked outputs (still carry the axis, {format_bytes(total)} in all):")
            lines.extend(f"    {a}: {format_bytes(b)}" for a, b in self.stacked)
        if self.hoisted:
            lines.append("  computed before the loop on the full axis:")
            lines.extend(f"    {h}" for h in self.hoisted)
        if stops:
            lines.append("  the region stopped at:")
            lines.extend(f"    {s}" for s in stops)
        if len(self.candidates) > 1:  # the others that would save memory, and a count
            lines.append("  candidate axes (estimated bytes saved by chunking, higher is better):")
            chosen = next(c for c in self.candidates if c.chosen)
            lines.append(f"    {_html.candidate_text(chosen)} (chosen)")
            shown, left_out = _html.other_candidates(self.candidates)
            lines.extend(f"    {_html.candidate_text(c)}" for c in shown)
            if left_out:
                lines.append(f"    {left_out} (Plan.candidates lists every one)")
        return lines
