"""Finding the equations that pair the axis with itself, and the values they pair.

A *pairing* is a top-level equation whose two operands both carry the axis, at places that
would put it twice in its result (the analysis makes it a barrier):

- ``dot_general`` with the axis a free dimension of both operands (``z @ z.T``, an
  ``einsum('id,jd->ij')``); the lhs is the *row* side, the rhs the *column* side;
- an elementwise equation with two operands that carry the axis at different dimensions
  (``z[:, None] - z[None]``, ``y[:, None] == y[None]``); the operand with the axis at the
  lower dimension is the row side.

Each side's *root* is the value the operand is a layout of: walking back through
``broadcast_in_dim``, ``transpose``, ``reshape``, ``squeeze``, ``expand_dims`` and
``convert_element_type`` (``z`` for ``z.T`` and for ``z[None]`` broadcast to ``[N, N, d]``).
The roots are what pass 1 stacks: the embeddings, a few values per example; the *chain* of
layout equations from a column root to its operand is what pass 2 re-emits on the full
stacked value. A pairing is a ``Use``: a ``Read`` of a column copy (the operand, its root and
chain) with a row side; the other reads of a column copy (``k @ z``) are chosen by ``reads``
and added to the ``Pairing``, whose roots are those of its uses and its reads.

On the column side a rearrangement of a root's rows along the axis (``permute``: ``z[::-1]``,
a roll, a gather) is walked through too: the column copy is whole, so pass 2 rearranges it.

``find(split)`` looks first for pairings of the axis being chunked (the encoder's batch,
paired in the loss): in the analysis of the program with each rearrangement of an
axis-carrying value replaced by a copy of it (``permute.substituted``: the one-pass analysis
stops at ``z[::-1]`` and never sees ``z @ z[::-1].T`` pair the axis), where there is one,
then in the split's own analysis. If there is none, it looks for a pairing of an axis
*born again* at one of the split's stops as a multiple or a part of the chunked one
(``reborn``): ``jnp.concatenate`` of two views along the batch stops the region and makes a
batch of ``2N`` rows, which the loss then pairs; the halves ``z[: N // 2]`` and ``z[N // 2 :]``
of one batch are two values ``N / 2`` long, which an MMD pairs with each other. The results
of one length are seeded at once (row ``i`` of each half in the same chunk, so that a chunk
of the halves' axis holds ``chunk / 2`` positions: ``Pairing.rows_at``), then each alone (at
most ``reborn.MAX_SEEDS`` analyses, with the slices of part of an axis barriers, so that the
halves' axis is never carried back into the value they slice); the first analysis with a
pairing is taken. Every pairing of the analysis taken is a *use*: pass 2 rewires them all.
An axis unrelated to the chunked one (the sequence of an attention after the loop) is never
considered: a program that does not pair the chunked axis, or a multiple of it, plans
exactly as it would without this module.
"""

from __future__ import annotations

import dataclasses
import functools

from jaxpr_accum import _compat
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._analysis._stages import variables
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Primitive, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._table import rule_for
from jaxpr_accum._pairwise import permute
from jaxpr_accum._pairwise.reborn import plain, reborn, seed_groups

LAYOUT = (
    "broadcast_in_dim transpose reshape squeeze expand_dims convert_element_type copy "
    "copy_p reduce_precision"
)


@functools.cache
def _layout_primitives() -> frozenset:
    return frozenset(p for p in map(_compat.primitive, LAYOUT.split()) if p is not None)


@functools.cache
def dot_general() -> Primitive | None:
    return _compat.primitive("dot_general")


@dataclasses.dataclass(frozen=True)
class Read:
    """An equation that reads a root's column copy in pass 2: its index, the operand position
    that reads it (``col``), the root, and the layout equations from the root to that operand
    (indices, in program order)."""

    index: int
    col: int
    col_root: Var
    chain: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Use(Read):
    """One pairing equation: a ``Read`` of its column side, with the operand position and the
    root of its row side."""

    row: int
    row_root: Var


@dataclasses.dataclass(frozen=True, eq=False)
class Pairing:
    """Every pairing of one axis (``analysis``) in ``jaxpr`` (``uses``), and the other
    equations that read a root's column copy (``reads``: ``reads.py``). ``rows_at``: the
    rows of the chunked axis at each position of this one (2 where the halves of one batch
    are its rows, seeded at once; else 1)."""

    jaxpr: Jaxpr
    analysis: Analysis
    uses: tuple[Use, ...]
    reads: tuple[Read, ...] = ()
    rows_at: int = 1

    @functools.cached_property
    def roots(self) -> tuple[Var, ...]:
        """The values both sides of the uses and the reads are layouts of, in program order
        (inputs first): what pass 1 stacks."""
        found = {r for u in self.uses for r in (u.row_root, u.col_root)}
        found.update(r.col_root for r in self.reads)
        order = {v: i for i, v in enumerate([*self.jaxpr.invars, *definitions(self.jaxpr)])}
        return tuple(sorted(found, key=order.__getitem__))

    @property
    def rewired(self) -> tuple[Read, ...]:
        """Every equation that reads a column copy: the uses, then the reads."""
        return (*self.uses, *self.reads)

    @property
    def column_roots(self) -> tuple[Var, ...]:
        seen: dict = {}
        for read in self.rewired:
            seen.setdefault(read.col_root, None)
        return tuple(seen)

    def loc(self, v: Var) -> AxisLoc | None:
        return self.analysis.loc((), v)


def sides(analysis: Analysis, eqn: JaxprEqn) -> tuple[int, int] | None:
    """``(row operand, column operand)`` if ``eqn`` pairs ``analysis``'s axis with itself."""
    locs = [analysis.loc((), v) for v in eqn.invars]
    if eqn.primitive is dot_general():
        lhs, rhs = locs[0], locs[1]
        if lhs is None or rhs is None:
            return None
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        if lhs.dim in (*lc, *lb) or rhs.dim in (*rc, *rb):
            return None
        return (0, 1) if plain(lhs) and plain(rhs) else None
    if not rule_for(eqn.primitive).elementwise:
        return None
    carrying = [(i, loc) for i, loc in enumerate(locs) if loc is not None]
    if len(carrying) != 2 or not all(plain(loc) for _, loc in carrying):
        return None
    (i, a), (j, b) = carrying
    if a.dim == b.dim:
        return None
    return (i, j) if a.dim < b.dim else (j, i)


def carries(analysis: Analysis | None, v: Var) -> bool:
    loc = None if analysis is None else analysis.loc((), v)
    return loc is not None and plain(loc)


def definitions(jaxpr: Jaxpr) -> dict:
    return {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}


def root_of(
    jaxpr: Jaxpr, v: Var, defined: dict, rearranging: Analysis | None = None
) -> tuple[Var, tuple[int, ...]]:
    """``(root, chain)``: the value ``v`` is a layout of, and the equations from it to ``v``
    (indices in program order); ``rearranging``: rearrangements (``permute``) of rows of a
    value that carries this analysis's axis count as layouts too (the column side)."""
    chain: list[int] = []
    layout = _layout_primitives()
    while v in defined:
        eqn = jaxpr.eqns[defined[v]]
        ins = variables(eqn.invars)
        found = None if rearranging is None else permute.rearranged(jaxpr, eqn, defined)
        if found is not None and carries(rearranging, found[0]):
            chain.extend((defined[v], *found[1]))
            v = found[0]
            continue
        if eqn.primitive not in layout or len(ins) != 1 or len(eqn.outvars) != 1:
            break
        chain.append(defined[v])
        v = ins[0]
    return v, tuple(sorted(chain))


def _pairing(jaxpr: Jaxpr, analysis: Analysis) -> Pairing | None:
    """Every pairing of ``analysis``'s axis; None if none."""
    defined = definitions(jaxpr)
    uses = []
    for idx, eqn in enumerate(jaxpr.eqns):
        if ((), idx) not in analysis.barriers:
            continue
        found = sides(analysis, eqn)
        if found is None:
            continue
        row, col = found
        row_side, col_side = eqn.invars[row], eqn.invars[col]
        if not (isinstance(row_side, Var) and isinstance(col_side, Var)):
            continue  # a constant carries no axis: the sides found always are variables
        row_root, _ = root_of(jaxpr, row_side, defined)
        col_root, chain = root_of(jaxpr, col_side, defined, analysis)
        uses.append(Use(idx, col, col_root, chain, row=row, row_root=row_root))
    return Pairing(jaxpr, analysis, tuple(uses)) if uses else None


def _seeds(split: Split) -> list[tuple[Var, AxisLoc]]:
    """The split's facts about the program's inputs: its analysis's seeds."""
    invars = set(split.jaxpr.invars)
    return [(v, loc) for (ctx, v), loc in split.analysis.locs.items() if ctx == () and v in invars]


def find(split: Split) -> Pairing | None:
    """The pairings of ``split``'s axis, or else of an axis born again at one of its stops
    (see the module docstring); None when nothing pairs either with itself."""
    jaxpr = split.jaxpr
    substituted = permute.substituted(jaxpr, split.analysis)
    if substituted is not None:
        analysis = Analysis(substituted, split.size, split.analysis.stop_slices)
        found = _pairing(jaxpr, analysis.run(_seeds(split)))
        if found is not None:
            return found
    found = _pairing(jaxpr, split.analysis)
    if found is not None:
        return found
    for size, seeds in seed_groups(reborn(split)):
        # parts of the axis (halves) are slices of one value: never carried back into it
        analysis = Analysis(jaxpr, size, stop_slices=size < split.size).run(seeds)
        found = _pairing(jaxpr, analysis)
        if found is not None:
            parts = len(seeds) if size < split.size else 1
            return dataclasses.replace(found, rows_at=parts)
    return None
