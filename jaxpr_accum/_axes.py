"""Axis analysis: where does the tracked axis sit in every value of a jaxpr?

The lattice, per value (a jaxpr variable in one *context*, i.e. one path of enclosing
equations, so a sub-jaxpr shared by two call sites is analysed once per site):

    unknown  <  AxisLoc(dim, inner)  <  conflict

``unknown`` means "carries no trace of the axis"; ``AxisLoc(d, m)`` means dimension ``d`` has
size ``N*m`` with the axis as its major factor (``m == 1``: the dimension *is* the axis).
Two different locations for one value is a conflict: the equation that found it becomes a
barrier. Equations get three more marks: *reduces* (an output is a reduction over the axis,
with its monoid), *hoist* (exact only on the full axis, before the loop: e.g. a random draw
along it), *barrier* (mixes positions along the axis; the region stops there).

Propagation seeds some values, then sweeps every equation (recursing into sub-jaxprs through
their rules) applying the primitive's rule in both directions, until a sweep adds nothing.
Facts only ever get added, so the sweep terminates; the result does not depend on equation
order. An analysis never changes the program: it is read by the planner and the resizer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jaxpr_accum import _compat
from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var, open_jaxpr
from jaxpr_accum._rules import AxisLoc, passed_through, rule_for

Ctx = tuple  # path of (equation index, sub-jaxpr path) pairs from the top-level jaxpr
Ref = tuple  # (ctx, Var)
EqnKey = tuple  # (ctx, equation index)

_MAX_SWEEPS = 100


class Analysis:
    """Locations of one axis of size ``size`` throughout a jaxpr and its sub-jaxprs."""

    def __init__(self, jaxpr: Jaxpr, size: int):
        self.jaxpr = jaxpr
        self.size = size
        self.locs: dict[Ref, AxisLoc] = {}
        self.barriers: dict[EqnKey, str] = {}
        self.hoists: dict[EqnKey, str] = {}
        self.reductions: dict[EqnKey, dict[int, str]] = {}
        self.eqns: dict[EqnKey, JaxprEqn] = {}
        self.memo: dict[Any, Any] = {}
        self._changed = False

    # -- reading -------------------------------------------------------------------------
    def loc(self, ctx: Ctx, v: Any) -> AxisLoc | None:
        if isinstance(v, Literal):
            return None
        return self.locs.get((ctx, v))

    def touches(self, ctx: Ctx, eqn: JaxprEqn) -> bool:
        locs = self.locs
        for v in eqn.invars:
            if not isinstance(v, Literal) and (ctx, v) in locs:
                return True
        return any((ctx, v) in locs for v in eqn.outvars)

    def memoize(self, key: Any, build: Any) -> Any:
        """Build per-equation data once (e.g. a custom rule's jaxpr) and share it."""
        if key not in self.memo:
            self.memo[key] = build()
        return self.memo[key]

    # -- writing -------------------------------------------------------------------------
    def set(self, ctx: Ctx, v: Any, loc: AxisLoc | None, key: EqnKey) -> None:
        if loc is None or isinstance(v, _compat.DropVar):
            return
        if isinstance(v, Literal):
            self.mark_barrier(key, "a constant would need the axis")
            return
        shape = v.aval.shape
        if not (0 <= loc.dim < len(shape)) or shape[loc.dim] != self.size * loc.inner:
            self.mark_barrier(key, f"the axis cannot sit at dimension {loc.dim} of {v.aval}")
            return
        old = self.locs.get((ctx, v))
        if old is None:
            self.locs[(ctx, v)] = loc
            self._changed = True
        elif old != loc:
            self.mark_barrier(key, f"the axis would sit at two places ({old} and {loc})")

    def mark_barrier(self, key: EqnKey, reason: str) -> None:
        if key not in self.barriers:
            self.barriers[key] = reason
            self._changed = True

    # -- running -------------------------------------------------------------------------
    def run(self, seeds: Iterable[tuple[Var, AxisLoc]]) -> Analysis:
        for v, loc in seeds:
            self.set((), v, loc, ((), -1))
        for _ in range(_MAX_SWEEPS):
            self._changed = False
            self.walk(self.jaxpr, ())
            if not self._changed:
                break
        else:  # pragma: no cover
            raise RuntimeError("axis analysis did not converge")
        for (ctx, idx), eqn in list(self.eqns.items()):
            if not rule_for(eqn.primitive).children(eqn, View(self, ctx, idx, eqn)):
                self._check_outputs_accounted(ctx, idx, eqn)
        return self

    def walk(self, jaxpr: Jaxpr | ClosedJaxpr, ctx: Ctx) -> None:
        for idx, eqn in enumerate(open_jaxpr(jaxpr).eqns):
            key = (ctx, idx)
            if key in self.barriers or not self.touches(ctx, eqn):
                continue
            self.eqns[key] = eqn
            view = View(self, ctx, idx, eqn)
            rule_for(eqn.primitive).propagate(eqn, view)

    def _check_outputs_accounted(self, ctx: Ctx, idx: int, eqn: JaxprEqn) -> None:
        """After convergence: an equation that reads the axis must carry it on, or reduce it."""
        key = (ctx, idx)
        if key in self.barriers or key in self.hoists:
            return
        if not any(self.loc(ctx, v) for v in eqn.invars):
            return
        reduced = self.reductions.get(key, {})
        for j, v in enumerate(eqn.outvars):
            if j in reduced or isinstance(v, _compat.DropVar) or self.loc(ctx, v):
                continue
            self.mark_barrier(key, f"`{eqn.primitive.name}` drops the axis without reducing it")
            return

    # -- verdicts ------------------------------------------------------------------------
    def blocker(self, ctx: Ctx, idx: int, eqn: JaxprEqn) -> tuple[JaxprEqn, str] | None:
        """Why ``eqn`` cannot run per chunk as one unit, or None if it can.

        An equation can if it is no barrier and no hoist, every output that is used either
        carries the axis or is a reduction over it, and every equation inside its
        sub-jaxprs can, with no reduction over the axis inside.
        """
        key = (ctx, idx)
        if key in self.barriers:
            return eqn, self.barriers[key]
        if key in self.hoists:
            return eqn, self.hoists[key]
        rule = rule_for(eqn.primitive)
        for path, sub in rule.children(eqn, View(self, ctx, idx, eqn)):
            sub_ctx = ctx + ((idx, path),)
            body = open_jaxpr(sub)
            passed = passed_through(body) if getattr(rule, "passes_reductions", False) else set()
            for j, inner in enumerate(body.eqns):
                if not self.touches(sub_ctx, inner):
                    continue
                reduced = self.reductions.get((sub_ctx, j), {})
                if any(inner.outvars[o] not in passed for o in reduced):
                    return inner, "reduces over the axis inside a nested function"
                found = self.blocker(sub_ctx, j, inner)
                if found is not None:
                    return found
        return None


class View:
    """One equation's window on an ``Analysis``: what rules read and write."""

    __slots__ = ("analysis", "ctx", "idx", "eqn")

    def __init__(self, analysis: Analysis, ctx: Ctx, idx: int, eqn: JaxprEqn):
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
        self.analysis.hoists.setdefault(self.key, reason)

    def reduce(self, j: int, kind: str) -> None:
        self.analysis.reductions.setdefault(self.key, {})[j] = kind

    # -- sub-jaxprs ----------------------------------------------------------------------
    def sub_ctx(self, path: tuple) -> Ctx:
        return self.ctx + ((self.idx, path),)

    def link(self, a: tuple[Ctx, Any], b: tuple[Ctx, Any], shift: int = 0) -> None:
        """Values ``a`` and ``b`` are the same up to ``shift``: dim ``d`` of a is ``d+shift`` of b.

        A location that would fall off the front (``dim + shift < 0``) is a barrier.
        """
        an = self.analysis
        la, lb = an.loc(*a), an.loc(*b)
        if la is not None:
            if la.dim + shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*b, AxisLoc(la.dim + shift, la.inner), self.key)
        if lb is not None:
            if lb.dim - shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*a, AxisLoc(lb.dim - shift, lb.inner), self.key)

    def walk(self, path: tuple, jaxpr: Jaxpr | ClosedJaxpr) -> None:
        self.analysis.walk(jaxpr, self.sub_ctx(path))
