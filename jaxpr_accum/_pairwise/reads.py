"""Per-row values read at the pairs' column positions: ``k @ z`` (a kernel matrix contracted
over its columns with the rows of ``z``: the kernel-weighted mean of the particles) and
``k[:, :, None] * g[None]`` summed over the columns (SVGD's step, a double ``vmap``).

In pass 2 the pairs carry the axis on their rows (a block of them) and their columns are
whole. An equation that reads the pairs and a per-row value ``v`` laid out along the columns
(``k @ v`` contracts the columns of ``k`` with the rows of ``v``; ``g[None]`` puts the rows
of ``g`` on the columns' dimension) needs ``v`` whole as well: read per block, as pass 2
reads every per-row value, it would put the axis on the columns too, and the region would
stop (the axis at two places), leaving the pairs after the loop. So such an equation is a
*read* (``detect.Read``): as a pairing's column side, the operand's root (the value it is a
layout of, or a rearrangement of the rows of: ``permute``) is stacked by pass 1, and pass 2
reads it twice, as chunked rows wherever the program reads it per row and whole, through its
column copy and a copy of the chain from the root, at the read. The read's result then
carries the row axis only: that block's rows of it.

**Candidates** (``candidates``): a top-level ``dot_general`` or elementwise equation, not a
pairing, that reads a value computed from a pairing (``k``) and an operand that is not, and
that is a layout (or a rearrangement of the rows) of a root carrying the axis in the
pairing's analysis (the encoded rows, the
chunked input or another per-row value computed from it: what pass 1 can stack).

**Choice** (``extend``). Rewiring any operand to a column copy computes what the original
computes: the copy is fed the same array as its root, the chain is pure (layouts and
rearrangements, applied to the whole copy), and JAX adds the cotangents of the root's rows
and columns as it does for a pairing. So the choice decides the plan, never a number. It is
made by pass 2's analysis (``stops``: the equations where pass 2 would stop with a set of
reads, None where there is no pass 2): every candidate is taken; then each is dropped where
pass 2 stops at fewer equations without it (a per-row value read at the rows, ``x + phi`` or
``w[:, None] * k``: its column copy, read at the rows, would carry the axis there too), then
each where pass 2 stops at no more equations without it (a contraction that was not with
the column side, or one that another read already frees); the reads left are kept only
where pass 2 stops at fewer equations than with none. Otherwise the pairing is returned
unchanged: the plan is the one without reads. At most ``MAX_READS`` candidates are weighed
(``2 MAX_READS + 2`` analyses of pass 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxpr_accum._analysis._stages import variables
from jaxpr_accum._compat import JaxprEqn, Var
from jaxpr_accum._engine._table import rule_for
from jaxpr_accum._pairwise import detect
from jaxpr_accum._pairwise.detect import Pairing, Read

MAX_READS = 8  # candidates weighed by ``extend``


def candidates(pairing: Pairing) -> tuple[Read, ...]:
    """The equations that may read a root's column copy (see the module docstring), in
    program order, at most ``MAX_READS``."""
    jaxpr, analysis = pairing.jaxpr, pairing.analysis
    defined = detect.definitions(jaxpr)
    uses = {u.index for u in pairing.uses}
    paired: set = set()  # values computed from a pairing
    found: list[Read] = []
    for idx, eqn in enumerate(jaxpr.eqns):
        ins = variables(eqn.invars)
        if idx not in uses and not paired.intersection(ins):
            continue
        paired.update(eqn.outvars)
        if idx in uses or not _reads_pairs(eqn):
            continue
        for col, v in enumerate(eqn.invars):
            if not isinstance(v, Var) or v not in ins or v in paired:
                continue
            if not detect.carries(analysis, v):
                continue
            root, chain = detect.root_of(jaxpr, v, defined, analysis)
            if detect.carries(analysis, root):
                found.append(Read(idx, col, root, chain))
    return tuple(found[:MAX_READS])


def _reads_pairs(eqn: JaxprEqn) -> bool:
    """A contraction or an elementwise equation, without effects."""
    p = eqn.primitive
    return not eqn.effects and (p is detect.dot_general() or rule_for(p).elementwise)


def extend(pairing: Pairing, stops: Callable[[Pairing], int | None]) -> Pairing:
    """``pairing`` with the reads that remove stops of pass 2 (see the module docstring),
    or ``pairing`` itself where none does."""
    found = list(candidates(pairing))
    if not found:
        return pairing

    def weigh(reads: list[Read]) -> float:
        n = stops(dataclasses.replace(pairing, reads=tuple(reads)))
        return float("inf") if n is None else n

    best = weigh(found)
    for harmful in (True, False):  # first those that add stops, then those that remove none
        for read in list(found):
            rest = [r for r in found if r is not read]
            fewer = weigh(rest)
            if fewer < best or (fewer == best and not harmful):
                found, best = rest, fewer
    if not found or best >= weigh([]):
        return pairing
    return dataclasses.replace(pairing, reads=tuple(found))
