"""Elementwise primitives: every operand of full rank shares the output's axis position.

Operands may be rank-0 or have size 1 at the axis dimension (implicit broadcasting); those
do not carry the axis and stay as they are at chunk size. Nothing changes shape on resize.
"""

from __future__ import annotations

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, JaxprEqn
from jaxpr_accum._engine._table import Rule, register, shared_loc
from jaxpr_accum._engine._view import EqnResize, View


class Elementwise(Rule):
    middle_factor_ok = True  # position by position: where the axis sits does not matter
    elementwise = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        out_shape = _compat.shape_of(eqn.outvars[0])
        loc = shared_loc(eqn, view, range(len(eqn.invars)))
        if loc is None:
            return
        for i, v in enumerate(eqn.invars):
            shape = getattr(v.aval, "shape", ())
            if len(shape) == len(out_shape) and shape[loc.dim] == out_shape[loc.dim]:
                view.set_in(i, loc)
        for j in range(len(eqn.outvars)):
            view.set_out(j, loc)


class LayoutOnly(Elementwise):
    """Sharding annotations: the value is unchanged. Inside the chunk body they are dropped:
    the chunk's layout is the loop's business, and a spec written for the full axis need
    not divide a chunk."""

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        return list(invals)


class PerOperandIdentity(Rule):
    """``optimization_barrier``-like: output ``i`` is operand ``i``."""

    row_map_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        for i in range(len(eqn.invars)):
            view.set_out(i, view.in_loc(i))
            view.set_in(i, view.out_loc(i))


class Placement(PerOperandIdentity):
    """``device_put``: each value unchanged; inside the chunk body the placement is the
    loop's (as for sharding annotations), so the chunk is passed through."""

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        return list(invals)


class NoAxisOut(Rule):
    """No result ever carries the axis (``dce_sink`` has none; ``empty2`` is a scalar): the
    equation is fine per chunk."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        pass


class BitcastConvert(Rule):
    """``bitcast_convert_type`` may add or drop a trailing dimension; others map 1:1."""

    row_map_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        rank = min(len(_compat.shape_of(eqn.invars[0])), len(_compat.shape_of(eqn.outvars[0])))
        for loc, setter in ((view.in_loc(0), view.set_out), (view.out_loc(0), view.set_in)):
            if loc is None:
                continue
            if loc.dim >= rank:
                view.barrier("`bitcast_convert_type` changes the width along the axis")
                return
            setter(0, loc)


ELEMENTWISE_PRIMITIVES = """
neg sign floor ceil round is_finite exp exp2 log log1p expm1 tanh logistic sin cos tan asin
acos atan sinh cosh asinh acosh atanh sqrt rsqrt cbrt abs not population_count clz real imag
conj complex add sub mul div rem pow max min nextafter atan2 and or xor shift_left
shift_right_logical shift_right_arithmetic eq ne lt le gt ge select_n clamp
convert_element_type integer_pow erf erfc erf_inv lgamma digamma polygamma zeta igamma
igammac igamma_grad_a bessel_i0e bessel_i1e regularized_incomplete_beta
square reduce_precision copy stop_gradient add_any pvary mulhi eq_to le_to lt_to name stage
""".split()

register(ELEMENTWISE_PRIMITIVES, Elementwise())
register("optimization_barrier", PerOperandIdentity())
register(["sharding_constraint", "reshard"], LayoutOnly())
register("device_put", Placement())
register(["dce_sink", "empty2"], NoAxisOut())
register("bitcast_convert_type", BitcastConvert())
