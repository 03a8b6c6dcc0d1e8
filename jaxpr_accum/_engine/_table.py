"""The rule table: one ``Rule`` per primitive, keyed by the primitive *object*.

A rule knows two things about one primitive, so that everything a primitive needs lives
together (JAX's ``batching.py`` keys its rules the same way):

- ``propagate(eqn, view)``: given what is known of where the tracked axis sits in the
  equation's operands and results (``view.in_loc(i)`` / ``view.out_loc(j)``, each an
  ``AxisLoc`` or ``None``), record what follows (``view.set_in`` / ``view.set_out``), or say
  that the equation reduces over the axis (``view.reduce(j, kind)``), that it must run before
  the loop on the full axis (``view.hoist(reason)``), or that it mixes positions along the
  axis (``view.barrier(reason)``). Propagation runs in both directions until nothing
  changes, so a rule must only ever *add* facts that hold whatever else is learnt later.
- ``resize(eqn, r, invals)``: re-emit the equation on chunk-sized operands, returning its
  results. ``r.k`` is the chunk length, ``r.start`` the traced index of the chunk's first
  position, ``r.in_locs`` / ``r.out_locs`` the axis positions.

Declared hooks with defaults: ``children(eqn, view)`` (sub-jaxprs that must be chunkable
too; by default every sub-jaxpr in the parameters), ``finalize(eqn, view)`` (called once
after the analysis has converged; custom derivative rules are analysed there), and the flags
``middle_factor_ok``, ``row_map_ok``, ``passes_reductions`` and ``elementwise`` (see ``Rule``).
Planning reads a rule through these declared properties, never by its class.

Rules are plugins (``jaxpr_accum._rules``) that import this module; this module imports no
rule. A primitive without a rule gets ``UNKNOWN``, a barrier that says how to register one.
The package's own tables register by name (``register``); they name the primitives of every
tested JAX version, and a name the installed JAX has no primitive for is skipped (such a
primitive cannot appear in its programs; ``_compat.ABSENT`` records it). A user's
``ja.register_rule`` resolves its name with ``resolve``: there an unknown name is an error,
never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar, cast

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import Array, ClosedJaxpr, Jaxpr, JaxprEqn, Params, Primitive, Var
from jaxpr_accum._engine._view import EqnResize, View


class Rule:
    """Base rule: shape-free re-emission. Subclasses override ``propagate``.

    Declared hooks (the analysis reads nothing else):

    - ``middle_factor_ok``: the rule accepts the axis as a middle factor of a merged
      dimension (``AxisLoc.outer > 1``) because it never indexes along a dimension that holds
      the axis: elementwise functions, layout changes, contractions and reductions of it. For
      every other rule the analysis turns such an equation into a barrier before the rule runs.
    - ``row_map_ok``: the rule accepts a row-mapped axis (``AxisLoc.lo / span / rev``: a
      concatenated, sliced or reversed one), computing its window (``EqnResize.window``);
      ``middle_factor_ok`` rules accept it too (they never index along the axis).
    - ``passes_reductions``: a reduction over the axis whose result is a direct output of a
      sub-jaxpr makes that output of the equation a reduction too (an inlined call).
    - ``elementwise``: the equation computes each position of its result from the same
      position of its operands, an operand without the axis broadcast; planning reads it
      (``_pairwise`` finds an elementwise equation that pairs the axis with itself).
    - ``children``: the sub-jaxprs that must be chunkable for the equation to be.
    - ``finalize``: called once per analysed equation after the analysis has converged
      (custom derivative rules are analysed there); a no-op by default.
    """

    middle_factor_ok: bool = False
    row_map_ok: bool = False
    passes_reductions: bool = False
    elementwise: bool = False

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        raise NotImplementedError

    def resize_params(self, eqn: JaxprEqn, r: EqnResize) -> Params:
        return eqn.params

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        return _compat.bind(eqn, invals, self.resize_params(eqn, r))

    def children(self, eqn: JaxprEqn, view: View) -> list[tuple[tuple, Jaxpr | ClosedJaxpr]]:
        """Sub-jaxprs that must be mappable for this equation to be chunked."""
        return list(_compat.sub_jaxprs(eqn.params))

    def finalize(self, eqn: JaxprEqn, view: View) -> None:
        """After the analysis has converged (nothing by default)."""


def refusal(rule: Rule, locs: Sequence[AxisLoc | None]) -> str | None:
    """Why ``rule`` cannot meet the axis at ``locs``: a middle factor, or a row map."""
    if not rule.middle_factor_ok and any(loc is not None and loc.outer > 1 for loc in locs):
        return (
            "the axis as a middle factor of a merged dimension (after a reshape such as "
            "[T, B, H] -> [T * B, H])"
        )
    if not (rule.middle_factor_ok or rule.row_map_ok) and any(is_mapped(loc) for loc in locs):
        return "a concatenated, sliced or reversed axis"
    return None


class Barrier(Rule):
    """Mixes positions along the axis, always (``{name}`` in the reason: the primitive)."""

    def __init__(self, reason: str):
        self.reason = reason

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        view.barrier(self.reason.format(name=eqn.primitive.name))


UNKNOWN = Barrier(
    "primitive `{name}` is not known to be chunkable; register a rule with `ja.register_rule`"
)

RULES: dict[Primitive, Rule] = {}

R = TypeVar("R", bound=Rule)


def rule_for(primitive: Primitive) -> Rule:
    return RULES.get(primitive, UNKNOWN)


def register(primitives: str | Primitive | Iterable[str | Primitive], rule: R) -> R:
    """Register ``rule`` for each of ``primitives`` (primitive objects or names) in the
    package's own tables: a name the installed JAX lacks is skipped (``_compat.ABSENT``)."""
    if isinstance(primitives, str) or not isinstance(primitives, Iterable):
        primitives = [primitives]
    for p in primitives:
        found = _compat.table_primitive(p) if isinstance(p, str) else resolve(p)
        if found is not None:
            RULES[found] = rule
    return rule


def resolve(primitive: object) -> Primitive:
    """The primitive object for a primitive or its name (an unknown name is an error)."""
    if isinstance(primitive, str):
        found = _compat.primitive(primitive)
        if found is None:
            raise ValueError(
                f"no primitive named {primitive!r} in the installed JAX "
                f"({_compat.jax_version()}); pass the primitive object itself"
            )
        return found
    if not (hasattr(primitive, "bind") and isinstance(getattr(primitive, "name", None), str)):
        raise TypeError(f"`primitive` must be a JAX primitive or its name, got {primitive!r}")
    return cast(Primitive, primitive)  # a primitive by its interface (a user's own class too)


def shared_loc(eqn: JaxprEqn, view: View, operands: Sequence[int]) -> AxisLoc | None:
    """The one position that ``operands`` and every result agree on, or None.

    Two different positions make the equation a barrier (and return None); two row maps of
    one dimension make the values conflicted instead.
    """
    found = [view.in_loc(i) for i in operands]
    found += [view.out_loc(j) for j in range(len(eqn.outvars))]
    locs = {loc for loc in found if loc is not None}
    one_dim = len({(loc.dim, loc.inner, loc.outer) for loc in locs}) == 1
    if len(locs) > 1 and one_dim and any(is_mapped(loc) for loc in locs):
        # two row maps of one dimension: the values meet at CONFLICT, which the analysis
        # reports, and ``_fanout`` resolves by copying the equations in front
        for loc in locs:
            for i in operands:
                view.set_in(i, loc)
            for j in range(len(eqn.outvars)):
                view.set_out(j, loc)
        return None
    return agreed(eqn, view, found)


def agreed(eqn: JaxprEqn, view: View, found: Sequence[AxisLoc | None]) -> AxisLoc | None:
    """The one position among ``found`` (``None`` entries ignored), or None; two different
    positions make the equation a barrier."""
    locs = {loc for loc in found if loc is not None}
    if len(locs) > 1:
        view.barrier(f"operands of `{eqn.primitive.name}` carry the axis at different places")
        return None
    return next(iter(locs), None)


def reduced_inside(eqn: JaxprEqn) -> str:
    """Why a reduction over the axis inside ``eqn``'s sub-jaxprs stops the region."""
    why = "reduces over the axis inside a nested function"
    if _compat.is_checkpoint(eqn):  # the function's own result would be inlined (``_trace``)
        why += (
            f" (a `jax.checkpoint` at {_compat.source_line(eqn)} whose result is computed "
            "with further: serialize the function it wraps, or return its result as is)"
        )
    return why


def passed_through(jaxpr: Jaxpr) -> set[Var]:
    """Outputs of ``jaxpr`` that no equation inside it reads: a reduction producing one of
    them hands its per-chunk partial straight out, so the enclosing call reduces too."""
    read = {v for e in jaxpr.eqns for v in e.invars if not isinstance(v, _compat.Literal)}
    return {v for v in jaxpr.outvars if not isinstance(v, _compat.Literal) and v not in read}
