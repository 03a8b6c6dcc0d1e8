"""The cells of a chunk loop's body: which body equations run per cell, under ``lax.switch``.

Where the program's row maps cut the axis into cells (``cells``), a chunk computes the
row-mapped values of its own cell only. ``split_body`` finds the body equations whose rows
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

Invariants: every cell boundary is a multiple of the chunk from the shard's offset, so each
chunk (the remainder too) lies in exactly one cell; the body's equations run each exactly
once per chunk, in program order (``before``, ``inside``, ``after``), and only the values
``carried`` out of the cell cross the switch, each at a shape no cell changes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._analysis._order import segment
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._base._lattice import is_mapped
from jaxpr_accum._build._signature import Signature
from jaxpr_accum._compat import Array, Atom, Eqn, Literal, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._resize import Cell, Instead, Resizer, Special, take_chunk

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk: ``size`` positions from global position ``start`` (traced in the scan),
    in one of ``cells`` (``cells``'s; None: no cells to tell apart)."""

    size: int
    start: Array | int
    cells: list[Cell] | None


def cells(analysis: Analysis, offset: Array | int, size: int, k: int) -> list[Cell] | None:
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


def by_cell(chunk: Chunk, run: Callable[[Cell | None], T]) -> T:
    """``run(cell)`` for the cell (of ``chunk.cells``) that holds ``chunk``: chosen in Python
    for a static start, else by ``lax.switch`` over the cells that can hold its positions (a
    shorter one, the last, holds only the remainder; each branch computes the row-mapped values
    of its own cell only); ``run(None)`` without cells."""
    found, start, k = chunk.cells, chunk.start, chunk.size
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


def _reads(eqn: Eqn) -> list[Var]:
    return _reads_of(eqn.invars)


def _reads_of(vs: Sequence[Atom]) -> list[Var]:
    return [v for v in vs if not isinstance(v, Literal)]


def split_body(
    split: Split, signature: Signature, body: Sequence[int], found: list[Cell] | None
) -> Parts:
    """The equations at ``body`` of ``split`` (whose body's outputs are those of
    ``signature``) split around the cells ``found`` (module docstring); all of them per cell
    where no value carried out has two readers, a streamed equation or a deferred value falls
    inside, an equation has effects, or a row-mapped value would be carried out (without
    cells: all of them, once)."""
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
    split: Split,
    chunk: Chunk,
    parts: Parts,
    env: dict,
    *,
    invariants: dict[Var, Array],
    streamed: Instead,
    finish: Callable[[dict], T],
) -> T:
    """``finish(env)`` once ``parts`` of the body of ``split`` are evaluated into ``env`` on
    ``chunk``: ``before`` and ``after`` once, ``inside`` in the cell that holds the chunk
    (``by_cell``) with the windows of the row-mapped ones of ``invariants`` (``{var: whole
    value}``) in it. Without ``carried`` (the whole body): all of it, and ``finish``, in the
    cell. The streamed equations of ``split`` are emitted by ``streamed`` (``_stream``), not
    their rules: never inside a split body's cell."""
    k, start = chunk.size, chunk.start
    analysis, eqns = split.analysis, split.jaxpr.eqns
    mapped = {v: analysis.loc((), v) for v in invariants}
    for v, x in invariants.items():
        loc = mapped[v]
        if not is_mapped(loc):
            env[v] = x if loc is None else take_chunk(x, loc, start, k)

    def special(idx: int) -> Instead | None:
        return streamed if idx in split.streamed else None

    def run(cell: Cell | None, indices: list[int], spec: Special | None, env: dict) -> dict:
        resizer = Resizer(analysis, k, start, cell)
        # each run of equations after as many that run after the loop in a scope of its
        # own, for ``checkify`` to order their checks with those (``_order``)
        for n, group in itertools.groupby(indices, lambda i: segment(split.between_the_body, i)):
            with _compat.segment_scope(n):
                resizer.eval_eqns((), eqns, env, list(group), spec)
        return env

    def in_cell(cell: Cell | None) -> dict:
        local = dict(env)
        for v, x in invariants.items():
            loc = mapped[v]
            if loc is not None and is_mapped(loc):
                local[v] = take_chunk(x, loc, start, k, size=analysis.size, cell=cell)
        return local

    if parts.carried is None:
        whole = parts.inside
        return by_cell(chunk, lambda c: finish(run(c, whole, special, in_cell(c))))
    run(None, parts.before, special, env)
    if parts.inside:
        carried = parts.carried
        inside = by_cell(
            chunk, lambda c: [run(c, parts.inside, None, in_cell(c))[v] for v in carried]
        )
        env.update(zip(carried, inside, strict=True))
    return finish(run(None, parts.after, special, env))
