"""``Decision``: what planning decided for one pass, as one frozen value.

The candidate at its chunk (``_estimate.Candidate``), the gradient ``Mode`` (``_mode``; never
``AUTO``: that is a request) and why, the layout (``_layout``), and with ``memory=`` the chunk
search that chose the chunk (``Budget``, each compile a ``Trial``). ``_choice.choose`` makes
one (by the estimate alone), the budget search (``_budget.choose_chunk``) returns a new one at
the chunk it chose, with its ``Budget``; ``_pairwise`` makes one per pass;
``_assemble.build`` builds one and ``Plan.from_decision`` reports it. A decision is never
changed in place: ``to`` and ``dataclasses.replace`` make the next.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._modes._mode import Mode


class Trial(NamedTuple):
    """One compile of the search, for ``Budget.tried``: the gradient mode's name (``grad``),
    the ``chunk``, and the temp bytes ``measured``."""

    grad: str
    chunk: int
    measured: int


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the chunk search of a memory budget did (``_budget.choose_chunk``), for
    ``explain``: the ``limit`` in bytes, as ``requested``, the chunk and mode chosen and their
    measured temp bytes, every ``Trial``, the fitted model and the time it took."""

    limit: int
    requested: int | float | str  # as the user wrote it
    chunk: int
    grad: str
    measured: int
    tried: tuple[Trial, ...]  # every chunk compiled and measured, in order
    model: tuple[float, float] | None  # bytes ~ a + b * chunk, fitted to the chosen mode's
    seconds: float
    wrt: str = "every floating argument"  # what the measured value_and_grad differentiates
    original: int | None = None  # the original's memory, measured when ``explain`` asks

    def lines(self) -> list[str]:
        req = "" if isinstance(self.requested, int) else f" ({self.requested!r})"
        out = [
            f"  memory budget: {format_bytes(self.limit)}{req} of XLA temp memory for "
            f"value_and_grad with respect to {self.wrt}",
            f"    chosen: chunk {self.chunk} ({self.grad}), measured {format_bytes(self.measured)}",
        ]
        if self.original is not None:
            out.append(f"    original (unchunked): {format_bytes(self.original)}")
        if self.model is not None:
            a, b = self.model
            out.append(
                f"    fitted model: {format_bytes(a)} + {format_bytes(b)} per chunk position"
            )
        tried = ", ".join(
            f"{t.chunk} -> {format_bytes(t.measured)}"
            + ("" if t.measured <= self.limit else " (over)")
            + (f" [{t.grad}]" if t.grad != self.grad else "")
            for t in self.tried
        )
        out.append(f"    chunks tried ({len(self.tried)} compiles, {self.seconds:.1f} s): {tried}")
        return out


@dataclasses.dataclass(frozen=True)
class Decision:
    """One pass's plan: ``candidate`` (a split at its chunk) differentiated in ``mode`` (never
    ``AUTO``) for ``reason``, laid out as ``layout``; ``budget``: with ``memory=``, the chunk
    search that chose the chunk (``Budget``), else None."""

    candidate: Candidate
    mode: Mode
    reason: str
    layout: Layout
    budget: Budget | None = None

    def to(self, mode: Mode, reason: str) -> Decision:
        """The same plan in another mode."""
        return dataclasses.replace(self, mode=mode, reason=reason)
