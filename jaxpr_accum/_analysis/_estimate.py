"""``Candidate``: a split at a chunk size, with the cost model's estimate of what it saves
(``net_saving``, see ``_cost``) and why it may not (``warning``). Candidates are compared by
their estimate (``_candidates``) and reported by ``explain``; the mode's choice and the
planner read it. A candidate is frozen: ``at`` makes the same split at another chunk.
"""

from __future__ import annotations

import dataclasses

from jaxpr_accum._analysis._cost import MARGIN, format_bytes, nbytes
from jaxpr_accum._analysis._split import Split


@dataclasses.dataclass(frozen=True, eq=False)
class Candidate:
    """A split (``_split``) at a chunk size, with what the cost model expects of it."""

    split: Split
    chunk: int
    advice: str = ""  # appended to ``warning``: a better axis elsewhere, if one was found

    def at(self, chunk: int) -> Candidate:
        """The same split at another chunk (the analysis and the stages are reused)."""
        return dataclasses.replace(self, chunk=chunk)

    @property
    def avoided_bytes(self) -> int:
        """Bytes of the body's materialised intermediates no longer held at full size."""
        held, size = self.split.held_bytes, self.split.size
        return int(held * (1 - min(self.chunk, size) / size)) if size else 0

    @property
    def net_saving(self) -> int:
        """The estimated bytes chunking saves: ``avoided_bytes`` less what the loop adds
        (see the module docstring). Candidates are compared by it; ``explain`` shows it."""
        split = self.split
        n_chunks = -(-split.size // max(self.chunk, 1)) if split.size else 0
        accumulators = sum(nbytes(v) for v in split.sums)
        accumulators += n_chunks * sum(nbytes(v) for v, _ in split.partials)
        accumulators += sum(s.nbytes * len(s.terms) for s in split.sinks)
        cotangents = split.invariant_bytes
        return self.avoided_bytes - split.stacked_bytes - accumulators - cotangents

    def builds_no_loop(self) -> bool:
        """Whether the build is the program as written whatever the mode: the axis is empty."""
        return self.split.size == 0

    def no_saving_is_certain(self) -> bool:
        """Whether an estimate of no saving needs no measurement: the axis is empty, one
        chunk covers it, or none of the region's intermediates is materialised at full size."""
        split = self.split
        return split.size == 0 or self.chunk >= split.size or self.avoided_bytes == 0

    def warning(self) -> str | None:
        """Why this plan is not expected to save memory, or None."""
        split, avoided = self.split, self.avoided_bytes
        if split.size == 0:
            return "the axis has size 0: there is nothing to chunk"
        if split.stacked and avoided <= split.stacked_bytes:
            why = (
                f"the region stacks {format_bytes(split.stacked_bytes)} of outputs back to full "
                f"size, at least the {format_bytes(avoided)} of per-chunk intermediates it "
                "avoids holding"
            )
        elif avoided == 0 and self.chunk >= split.size:
            why = f"one chunk of {self.chunk} holds the whole axis of {split.size}"
        elif avoided == 0:
            why = (
                "none of the region's axis-carrying intermediates is materialised at full size "
                "(XLA fuses elementwise chains into their readers): chunking avoids holding "
                "nothing"
            )
        elif (estimate := self.net_saving) <= 0:
            why = (
                f"what the loop adds (accumulators, and the cotangents of its "
                f"{len(split.invariants)} loop-invariant inputs) outweighs the "
                f"{format_bytes(avoided)} of per-chunk intermediates it avoids holding "
                f"(estimated: {format_bytes(-estimate)} more)"
            )
        elif split.stops and estimate < MARGIN * (split.held_bytes + split.epilogue_result_bytes):
            why = (
                f"the {format_bytes(split.epilogue_result_bytes)} the function computes after the "
                f"loop, where the region stops, stay at full size: the estimated "
                f"{format_bytes(estimate)} it saves is under {MARGIN:.0%} of what the function "
                "holds"
            )
        else:
            return None
        return f"this plan is not expected to save memory: {why}{self.advice}"
