"""Re-emitting equations at chunk size.

``Resizer.eval_jaxpr`` interprets a jaxpr (under whatever JAX trace is current: a scan
body, a ``vjp``, ``make_jaxpr``) on chunk-sized values. Equations that do not touch the axis
are bound unchanged; the others go through their rule's ``resize``, which rewrites
shape-carrying parameters (``broadcast_in_dim.shape``, ``reshape.new_sizes``, ``iota``,
slice sizes: ``N*m -> k*m`` at the axis position) and recurses into sub-jaxprs. Every
equation is re-emitted under its original source information, so the rewritten program's
equations still point at the user's lines.

Invariant: the inputs handed in carry the axis exactly where the analysis says, at length
``k`` (the values of positions ``start .. start+k-1``); the outputs then do too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._axes import Analysis, Ctx
from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, open_jaxpr
from jaxpr_accum._rules import AxisLoc, rule_for


class Resizer:
    def __init__(self, analysis: Analysis, k: int, start: Any):
        self.analysis, self.k, self.start = analysis, k, start

    def eval_jaxpr(self, ctx: Ctx, jaxpr: Jaxpr | ClosedJaxpr, args: Sequence[Any]) -> list:
        inner = open_jaxpr(jaxpr)
        consts = jaxpr.consts if isinstance(jaxpr, ClosedJaxpr) else []
        env: dict = {}
        for v, x in zip(inner.constvars, consts, strict=True):
            loc = self.analysis.loc(ctx, v)  # a constant along the axis: this chunk's rows
            env[v] = x if loc is None else self.take_chunk(x, loc)
        for v, x in zip(inner.invars, args, strict=True):
            env[v] = x
        self.eval_eqns(ctx, inner.eqns, range(len(inner.eqns)), env)
        return [v.val if isinstance(v, Literal) else env[v] for v in inner.outvars]

    def take_chunk(self, x: Any, loc: AxisLoc) -> Any:
        """This chunk's rows of a full-size value that carries the axis at ``loc``."""
        return lax.dynamic_slice_in_dim(x, self.start * loc.inner, self.k * loc.inner, loc.dim)

    def eval_eqns(self, ctx: Ctx, eqns: Sequence[JaxprEqn], indices: Any, env: dict) -> None:
        """Evaluate ``eqns[i]`` for ``i`` in ``indices`` (in order), reading and writing ``env``."""
        for idx in indices:
            eqn = eqns[idx]
            invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
            if self.analysis.touches(ctx, eqn):
                outs = rule_for(eqn.primitive).resize(eqn, EqnResize(self, ctx, idx, eqn), invals)
            else:
                outs = _compat.bind(eqn, invals)
            for v, x in zip(eqn.outvars, outs, strict=True):
                if not isinstance(v, _compat.DropVar):
                    env[v] = x


class EqnResize:
    """What a rule's ``resize`` sees: the axis positions, the chunk, and sub-jaxpr evaluation."""

    __slots__ = ("resizer", "ctx", "idx", "eqn")

    def __init__(self, resizer: Resizer, ctx: Ctx, idx: int, eqn: JaxprEqn):
        self.resizer, self.ctx, self.idx, self.eqn = resizer, ctx, idx, eqn

    @property
    def analysis(self) -> Analysis:
        return self.resizer.analysis

    @property
    def key(self) -> tuple:
        return (self.ctx, self.idx)

    @property
    def k(self) -> int:
        return self.resizer.k

    @property
    def start(self) -> Any:
        return self.resizer.start

    @property
    def in_locs(self) -> list[AxisLoc | None]:
        return [self.analysis.loc(self.ctx, v) for v in self.eqn.invars]

    @property
    def out_locs(self) -> list[AxisLoc | None]:
        return [self.analysis.loc(self.ctx, v) for v in self.eqn.outvars]

    def rows(self, loc: AxisLoc) -> int:
        """Length at chunk size of the dimension that holds the axis at ``loc``."""
        return self.k * loc.inner

    def eval(self, path: tuple, jaxpr: Jaxpr | ClosedJaxpr, args: Sequence[Any]) -> list:
        return self.resizer.eval_jaxpr(self.ctx + ((self.idx, path),), jaxpr, args)
