"""Axis analysis: where does the tracked axis sit in every value of a jaxpr?

**Lattice.** One fact per value, a *value* being a jaxpr variable in one *context* (the path
of enclosing equations, so a sub-jaxpr shared by two call sites is analysed once per site):

    unknown  <  AxisLoc(dim, inner, outer)  <  CONFLICT

``unknown`` (no entry) means "carries no trace of the axis"; ``AxisLoc(d, m)`` means
dimension ``d`` has size ``N*m`` with the axis as its major factor (``m == 1``: the dimension
*is* the axis); ``AxisLoc(d, m, o)`` with ``o > 1``, that the axis is a middle factor of size
``o*N*m`` (``[T, B, H] -> [T*B, H]``): an equation whose rule lacks ``middle_factor_ok``
becomes a barrier when it meets one, before its rule runs. Two different locations for one
value join to ``CONFLICT``. ``Analysis.set`` is that join; ``Analysis.loc`` reads
``CONFLICT`` as ``None``, so rules never see it and nothing propagates out of a conflicted
value. Equations get three more marks, which are only ever added: *reduces* (an output is a
reduction over the axis, with its monoid), *hoist* (exact only on the full axis, before the
loop: e.g. a random draw along it), *barrier* (mixes positions along the axis; the region
stops there).

**Algorithm (a worklist fixpoint).** Each context's equations are indexed once, when it is
first walked (``_view.Context``: variable -> equations that read or define it). Seeding a
value, and every later change of a value's fact, enqueues only its *neighbours*: the
equations of its context that read or define it and, when the value is an input or output
of a sub-jaxpr, the enclosing equation (whose rule re-links the sub-jaxpr to its operands).
A new reduction inside a sub-jaxpr also re-enqueues the enclosing equation (a ``jit`` passes
reductions out). Popping an equation applies its primitive's rule, both directions. Rules
with sub-jaxprs link their boundaries (``View.link``) and *register* them (``View.walk``):
the first registration indexes the context and enqueues every equation in it that touches
the axis; later ones add nothing (the changes themselves enqueued what they concern). The
queue empties at the fixpoint. Then:

1. every equation (any context) that reads or defines a ``CONFLICT`` value becomes a barrier
   ("the axis would sit at two places in ..."); a conflicted sub-jaxpr input or output that
   no equation inside reads or defines makes the enclosing equation the barrier;
2. rules with a ``finalize(eqn, view)`` method are called once per analysed equation (by
   context, then index); facts they add are propagated, and conflicts marked, again;
3. every analysed equation without sub-jaxprs that reads the axis must carry it on or
   reduce it, else it is a barrier (``_check_outputs_accounted``), by context, then index.

**Termination.** Facts only go up a lattice of height 2 over finitely many values, marks are
only added, and an equation is enqueued only when a fact or reduction it depends on changes,
or once when its context is first registered (contexts are finite: the program's nesting).
So the work is bounded by about ``2 x (reads + definitions)`` rule applications; there is no
sweep cap and no convergence error.

**Invariants.** At the fixpoint, applying any non-barrier equation's rule to the facts adds
nothing (every equation is re-run after each change to one of its values, including the ones
it made itself). Barrier equations are not re-run; facts they set before becoming barriers
stay. The facts do not depend on equation order where rules agree: rules only add facts that
follow from what they read, so the fixpoint is the least one whatever the visiting order,
and a value two rules disagree about is ``CONFLICT`` whichever runs first. What can depend
on the visiting order is *which* equation reports a disagreement that a rule detects itself
(e.g. two operands of an elementwise op at different places): the region stops on the path
between the two places either way, only the equation named may differ. An analysis never
changes the program: it is read by the planner and the resizer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar, cast

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import CONFLICT, AxisLoc, Conflict, canonical, fits, is_mapped
from jaxpr_accum._compat import Atom, ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var, open_jaxpr
from jaxpr_accum._engine._table import passed_through, reduced_inside, refusal, rule_for
from jaxpr_accum._engine._view import Context, Ctx, EqnKey, Ref, View, order, parent

T = TypeVar("T")


class Analysis:
    """Locations of one axis of size ``size`` throughout a jaxpr and its sub-jaxprs."""

    def __init__(self, jaxpr: Jaxpr, size: int, stop_slices: bool = False):
        self.jaxpr = jaxpr
        self.size = size
        self.stop_slices = stop_slices  # a slice of part of the axis is a barrier (``_fanout``)
        # The lattice: a value is unknown (in neither), at ``locs[ref]``, or ``CONFLICT``
        # (in ``conflicts``, with the two locations that met; never also in ``locs``).
        self.locs: dict[Ref, AxisLoc] = {}
        self.conflicts: dict[Ref, tuple[AxisLoc, AxisLoc]] = {}
        self.barriers: dict[EqnKey, str] = {}
        self.hoists: dict[EqnKey, str] = {}
        self.reductions: dict[EqnKey, dict[int, str]] = {}
        self.eqns: dict[EqnKey, JaxprEqn] = {}
        self.memo: dict[Hashable, object] = {}
        self._contexts: dict[Ctx, Context] = {}
        self._queue: deque[EqnKey] = deque()
        self._queued: set[EqnKey] = set()

    # -- reading -------------------------------------------------------------------------
    def loc(self, ctx: Ctx, v: Atom) -> AxisLoc | None:
        """Where the axis sits in ``v``; None when unknown or conflicted."""
        if isinstance(v, Literal):
            return None
        return self.locs.get((ctx, v))

    def fact(self, ctx: Ctx, v: Atom) -> AxisLoc | Conflict | None:
        """The lattice value of ``v``: None (unknown), an ``AxisLoc``, or ``CONFLICT``."""
        if isinstance(v, Literal):
            return None
        ref = (ctx, v)
        return CONFLICT if ref in self.conflicts else self.locs.get(ref)

    def conflicted(self, ctx: Ctx, v: Atom) -> bool:
        return not isinstance(v, Literal) and (ctx, v) in self.conflicts

    def touches(self, ctx: Ctx, eqn: JaxprEqn) -> bool:
        """Whether any operand or result of ``eqn`` carries the axis (or is conflicted)."""
        locs, conflicts = self.locs, self.conflicts
        for v in eqn.invars:
            if not isinstance(v, Literal) and ((ctx, v) in locs or (ctx, v) in conflicts):
                return True
        return any((ctx, v) in locs or (ctx, v) in conflicts for v in eqn.outvars)

    def definition(self, ctx: Ctx, v: Atom) -> JaxprEqn | None:
        """The equation of context ``ctx`` that defines ``v`` (None for inputs, literals)."""
        context = self._contexts.get(ctx)
        if context is None or isinstance(v, Literal):
            return None
        for idx in context.users.get(v, ()):
            if any(out is v for out in context.eqns[idx].outvars):
                return context.eqns[idx]
        return None

    def memoize(self, key: Hashable, build: Callable[[], T]) -> T:
        """Build per-equation data once (e.g. a custom rule's jaxpr) and share it (a key
        names what it holds: each key is built by one ``build`` only)."""
        if key not in self.memo:
            self.memo[key] = build()
        return cast(T, self.memo[key])

    # -- writing -------------------------------------------------------------------------
    def set(self, ctx: Ctx, v: Atom, loc: AxisLoc | None, key: EqnKey) -> None:
        """Join ``loc`` into ``v``'s fact; on a change, enqueue ``v``'s neighbours."""
        if loc is None or isinstance(v, _compat.DropVar):
            return
        if isinstance(v, Literal):
            self.mark_barrier(key, "a constant would need the axis")
            return
        ref = (ctx, v)
        if ref in self.conflicts:
            return
        shape = _compat.shape_of(v)
        ok_dim = 0 <= loc.dim < len(shape)
        loc = canonical(loc, self.size, shape[loc.dim]) if ok_dim else loc
        bad = is_mapped(loc) and loc.outer > 1  # a row map of a middle factor: not modelled
        if bad or not ok_dim or not fits(loc, self.size, shape[loc.dim]):
            self.mark_barrier(key, f"the axis cannot sit at dimension {loc.dim} of {v.aval}")
            return
        old = self.locs.get(ref)
        if old is None:
            self.locs[ref] = loc
            self._changed(ctx, v)
        elif old != loc:
            # Top of the lattice. Nothing propagates from here: every equation touching the
            # value becomes a barrier after the fixpoint, so what it would imply is moot.
            del self.locs[ref]
            self.conflicts[ref] = (old, loc)

    def mark_barrier(self, key: EqnKey, reason: str) -> None:
        self.barriers.setdefault(key, reason)

    def mark_hoist(self, key: EqnKey, reason: str) -> None:
        self.hoists.setdefault(key, reason)

    def mark_reduction(self, key: EqnKey, j: int, kind: str) -> None:
        ctx = key[0]
        marks = self.reductions.setdefault(key, {})
        if marks.get(j) != kind:
            marks[j] = kind
            if ctx:  # a call passes reductions of its body out: let its rule see this one
                self._enqueue(parent(ctx))

    # -- the worklist --------------------------------------------------------------------
    def _enqueue(self, key: EqnKey) -> None:
        if key not in self._queued and key not in self.barriers:
            self._queued.add(key)
            self._queue.append(key)

    def _changed(self, ctx: Ctx, v: Var) -> None:
        """``v``'s fact went up: re-run the equations whose rules read it."""
        context = self._contexts.get(ctx)
        if context is None:
            return  # not registered yet: its first ``walk`` enqueues what touches the axis
        for idx in context.users.get(v, ()):
            self._enqueue((ctx, idx))
        if ctx and v in context.boundary:
            self._enqueue(parent(ctx))

    def walk(self, jaxpr: Jaxpr | ClosedJaxpr, ctx: Ctx) -> None:
        """Register ``jaxpr`` as context ``ctx``; the first time, enqueue what touches the axis
        (nothing is evaluated here: the fixpoint loop in ``run`` does the work)."""
        if ctx in self._contexts:
            return
        context = self._contexts[ctx] = Context(jaxpr)
        for idx, eqn in enumerate(context.eqns):
            if self.touches(ctx, eqn):
                self._enqueue((ctx, idx))

    def _fixpoint(self) -> None:
        queue, queued, barriers, contexts = self._queue, self._queued, self.barriers, self._contexts
        while queue:
            key = queue.popleft()
            queued.discard(key)
            if key in barriers:
                continue
            ctx, idx = key
            eqn = contexts[ctx].eqns[idx]
            self.eqns[key] = eqn
            rule, view = rule_for(eqn.primitive), View(self, ctx, idx, eqn)
            why = refusal(rule, [self.loc(ctx, v) for v in (*eqn.invars, *eqn.outvars)])
            if why is not None:
                view.barrier(f"`{eqn.primitive.name}` meets {why} and has no rule for it")
                continue
            rule.propagate(eqn, view)

    # -- running -------------------------------------------------------------------------
    def run(self, seeds: Iterable[tuple[Var, AxisLoc]]) -> Analysis:
        self.walk(self.jaxpr, ())
        for v, loc in seeds:
            self.set((), v, loc, ((), -1))
        self._fixpoint()
        self._mark_conflicts()
        for key in sorted(self.eqns, key=order):
            eqn = self.eqns[key]
            rule_for(eqn.primitive).finalize(eqn, View(self, key[0], key[1], eqn))
        if self._queue:  # a finalize added facts: propagate them too
            self._fixpoint()
            self._mark_conflicts()
        for key in sorted(self.eqns, key=order):
            eqn = self.eqns[key]
            if not rule_for(eqn.primitive).children(eqn, View(self, key[0], key[1], eqn)):
                self._check_outputs_accounted(key[0], key[1], eqn)
        return self

    def _mark_conflicts(self) -> None:
        """After the fixpoint: every equation touching a conflicted value is a barrier."""
        marks: dict[EqnKey, str] = {}
        for (ctx, v), (old, new) in self.conflicts.items():
            reason = (
                f"the axis would sit at two places in {v.aval.str_short()} "
                f"({old.describe()} and {new.describe()})"
            )
            context = self._contexts.get(ctx)
            users = context.users.get(v, ()) if context is not None else ()
            for idx in users:
                marks.setdefault((ctx, idx), reason)
            if ctx and not users:  # passed straight through a sub-jaxpr: its caller links it
                marks.setdefault(parent(ctx), reason)
        for key in sorted(marks, key=order):
            ctx, idx = key
            if key not in self.eqns:
                self.eqns[key] = self._contexts[ctx].eqns[idx]
            self.mark_barrier(key, marks[key])

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
            passed = passed_through(body) if rule.passes_reductions else set()
            for j, inner in enumerate(body.eqns):
                if not self.touches(sub_ctx, inner):
                    continue
                reduced = self.reductions.get((sub_ctx, j), {})
                if any(inner.outvars[o] not in passed for o in reduced):
                    return inner, reduced_inside(eqn)
                found = self.blocker(sub_ctx, j, inner)
                if found is not None:
                    return found
        return None
