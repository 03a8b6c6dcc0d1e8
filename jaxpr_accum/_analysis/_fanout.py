"""Fan-out: a value that the axis reaches at two row maps gets one copy per reader.

The analysis gives a value one place of the axis. A value read by two parts of a
concatenation along the axis (antithetic noise ``concatenate([z, -z])``; ``jnp.roll``'s two
slices of one value) has its rows needed at two sets of positions: two row maps
(``_lattice``), which meet at ``CONFLICT``. ``analyse`` first leaves out the empty operands
of concatenations (``jnp.roll`` by a multiple of the length), runs the analysis and, where a
top-level value defined by an equation without effects is conflicted between two row maps
of one dimension, gives its readers copies of that equation and of the equations upstream
of it that carry the axis (its *cone*): every operand slot after the first gets one; a value
with one reader (the two places came from upstream, through a value its cone shares with
another path) gets a private one. A slice that takes part of the axis reads its operand on
its own rows only (``_rules/rows``), so a value read whole and in part, or by two slices
(halves rejoined, a roll), is such a conflict too. An input cannot be copied: a copy reads
each input that carries the axis through a *root* of its own (a slice that keeps all of it,
``root_of``), which carries no row map of the input and runs before the loop, so the copy
reads whichever rows it needs of the whole input; an input conflicted itself gives each
reader but the first a root. It drops what is then dead and runs the analysis again, until
no such conflict is left, the same conflicts come back (a copy cannot help), or
``MAX_ROUNDS`` rounds. Copies that leave at least as many conflicts as there were (both parts
of a concatenation carrying the same rows) are dropped: they would only compute the same
values more times; so are copies with a root that no row map reaches (the seed was an input
that every copy now reads through a root: nothing says which rows they are) or whose rows
are positions no chunk holds (two views of one batch joined: the copy would run after the
loop, not in it). Where conflicts remain, the slices that take part of the axis stop the
region instead if that leaves fewer (``Analysis.stop_slices``: the pairwise planner then sees
a rolled root as columns). A conflict on a value with effects stays: the region stops there.

The copies compute the same values (a random draw too: same key, same counters), so the
program means what it meant: per chunk each copy computes the window its own reader needs.
The result is a new jaxpr with the same inputs and outputs; ``Split.jaxpr`` is that jaxpr.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from jaxpr_accum import _compat
from jaxpr_accum._analysis._input_slices import root_of, through_roots
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, positions
from jaxpr_accum._compat import Jaxpr, Literal, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._rules.rows import keeps_all

MAX_ROUNDS = 16


def analyse(jaxpr: Jaxpr, size: int, seeds: Iterable[tuple[Var, AxisLoc]]) -> tuple:
    """``(jaxpr, analysis)``: the program with its row-map conflicts fanned out, analysed
    (the analysis ``Split`` is made from: an empty axis touches no equation)."""
    seeds = list(seeds)
    jaxpr, anchors = through_roots(_without_empty_parts(jaxpr), seeds, size)
    analysis, conflicts = _analysed(jaxpr, size, seeds)
    if anchors and _unanchored(jaxpr, analysis):  # nothing else says where the slices sit
        seeds += anchors
        analysis, conflicts = _analysed(jaxpr, size, seeds)
    unchanged, first = (jaxpr, analysis), conflicts.count
    seen: set = set()
    for _ in range(MAX_ROUNDS):
        # the same conflicts again (a copy that cannot help): stop
        signature = tuple(sorted(str(analysis.conflicts[((), v)]) for v in conflicts.all))
        if not signature or signature in seen:
            break
        seen.add(signature)
        copied = _copy_for_readers(jaxpr, analysis, conflicts.values)
        jaxpr = _roots_for_readers(copied, conflicts.inputs)
        analysis, conflicts = _analysed(jaxpr, size, seeds)
    left = conflicts.count
    # copies that removed no conflict (both parts of a concatenation carry the same rows, so
    # every copy conflicts again) would only compute the same values more times; a root that
    # no row map reaches lost the seed's anchor (its copy would run before the loop): dropped
    if first and (left >= first or _unanchored(jaxpr, analysis)):
        (jaxpr, analysis), left = unchanged, first
    if left:  # what no copy resolves: the slices stop, if that leaves fewer
        stopped, still = _analysed(unchanged[0], size, seeds, stop_slices=True)
        if still.count < left:
            return unchanged[0], stopped
    return jaxpr, analysis


@dataclasses.dataclass(frozen=True)
class Conflicts:
    """An analysis's conflicts between two row maps of one dimension: the ``values`` whose
    readers get copies (``_row_map_conflicts``), the ``inputs`` whose readers get roots."""

    values: list[Var]
    inputs: list[Var]

    @property
    def all(self) -> list[Var]:
        return self.values + self.inputs

    @property
    def count(self) -> int:
        return len(self.values) + len(self.inputs)


def _analysed(
    jaxpr: Jaxpr, size: int, seeds: list[tuple[Var, AxisLoc]], stop_slices: bool = False
) -> tuple[Analysis, Conflicts]:
    """``jaxpr`` analysed from ``seeds``, and the conflicts that analysis leaves (an empty
    axis: nothing to chunk, no equation is treated as touching it, and nothing conflicts)."""
    if size == 0:
        return Analysis(jaxpr, 0), Conflicts([], [])
    analysis = Analysis(jaxpr, size, stop_slices=stop_slices).run(seeds)
    conflicts = Conflicts(_row_map_conflicts(jaxpr, analysis), _conflicted_inputs(jaxpr, analysis))
    return analysis, conflicts


def _conflicted_inputs(jaxpr: Jaxpr, analysis: Analysis) -> list[Var]:
    """Top-level inputs conflicted between two row maps of one dimension (in order)."""
    return [v for v in jaxpr.invars if _row_maps(analysis.conflicts.get(((), v)))]


def _row_maps(pair: tuple | None) -> bool:
    """Whether a conflict's two places are row maps of one dimension."""
    if pair is None:
        return False
    a, b = pair
    return (a.dim, a.inner, a.outer) == (b.dim, b.inner, b.outer) and (is_mapped(a) or is_mapped(b))


def _unanchored(jaxpr: Jaxpr, analysis: Analysis) -> bool:
    """Whether a root carries no fact (nothing tells which rows its readers need), or rows
    at positions outside the axis (a part of a concatenation longer than the axis, which no
    chunk holds: two views of one batch)."""
    inputs, carrying = set(jaxpr.invars), _carrying(analysis)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "slice" or not keeps_all(eqn) or eqn.invars[0] not in inputs:
            continue
        root = eqn.outvars[0]
        if root not in carrying:
            return True
        loc = carrying[root]
        if loc is not None and (
            loc.lo < 0 or loc.lo + positions(loc, analysis.size) > analysis.size
        ):
            return True
    return False


def _carrying(analysis: Analysis) -> dict[Var, AxisLoc | None]:
    """The top-level values that carry the axis, each with its place (None: conflicted):
    ``Analysis.fact`` at the top level, read once."""
    carrying: dict[Var, AxisLoc | None] = {
        v: loc for (ctx, v), loc in analysis.locs.items() if ctx == () and loc is not None
    }
    carrying.update({v: None for ctx, v in analysis.conflicts if ctx == ()})
    return carrying


def _roots_for_readers(jaxpr: Jaxpr, inputs: list[Var]) -> Jaxpr:
    """Each reader of each of ``inputs`` but the first (or the only one) reads it through a
    root of its own."""
    for x in inputs:
        eqns = list(jaxpr.eqns)
        slots = [(i, j) for i, e in enumerate(eqns) for j, u in enumerate(e.invars) if u is x]
        roots = []
        for i, j in slots[1:] if len(slots) > 1 else slots:
            roots.append(root_of(x, eqns[i]))
            invars = list(eqns[i].invars)
            invars[j] = roots[-1].outvars[0]
            eqns[i] = eqns[i].replace(invars=invars)
        jaxpr = jaxpr.replace(eqns=[*roots, *eqns])
    return _without_dead(jaxpr)


def _row_map_conflicts(jaxpr: Jaxpr, analysis: Analysis) -> list[Var]:
    """Conflicted top-level values defined by an equation without effects whose two places
    are row maps of one dimension (in program order)."""
    producer = _producers(jaxpr)
    found = []
    for (ctx, v), pair in analysis.conflicts.items():
        if ctx != () or v not in producer or jaxpr.eqns[producer[v]].effects:
            continue
        if _row_maps(pair):
            found.append(v)
    return sorted(found, key=lambda v: producer[v])


def _producers(jaxpr: Jaxpr) -> dict[Var, int]:
    return {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}


def _cone(jaxpr: Jaxpr, analysis: Analysis, carrying: dict, v: Var) -> list[int]:
    """The equation defining ``v`` and those upstream of it, without effects, whose results
    carry the axis (a place or a conflict) or may (a dimension of ``v``'s length there: above
    a conflict the analysis stops, so the facts there are incomplete), in program order."""
    producer = _producers(jaxpr)
    rows = {_compat.shape_of(v)[analysis.conflicts[((), v)][0].dim]}
    cone, todo = set(), [producer[v]]
    while todo:
        i = todo.pop()
        if i in cone or jaxpr.eqns[i].effects:
            continue
        cone.add(i)
        for u in jaxpr.eqns[i].invars:
            if isinstance(u, Literal) or u not in producer:
                continue
            if u in carrying or rows & set(_compat.shape_of(u)):
                todo.append(producer[u])
    return sorted(cone)


def _copy_for_readers(jaxpr: Jaxpr, analysis: Analysis, targets: list[Var]) -> Jaxpr:
    carrying = _carrying(analysis)
    for v in targets:
        producer = _producers(jaxpr)
        if v not in producer:
            continue
        cone = _cone(jaxpr, analysis, carrying, v)
        inputs = _carrying_inputs(jaxpr, carrying, cone)
        slots = [(i, j) for i, e in enumerate(jaxpr.eqns) for j, u in enumerate(e.invars) if u is v]
        eqns = list(jaxpr.eqns)
        copies = []
        # several readers: all but the first get copies; one reader (the two places came
        # from upstream, a value its cone shares with another path): a private copy
        for i, j in slots[1:] if len(slots) > 1 else slots:
            # the copy reads the inputs through roots of its own (any rows of an input)
            renamed: dict[Var, Var] = {}
            for x in inputs:
                copies.append(root_of(x, eqns[producer[v]]))
                renamed[x] = copies[-1].outvars[0]
            for c in cone:
                eqn = eqns[c]
                outs = [_compat.new_var(o.aval) for o in eqn.outvars]
                renamed.update(zip(eqn.outvars, outs, strict=True))
                ins = [renamed.get(u, u) if not isinstance(u, Literal) else u for u in eqn.invars]
                copies.append(eqn.replace(invars=ins, outvars=outs))
            invars = list(eqns[i].invars)
            invars[j] = renamed[v]
            eqns[i] = eqns[i].replace(invars=invars)
        at = producer[v] + 1
        jaxpr = jaxpr.replace(eqns=[*eqns[:at], *copies, *eqns[at:]])
    return _without_dead(jaxpr)


def _carrying_inputs(jaxpr: Jaxpr, carrying: dict, cone: list[int]) -> list[Var]:
    """The top-level inputs that ``cone`` reads and that carry the axis (a place or a
    conflict), in order of first reading."""
    top = set(jaxpr.invars)
    found: dict[Var, None] = {}
    for c in cone:
        for u in jaxpr.eqns[c].invars:
            if not isinstance(u, Literal) and u in top and u in carrying:
                found.setdefault(u, None)
    return list(found)


def _without_empty_parts(jaxpr: Jaxpr) -> Jaxpr:
    """``jaxpr`` with the empty operands of its concatenations left out (``jnp.roll`` by a
    multiple of the length concatenates an empty slice): an empty part has no row map."""
    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "concatenate":
            d = eqn.params["dimension"]
            kept = [v for v in eqn.invars if _compat.shape_of(v)[d] > 0]
            if kept and len(kept) < len(eqn.invars):
                eqn = eqn.replace(invars=kept)
        eqns.append(eqn)
    return _without_dead(jaxpr.replace(eqns=eqns))


def _without_dead(jaxpr: Jaxpr) -> Jaxpr:
    """``jaxpr`` without the equations (without effects) whose results nothing reads."""
    used = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in used for v in eqn.outvars):
            kept.append(eqn)
            used.update(v for v in eqn.invars if not isinstance(v, Literal))
    return jaxpr.replace(eqns=kept[::-1])
