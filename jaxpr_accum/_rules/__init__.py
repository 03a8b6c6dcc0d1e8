"""Per-primitive rules, one module per primitive family: plugins of the rule table.

Importing this package fills ``jaxpr_accum._table.RULES``. Rules import the engine
(``_lattice``, ``_table``, ``_axes``, ``_resize``, ``_compat``); the engine imports no rule.
``register_rule`` is the public way to add one.
"""

from __future__ import annotations

from typing import Any

from jaxpr_accum._rules import (  # noqa: F401  (registration side effects)
    contraction,
    control_flow,
    custom_derivatives,
    elementwise,
    indexing,
    linalg,
    random,
    reduction,
    rows,
    shape,
)
from jaxpr_accum._rules.elementwise import Elementwise
from jaxpr_accum._table import RULES, Rule, resolve


def register_rule(primitive: Any, rule: Any) -> None:
    """Tell the rewriter how ``primitive`` treats the axis.

    Until then the primitive is a barrier: ``explain`` says it "is not known to be chunkable".
    The registration is global and applies to functions planned afterwards. Unlike a
    ``custom_vjp`` in your function, which is analysed, a registered rule is taken at its word:
    check the function with ``jaxpr_accum.testing`` afterwards.

    A rule object needs no base class, only two methods:

    - ``propagate(eqn, view)``: ``view.in_loc(i)`` / ``view.out_loc(j)`` give where the axis
      sits in operand ``i`` / result ``j`` (``None``, or ``(dim, inner, outer)``: dimension
      ``dim`` has length ``outer * N * inner``; ``outer > 1`` only with the attribute
      ``middle_factor_ok = True``). Record facts with ``view.set_in(i, loc)`` /
      ``view.set_out(j, loc)``, ``view.reduce(j, kind)`` (a ``"sum"``, ``"max"``, ...
      over the axis), ``view.barrier(reason)`` or ``view.hoist(reason)`` (run before the
      loop). Propagation runs both ways until nothing changes: add only facts that always hold.
    - ``resize(eqn, r, invals) -> list``: the equation's outputs on chunk-sized ``invals``;
      ``r.k`` is the chunk length, ``r.start`` the chunk's (traced) first position,
      ``r.in_locs`` / ``r.out_locs`` the axis positions.

    Args:
        primitive: A JAX primitive, or the name of one of the installed JAX's primitives.
        rule: ``"elementwise"`` (each position independently; full-rank operands have the
            output's shape, the others are broadcast), or a rule object as above.

    Raises:
        ValueError: ``primitive`` names no primitive of the installed JAX.
        TypeError: ``primitive`` is not a primitive or a name, or ``rule`` is not a rule.

    Examples:
        >>> ja.register_rule(softsign_p, "elementwise")  # softsign_p: your own Primitive
    """
    key = resolve(primitive)
    if rule == "elementwise":
        rule = Elementwise()
    if not (hasattr(rule, "propagate") and hasattr(rule, "resize")):
        raise TypeError(
            "`rule` must be 'elementwise' or an object with `propagate` and `resize` methods, "
            f"got {rule!r}"
        )
    RULES[key] = rule if isinstance(rule, Rule) else _UserRule(rule)


class _UserRule(Rule):
    """A user's object with ``propagate`` and ``resize`` (and optionally ``children`` /
    ``finalize``); the rest from ``Rule``."""

    def __init__(self, user: Any):
        self.user = user
        self.middle_factor_ok = bool(getattr(user, "middle_factor_ok", False))

    def finalize(self, eqn: Any, view: Any) -> None:
        if hasattr(self.user, "finalize"):
            self.user.finalize(eqn, view)

    def propagate(self, eqn: Any, view: Any) -> None:
        self.user.propagate(eqn, view)

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        return self.user.resize(eqn, r, invals)

    def children(self, eqn: Any, view: Any) -> list:
        if hasattr(self.user, "children"):
            return self.user.children(eqn, view)
        return super().children(eqn, view)
