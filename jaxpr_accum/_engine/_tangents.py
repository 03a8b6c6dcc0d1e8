"""Which outputs of a list of equations have a nonzero tangent, read off the equations
without tracing their JVP, where every equation's rule is known here.

``reached_outputs(eqns, invars, outvars, perturbed)`` runs one forward pass: a value is
*reached* when JAX's JVP would give it a tangent that is not a symbolic zero, starting from
the ``perturbed`` inputs. Per equation:

- no operand reached: no output is (JAX binds such an equation outside the JVP, whatever
  its primitive);
- a value of a dtype other than floating or complex (integers, booleans, keys) is never
  reached: its tangent is ``float0``;
- ``PROPAGATE``: every inexact output is reached (JAX's JVP rules of these primitives sum
  the contributions of the operands whose tangents are not symbolic zeros, or are linear
  in their tangent);
- ``BLOCK``: no output is reached (``stop_gradient`` and JAX's zero JVPs: ``floor``,
  ``sign``, ``bitcast_convert_type``, ...).

Any other primitive with a reached operand and an inexact output (a loop, a call, a custom
rule) answers None: the caller then asks JAX (``_compat.nonzero_tangents``). The answer,
where given, is JAX's own (tests compare both, rule by rule and on random programs), so the
symbolic zeros an output gets are the ones JAX would give the original.
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._compat import JaxprEqn, Literal

PROPAGATE = frozenset({
    # arithmetic and elementwise functions
    "add", "sub", "mul", "div", "neg", "max", "min", "abs", "square", "integer_pow", "pow",
    "exp", "exp2", "expm1", "log", "log1p", "tanh", "logistic", "sin", "cos", "tan", "sqrt",
    "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "atan2", "clamp", "select_n",
    "convert_element_type", "copy", "reduce_precision",
    # reductions and cumulative sums
    "reduce_sum", "reduce_max", "reduce_min", "cumsum", "dot_general",
    # moving data
    "broadcast_in_dim", "reshape", "transpose", "squeeze", "concatenate", "pad", "slice",
    "dynamic_slice", "dynamic_update_slice", "gather", "rev",
})  # fmt: skip

BLOCK = frozenset({
    "stop_gradient", "sign", "floor", "ceil", "round", "bitcast_convert_type",
})  # fmt: skip


def reached_outputs(
    eqns: Sequence[JaxprEqn], invars: Sequence, outvars: Sequence, perturbed: Sequence[bool]
) -> list[bool] | None:
    """Per variable in ``outvars``: reached from the ``invars`` flagged in ``perturbed``
    through ``eqns`` (in program order), or None where an equation's rule is not known."""
    reached = {v for v, p in zip(invars, perturbed, strict=True) if p and has_float_dtype(v)}
    for eqn in eqns:
        if not any(not isinstance(v, Literal) and v in reached for v in eqn.invars):
            continue
        inexact = [v for v in eqn.outvars if has_float_dtype(v)]
        name = eqn.primitive.name
        if not inexact or name in BLOCK:
            continue
        if name not in PROPAGATE:
            return None
        reached.update(inexact)
    return [not isinstance(v, Literal) and v in reached for v in outvars]
