"""Checking a custom derivative rule: is its full-size jaxpr chunkable, position by position?

``check_rule`` analyses a rule's jaxpr (a JVP, a custom VJP's forward or backward, traced at
the call's full shapes) with the same axis analysis as the program, seeded at both ends with
where the axis must sit, and returns the first *problem*, if any: a barrier inside it; a
reduction over the axis, except the *sum* that forms the cotangent of an input without the
axis, handed out through linear, structural equations only (``partial_outputs``); a result
that drops or moves the axis. ``CheckedRule.resized`` re-emits the analysed jaxpr at chunk
size. Invariant: a rule without a problem computes, chunk by chunk, exactly its full-size
results (the partial sums adding up to the full ones).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import TypeAlias

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array, Atom, ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._resize import Resizer
from jaxpr_accum._engine._view import EqnResize

# Equations that map a per-chunk partial sum linearly onto another (so the partials of the
# result still add up to the full result). Binary ones need every operand to be a partial,
# except ``mul``/``div`` by a value that neither carries the axis nor depends on a reduction.
_LINEAR_UNARY = _compat.primitives(
    "broadcast_in_dim convert_element_type copy neg reduce_precision reduce_sum "
    "reshape squeeze transpose"
)
_LINEAR_SUM = _compat.primitives("add add_any sub")
_LINEAR_SCALE = {  # operands that may be the partial
    _compat.primitive("mul"): (0, 1),
    _compat.primitive("div"): (0,),
}


class Residual(enum.Enum):
    """An output position of a rule whose axis position is free (a residual)."""

    FREE = "free"


RESIDUAL = Residual.FREE
Problem: TypeAlias = tuple[JaxprEqn | None, str]  # (the equation, or None: the rule; why)


@dataclasses.dataclass
class CheckedRule:
    """A rule's full-size jaxpr and its axis analysis; ``problem`` is why it cannot run per
    chunk (``(equation or None, reason)``), or None."""

    jaxpr: ClosedJaxpr
    analysis: Analysis
    problem: Problem | None

    def resized(
        self, r: EqnResize, args: Sequence[Array], start: Array | int | None = None
    ) -> list[Array]:
        """The rule at ``r``'s chunk, whose first position is ``start`` (``r.start`` where
        None)."""
        at = r.start if start is None else start
        return Resizer(self.analysis, r.k, at).eval_jaxpr((), self.jaxpr, list(args))


def check_rule(
    jaxpr: ClosedJaxpr,
    size: int,
    in_locs: Sequence[AxisLoc | None],
    out_locs: Sequence[AxisLoc | Residual | None],
    partial_outputs: Sequence[bool] = (),
) -> CheckedRule:
    """Analyse a rule's jaxpr seeded with its inputs' and outputs' axis positions.

    ``out_locs[j]`` is where output ``j`` must carry the axis (None: nowhere), or
    ``RESIDUAL``: wherever the analysis finds it.
    ``partial_outputs[j]``: output ``j`` may be a sum over the axis (the cotangent of an
    input without it).
    """
    inner = jaxpr.jaxpr
    analysis = Analysis(inner, size)
    seeds = [(v, loc) for v, loc in zip(inner.invars, in_locs, strict=True) if loc is not None]
    for v, loc in zip(inner.outvars, out_locs, strict=True):
        if loc is None or loc is RESIDUAL:
            continue
        if isinstance(v, Literal):
            return CheckedRule(jaxpr, analysis, (None, "returns a constant where the axis is"))
        seeds.append((v, loc))
    analysis.run(seeds)
    problem = _input_read_with_the_axis(analysis, inner, in_locs) or _first_problem(
        analysis, inner, out_locs, partial_outputs
    )
    return CheckedRule(jaxpr, analysis, problem)


def _input_read_with_the_axis(
    analysis: Analysis, inner: Jaxpr, in_locs: Sequence[AxisLoc | None]
) -> Problem | None:
    """An input that the caller gives without the axis, which the rule reads as carrying it
    (a forward rule's residual ``jnp.arange(n)``, computed whole, meeting the cotangent's
    rows in the backward rule): per chunk the caller would pass the whole value where the
    rule takes the chunk's rows."""
    for j, (v, loc) in enumerate(zip(inner.invars, in_locs, strict=True)):
        if loc is None and analysis.loc((), v) is not None:
            return None, (
                f"reads its input {j} ({v.aval.str_short()}) along the axis, which the call "
                "computes whole"
            )
    return None


def _first_problem(
    analysis: Analysis,
    inner: Jaxpr,
    out_locs: Sequence[AxisLoc | Residual | None],
    partial_outputs: Sequence[bool],
) -> Problem | None:
    for key, reason in analysis.barriers.items():
        if key[1] < 0:  # a seed that cannot hold: the rule moves or drops the axis
            return None, reason
    partials: set[Var] = set()  # per-chunk partial sums (and linear maps of them)
    tainted: dict[
        Var, JaxprEqn
    ] = {}  # anything computed from a reduction over the axis -> that reduction
    for idx, eqn in enumerate(inner.eqns):
        if not analysis.touches((), eqn) and not any(
            v in tainted for v in eqn.invars if not isinstance(v, Literal)
        ):
            continue
        found = analysis.blocker((), idx, eqn)
        if found is not None:
            return found
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        reduced = analysis.reductions.get(((), idx), {})
        if reduced:
            if any(v in tainted for v in ins) or any(k != "sum" for k in reduced.values()):
                return eqn, "reduces over the axis"
            partials.update(eqn.outvars[j] for j in reduced)
            tainted.update(dict.fromkeys(eqn.outvars, eqn))
            continue
        if not any(v in tainted for v in ins):
            continue
        origin = next(tainted[v] for v in ins if v in tainted)
        if not _is_linear_in_partials(eqn, analysis, partials, tainted) or any(
            analysis.loc((), v) is not None for v in eqn.outvars
        ):
            return origin, (
                f"a reduction over the axis feeds `{eqn.primitive.name}` at "
                f"{_compat.source_line(eqn)}"
            )
        partials.update(eqn.outvars)
        tainted.update(dict.fromkeys(eqn.outvars, origin))
    for j, v in enumerate(inner.outvars):
        if isinstance(v, Literal):  # a constant output (a rule's residual ``3.0``)
            continue
        if v in tainted and not (j < len(partial_outputs) and partial_outputs[j]):
            return tainted[v], "returns a value reduced over the axis"
        if out_locs[j] is None and analysis.loc((), v) is not None:
            return None, "returns the axis where the primal has none"
    return None


def _is_linear_in_partials(
    eqn: JaxprEqn, analysis: Analysis, partials: set[Var], tainted: dict[Var, JaxprEqn]
) -> bool:
    prim = eqn.primitive
    operands = list(eqn.invars)

    def is_partial(v: Atom) -> bool:
        return not isinstance(v, Literal) and v in partials

    def is_constant(v: Atom) -> bool:  # along the axis, and free of any reduction over it
        return isinstance(v, Literal) or (v not in tainted and analysis.loc((), v) is None)

    if prim in _LINEAR_UNARY:
        return is_partial(operands[0]) and all(is_constant(v) for v in operands[1:])
    if prim in _LINEAR_SUM:
        return all(is_partial(v) for v in operands)
    if prim in _LINEAR_SCALE:
        return any(
            is_partial(operands[i])
            and all(is_constant(v) for k, v in enumerate(operands) if k != i)
            for i in _LINEAR_SCALE[prim]
        )
    return False


def describe(name_of: Callable[[JaxprEqn], str], eqn: JaxprEqn, what: str, problem: Problem) -> str:
    """Why the custom call ``eqn`` (its function's name: ``name_of(eqn)``) runs unchunked:
    its rule ``what``'s first problem and where it is. A problem at a custom call inside the
    rule (JAX's ``odeint`` calls itself in its forward rule) already says this of that call:
    it is given once, not nested. A line JAX kept no user frame for is left out."""
    where, reason = problem
    name = name_of(eqn)
    if where is not None and where.primitive.name in ("custom_jvp_call", "custom_vjp_call"):
        inner = name_of(where)
        return reason if inner == name else f"`{name}` calls `{inner}`, and {reason}"
    at = ""
    if where is not None:
        line = _compat.source_line(where)
        at = f": `{where.primitive.name}`" + ("" if line == "<unknown>" else f" at {line}")
    return (
        f"the {what} of custom-derivative function `{name}` mixes positions along the axis "
        f"({reason}{at}); the call runs unchunked"
    )
