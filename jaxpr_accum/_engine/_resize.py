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

from collections.abc import Callable, Sequence
from typing import Any

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, window
from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, JaxprEqn
from jaxpr_accum._engine import _interpret
from jaxpr_accum._engine._axes import Analysis, Ctx
from jaxpr_accum._engine._table import rule_for
from jaxpr_accum._engine._view import EqnResize


def scaled(index: Any, factor: int) -> Any:
    """``index * factor``, folded in Python when the factor is 1 (no ``mul ... 1`` emitted)."""
    return index if factor == 1 else index * factor


def shifted(index: Any, offset: Any) -> Any:
    """``index + offset``, folded in Python when the offset is a static 0."""
    return index if isinstance(offset, int) and offset == 0 else index + offset


def take_chunk(
    x: Any, loc: AxisLoc, start: Any, k: int, size: int | None = None, cell: Any = None
) -> Any:
    """Rows ``start .. start+k-1`` of the axis of ``x`` (which carries it at ``loc``, never
    as a middle factor: ``_plan`` keeps such values inside the region); a row-mapped ``loc``
    (then ``size`` is the axis's): the chunk's window of ``x`` (in ``cell``, ``window``)."""
    assert loc.outer == 1, loc
    if is_mapped(loc):
        assert size is not None, loc
        start, k = window(loc, size, k, start, cell)
    if isinstance(start, int) and start == 0 and k * loc.inner == x.shape[loc.dim]:
        return x
    return lax.dynamic_slice_in_dim(x, scaled(start, loc.inner), k * loc.inner, loc.dim)


def windows(analysis: Analysis, sig: Any, inputs: Any, start: Any, k: int, cell: Any) -> list:
    """The region's invariant inputs for the chunk at ``start``: a row-mapped one (passed
    whole, ``_plan``) as the chunk's window of it, the others as they are."""
    locs = [analysis.loc((), v) for v in sig.invariants]
    return [
        x if loc is None else take_chunk(x, loc, start, k, analysis.size, cell)
        for x, loc in zip(inputs.invariants, locs, strict=True)
    ]


def cells(analysis: Analysis, offset: Any, size: int, k: int) -> list[tuple[int, int]] | None:
    """The cells of positions ``[offset, offset + size)`` between the boundaries of the
    program's row maps, where each is a multiple of the chunk ``k`` from ``offset`` (each chunk,
    the remainder too, then lies in one cell); None when there are none to tell apart, or a
    chunk could straddle one (a traced ``offset``: a shard's)."""
    if not isinstance(offset, int):
        return None
    ends = {0, analysis.size}
    for loc in analysis.locs.values():
        if is_mapped(loc):
            ends.update((loc.lo, loc.lo + (loc.span or analysis.size)))
    inner = sorted(b for b in ends if offset < b < offset + size)
    if not inner or any((b - offset) % k for b in inner):
        return None
    bounds = [offset, *inner, offset + size]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def by_cell(found: list | None, start: Any, k: int, run: Callable[[Any], Any]) -> Any:
    """``run(cell)`` for the cell (of ``found``, ``cells``) that holds the chunk of ``k`` at
    ``start``: chosen in Python for a static ``start``, else by ``lax.switch`` over the cells
    that can hold ``k`` positions (a shorter one, the last, holds only the remainder; each
    branch computes the row-mapped values of its own cell only); ``run(None)`` without cells."""
    if found is None:
        return run(None)
    if isinstance(start, int):
        return run(next(c for c in found if c[0] <= start < c[1]))
    found = [c for c in found if c[1] - c[0] >= k]
    index = sum((start >= a).astype("int32") for a, _ in found[1:])
    return lax.switch(index, [lambda c=c: run(c) for c in found])


class Resizer:
    """Evaluates jaxprs of one analysis at chunk length ``k`` from global position ``start``
    (in ``cell``, where known: ``by_cell``)."""

    def __init__(self, analysis: Analysis, k: int, start: Any, cell: Any = None):
        self.analysis, self.k, self.start, self.cell = analysis, k, start, cell
        self.size = analysis.size

    def eval_jaxpr(self, ctx: Ctx, jaxpr: Jaxpr | ClosedJaxpr, args: Sequence[Any]) -> list:
        inner, consts = _compat.open_closed(jaxpr)
        env: dict = {}
        for v, x in zip(inner.constvars, consts, strict=True):
            loc = self.analysis.loc(ctx, v)  # a constant along the axis: this chunk's rows
            env[v] = (
                x if loc is None else take_chunk(x, loc, self.start, self.k, self.size, self.cell)
            )
        env.update(zip(inner.invars, args, strict=True))
        self.eval_eqns(ctx, inner.eqns, env)
        return [_interpret.read(env, v) for v in inner.outvars]

    def eval_eqns(
        self,
        ctx: Ctx,
        eqns: Sequence[JaxprEqn],
        env: dict,
        indices: Any = None,
        special: Callable | None = None,
    ) -> None:
        """Evaluate ``eqns`` (those at ``indices``, in order), reading and writing ``env``.
        ``special(idx)``, where given and not None, emits equation ``idx`` instead of its rule
        (``(eqn, r, invals) -> outs``; the streamed equations of ``_stream``)."""
        analysis = self.analysis

        def emit(idx: int, eqn: JaxprEqn, invals: list) -> list:
            if analysis.touches(ctx, eqn):
                r = EqnResize(self, ctx, idx, eqn)
                instead = None if special is None else special(idx)
                if instead is not None:
                    return instead(eqn, r, invals)
                return rule_for(eqn.primitive).resize(eqn, r, invals)
            return _compat.bind(eqn, invals)

        _interpret.eval_eqns(eqns, env, emit, indices)
