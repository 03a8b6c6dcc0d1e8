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
from collections.abc import Iterable, Iterator
from typing import TypeAlias

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._base._errors import SerializeError
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array, Atom, ClosedJaxpr, Float0Array, Jaxpr, JaxprEqn, Literal
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._table import Rule, register
from jaxpr_accum._engine._view import EqnKey, EqnResize, View
from jaxpr_accum._rules.control_flow import link_call
from jaxpr_accum._rules.rule_check import (
    RESIDUAL,
    CheckedRule,
    Residual,
    check_rule,
    describe,
)

Identity: TypeAlias = str  # where the function is defined
_ACTIVE: set[Identity] = set()  # the custom functions whose rules are being analysed

# What re-emitting a checked rule needs besides its jaxpr: the JVP rule's zero output
# tangents; the forward rule's residual count and forwarded operands; the backward rule's
# returned cotangents (None: a forward rule with a problem, never re-emitted).
Extra: TypeAlias = list[bool] | tuple[int, list[int | None]] | None
Checked: TypeAlias = tuple[str, CheckedRule, Extra]  # (which rule, its check, extra)
Arrays: TypeAlias = tuple[Array, ...]
Tangents: TypeAlias = tuple[Array | Float0Array, ...]  # an integer's tangent: a float0 array


def _nondiff(v: Atom) -> bool:
    return not has_float_dtype(v)


def _zero_tangent(x: Array) -> Array | Float0Array:
    if has_float_dtype(x):
        return jnp.zeros_like(x)
    return _compat.zeros_float0(x.shape)


def function_name(eqn: JaxprEqn) -> str:
    """The user's name of the custom function (``<unknown>`` when JAX kept none)."""
    return _compat.custom_call_identity(eqn)[0]


def _identity(eqn: JaxprEqn) -> Identity:
    return _compat.custom_call_identity(eqn)[1]


@contextlib.contextmanager
def _analysing(eqn: JaxprEqn) -> Iterator[bool]:
    """Yields False when ``eqn``'s function is already being analysed (a rule that calls
    its own function, at any shapes: ``odeint``'s backward rule solves a larger, augmented
    system with ``odeint``, a tower without end): its nested call then keeps its rules
    unchecked until first used."""
    ident = _identity(eqn)
    if ident in _ACTIVE:
        yield False
        return
    _ACTIVE.add(ident)
    try:
        yield True
    finally:
        _ACTIVE.discard(ident)


class CustomJVP(Rule):
    def children(self, eqn: JaxprEqn, view: View) -> list[tuple[tuple, Jaxpr | ClosedJaxpr]]:
        return [(("call_jaxpr",), _compat.custom_call_body(eqn)[0])]

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        call, nc = _compat.custom_call_body(eqn)
        if any(view.in_loc(i) is not None for i in range(nc)):
            view.barrier("a custom-derivative function closes over a value with the axis")
            return
        link_call(view, eqn, ("call_jaxpr",), call, eqn.invars, eqn.outvars)

    def finalize(self, eqn: JaxprEqn, view: View) -> None:
        """After convergence: analyse the rules at full size; mixing makes this a barrier."""
        if view.key in view.analysis.barriers:
            return
        with _analysing(eqn) as fresh:
            if not fresh:
                return
            for what, checked, _ in self.checked_rules(eqn, view.analysis, view.key):
                if checked.problem is not None:
                    view.barrier(describe(function_name, eqn, what, checked.problem))
                    return

    def checked_rules(self, eqn: JaxprEqn, analysis: Analysis, key: EqnKey) -> list[Checked]:
        """``[(what, CheckedRule, extra)]`` for this call's rules, built once per equation
        (``extra``: what re-emitting the rule needs besides its jaxpr)."""
        return analysis.memoize(("rules", key), lambda: self._check(eqn, analysis, key))

    def _locs(
        self, eqn: JaxprEqn, analysis: Analysis, key: EqnKey
    ) -> tuple[list[AxisLoc | None], list[AxisLoc | None]]:
        ctx = key[0]
        nc = _compat.custom_call_body(eqn)[1]
        return (
            [analysis.loc(ctx, v) for v in eqn.invars[nc:]],
            [analysis.loc(ctx, v) for v in eqn.outvars],
        )

    def _check(self, eqn: JaxprEqn, analysis: Analysis, key: EqnKey) -> list[Checked]:
        nc = _compat.custom_call_body(eqn)[1]
        zeros = [_nondiff(v) for v in eqn.invars[nc:]]
        jvp, out_zeros = _compat.custom_jvp_rule_jaxpr(eqn, zeros)
        in_locs, out_locs = self._locs(eqn, analysis, key)
        tangent_in = [loc for loc, z in zip(in_locs, zeros, strict=True) if not z]
        tangent_out = [loc for loc, z in zip(out_locs, out_zeros, strict=True) if not z]
        checked = check_rule(jvp, analysis.size, in_locs + tangent_in, out_locs + tangent_out)
        return [("JVP rule", checked, out_zeros)]

    def _rules(self, eqn: JaxprEqn, r: EqnResize) -> dict[str, tuple[CheckedRule, Extra]]:
        """``{what: (CheckedRule, extra)}``, every rule checked (a call nested in its own rule
        is first checked here)."""
        rules = {}
        for what, checked, extra in self.checked_rules(eqn, r.analysis, r.key):
            if checked.problem is not None:
                raise SerializeError(describe(function_name, eqn, what, checked.problem))
            rules[what] = (checked, extra)
        return rules

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        call, nc = _compat.custom_call_body(eqn)
        consts, args = invals[:nc], invals[nc:]
        zeros = [_nondiff(v) for v in eqn.invars[nc:]]
        n_out = len(eqn.outvars)

        @jax.custom_jvp
        def fun(*a: Array) -> tuple[Array, ...]:
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        @fun.defjvp  # type: ignore[arg-type]  # JAX types a tangent as its primal (not float0)
        def fun_jvp(primals: Arrays, tangents: Arrays) -> tuple[Arrays, Tangents]:
            checked, out_zeros = self._rules(eqn, r)["JVP rule"]
            assert isinstance(out_zeros, list)
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
    def _check(self, eqn: JaxprEqn, analysis: Analysis, key: EqnKey) -> list[Checked]:
        nc = _compat.custom_call_body(eqn)[1]
        fwd_of, bwd_fn = _compat.custom_vjp_parts(eqn)
        in_locs, out_locs = self._locs(eqn, analysis, key)
        constants = _constants_at(analysis.jaxpr, key[0])
        nonzeros = [not (_nondiff(v) or v in constants) for v in eqn.invars[nc:]]
        fwd, (n_res, input_fwds) = fwd_of(nonzeros)
        n_res_out = n_res - sum(f is not None for f in input_fwds)
        fwd_out_locs: list[AxisLoc | Residual | None] = [*[RESIDUAL] * n_res_out, *out_locs]
        fwd_checked = check_rule(fwd, analysis.size, in_locs, fwd_out_locs)
        if fwd_checked.problem is not None:
            return [("forward rule", fwd_checked, None)]

        bwd, returned, sources = _compat.custom_vjp_backward(eqn, fwd, input_fwds, bwd_fn)
        outer_locs = [None] * nc + in_locs

        def residual_loc(source: Atom | int) -> AxisLoc | None:  # where the axis is in a residual
            if isinstance(source, int):  # an operand the forward rule passes through
                return outer_locs[source]
            return None if isinstance(source, Literal) else fwd_checked.analysis.loc((), source)

        res_locs = [residual_loc(s) for s in sources]
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

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        call, nc = _compat.custom_call_body(eqn)
        consts, args = invals[:nc], invals[nc:]

        # The chunk's first position (traced inside the loop) is an argument of the rules,
        # and a residual of the backward rule: JAX may trace the forward and backward rules
        # later, outside the chunk's trace (the transpose of ``grad="native"``'s loop), where
        # a closed-over tracer would escape. The cotangent of an integer argument is None. A
        # static first position (a remainder chunk's) stays a Python integer.
        static = isinstance(r.start, int)

        def at(start: Array) -> Array | int:
            return r.start if static else start

        @jax.custom_vjp
        def fun(start: Array, *a: Array) -> Arrays:
            del start  # the primal is traced at once, inside the chunk's trace
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        def fwd(start: Array, *a: Array) -> tuple[Arrays, Arrays]:
            fwd_checked, extra = self._rules(eqn, r)["forward rule"]
            assert isinstance(extra, tuple)
            n_res_out, input_fwds = extra
            outs = fwd_checked.resized(r, a, at(start))
            res_out = iter(outs[:n_res_out])
            everything = [*consts, *a]
            res = [next(res_out) if f is None else everything[f] for f in input_fwds]
            return tuple(outs[n_res_out:]), (start, *res)

        def bwd(res: Arrays, cts: Arrays) -> tuple[Array | None, ...]:
            bwd_checked, returned = self._rules(eqn, r)["backward rule"]
            assert isinstance(returned, list)
            outs = iter(bwd_checked.resized(r, [*res[1:], *cts], at(res[0])))
            return (None, *(next(outs) if kept else None for kept in returned))

        fun.defvjp(fwd, bwd)
        with _compat.user_context(eqn):
            return list(fun(jnp.asarray(r.start, jnp.int32), *args))


def _constant_vars(jaxpr: Jaxpr, known: Iterable[Atom]) -> set:
    """The values of ``jaxpr`` computed from its constants, the ``known`` inputs and
    literals alone (through equations without sub-jaxprs)."""
    const = {*known, *jaxpr.constvars}
    for e in jaxpr.eqns:
        if _compat.is_pure(e) and all(isinstance(v, Literal) or v in const for v in e.invars):
            const.update(e.outvars)
    return const


def _constants_at(top: Jaxpr, ctx: tuple) -> set:
    """The constant values (``_constant_vars``) of the jaxpr at ``ctx`` under ``top``,
    followed through calls (whose inputs are their operands); none past another primitive.
    JAX never differentiates them: a custom VJP's forward rule refuses a tangent for the
    arrays its function closes over, which a ``jit`` passes as such operands."""
    jaxpr, const = top, _constant_vars(top, ())
    for idx, path in ctx:
        eqn = jaxpr.eqns[idx]
        sub = eqn.params
        for k in path:
            sub = sub[k]
        inner = _compat.open_jaxpr(sub)
        if len(inner.invars) != len(eqn.invars):
            return set()
        pairs = zip(inner.invars, eqn.invars, strict=True)
        known = [i for i, o in pairs if isinstance(o, Literal) or o in const]
        jaxpr, const = inner, _constant_vars(inner, known)
    return const


CUSTOM_JVP = register("custom_jvp_call", CustomJVP())
CUSTOM_VJP = register("custom_vjp_call", CustomVJP())
