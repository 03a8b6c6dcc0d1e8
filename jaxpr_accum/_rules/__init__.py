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
    shape,
)
from jaxpr_accum._rules.elementwise import Elementwise
from jaxpr_accum._table import RULES, Rule, resolve


def register_rule(primitive: Any, rule: Any) -> None:
    """Tell the rewriter how ``primitive`` treats the axis.

    Until a primitive has a rule, it is a barrier: the region stops there and ``explain``
    says "primitive `X` is not known to be chunkable; register a rule with
    `ja.register_rule`". The registration is global (per process) and applies to functions
    planned afterwards. Unlike a ``custom_vjp`` inside your function, which is analysed, a
    registered rule is taken at its word: a wrong one can make a result wrong, so check the
    function with ``jaxpr_accum.testing`` afterwards.

    A rule object needs no base class; it has two methods:

    - ``propagate(eqn, view)``: ``view.in_loc(i)`` / ``view.out_loc(j)`` give where the axis
      sits in operand ``i`` / result ``j`` (``None``, or a named tuple ``(dim, inner,
      outer)``: dimension ``dim`` has length ``outer * N * inner``; ``outer > 1`` is only
      shown to an object with the attribute ``middle_factor_ok = True``). Record what
      follows with ``view.set_in(i, loc)`` / ``view.set_out(j, loc)``, or declare
      ``view.reduce(j, kind)`` (result ``j`` reduces over the axis with monoid ``"sum"``,
      ``"max"``, ``"min"``, ...), ``view.barrier(reason)`` or ``view.hoist(reason)`` (exact
      only on the full axis: run before the loop). Propagation runs in both directions until
      nothing changes, so add only facts that hold whatever is learnt later.
    - ``resize(eqn, r, invals) -> list``: re-emit the equation on chunk-sized inputs
      ``invals`` and return its outputs. ``r.k`` is the chunk length, ``r.start`` the
      (traced) index of the chunk's first position, ``r.in_locs`` / ``r.out_locs`` the axis
      positions.

    Args:
        primitive: A JAX primitive (``jax.extend.core.Primitive``), or the name of one of
            the installed JAX's own primitives.
        rule: ``"elementwise"`` (the primitive acts on each position independently, and all
            its full-rank operands have the output's shape; operands of rank 0 or of size 1
            along the axis are broadcast), or a rule object as above.

    Returns:
        None.

    Raises:
        ValueError: ``primitive`` is a name that no primitive of the installed JAX has.
        TypeError: ``rule`` is neither ``"elementwise"`` nor an object with ``propagate``
            and ``resize`` methods.

    Examples:
        >>> import jax.numpy as jnp
        >>> import jaxpr_accum as ja
        >>> from jax.extend.core import Primitive
        >>> from jax.interpreters import mlir
        >>> def _softsign(x):
        ...     return x / (1 + jnp.abs(x))
        >>> softsign_p = Primitive("softsign")
        >>> softsign_p.def_impl(_softsign)
        <function _softsign at ...>
        >>> _ = softsign_p.def_abstract_eval(lambda x: x)
        >>> mlir.register_lowering(softsign_p, mlir.lower_fun(_softsign, multiple_results=False))
        >>> ja.register_rule(softsign_p, "elementwise")
        >>> sf = ja.serialize_axis(lambda x: jnp.sum(softsign_p.bind(x)), chunk=4, argnums=0)
        >>> sf.explain(jnp.ones((10, 3))).stops
        []
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
