"""Per-primitive rules, one module per primitive family: plugins of the rule table.

Importing this package fills ``jaxpr_accum._engine._table.RULES``. Rules import the engine
(``_lattice``, ``_table``, ``_axes``, ``_resize``, ``_compat``); the engine imports no rule.
``register_rule`` is the public way to add one.
"""

from __future__ import annotations

from typing import Literal, Protocol

from jaxpr_accum._compat import Array, ClosedJaxpr, Jaxpr, JaxprEqn, Primitive
from jaxpr_accum._engine._table import RULES, Rule, resolve
from jaxpr_accum._engine._view import EqnResize, View
from jaxpr_accum._rules import (  # noqa: F401  (registration side effects)
    blocks,
    contraction,
    control_flow,
    custom_derivatives,
    elementwise,
    indexing,
    linalg,
    random,
    reduction,
    rows,
    scatter,
    shape,
)
from jaxpr_accum._rules.elementwise import Elementwise


class RuleLike(Protocol):
    """What ``register_rule`` needs of a rule object (``children`` and ``finalize`` are
    optional, as is the flag ``middle_factor_ok``)."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None: ...

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]: ...


def register_rule(primitive: Primitive | str, rule: RuleLike | Literal["elementwise"]) -> None:
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

    def __init__(self, user: RuleLike):
        self.user = user
        self.middle_factor_ok = bool(getattr(user, "middle_factor_ok", False))

    def finalize(self, eqn: JaxprEqn, view: View) -> None:
        finalize = getattr(self.user, "finalize", None)
        if finalize is not None:
            finalize(eqn, view)

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        self.user.propagate(eqn, view)

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        return self.user.resize(eqn, r, invals)

    def children(self, eqn: JaxprEqn, view: View) -> list[tuple[tuple, Jaxpr | ClosedJaxpr]]:
        children = getattr(self.user, "children", None)
        if children is not None:
            return children(eqn, view)
        return super().children(eqn, view)
