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

The cells of the program's row maps, and which body equations run per cell, are the build
layer's (``_build._cells``): a ``Resizer`` is told its chunk's cell (``cell``), where known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, window
from jaxpr_accum._compat import Array, ClosedJaxpr, Jaxpr, JaxprEqn
from jaxpr_accum._engine import _interpret
from jaxpr_accum._engine._axes import Analysis, Ctx
from jaxpr_accum._engine._table import rule_for
from jaxpr_accum._engine._view import EqnResize

Cell: TypeAlias = tuple[int, int]  # positions ``[a, b)`` holding a chunk (``_lattice.window``)
# how an equation is emitted instead of its rule: ``(eqn, r, invals) -> outs``
Instead: TypeAlias = Callable[[JaxprEqn, EqnResize, list], list]
# which body equations are emitted otherwise: ``special(idx)``, None for the rule
Special: TypeAlias = Callable[[int], Instead | None]


def scaled(index: Array | int, factor: int) -> Array | int:
    """``index * factor``, folded in Python when the factor is 1 (no ``mul ... 1`` emitted)."""
    return index if factor == 1 else index * factor


def shifted(index: Array | int, offset: Array | int) -> Array | int:
    """``index + offset``, folded in Python when the offset is a static 0."""
    return index if isinstance(offset, int) and offset == 0 else index + offset


def take_chunk(
    x: Array,
    loc: AxisLoc,
    start: Array | int,
    k: int,
    *,
    size: int | None = None,
    cell: Cell | None = None,
) -> Array:
    """Rows ``start .. start+k-1`` of the axis of ``x`` (which carries it at ``loc``, never
    as a middle factor: ``_split`` keeps such values inside the region); a row-mapped ``loc``
    (then ``size`` is the axis's): the chunk's window of ``x`` (in ``cell``, ``window``)."""
    assert loc.outer == 1, loc
    if is_mapped(loc):
        assert size is not None, loc
        start, k = window(loc, size, k, start, cell)
    if isinstance(start, int) and start == 0 and k * loc.inner == x.shape[loc.dim]:
        return x
    return lax.dynamic_slice_in_dim(x, scaled(start, loc.inner), k * loc.inner, loc.dim)


class Resizer:
    """Evaluates jaxprs of one analysis at chunk length ``k`` from global position ``start``
    (in ``cell``, where known: ``by_cell``)."""

    def __init__(self, analysis: Analysis, k: int, start: Array | int, cell: Cell | None = None):
        self.analysis, self.k, self.start, self.cell = analysis, k, start, cell
        self.size = analysis.size

    def eval_jaxpr(
        self, ctx: Ctx, jaxpr: Jaxpr | ClosedJaxpr, args: Sequence[Array]
    ) -> list[Array]:
        inner, consts = _compat.open_closed(jaxpr)
        env: dict = {}
        for v, x in zip(inner.constvars, consts, strict=True):
            loc = self.analysis.loc(ctx, v)  # a constant along the axis: this chunk's rows
            env[v] = (
                x
                if loc is None
                else take_chunk(x, loc, self.start, self.k, size=self.size, cell=self.cell)
            )
        env.update(zip(inner.invars, args, strict=True))
        self.eval_eqns(ctx, inner.eqns, env)
        return [_interpret.read(env, v) for v in inner.outvars]

    def eval_eqns(
        self,
        ctx: Ctx,
        eqns: Sequence[JaxprEqn],
        env: dict,
        indices: Iterable[int] | None = None,
        special: Special | None = None,
    ) -> None:
        """Evaluate ``eqns`` (those at ``indices``, in order), reading and writing ``env``.
        ``special(idx)``, where given and not None, emits equation ``idx`` instead of its rule
        (``(eqn, r, invals) -> outs``; the streamed equations of ``_stream``)."""
        analysis = self.analysis

        def emit(idx: int, eqn: JaxprEqn, invals: list) -> list:
            if _compat.is_pure(eqn) and all(isinstance(v, _compat.DropVar) for v in eqn.outvars):
                return [None] * len(eqn.outvars)  # dead: no result has a place to resize to
            if analysis.touches(ctx, eqn):
                r = EqnResize(self, ctx, idx, eqn)
                instead = None if special is None else special(idx)
                if instead is not None:
                    return instead(eqn, r, invals)
                return rule_for(eqn.primitive).resize(eqn, r, invals)
            return _compat.bind(eqn, invals)

        _interpret.eval_eqns(eqns, env, emit, indices)
