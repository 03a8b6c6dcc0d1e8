"""The rule interface and the table that maps each primitive to its rule.

A *rule* knows two things about one primitive, so that everything a primitive needs lives
together:

- ``propagate(eqn, view)``: given what is known of where the tracked axis sits in the
  equation's inputs and outputs (``view.in_loc(i)`` / ``view.out_loc(j)``, each an ``AxisLoc``
  or ``None``), record what follows (``view.set_in`` / ``view.set_out``), or say that the
  equation reduces over the axis (``view.reduce(j, kind)``), that it must run before the loop
  on the full axis (``view.hoist(reason)``), or that it mixes positions along the axis
  (``view.barrier(reason)``). Propagation runs in both directions until nothing changes, so a
  rule must only ever *add* facts that hold whatever else is learnt later.
- ``resize(eqn, r, invals)``: re-emit the equation on chunk-sized inputs, returning its
  outputs. ``r.k`` is the chunk length along the axis, ``r.start`` the traced index of the
  chunk's first position, ``r.in_locs`` / ``r.out_locs`` the axis positions.

Rules are looked up by primitive *name* (primitive objects of the same name are the same
primitive across JAX's internal copies). Unknown primitives get ``UNKNOWN``, a barrier that
tells the user how to register a rule.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jaxpr_accum import _compat


def passed_through(jaxpr: Any) -> set:
    """Outputs of ``jaxpr`` that no equation inside it reads: a reduction producing one of
    them hands its per-chunk partial straight out, so the enclosing call reduces too."""
    read = {v for e in jaxpr.eqns for v in e.invars if not isinstance(v, _compat.Literal)}
    return {v for v in jaxpr.outvars if not isinstance(v, _compat.Literal) and v not in read}


class AxisLoc(NamedTuple):
    """Where the tracked axis sits in one value: dimension ``dim`` has size ``N * inner``
    and the axis is its major factor (``inner == 1``: the dimension is the axis itself)."""

    dim: int
    inner: int = 1


class Rule:
    """Base rule: shape-free re-emission. Subclasses override ``propagate``."""

    def propagate(self, eqn: Any, view: Any) -> None:
        raise NotImplementedError

    def resize_params(self, eqn: Any, r: Any) -> dict:
        return eqn.params

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        return _compat.bind(eqn, invals, self.resize_params(eqn, r))

    def children(self, eqn: Any, view: Any) -> list:
        """Sub-jaxprs that must be mappable for this equation to be chunked."""
        return [(path, j) for path, j in _compat.sub_jaxprs(eqn.params)]


def shared_loc(eqn: Any, view: Any, operands: Any) -> AxisLoc | None:
    """The one position that ``operands`` and every output agree on, or None.

    Two different positions make the equation a barrier (and return None).
    """
    found = [view.in_loc(i) for i in operands]
    found += [view.out_loc(j) for j in range(len(eqn.outvars))]
    locs = {loc for loc in found if loc is not None}
    if len(locs) > 1:
        view.barrier(f"operands of `{eqn.primitive.name}` carry the axis at different places")
        return None
    return next(iter(locs), None)


class Barrier(Rule):
    def __init__(self, reason: str):
        self.reason = reason

    def propagate(self, eqn: Any, view: Any) -> None:
        view.barrier(self.reason.format(name=eqn.primitive.name))


UNKNOWN = Barrier(
    "primitive `{name}` is not known to be chunkable; register a rule with `ja.register_rule`"
)

RULES: dict[str, Rule] = {}


def rule_for(primitive: Any) -> Rule:
    return RULES.get(primitive.name, UNKNOWN)


def register(names: str | list[str], rule: Rule) -> Rule:
    for name in [names] if isinstance(names, str) else names:
        RULES[name] = rule
    return rule


def register_rule(primitive: Any, rule: Any) -> None:
    """Tell the rewriter how ``primitive`` treats the axis.

    ``primitive``: a JAX primitive or its name. ``rule``: ``"elementwise"`` (acts on each
    position independently, all full-rank operands share the output's shape), or an object
    with ``propagate(eqn, view)`` and ``resize(eqn, r, invals)`` methods (see ``Rule``).
    """
    name = primitive if isinstance(primitive, str) else getattr(primitive, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"`primitive` must be a JAX primitive or its name, got {primitive!r}")
    if rule == "elementwise":
        from jaxpr_accum._rules.elementwise import Elementwise

        rule = Elementwise()
    if not (hasattr(rule, "propagate") and hasattr(rule, "resize")):
        raise TypeError(
            "`rule` must be 'elementwise' or an object with `propagate` and `resize` methods, "
            f"got {rule!r}"
        )
    RULES[name] = rule if isinstance(rule, Rule) else _UserRule(rule)


class _UserRule(Rule):
    """A user's object with ``propagate`` and ``resize``; the rest from ``Rule``."""

    def __init__(self, user: Any):
        self.user = user

    def propagate(self, eqn: Any, view: Any) -> None:
        self.user.propagate(eqn, view)

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        return self.user.resize(eqn, r, invals)
