"""Higher-order primitives: calls, remat, ``scan``, ``while`` and ``cond``, recursively.

Each rule *links* the equation's operands and results to its sub-jaxprs' inputs and outputs
(same value, possibly shifted by the loop's own dimension), and registers the sub-jaxprs for
analysis in their own context (``view.walk``: the analysis' worklist visits them later, not
during the call). The analysis re-runs the rule whenever a fact of a sub-jaxpr input or
output changes, or a reduction appears inside it, so a rule links both ways every time and
never assumes the sub-jaxpr has been analysed yet. The equation is chunkable when everything
inside is (``Analysis.blocker``). On resize the sub-jaxprs are re-emitted at chunk size
through the public API (``lax.scan``, ``lax.while_loop``, ``lax.switch``,
``jax.checkpoint``), which keeps their semantics and lets JAX handle closures; nested ``jit``
calls are inlined.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import (
    Array,
    Atom,
    ClosedJaxpr,
    Jaxpr,
    JaxprEqn,
    Var,
    inherit_sources,
    open_jaxpr,
)
from jaxpr_accum._engine._table import Rule, passed_through, register
from jaxpr_accum._engine._view import EqnResize, View


def link_call(
    view: View,
    eqn: JaxprEqn,
    path: tuple,
    sub: Jaxpr | ClosedJaxpr,
    operands: Sequence[Atom],
    results: Sequence[Var],
) -> None:
    """Link ``operands`` to ``sub``'s inputs and ``sub``'s outputs to ``results``; register it."""
    inner = open_jaxpr(sub)
    ctx = view.sub_ctx(path)
    for operand, v in zip(operands, inner.invars, strict=True):
        view.link((view.ctx, operand), (ctx, v))
    view.walk(path, sub)
    for out, result in zip(inner.outvars, results, strict=True):
        view.link((ctx, out), (view.ctx, result))


def _passed(sub: Jaxpr | ClosedJaxpr) -> list[tuple[int, int, list[int]]]:
    """``(equation, its output, outputs of sub)`` for each output of ``sub`` that an equation
    produces and no equation reads (see ``passed_through``)."""
    inner = open_jaxpr(sub)
    passed = passed_through(inner)
    found = []
    for j, inner_eqn in enumerate(inner.eqns):
        for o, v in enumerate(inner_eqn.outvars):
            if v in passed:
                found.append((j, o, [i for i, w in enumerate(inner.outvars) if w is v]))
    return found


class Call(Rule):
    """``jit`` / ``closed_call``: inlined at chunk size.

    A reduction over the axis whose result is a direct output of the called function makes
    that output of the call a reduction too (the call returns the chunk's partial).
    """

    passes_reductions = True
    middle_factor_ok = True  # inlined: the equations inside meet the middle factor themselves

    def __init__(self, param: str):
        self.param = param

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        sub = eqn.params[self.param]
        link_call(view, eqn, (self.param,), sub, eqn.invars, eqn.outvars)
        ctx = view.sub_ctx((self.param,))
        reductions = view.analysis.reductions
        for j, o, out_indices in view.analysis.memoize(("passed", ctx), lambda: _passed(sub)):
            kind = reductions.get((ctx, j), {}).get(o)
            if kind is not None:
                for out_index in out_indices:
                    view.reduce(out_index, kind)

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        # what the call computes keeps its line in the user's program (``jnp.take``'s jit)
        return r.eval((self.param,), inherit_sources(eqn.params[self.param], eqn), invals)


class Remat(Call):
    def __init__(self) -> None:
        super().__init__("jaxpr")

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        p = eqn.params

        def body(*args: Array) -> list[Array]:
            return r.eval(("jaxpr",), p["jaxpr"], list(args))

        return jax.checkpoint(body, prevent_cse=p["prevent_cse"], policy=p["policy"])(*invals)


class Scan(Rule):
    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        p = eqn.params
        nc, ncarry = p["num_consts"], p["num_carry"]
        inner = p["jaxpr"].jaxpr
        ctx = view.sub_ctx(("jaxpr",))
        outer_in, outer_out = eqn.invars, eqn.outvars
        for i in range(nc):
            view.link((view.ctx, outer_in[i]), (ctx, inner.invars[i]))
        for i in range(ncarry):
            view.link((view.ctx, outer_in[nc + i]), (ctx, inner.invars[nc + i]))
            view.link((ctx, inner.invars[nc + i]), (ctx, inner.outvars[i]))
            view.link((ctx, inner.outvars[i]), (view.ctx, outer_out[i]))
        for i in range(nc + ncarry, len(outer_in)):
            view.link((view.ctx, outer_in[i]), (ctx, inner.invars[i]), shift=-1)
        view.walk(("jaxpr",), p["jaxpr"])
        for j in range(ncarry, len(outer_out)):
            view.link((ctx, inner.outvars[j]), (view.ctx, outer_out[j]), shift=1)
        for i in range(ncarry):  # the carry must come back where it went in
            view.link((ctx, inner.invars[nc + i]), (ctx, inner.outvars[i]))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        p = eqn.params
        nc, ncarry = p["num_consts"], p["num_carry"]
        consts, init, xs = invals[:nc], invals[nc : nc + ncarry], invals[nc + ncarry :]

        def body(carry: list[Array], x: list[Array]) -> tuple[list[Array], list[Array]]:
            outs = r.eval(("jaxpr",), p["jaxpr"], [*consts, *carry, *x])
            return outs[:ncarry], outs[ncarry:]

        carry, ys = lax.scan(  # type: ignore[var-annotated]
            body, list(init), list(xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
        )
        return [*carry, *ys]


class While(Rule):
    """A loop whose condition is a scalar runs whole in each chunk (its condition must not
    read the axis). A condition with an entry per position (``jax.vmap`` of a loop whose
    condition reads the row: the rows whose condition fails are held as they are while the
    others iterate) is a loop per row: each chunk runs its own, which gives each row the
    iterations it has in the original, emitted as JAX lowers it (any row running; the body's
    results selected by each row's condition)."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cond, body = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
        cctx, bctx = view.sub_ctx(("cond_jaxpr",)), view.sub_ctx(("body_jaxpr",))
        ins, outs = eqn.invars, eqn.outvars
        for i in range(cn):
            view.link((view.ctx, ins[i]), (cctx, cond.invars[i]))
        for i in range(bn):
            view.link((view.ctx, ins[cn + i]), (bctx, body.invars[i]))
        for i, out in enumerate(outs):
            chain = [
                (view.ctx, ins[cn + bn + i]),
                (bctx, body.invars[bn + i]),
                (bctx, body.outvars[i]),
                (cctx, cond.invars[cn + i]),
                (view.ctx, out),
            ]
            for a, b in zip(chain, chain[1:] + chain[:1], strict=True):
                view.link(a, b)
        view.walk(("cond_jaxpr",), p["cond_jaxpr"])
        view.walk(("body_jaxpr",), p["body_jaxpr"])
        pred = view.analysis.loc(cctx, cond.outvars[0])
        if pred is None:
            return
        if pred != AxisLoc(pred.dim):
            view.barrier("the loop's condition depends on the axis")
            return
        for i in range(len(outs)):  # a loop per row: every carry has the axis where its
            view.set_in(cn + bn + i, pred)  # condition does (the condition's dims lead)

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]

        def rows_running(carry: list[Array]) -> Array:
            return r.eval(("cond_jaxpr",), p["cond_jaxpr"], [*cconsts, *carry])[0]

        def body_fun(carry: list[Array]) -> list[Array]:
            return r.eval(("body_jaxpr",), p["body_jaxpr"], [*bconsts, *carry])

        if not p["cond_jaxpr"].out_avals[0].shape:
            return list(lax.while_loop(rows_running, body_fun, list(init)))  # type: ignore[arg-type]

        def frozen_when_done(carry: list[Array]) -> list[Array]:
            running = rows_running(carry)
            dims = tuple(range(running.ndim))
            return [
                lax.select(lax.broadcast_in_dim(running, new.shape, dims), new, old)
                for new, old in zip(body_fun(carry), carry, strict=True)
            ]

        def any_running(carry: list[Array]) -> Array:
            return jnp.any(rows_running(carry))

        return list(lax.while_loop(any_running, frozen_when_done, list(init)))  # type: ignore[arg-type]


class Cond(Rule):
    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        if view.in_loc(0) is not None:
            view.barrier("`cond` chooses a branch per position along the axis")
            return
        for b, branch in enumerate(eqn.params["branches"]):
            link_call(view, eqn, ("branches", b), branch, eqn.invars[1:], eqn.outvars)

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        index, operands = invals[0], invals[1:]
        branches = [
            (lambda *ops, b=b, br=br: r.eval(("branches", b), br, list(ops)))
            for b, br in enumerate(eqn.params["branches"])
        ]
        return list(lax.switch(index, branches, *operands))


register("jit", Call("jaxpr"))
register(["closed_call", "call"], Call("call_jaxpr"))
register("remat2", Remat())  # `jax.checkpoint`
register("scan", Scan())
register("while", While())
register("cond", Cond())
