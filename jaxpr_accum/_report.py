"""``Plan``: what the rewriter decided and why, as data and as a readable report."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpr_accum._plan import BODY, EPILOGUE, PROLOGUE, RegionPlan, format_bytes, nbytes


def _describe_layout(layout: Any, region: RegionPlan) -> str:
    if layout.devices == 1:
        return "one device, contiguous chunks"
    per = region.chunk // layout.devices
    return (
        f"sharded over mesh axis {layout.axes} ({layout.devices} devices): each device scans its "
        f"own shard of {region.size // layout.devices} in chunks of {per} (chunk i takes {per} "
        "rows from every shard); accumulators are summed across devices once, after the loop"
    )


@dataclasses.dataclass
class Plan:
    """The result of ``SerializedFunction.explain``; ``str(plan)`` is a readable report."""

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
    stops: list[str]
    hoisted: list[str]
    candidates: list[tuple[int, str, int, bool]]
    layout: str
    warning: str | None = None  # why this plan is not expected to save memory, if it is not

    @classmethod
    def from_region(
        cls,
        region: RegionPlan,
        candidates: list[RegionPlan],
        grad: str,
        grad_reason: str,
        layout: Any,
    ) -> Plan:
        n_full, rem = divmod(region.size, region.chunk)
        counts = {s: region.stages.count(s) for s in (PROLOGUE, BODY, EPILOGUE)}
        return cls(
            axis_size=region.size,
            chunk=region.chunk,
            born=region.born,
            grad=grad,
            grad_reason=grad_reason,
            n_chunks=n_full + (1 if rem else 0),
            remainder=rem,
            reduced_at=[str(s) for s in region.reductions],
            counts=counts,
            stacked=[(str(v.aval), nbytes(v)) for v, _ in region.stacked],
            accumulated=[f"{v.aval} (sum)" for v in region.sums]
            + [f"{v.aval} ({kind})" for v, kind in region.partials],
            stops=[str(s) for s in region.stops],
            hoisted=[str(s) for s in region.hoisted_draws],
            candidates=[(c.size, c.born, c.estimate, c is region) for c in candidates],
            layout=_describe_layout(layout, region),
            warning=region.not_worth_it(),
        )

    def __str__(self) -> str:
        lines = [] if self.warning is None else [f"note: {self.warning}"]
        lines += [
            f"jaxpr_accum plan: axis of size {self.axis_size} in chunks of {self.chunk} "
            f"({self.n_chunks} chunk{'s' if self.n_chunks != 1 else ''}"
            + (f", the last of {self.remainder}" if self.remainder else "")
            + ")",
            f"  born at: {self.born}",
            f"  gradient mode: {self.grad} ({self.grad_reason})",
            f"  layout: {self.layout}",
            f"  equations: {self.counts[PROLOGUE]} hoisted before the loop, "
            f"{self.counts[BODY]} chunked, {self.counts[EPILOGUE]} left after the loop",
        ]
        if self.reduced_at:
            lines.append("  reduced at:")
            lines.extend(f"    {r}" for r in self.reduced_at)
        if self.accumulated:
            lines.append("  accumulated across chunks: " + ", ".join(self.accumulated))
        if self.stacked:
            total = sum(b for _, b in self.stacked)
            lines.append(f"  stacked outputs (still carry the axis, {format_bytes(total)} in all):")
            lines.extend(f"    {a}: {format_bytes(b)}" for a, b in self.stacked)
        if self.hoisted:
            lines.append("  computed before the loop on the full axis:")
            lines.extend(f"    {h}" for h in self.hoisted)
        if self.stops:
            lines.append("  the region stopped at:")
            lines.extend(f"    {s}" for s in self.stops)
        others = [c for c in self.candidates if not c[3]]
        if others:
            lines.append("  other candidate axes (estimated bytes live, lower is better):")
            chosen = next(c for c in self.candidates if c[3])
            lines.append(f"    size {chosen[0]} at {chosen[1]}: {format_bytes(chosen[2])} (chosen)")
            lines.extend(f"    size {n} at {b}: {format_bytes(e)}" for n, b, e, _ in others)
        return "\n".join(lines)
