"""The pieces of a plan's report: its records (``PlanStop``, ``CandidateAxis``), each stop once
with its count (``once_each``), the gradient-mode line as one sentence with indented detail
(``gradient_mode_lines``), and the differentiation a plan was made for (``planned_for_text``).

Invariant: every value of the report surface is read by name; the records that replace tuples
(``CandidateAxis``) are named tuples, so code that unpacks them keeps working."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import NamedTuple

from jaxpr_accum._analysis._stages import Stop


class PlanStop(str):
    """One place where a region stopped, as readable text (```prim` at file:line: why``),
    with the pass it belongs to: ``pass_`` is 1, or 2 for the second pass of a two-pass
    plan; ``repeats``: how many identical stops it stands for (``once_each``). A ``str``, so
    that code reading ``plan.stops`` as text keeps working."""

    pass_: int
    repeats: int

    def __new__(cls, text: str, pass_: int = 1, repeats: int = 1) -> PlanStop:
        stop = super().__new__(cls, text)
        stop.pass_, stop.repeats = pass_, repeats
        return stop


class CandidateAxis(NamedTuple):
    """One candidate axis of ``Plan.candidates``: its ``size``, where it is ``born``, the
    estimated bytes saved by chunking it (``saved_bytes``; negative: chunking it costs
    memory), and whether it is the ``chosen`` one."""

    size: int
    born: str
    saved_bytes: int
    chosen: bool


def once_each(stops: Sequence[Stop]) -> list[PlanStop]:
    """``stops`` listed once each, in program order, with a count where one repeats: a
    program unrolled over the axis (``jax.debug.print`` in a ``vmap``-ped function is one
    callback per row) stops at N equations of the same primitive, source line and reason."""
    counts = collections.Counter(str(s) for s in stops)  # in first-seen order
    return [
        PlanStop(text if n == 1 else f"{text} ({n} identical stops)", repeats=n)
        for text, n in counts.items()
    ]


def gradient_mode_lines(grad: str, reason: str) -> list[str]:
    """The gradient-mode line: the reason's first line (one sentence: the mode, why, what the
    other mode would cost), its further lines as indented detail."""
    head, *detail = reason.split("\n")
    head = head if head.startswith(f"{grad},") else f"{grad}: {head}"
    return [f"  gradient mode: {head}", *(f"    {d}" for d in detail)]


def planned_for_text(differentiated: Sequence[str], known: bool) -> str:
    """The differentiation planned for, for ``Plan.planned_for``: the names of the
    ``differentiated`` inputs; ``known``: the caller's (a call under ``jax.grad``, or
    ``explain(..., grad_argnums=...)``), else every floating argument, as for a call whose
    differentiation is not seen."""
    if not differentiated:
        return "the forward pass only (nothing is differentiated)"
    names = [f"`{name}`" for name in differentiated]
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if known:
        return f"the gradient with respect to {listed} (the call's)"
    return (
        f"the gradient with respect to every floating argument ({listed}); for a call's "
        "`jax.grad` of fewer, `explain(..., grad_argnums=...)`"
    )
