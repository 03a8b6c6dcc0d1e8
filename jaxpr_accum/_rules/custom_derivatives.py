"""``custom_jvp_call`` and ``custom_vjp_call``: chunked, with their custom rules kept.

The primal function is analysed as a sub-jaxpr linked to the equation's operands and results.
The rule (the JVP jaxpr, or the VJP's forward jaxpr) is traced when the equation is first
analysed (in the caller's context, not inside a ``shard_map``), but analysed lazily, when JAX
asks for it while differentiating the chunked body: a rule usually calls its own primal
function, so analysing it eagerly would recurse forever. It is seeded with the primal's axis
positions (tangents sit where their primals do), checked, and resized like any jaxpr. At chunk size
both are re-emitted through ``jax.custom_jvp`` / ``jax.custom_vjp``; a custom VJP's backward
function is the user's own, called on chunk-sized residuals and cotangents (it must not
hard-code the full size).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._rules.base import Rule, register
from jaxpr_accum._rules.control_flow import link_call


def _nondiff(v: Any) -> bool:
    return not jnp.issubdtype(v.aval.dtype, jnp.inexact)


def _zero_tangent(x: Any) -> Any:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return _compat.zeros_float0(x.shape)


def _eval_rule(r: Any, closed: Any, seeds: list, args: list) -> list:
    """Analyse a rule's jaxpr seeded with ``(invar index, loc)`` and evaluate it resized."""
    from jaxpr_accum._axes import Analysis  # the analysis imports the rule table
    from jaxpr_accum._plan import SerializeError
    from jaxpr_accum._resize import Resizer

    jaxpr = closed.jaxpr
    analysis = Analysis(jaxpr, r.analysis.size)
    analysis.run([(jaxpr.invars[i], loc) for i, loc in seeds if loc is not None])
    for idx, eqn in enumerate(jaxpr.eqns):
        if analysis.touches((), eqn):
            found = analysis.blocker((), idx, eqn)
            if found is not None or ((), idx) in analysis.reductions:
                where = found[0] if found else eqn
                raise SerializeError(
                    f"the custom derivative rule of `{r.eqn.params.get('name', '?')}` cannot run "
                    f"per chunk: `{where.primitive.name}` at {_compat.source_line(where)}"
                )
    return Resizer(analysis, r.k, r.start).eval_jaxpr((), closed, args)


class CustomJVP(Rule):
    def children(self, eqn: Any, view: Any) -> list:
        return [(("call_jaxpr",), eqn.params["call_jaxpr"])]

    def propagate(self, eqn: Any, view: Any) -> None:
        nc = eqn.params["num_consts"]
        if any(view.in_loc(i) is not None for i in range(nc)):
            view.barrier("a custom-derivative function closes over a value with the axis")
            return
        link_call(view, eqn, ("call_jaxpr",), eqn.params["call_jaxpr"], eqn.invars, eqn.outvars)
        if not _compat.in_manual_context():  # trace the rule now, in the caller's context
            self.rule_jaxpr(eqn, view.analysis, view.key)

    def rule_jaxpr(self, eqn: Any, analysis: Any, key: tuple) -> tuple:
        """The JVP rule's jaxpr and output-zero flags, traced once per equation."""
        zeros = [_nondiff(v) for v in eqn.invars[eqn.params["num_consts"] :]]
        return analysis.memoize(("jvp", key), lambda: _compat.custom_jvp_rule_jaxpr(eqn, zeros))

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        nc = eqn.params["num_consts"]
        consts, args = invals[:nc], invals[nc:]
        call = eqn.params["call_jaxpr"]
        zeros = [_nondiff(v) for v in eqn.invars[nc:]]
        in_locs = r.in_locs[nc:]
        n_out = len(eqn.outvars)

        @jax.custom_jvp
        def fun(*a: Any) -> tuple:
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        @fun.defjvp
        def fun_jvp(primals: tuple, tangents: tuple) -> tuple:
            jvp, out_zeros = self.rule_jaxpr(eqn, r.analysis, r.key)
            nonzero = [t for t, z in zip(tangents, zeros, strict=True) if not z]
            tangent_locs = [loc for loc, z in zip(in_locs, zeros, strict=True) if not z]
            seeds = list(enumerate(in_locs + tangent_locs))
            outs = _eval_rule(r, jvp, seeds, [*primals, *nonzero])
            primal_out, rest = outs[:n_out], iter(outs[n_out:])
            tangent_out = [
                _zero_tangent(p) if z else next(rest)
                for p, z in zip(primal_out, out_zeros, strict=True)
            ]
            return tuple(primal_out), tuple(tangent_out)

        with _compat.user_context(eqn):
            return list(fun(*args))


class CustomVJP(CustomJVP):
    def rule_jaxpr(self, eqn: Any, analysis: Any, key: tuple) -> tuple:
        """The forward rule's jaxpr and ``(n_res, input_fwds)``, traced once per equation."""
        fwd_of, _, nc = _compat.custom_vjp_parts(eqn)
        nonzeros = [not _nondiff(v) for v in eqn.invars[nc:]]
        return analysis.memoize(("fwd", key), lambda: fwd_of(nonzeros))

    def resize(self, eqn: Any, r: Any, invals: list) -> list:
        nc = eqn.params["num_consts"]
        consts, args = invals[:nc], invals[nc:]
        call = eqn.params["call_jaxpr"]
        _, bwd_fn, _ = _compat.custom_vjp_parts(eqn)
        in_locs = r.in_locs[nc:]

        @jax.custom_vjp
        def fun(*a: Any) -> tuple:
            return tuple(r.eval(("call_jaxpr",), call, [*consts, *a]))

        def fwd(*a: Any) -> tuple:
            fwd_jaxpr, (n_res, input_fwds) = self.rule_jaxpr(eqn, r.analysis, r.key)
            n_res_out = n_res - sum(f is not None for f in input_fwds)
            outs = _eval_rule(r, fwd_jaxpr, list(enumerate(in_locs)), list(a))
            res_out = iter(outs[:n_res_out])
            everything = [*consts, *a]
            res = [next(res_out) if f is None else everything[f] for f in input_fwds]
            return tuple(outs[n_res_out:]), tuple(res)

        def bwd(res: tuple, cts: tuple) -> tuple:
            out = bwd_fn(*res, *cts)
            return tuple(x if _compat.is_array(x) else None for x in out)

        fun.defvjp(fwd, bwd)
        with _compat.user_context(eqn):
            return list(fun(*args))


register("custom_jvp_call", CustomJVP())
register("custom_vjp_call", CustomVJP())
