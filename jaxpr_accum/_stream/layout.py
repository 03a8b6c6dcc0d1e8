"""The layout of a region's streamed outputs: one accumulator per term of every streamed sum,
and one final stabiliser per term that has an ``Exp`` factor (see ``jaxpr_accum._stream``).

``StreamLayout`` is built once from the split's sinks; the chunk loop, the gradient passes,
the merge across devices and the combination after the loop all read the streamed outputs
through it, so adding a kind of term touches this module only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from jaxpr_accum._compat import Array
from jaxpr_accum._stream.online import Sink
from jaxpr_accum._stream.terms import Exp

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class StreamLayout:
    """Every term of the streamed sums, in order: ``(sink, its Exp factor or None)``."""

    terms: tuple[tuple[Sink, Exp | None], ...]

    @classmethod
    def of(cls, sinks: Sequence[Sink]) -> StreamLayout:
        return cls(tuple((sink, t.exp) for sink in sinks for t in sink.terms))

    @property
    def n_terms(self) -> int:
        return len(self.terms)

    @property
    def n_finals(self) -> int:
        """Final stabilisers: one per term with an ``Exp`` factor."""
        return sum(f is not None for _, f in self.terms)

    def finals_per_term(self, finals: Sequence[Array]) -> list[Array | None]:
        """``finals`` (one per ``Exp`` term) spread to one entry per term (None elsewhere)."""
        it = iter(finals)
        out = [None if f is None else next(it) for _, f in self.terms]
        assert next(it, None) is None, "more final stabilisers than Exp terms"
        return out

    def exp_only(self, per_term: Sequence[T]) -> list[T]:
        """The entries of ``per_term`` (one per term) that belong to ``Exp`` terms."""
        return [x for x, (_, f) in zip(per_term, self.terms, strict=True) if f is not None]

    def by_sink(
        self, accs: Sequence[Array], finals: Sequence[Array]
    ) -> list[tuple[Sink, list[Array], list[Array]]]:
        """``(sink, its accumulators, its terms' final stabilisers)`` per sink, in order;
        the stabilisers only for its ``Exp`` terms, as ``_stream.combine`` takes them."""
        per_term = self.finals_per_term(finals)
        out: list[tuple[Sink, list[Array], list[Array]]] = []
        for i, (sink, _) in enumerate(self.terms):
            if not out or out[-1][0] is not sink:
                out.append((sink, [], []))
            out[-1][1].append(accs[i])
            final = per_term[i]
            if final is not None:
                out[-1][2].append(final)
        return out
