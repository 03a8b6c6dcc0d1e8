"""Per-primitive rules, one module per primitive family; importing this package fills the table."""

from jaxpr_accum._rules import (  # noqa: E402, F401  (registration side effects)
    contraction,
    control_flow,
    custom_derivatives,
    elementwise,
    indexing,
    random,
    reduction,
    shape,
)
from jaxpr_accum._rules.base import (
    RULES,
    UNKNOWN,
    AxisLoc,
    Barrier,
    Rule,
    passed_through,
    register,
    register_rule,
    rule_for,
)

__all__ = [
    "RULES",
    "UNKNOWN",
    "AxisLoc",
    "Barrier",
    "Rule",
    "passed_through",
    "register",
    "register_rule",
    "rule_for",
]
