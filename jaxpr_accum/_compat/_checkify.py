"""``jax.experimental.checkify`` through the region: the checks inside it are kept.

``checkify`` traces a function to a jaxpr and interprets it equation by equation, each through
its rule in JAX's table ``error_checks`` (the default rule binds the equation unchanged, so a
primitive of our own without a rule would lose every check inside it). Two rules:

- **the region** (``checks_through``): where the enabled error set has a check that can fire
  inside the region's chunk loop (JAX's own checkify of the loop's jaxpr reports an error
  effect), the equation is replaced by that loop, checkified. The loop is the one with
  checkpointed bodies (``loop_of(params)``), so a derivative taken of the checkified
  function still recomputes each chunk instead of holding the whole axis. Where no check can
  fire, the equation is bound as it is. The loop's equations are those of a chunk loop's name
  scope, which ``_loop_checks`` interprets with one error slot per check site, so the report
  is the original's (as for every chunk loop JAX derives from the region's passes).
- **checkpoint** (``remat_p``): JAX's rule requires the checkified body to close over no
  constant, which fails on the ``dynamic_slice`` that takes a chunk from the whole input
  inside each checkpointed body (its check's bounds are array constants): "too many values
  to unpack". Where the checked body has constants they are passed as leading inputs of
  the checkpoint instead; everywhere else JAX's rule runs unchanged.

Invariants: the values are the loop's, which are the original's; outside ``checkify``
nothing here runs (the unchecked program is unchanged).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._types import ClosedJaxpr, Jaxpr, Params, Primitive

_CHECKIFY = "jax._src.checkify."


def checks_through(p: Primitive, loop_of: Callable[[Params], ClosedJaxpr]) -> None:
    """Register ``p``'s checkify rule: its ``loop_of(params)`` (a ``ClosedJaxpr`` of the same
    inputs and outputs as the equation) checkified, where a check can fire inside it."""
    checkify_jaxpr = internal(_CHECKIFY + "checkify_jaxpr")

    def rule(error: object, enabled_errors: object, *args: object, **params: object) -> tuple:
        loop = loop_of(params)
        if not _error_effects(loop, enabled_errors, args):
            return error, p.bind(*args, **params)
        return checkify_jaxpr(loop, enabled_errors, error, *args)

    internal(_CHECKIFY + "error_checks")[p] = rule


def _error_effects(closed: ClosedJaxpr, enabled_errors: object, args: tuple) -> set:
    """The kinds of error that ``closed``, checkified with ``enabled_errors``, can report."""
    err_vals, err_tree = jax.tree_util.tree_flatten(internal(_CHECKIFY + "init_error"))
    avals = [jax.typeof(x) for x in (*err_vals, *args)]
    to_checked = internal(_CHECKIFY + "jaxpr_to_checkify_jaxpr")
    return to_checked(closed, enabled_errors, err_tree, *avals)[2]


def _checkpoint_keeping_constants() -> None:
    """Wrap JAX's checkify rule of ``remat_p`` so that a checked body with constants takes
    them as inputs (see the module's docstring)."""
    table = internal(_CHECKIFY + "error_checks")
    remat_p = internal("jax._src.ad_checkpoint.remat_p")
    jax_rule = table[remat_p]
    pe = "jax._src.interpreters.partial_eval."
    close_jaxpr, constvars_as_inputs = (
        internal(pe + "close_jaxpr"),
        internal(pe + "convert_constvars_jaxpr"),
    )

    def rule(
        error: object, enabled_errors: object, *args: object, jaxpr: Jaxpr, **params: object
    ) -> object:
        err_vals, err_tree = jax.tree_util.tree_flatten(error)
        avals = [jax.typeof(x) for x in (*err_vals, *args)]
        to_checked = internal(_CHECKIFY + "jaxpr_to_checkify_jaxpr")
        checked, out_tree, _ = to_checked(close_jaxpr(jaxpr), enabled_errors, err_tree, *avals)
        if not checked.consts:
            return jax_rule(error, enabled_errors, *args, jaxpr=jaxpr, **params)
        body = constvars_as_inputs(checked.jaxpr)
        outs = remat_p.bind(*checked.consts, *err_vals, *args, jaxpr=body, **params)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    table[remat_p] = rule


_checkpoint_keeping_constants()
