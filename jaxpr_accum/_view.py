"""``View``: one equation's window on an ``Analysis``, what a rule's ``propagate`` reads and
writes (the axis positions of its operands and results, and the marks: barrier, hoist,
reduction), and how rules with sub-jaxprs link and register them."""

from __future__ import annotations

from typing import Any

from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, JaxprEqn
from jaxpr_accum._lattice import AxisLoc

Ctx = tuple  # path of (equation index, sub-jaxpr path) pairs from the top-level jaxpr
EqnKey = tuple  # (ctx, equation index)


class View:
    """One equation's window on an ``Analysis``: what rules read and write."""

    __slots__ = ("analysis", "ctx", "idx", "eqn")

    def __init__(self, analysis: Any, ctx: Ctx, idx: int, eqn: JaxprEqn):
        self.analysis, self.ctx, self.idx, self.eqn = analysis, ctx, idx, eqn

    @property
    def key(self) -> EqnKey:
        return (self.ctx, self.idx)

    @property
    def size(self) -> int:
        return self.analysis.size

    def in_loc(self, i: int) -> AxisLoc | None:
        return self.analysis.loc(self.ctx, self.eqn.invars[i])

    def out_loc(self, j: int) -> AxisLoc | None:
        return self.analysis.loc(self.ctx, self.eqn.outvars[j])

    def set_in(self, i: int, loc: AxisLoc | None) -> None:
        self.analysis.set(self.ctx, self.eqn.invars[i], loc, self.key)

    def set_out(self, j: int, loc: AxisLoc | None) -> None:
        self.analysis.set(self.ctx, self.eqn.outvars[j], loc, self.key)

    def barrier(self, reason: str) -> None:
        self.analysis.mark_barrier(self.key, reason)

    def hoist(self, reason: str) -> None:
        self.analysis.mark_hoist(self.key, reason)

    def reduce(self, j: int, kind: str) -> None:
        self.analysis.mark_reduction(self.key, j, kind)

    # -- sub-jaxprs ----------------------------------------------------------------------
    def sub_ctx(self, path: tuple) -> Ctx:
        return self.ctx + ((self.idx, path),)

    def link(self, a: tuple[Ctx, Any], b: tuple[Ctx, Any], shift: int = 0) -> None:
        """Values ``a`` and ``b`` are the same up to ``shift``: dim ``d`` of a is ``d+shift`` of b.

        A location that would fall off the front (``dim + shift < 0``) is a barrier. A link
        is re-applied whenever the enclosing equation is re-run, i.e. whenever a fact of a
        sub-jaxpr input or output changes, so either side may be learnt first.
        """
        an = self.analysis
        la, lb = an.loc(*a), an.loc(*b)
        if la is not None:
            if la.dim + shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*b, la._replace(dim=la.dim + shift), self.key)
        if lb is not None:
            if lb.dim - shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*a, lb._replace(dim=lb.dim - shift), self.key)

    def walk(self, path: tuple, jaxpr: Jaxpr | ClosedJaxpr) -> None:
        """Register sub-jaxpr ``path`` for analysis (it is analysed by the worklist, not now)."""
        self.analysis.walk(jaxpr, self.sub_ctx(path))
