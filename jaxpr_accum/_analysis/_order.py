"""Where the equations outside the region run: before the chunk loop or after it.

The loop runs the region's equations (the body) as one step of the program. Every other
equation runs on the full axis, before the loop or after it, and where the dataflow leaves
the choice, the program's own order decides, so that what the original reports in
execution order (``checkify``'s first error of a kind, an ordered effect) comes in the same
order:

- a prologue equation that the body reads, at any remove, runs before the loop;
- every other equation runs before the loop if it comes before the body's first equation in
  the program, else after it (an epilogue equation before the body's first cannot read the
  body's results, at any remove).

The loop runs the body as one step, so an equation between the body's first and last (that
the body does not read) cannot keep the program's order with both: it runs after the loop.
``between_the_body`` numbers these equations, and the body's equations by how many come
before them (``segment``), so that ``checkify`` can order their checks as the program does
(``_compat.between_scope``, ``_compat.segment_scope``).

Invariants: each side keeps program order, and each equation runs after those it reads (a
prologue equation reads prologue values only; the body and the prologue equations it needs
read none placed after the loop; an equation before the body's first reads only equations
before it).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from jaxpr_accum._analysis._stages import BODY, PROLOGUE, variables
from jaxpr_accum._compat import Jaxpr, Var


def around_the_loop(jaxpr: Jaxpr, stages: Sequence[str]) -> tuple[list[int], list[int]]:
    """The indices of the equations outside the body that run before the loop and after it,
    each in program order (the module's docstring); the body must not be empty."""
    eqns = jaxpr.eqns
    body = [i for i, s in enumerate(stages) if s == BODY]
    first = body[0]
    read: set[Var] = {v for i in body for v in variables(eqns[i].invars)}
    needed: set[int] = set()  # prologue equations the body reads, at any remove
    for i in reversed(range(len(eqns))):
        if stages[i] == PROLOGUE and any(v in read for v in eqns[i].outvars):
            needed.add(i)
            read.update(variables(eqns[i].invars))
    before: list[int] = []
    after: list[int] = []
    for i, stage in enumerate(stages):
        if stage != BODY:
            (before if i in needed or i < first else after).append(i)
    return before, after


def between_the_body(after: Sequence[int], stages: Sequence[str]) -> dict[int, int]:
    """Each equation that runs after the loop (``after``: ``around_the_loop``'s) though it
    comes before the body's last equation in the program: its index -> its ordinal among
    them, from 1."""
    last = max(i for i, s in enumerate(stages) if s == BODY)
    return {i: n for n, i in enumerate((i for i in after if i < last), 1)}


def segment(between: dict[int, int], index: int) -> int:
    """How many of the equations ``between`` the body's (``between_the_body``) come before
    the equation at ``index`` in the program."""
    return bisect.bisect_left(sorted(between), index)
