"""``TwoPass``: a program that pairs the axis with itself, planned as two ordinary splits.

``plan(single, stream)`` takes the one-pass candidate (where the pairing is a barrier and
the pairs run after the loop, on the full axis) and, when ``detect`` finds pairings, adds the
reads of per-row values at the pairs' columns that free pass 2 (``reads``: ``k @ z``; where
the plan with them fails, it is planned without), cuts the program in two (``rewrite``: each
effect and each custom VJP call in exactly one pass; no two-pass plan where the cut would
reorder the effects) and plans each part as any other program is planned
(``_split.make_split``):

- pass 1 is analysed with the one-pass plan's own facts (the same axis, where the program's
  inputs and values carry it), so it chunks exactly what the one-pass plan chunks before the
  pairing and stacks the paired values;
- pass 2 is analysed with the pairing's axis seeded where its inputs carry it: the stacked
  values (rows) and any original input the pairing's analysis reached. Its column copies
  carry no axis. Its constants (labels, masks, positives from ``iota``) are first copied per
  reader (``constants.private``), so each is computed per block where its reader needs the
  axis; a constant computed by an equation that stops the analysis becomes an input
  computed whole before pass 2 (``constants.materialise``), and pass 2 is analysed again
  (at most ``MAX_ROUNDS`` times).

The estimate is the sum of the two passes' (``_cost``): pass 2's avoided bytes are the
pairs' intermediates held per row block instead of whole, less the column copies'
cotangent accumulators; pass 1's stacked values are counted as the cost of pass 1, as in the
one-pass plan. The planner takes the two passes where they are expected to save more than
the one pass, and weighs them against the function as written like any plan (``_worth``;
a paired plan that still stops is measured, ``_worth.for_paired``).
"""

from __future__ import annotations

import dataclasses

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import format_bytes, nbytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._analysis._split import Split, make_split
from jaxpr_accum._analysis._stages import Stop
from jaxpr_accum._compat import Jaxpr, Var
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._pairwise import constants, detect, reads, rewrite
from jaxpr_accum._pairwise.constants import Constants
from jaxpr_accum._pairwise.detect import Pairing

# Rows of pass 2's block below which it is not shrunk (``block_of``): each block also stacks
# its partials (a column's max over its rows, ``N`` long), so smaller blocks hold fewer pairs
# but stack more partials. CLIP's symmetric loss at N = 4096 holds 7.6 MiB at 32 rows, 8.1 at
# 64 and 9.8 at 37 (a remainder), and grows 2.31x per doubling at 32, 2.01x at 64.
MIN_BLOCK = 64
MAX_ROUNDS = 4  # analyses of pass 2 with constants computed whole before it (``constants``)


@dataclasses.dataclass(frozen=True, eq=False)
class TwoPass:
    """Pass 1 (``first``, None when the paired values are the program's inputs) stacks
    ``stacked``; pass 2 (``second``) reads them as chunked rows and, through the column copies
    (``columns``: copy -> root), whole, and reads the ``constants`` computed whole before it.
    ``single``: the one-pass plan this replaces."""

    single: Candidate
    pairing: Pairing
    stacked: tuple[Var, ...]
    first: Candidate | None
    second: Candidate
    columns: dict[Var, Var]
    constants: Constants = Constants()

    @property
    def chunk(self) -> int:
        """The chunk, in rows of the chunked axis (pass 1's; pass 2's block: ``block_of``)."""
        return self.single.chunk

    @property
    def passes(self) -> tuple[Candidate, ...]:
        return (self.second,) if self.first is None else (self.first, self.second)

    def at(self, chunk: int) -> TwoPass:
        return dataclasses.replace(
            self,
            single=self.single.at(chunk),
            first=None if self.first is None else self.first.at(chunk),
            second=self.second.at(
                block_of(
                    chunk,
                    self.pairing,
                    first=None if self.first is None else self.first.split,
                    second=self.second.split,
                    columns=self.columns,
                )
            ),
        )

    @property
    def stops(self) -> tuple[Stop, ...]:
        """Where either pass stopped (``_stages.Stop``), pass 1's first."""
        return tuple(stop for c in self.passes for stop in c.split.stops)

    @property
    def avoided_bytes(self) -> int:
        return sum(c.avoided_bytes for c in self.passes)

    @property
    def net_saving(self) -> int:
        return sum(c.net_saving for c in self.passes)

    def builds_no_loop(self) -> bool:
        return any(c.builds_no_loop() for c in self.passes)

    def no_saving_is_certain(self) -> bool:
        return all(c.no_saving_is_certain() for c in self.passes)

    def warning(self) -> str | None:
        """Why the two passes are not expected to save memory, or None."""
        if self.net_saving > 0:
            return None
        worst = [w for c in self.passes if (w := c.warning()) is not None]
        why = worst[0].split(": ", 1)[-1] if worst else "what the passes add outweighs it"
        return (
            "this plan is not expected to save memory: its two passes are estimated to save "
            f"{format_bytes(self.avoided_bytes)} of intermediates held whole, less what the "
            f"loops add ({why})"
        )


def plan(single: Candidate, names: dict, stream: bool = True) -> TwoPass | None:
    """The two-pass plan of ``single``'s program, or None when nothing pairs an axis with
    itself (or pass 2 would chunk nothing); ``names``: the inputs' names, for ``explain``.
    The pairing's reads of per-row values at its columns (``reads``) are those that remove
    stops of pass 2; where the plan with them fails, it is the plan without."""
    pairing = detect.find(single.split)
    if pairing is None:
        return None
    extended = reads.extend(pairing, _stops)
    two = _two_passes(single, extended, names, stream)
    if two is None and extended is not pairing:
        return _two_passes(single, pairing, names, stream)
    return two


def _two_passes(single: Candidate, pairing: Pairing, names: dict, stream: bool) -> TwoPass | None:
    """The two passes of ``pairing`` (its uses and reads), or None (see ``plan``)."""
    split = single.split
    found = rewrite.cut(pairing)
    if found is None:
        return None
    stacked, once = found
    first = None
    if stacked:
        program = rewrite.first_pass(split.jaxpr, stacked, once)
        values = {*program.invars, *(v for e in program.eqns for v in e.outvars)}
        facts = [
            (v, loc) for (ctx, v), loc in split.analysis.locs.items() if ctx == () and v in values
        ]
        analysis = Analysis(program, split.size, split.analysis.stop_slices).run(facts)
        first = Candidate(make_split(program, analysis, split.born, stream), single.chunk)
        if not first.split.has_body:
            return None
    cut_out = _second_pass(pairing, stacked, once)
    program, seeds, analysis = cut_out.program, cut_out.seeds, cut_out.analysis
    made: list[Var] = []
    whole = program
    for _ in range(MAX_ROUNDS):
        cut = constants.materialise(program, analysis)
        if cut is None:
            break
        program, inputs = cut
        made.extend(inputs)
        analysis = Analysis(program, pairing.analysis.size).run(seeds)
    second = make_split(program, analysis, _born(pairing, seeds, names), stream)
    if not second.has_body:
        return None
    fed = Constants(tuple(made), constants.program_of(whole, made) if made else None)
    block = block_of(
        single.chunk,
        pairing,
        first=None if first is None else first.split,
        second=second,
        columns=cut_out.columns,
    )
    second_candidate = Candidate(second, block)
    return TwoPass(single, pairing, stacked, first, second_candidate, cut_out.columns, fed)


def block_of(
    chunk: int,
    pairing: Pairing,
    *,
    first: Split | None,
    second: Split,
    columns: dict[Var, Var],
) -> int:
    """Pass 2's block along the pairing's axis for ``chunk`` rows of the chunked axis.

    At most the positions that hold ``chunk`` rows (``pairing.rows_at`` rows each: a block
    of the halves of one batch takes ``chunk // 2`` rows of each half). Fewer where a block
    of that many rows would hold more than the larger of what a chunk of pass 1 holds and
    the columns that pass 2 reads whole (each row of the pairs is ``N`` long, so ``chunk``
    rows of them grow with ``N``); never fewer than ``MIN_BLOCK`` (or that many rows, if
    fewer). So the pairs never hold more per step than the rest of the plan holds anyway,
    and the peak grows about linearly with ``N`` whatever ``chunk`` is."""
    rows = max(1, chunk // pairing.rows_at)
    per_position = second.held_bytes / second.size if second.size else 0.0
    if per_position == 0:
        return rows
    per_chunk = 0.0
    if first is not None and first.size:
        per_chunk = min(chunk, first.size) * first.held_bytes / first.size
    whole_columns = sum(nbytes(root) for root in set(columns.values()))
    fits = int(max(per_chunk, whole_columns) // per_position)
    return min(rows, max(fits, MIN_BLOCK))


@dataclasses.dataclass(frozen=True)
class _Second:
    """Pass 2 as cut (its constants private to each reader), its column copies (copy ->
    root), the seeds of its analysis and that analysis."""

    program: Jaxpr
    columns: dict[Var, Var]
    seeds: list
    analysis: Analysis


def _second_pass(pairing: Pairing, stacked: tuple[Var, ...], once: frozenset[int]) -> _Second:
    program, columns = rewrite.second_pass(pairing, stacked, once)
    program = constants.private(program)
    seeds = [(v, loc) for v in program.invars if (loc := pairing.loc(v)) is not None]
    analysis = Analysis(program, pairing.analysis.size).run(seeds)
    return _Second(program, columns, seeds, analysis)


def _stops(pairing: Pairing) -> int | None:
    """The equations where pass 2's analysis stops (before constants are computed whole),
    or None where the effects allow no two passes."""
    found = rewrite.cut(pairing)
    if found is None:
        return None
    return len(_second_pass(pairing, *found).analysis.barriers)


def describe_value(pairing: Pairing, v: Var, names: dict) -> str:
    """An input's name (``x``), or a computed value's type and the equation that computes it
    (``float32[N,d] from `div` at file:line (fn)``)."""
    if v in names:
        return names[v]
    eqn = pairing.analysis.definition((), v)
    where = "" if eqn is None else f" from `{eqn.primitive.name}` at {_compat.source_line(eqn)}"
    return f"{v.aval.str_short()}{where}"


def _born(pairing: Pairing, seeds: list, names: dict) -> str:
    """Where pass 2's axis is: the rows of the paired values."""
    found = [
        f"{describe_value(pairing, v, names)} at axis {loc.dim}"
        for v, loc in seeds
        if v in pairing.roots
    ]
    return "the rows of " + ", ".join(found)
