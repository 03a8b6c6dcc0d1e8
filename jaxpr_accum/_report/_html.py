"""HTML for notebooks: ``Plan._repr_html_``, and the pieces ``Sweep._repr_html_`` uses.

Plain tables with inline styles only (no scripts, no external CSS), so they render the same in
Jupyter, VS Code and exported HTML. Every piece of text that comes from the program (source
lines, shapes, reasons, names) goes through ``html.escape``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._report._plan_text import CandidateAxis

if TYPE_CHECKING:  # the plan's HTML view, which the plan shows
    from jaxpr_accum._report._plan import Plan

TABLE = 'style="border-collapse: collapse; text-align: left; font-size: 0.9em"'
_CELL = 'style="padding: 2px 8px; vertical-align: top; text-align: {align}"'
_NOTE = (
    'style="padding: 4px 8px; margin: 4px 0; border-left: 4px solid #d9a400; '
    'background: rgba(217, 164, 0, 0.12)"'
)


def cell(text: object, tag: str = "td", align: str = "left") -> str:
    return f"<{tag} {_CELL.format(align=align)}>{escape(str(text))}</{tag}>"


def items(title: str, items: Sequence[object]) -> str:
    if not items:
        return ""
    lis = "".join(f"<li><code>{escape(str(s))}</code></li>" for s in items)
    summary = f"<summary>{escape(title)} ({len(items)})</summary>"
    return f"<details open>{summary}<ul>{lis}</ul></details>"


def saved_text(n: int) -> str:
    """Estimated bytes saved, as the reports write them (negative: it costs memory)."""
    return format_bytes(n) if n >= 0 else f"-{format_bytes(-n)} (costs memory)"


def candidate_text(c: CandidateAxis) -> str:
    """A candidate axis as the report lists it: ``size 8 at dimension 0 of x: 1000 B``."""
    return f"size {c.size} at {c.born}: {saved_text(c.saved_bytes)}"


def other_candidates(
    candidates: list[CandidateAxis], most: int = 5
) -> tuple[list[CandidateAxis], str | None]:
    """The candidate axes a report lists besides the chosen one: those estimated to save
    memory, the best first, at most ``most``; and a count of the others (None: no other)."""
    ranked = sorted((c for c in candidates if not c.chosen), key=lambda c: -c.saved_bytes)
    shown = [c for c in ranked if c.saved_bytes > 0][:most]
    costly = sum(c.saved_bytes <= 0 for c in ranked)
    less = len(ranked) - len(shown) - costly
    parts = [f"{less} more that would save less"] * bool(less)
    parts += [f"{costly}{'' if less else ' more'} that would not save memory"] * bool(costly)
    return shown, ("and " + ", ".join(parts)) if parts else None


def plan_html(plan: Plan) -> str:
    """The plan at a glance (``_one_plan``); a program that pairs the axis with itself shows
    the pairings, what pass 1 stacks for pass 2, and then each pass."""
    if not plan.pairs:
        return _one_plan(plan, "jaxpr_accum plan")
    two = plan.second is not None
    rows = [("passes", "two: the per-example part, then the pairs by rows" if two else
             "one, by rows: the paired values are inputs, whole on the column side")]  # fmt: skip
    if plan.savings is not None:
        rows.append(
            ("estimated saving", f"{saved_text(plan.savings[0])} (one pass, with the pairs after "
             f"the loop: {saved_text(plan.savings[1])})")
        )  # fmt: skip
    if plan.between:
        total = sum(n for _, n in plan.between)
        rows.append(("stacked between the passes", f"{format_bytes(total)} in all"))
    head = "pass 1: the per-example part" if two else "the pairs by rows"
    return "".join(
        [
            _opening("jaxpr_accum plan: the program pairs the axis with itself", plan, rows),
            items("pairs the axis with itself at", plan.pairs),
            items(
                "stacked by pass 1 for pass 2",
                [f"{a}: {format_bytes(n)}" for a, n in plan.between],
            ),
            _one_plan(dataclasses.replace(plan, warning=None), head),
            "" if plan.second is None else _one_plan(plan.second, "pass 2: the pairs by rows", 2),
            "</div>",
        ]
    )


def _one_plan(plan: Plan, title: str, pass_: int = 1) -> str:
    """One region at a glance: axis, chunks, gradient mode and why, equation counts, the
    estimated saving, the warning; then the stops of pass ``pass_`` (with their source
    lines) and the rest."""
    chunks = f"{plan.chunk} ({plan.chunks_text()})"
    chosen = next((c for c in plan.candidates if c.chosen), None)
    rows = [
        ("axis", f"size {plan.axis_size}, born at {plan.born}"),
        ("chunk", chunks),
        ("gradient mode", f"{plan.grad}: {plan.grad_reason}"),
        ("equations", plan.equations_text()),
        ("layout", plan.layout),
    ]
    if plan.planned_for:
        rows.insert(3, ("planned for", plan.planned_for))
    if chosen is not None:
        saving = f"{saved_text(chosen.saved_bytes)} (cost model, bytes saved)"
        rows.append(("estimated saving", saving))
    if plan.budget is not None:
        b = plan.budget
        rows.append(
            ("memory budget", f"{format_bytes(b.limit)}: chunk {b.chunk} ({b.grad}) measured "
             f"{format_bytes(b.measured)}")
        )  # fmt: skip
    if plan.stacked:
        total = sum(n for _, n in plan.stacked)
        rows.append(("stacked outputs", f"{len(plan.stacked)}, {format_bytes(total)} in all"))
    others, left_out = other_candidates(plan.candidates)
    stops = [s for s in plan.stops if getattr(s, "pass_", 1) == pass_]  # a plain string: 1
    return "".join(
        [
            _opening(title, plan, rows),
            items("the region stopped at", stops),
            items("reduced at", plan.reduced_at),
            items("streamed normalisers", plan.streamed),
            items("accumulated across chunks", plan.accumulated),
            items("stacked outputs", [f"{a}: {format_bytes(n)}" for a, n in plan.stacked]),
            items("computed before the loop on the full axis", plan.hoisted),
            items(
                "other candidate axes (estimated bytes saved)",
                [candidate_text(c) for c in others] + ([left_out] if left_out else []),
            ),
            "</div>",
        ]
    )


def _opening(title: str, plan: Plan, rows: list[tuple[str, str]]) -> str:
    """A plan's view opened: the ``title``, the plan's warning as a note and ``rows`` as a
    table, in a ``<div>`` that the caller closes after its lists."""
    body = "".join(f"<tr>{cell(k, 'th')}{cell(v)}</tr>" for k, v in rows)
    note = "" if plan.warning is None else f"<div {_NOTE}>note: {escape(plan.warning)}</div>"
    return f"<div><strong>{escape(title)}</strong>{note}<table {TABLE}>{body}</table>"
