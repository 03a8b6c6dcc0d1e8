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

    ``primitive``: a JAX primitive or the name of one of the installed JAX's primitives (an
    unknown name is a ``ValueError``). ``rule``: ``"elementwise"`` (acts on each position
    independently, all full-rank operands share the output's shape), or an object with
    ``propagate(eqn, view)`` and ``resize(eqn, r, invals)`` methods (see ``_table.Rule``).
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
