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

**Cells.** Where the program's row maps cut the axis into cells (``cells``), a chunk computes
the row-mapped values of its own cell only. ``split_body`` finds the body equations whose rows
depend on the cell (they read or write a row-mapped value, at any depth) and those between
two of them; only these run per cell, under ``lax.switch`` (``eval_body``), the others once
outside it. The values the switch hands on are whole-axis values (a concatenation's window),
whose shape no cell changes, materialised as the conditional's outputs. That pays where one
of them has two readers (antithetic noise ``z`` read by ``mean + sigma * z`` and by
``z.T @ fitness``): XLA materialises such a value in the original too (the concatenation),
while inside the switch it fuses the value's producers into each reader and keeps their
intermediates (a draw's ``erf_inv`` terms, its bits) live across both; and the equations after
the switch are linearised outside it, so their residuals are no branch outputs. A value
with one reader is fused into it (a conditional's output would not be): the whole body then
runs per cell, as it does where a streamed equation or a deferred value falls inside, or the
body has effects (their order). A body none of whose equations depends on the cell runs once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, window
from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var
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
    as a middle factor: ``_split`` keeps such values inside the region); a row-mapped ``loc``
    (then ``size`` is the axis's): the chunk's window of ``x`` (in ``cell``, ``window``)."""
    assert loc.outer == 1, loc
    if is_mapped(loc):
        assert size is not None, loc
        start, k = window(loc, size, k, start, cell)
    if isinstance(start, int) and start == 0 and k * loc.inner == x.shape[loc.dim]:
        return x
    return lax.dynamic_slice_in_dim(x, scaled(start, loc.inner), k * loc.inner, loc.dim)


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


class Parts(NamedTuple):
    """A chunk body around its cells: ``before``, ``inside`` (per cell) and ``after``
    (equation indices, in program order), and ``carried``: the values ``inside`` defines that
    ``after`` or the body's outputs read (None: the whole body, ``inside``, runs per cell)."""

    before: list[int]
    inside: list[int]
    after: list[int]
    carried: list[Var] | None


def _reads(eqn: JaxprEqn) -> list[Var]:
    return _reads_of(eqn.invars)


def _reads_of(vs: Sequence[Any]) -> list[Var]:
    return [v for v in vs if not isinstance(v, Literal)]


def split_body(split: Any, signature: Any, body: Sequence[int], found: Any) -> Parts:
    """The equations at ``body`` of ``split`` (a ``_split.Split``, whose body's outputs are
    those of ``signature``, a ``_signature.Signature``) split around the cells ``found``
    (module docstring); all of them per cell where no value carried out has two readers, a
    streamed equation or a deferred value falls inside, an equation has effects, or a
    row-mapped value would be carried out (without cells: all of them, once)."""
    analysis, eqns = split.analysis, split.jaxpr.eqns
    special, deferred = split.streamed, split.deferred
    sig = signature
    outputs = [*sig.sums, *(v for v, _ in (*sig.partials, *sig.stacked))]
    outputs += [sink.var for sink in split.sinks]
    whole = Parts([], list(body), [], None)
    if not found or any(eqns[i].effects for i in body):
        return whole
    deep = {ctx[0][0] for (ctx, _), loc in analysis.locs.items() if ctx and is_mapped(loc)}

    def celled(i: int) -> bool:
        own = (*_reads(eqns[i]), *eqns[i].outvars)
        return i in deep or any(is_mapped(analysis.loc((), v)) for v in own)

    down: set[int] = set()
    below: set[Var] = set()
    for i in body:  # downstream of a celled equation (or one)
        if celled(i) or any(v in below for v in _reads(eqns[i])):
            down.add(i)
            below.update(eqns[i].outvars)
    up: set[int] = set()
    needed: set[Var] = set()
    for i in reversed(body):  # upstream of a celled equation (or one)
        if celled(i) or any(v in needed for v in eqns[i].outvars):
            up.add(i)
            needed.update(_reads(eqns[i]))
    inside = [i for i in body if celled(i) or (i in down and i in up)]
    if not inside:
        return Parts(list(body), [], [], [])
    within = set(inside)
    after = [i for i in body if i in down and i not in within]
    defined = {v for i in inside for v in eqns[i].outvars}
    read = [*(v for i in after for v in _reads(eqns[i])), *_reads_of(outputs)]
    carried = list(dict.fromkeys(v for v in read if v in defined))
    readers = Counter(v for i in after for v in set(_reads(eqns[i])))
    readers.update(set(_reads_of(outputs)))
    if (
        within & set(special)
        or any(v in deferred for i in inside for v in _reads(eqns[i]))
        or any(is_mapped(analysis.loc((), v)) for v in carried)
        or all(readers[v] < 2 for v in carried)
    ):
        return whole
    return Parts([i for i in body if i not in down], inside, after, carried)


def eval_body(
    split: Any,
    chunk: tuple[int, Any, list | None],
    parts: Parts,
    env: dict,
    invariants: dict,
    special: Callable | None,
    finish: Callable[[dict], Any],
) -> Any:
    """``finish(env)`` once ``parts`` of the body of ``split`` (a ``_split.Split``) are
    evaluated into ``env`` on the chunk of ``k`` at ``start`` (``chunk``: ``(k, start,
    found)``, ``found`` the cells): ``before`` and ``after`` once, ``inside`` in the cell that
    holds the chunk (``by_cell``) with the windows of the row-mapped ones of ``invariants``
    (``{var: whole value}``) in it. Without ``carried`` (the whole body): all of it, and
    ``finish``, in the cell."""
    k, start, found = chunk
    analysis, eqns = split.analysis, split.jaxpr.eqns
    mapped = {v: analysis.loc((), v) for v in invariants}
    for v, x in invariants.items():
        if not is_mapped(mapped[v]):
            env[v] = x if mapped[v] is None else take_chunk(x, mapped[v], start, k)

    def run(cell: Any, indices: list[int], spec: Callable | None, env: dict) -> dict:
        Resizer(analysis, k, start, cell).eval_eqns((), eqns, env, indices, spec)
        return env

    def in_cell(cell: Any) -> dict:
        local = dict(env)
        for v, x in invariants.items():
            if is_mapped(mapped[v]):
                local[v] = take_chunk(x, mapped[v], start, k, analysis.size, cell)
        return local

    if parts.carried is None:
        whole = parts.inside
        return by_cell(found, start, k, lambda c: finish(run(c, whole, special, in_cell(c))))
    run(None, parts.before, special, env)
    if parts.inside:
        carried = parts.carried
        inside = by_cell(
            found, start, k, lambda c: [run(c, parts.inside, None, in_cell(c))[v] for v in carried]
        )
        env.update(zip(carried, inside, strict=True))
    return finish(run(None, parts.after, special, env))


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
