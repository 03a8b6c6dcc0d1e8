"""``custom_jvp_call`` and ``custom_vjp_call``: chunked only when their rules are proven to be.

Custom derivative rules are analysed, never trusted. The primal function is analysed as a
sub-jaxpr linked to the equation's operands and results, like any call. Once the analysis
has converged, ``finalize`` traces each carrying call's rules *at the call's full shapes*
and analyses them with the same axis analysis, seeded at both ends:

- ``custom_jvp``: the JVP rule, from the primals' and tangents' positions to the outputs'
  (a tangent sits where its primal does);
- ``custom_vjp``: the forward rule, from the primals to the primal outputs (the residuals'
  positions are found), and the backward rule, from the residuals and the output cotangents
  to the input cotangents (a cotangent sits where its primal does).

A rule that mixes positions along the axis makes the call a barrier (it runs unchunked,
exactly, and ``explain`` names the function and the user's line). Mixing is: a barrier inside
the rule; any reduction over the axis in a JVP or forward rule (a batch statistic, a residual
that is a mean over the axis); in a backward rule, any reduction except the *sum* that forms
the cotangent of an input without the axis (a weight gradient ``x.T @ g``), handed out
through linear, structural equations only: per-chunk partials of such a sum add up to the
full cotangent, which is exactly what the chunk loop accumulates.

At chunk size the call is re-emitted through ``jax.custom_jvp`` / ``jax.custom_vjp`` whose
rules are the analysed full-size jaxprs *resized*, never the user's Python rule called at
chunk size: a rule that reads ``g.shape[0]`` computes what it computed at full size.

Invariant: a custom call in the chunked body has rules whose every equation is chunkable
under the analysis that ``resize`` uses; no check is deferred to differentiation time,
except for the rules of a call nested in its own rule (recursion), checked when first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._axes import Analysis
from jaxpr_accum._compat import ClosedJaxpr, Literal
from jaxpr_accum._errors import SerializeError
from jaxpr_accum._resize import Resizer
from jaxpr_accum._rules.control_flow import link_call
from jaxpr_accum._table import Rule, register, rule_for

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

RESIDUAL = object()  # an output position of a rule whose axis position is free (a residual)

_ACTIVE: set = set()  # identities of the custom functions whose rules are being analysed


def _nondiff(v: Any) -> bool:
    return not jnp.issubdtype(v.aval.dtype, jnp.inexact)


def _zero_tangent(x: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return _compat.zeros_float0(x.shape)


def is_custom_vjp(eqn: Any) -> bool:
    return rule_for(eqn.primitive) is CUSTOM_VJP


def function_name(eqn: Any) -> str:
    """The user's name of the custom function (``<unknown>`` when JAX kept none)."""
    return _compat.custom_call_identity(eqn)[0]


def _identity(eqn: Any) -> tuple:
    return (_compat.custom_call_identity(eqn)[1], tuple(str(v.aval) for v in eqn.invars))


@contextlib.contextmanager
def _analysing(eqn: Any) -> Iterator[bool]:
    """Yields False when ``eqn``'s function is already being analysed (a rule that calls
    its own function): its nested call then keeps its rules unchecked until first used."""
    ident = _identity(eqn)
    if ident in _ACTIVE:
        yield False
        return
    _ACTIVE.add(ident)
    try:
        yield True
    finally:
        _ACTIVE.discard(ident)


@dataclasses.dataclass
class CheckedRule:
    """A rule's full-size jaxpr and its axis analysis; ``problem`` is why it cannot run per
    chunk (``(equation or None, reason)``), or None."""

    jaxpr: ClosedJaxpr
    analysis: Any
    problem: tuple | None

    def resized(self, r: Any, args: Sequence) -> list:
        return Resizer(self.analysis, r.k, r.start).eval_jaxpr((), self.jaxpr, list(args))


def check_rule(
    jaxpr: ClosedJaxpr,
    size: int,
    in_locs: Sequence,
    out_locs: Sequence,
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
    return CheckedRule(jaxpr, analysis, _first_problem(analysis, inner, out_locs, partial_outputs))


def _first_problem(analysis: Any, inner: Any, out_locs: Sequence, partial_outputs: Sequence):
    for key, reason in analysis.barriers.items():
        if key[1] < 0:  # a seed that cannot hold: the rule moves or drops the axis
            return None, reason
    partials: set = set()  # per-chunk partial sums (and linear maps of them)
    tainted: dict = {}  # anything computed from a reduction over the axis -> that reduction
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
        if v in tainted and not (j < len(partial_outputs) and partial_outputs[j]):
            return tainted[v], "returns a value reduced over the axis"
        if out_locs[j] is None and not isinstance(v, Literal) and analysis.loc((), v) is not None:
            return None, "returns the axis where the primal has none"
    return None


def _is_linear_in_partials(eqn: Any, analysis: Any, partials: set, tainted: set) -> bool:
    prim = eqn.primitive
    operands = list(eqn.invars)

    def is_partial(v: Any) -> bool:
        return not isinstance(v, Literal) and v in partials

    def is_constant(v: Any) -> bool:  # along the axis, and free of any reduction over it
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


class CustomJVP(Rule):
    def children(self, eqn: Any, view: Any) -> list:
        return [(("call_jaxpr",), _compat.custom_call_body(eqn)[0])]

    def propagate(self, eqn: Any, view: Any) -> None:
        call, nc = _compat.custom_call_body(eqn)
        if any(view.in_loc(i) is not None for i in range(nc)):
            view.barrier("a custom-derivative function closes over a value with the axis")
            return
        link_call(view, eqn, ("call_jaxpr",), call, eqn.invars, eqn.outvars)

    def finalize(self, eqn: Any, view: Any) -> None:
        """After convergence: analyse the rules at full size; mixing makes this a barrier."""
        if view.key in view.analysis.barriers:
            return
        with _analysing(eqn) as fresh:
            if not fresh:
                return
            for what, checked, _ in self.checked_rules(eqn, view.analysis, view.key):
                if checked.problem is not None:
                    view.barrier(_describe(eqn, what, checked.problem))
                    return

    def checked_rules(self, eqn: Any, analysis: Any, key: tuple) -> list:
        """``[(what, CheckedRule, extra)]`` for this call's rules, built once per equation
        (``extra``: what re-emitting the rule needs besides its jaxpr)."""
        return analysis.memoize(("rules", key), lambda: self._check(eqn, analysis, key))

    def _locs(self, eqn: Any, analysis: Any, key: tuple) -> tuple[list, list]:
        ctx = key[0]
        nc = _compat.custom_call_body(eqn)[1]
        return (
            [analysis.loc(ctx, v) for v in eqn.invars[nc:]],
            [analysis.loc(ctx, v) for v in eqn.outvars],
        )

    def _check(self, eqn: Any, analysis: Any, key: tuple) -> list:
        nc = _compat.custom_call_body(eqn)[1]
        zeros = [_nondiff(v) for v in eqn.invars[nc:]]
        jvp, out_zeros = _compat.custom_jvp_rule_jaxpr(eqn, zeros)
        in_locs, out_locs = self._locs(eqn, analysis, key)
        tangent_in = [loc for loc, z in zip(in_locs, zeros, strict=True) if not z]
        tangent_out = [loc for loc, z in zip(out_locs, out_zeros, strict=True) if not z]
        checked = check_rule(jvp, analysis.size, in_locs + tangent_in, out_locs + tangent_out)
        return [("JVP rule", checked, out_zeros)]

    def _rules(self, eqn: Any, r: Any) -> dict:
        """``{what: (CheckedRule, extra)}``, every rule checked (a call nested in its own rule
        is first checked here)."""
        rules = {}
        for what, checked, extra in self.checked_rules(eqn, r.analysis, r.key):
            if checked.problem is not None:
                raise SerializeError(_describe(eqn, what, checked.problem))
            rules[what] = (checked, extra)
        return rules

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        call, nc = _compat.custom_call_body(eqn)
        consts, args = invals[:nc], invals[nc:]
        zeros = [_nondiff(v) for v in eqn.invars[nc:]]
        n_out = len(eqn.outvars)

        @jax.custom_jvp
        def fun(*a: Any) -> tuple:
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        @fun.defjvp
        def fun_jvp(primals: tuple, tangents: tuple) -> tuple:
            checked, out_zeros = self._rules(eqn, r)["JVP rule"]
            nonzero = [t for t, z in zip(tangents, zeros, strict=True) if not z]
            outs = checked.resized(r, [*primals, *nonzero])
            primal_out, rest = outs[:n_out], iter(outs[n_out:])
            tangent_out = [
                _zero_tangent(p) if z else next(rest)
                for p, z in zip(primal_out, out_zeros, strict=True)
            ]
            return tuple(primal_out), tuple(tangent_out)

        with _compat.user_context(eqn):
            return list(fun(*args))


class CustomVJP(CustomJVP):
    def _check(self, eqn: Any, analysis: Any, key: tuple) -> list:
        nc = _compat.custom_call_body(eqn)[1]
        fwd_of, bwd_fn = _compat.custom_vjp_parts(eqn)
        in_locs, out_locs = self._locs(eqn, analysis, key)
        nonzeros = [not _nondiff(v) for v in eqn.invars[nc:]]
        fwd, (n_res, input_fwds) = fwd_of(nonzeros)
        n_res_out = n_res - sum(f is not None for f in input_fwds)
        fwd_checked = check_rule(fwd, analysis.size, in_locs, [RESIDUAL] * n_res_out + out_locs)
        if fwd_checked.problem is not None:
            return [("forward rule", fwd_checked, None)]

        # The residuals, in the order the backward rule takes them, and where the axis is.
        outer_locs = [None] * nc + in_locs
        fwd_outs = iter(fwd.jaxpr.outvars[:n_res_out])
        res_avals, res_locs = [], []
        for f in input_fwds:
            if f is None:
                v = next(fwd_outs)
                res_avals.append(v.aval)
                res_locs.append(None if isinstance(v, Literal) else fwd_checked.analysis.loc((), v))
            else:
                res_avals.append(eqn.invars[f].aval)
                res_locs.append(outer_locs[f])
        ct_avals = [_compat.cotangent_aval(v.aval) for v in eqn.outvars]
        bwd, returned = _compat.trace_custom_vjp_bwd(bwd_fn, [*res_avals, *ct_avals])
        arg_locs = [loc for loc, kept in zip(in_locs, returned, strict=True) if kept]
        bwd_checked = check_rule(
            bwd,
            analysis.size,
            res_locs + out_locs,
            arg_locs,
            partial_outputs=[loc is None for loc in arg_locs],
        )
        return [
            ("forward rule", fwd_checked, (n_res_out, input_fwds)),
            ("backward rule", bwd_checked, returned),
        ]

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        call, nc = _compat.custom_call_body(eqn)
        consts, args = invals[:nc], invals[nc:]

        @jax.custom_vjp
        def fun(*a: Any) -> tuple:
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        def fwd(*a: Any) -> tuple:
            fwd_checked, (n_res_out, input_fwds) = self._rules(eqn, r)["forward rule"]
            outs = fwd_checked.resized(r, a)
            res_out = iter(outs[:n_res_out])
            everything = [*consts, *a]
            res = [next(res_out) if f is None else everything[f] for f in input_fwds]
            return tuple(outs[n_res_out:]), tuple(res)

        def bwd(res: tuple, cts: tuple) -> tuple:
            bwd_checked, returned = self._rules(eqn, r)["backward rule"]
            outs = iter(bwd_checked.resized(r, [*res, *cts]))
            return tuple(next(outs) if kept else None for kept in returned)

        fun.defvjp(fwd, bwd)
        with _compat.user_context(eqn):
            return list(fun(*args))


def _describe(eqn: Any, what: str, problem: tuple) -> str:
    where, reason = problem
    at = "" if where is None else f": `{where.primitive.name}` at {_compat.source_line(where)}"
    return (
        f"the {what} of custom-derivative function `{function_name(eqn)}` mixes positions "
        f"along the axis ({reason}{at}); the call runs unchunked"
    )


CUSTOM_JVP = register("custom_jvp_call", CustomJVP())
CUSTOM_VJP = register("custom_vjp_call", CustomVJP())
