"""``Decision``: what planning decided for one pass, as one frozen value.

The candidate at its chunk (``_cost.Candidate``), the gradient ``Mode`` (``_region_p``; never
``AUTO``: that is a request) and why, the layout (``_layout``), and with ``memory=`` the chunk
search that chose the chunk (``_budget.Budget``). ``_choice.choose`` makes one (by the
estimate alone), the budget search (``_budget.choose_chunk``) returns a new one at the chunk
it chose, ``_pairwise`` makes one per pass; ``_assemble.build`` builds one and
``Plan.from_decision`` reports it. A decision is never changed in place: ``to`` and
``dataclasses.replace`` make the next.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpr_accum._build._layout import Layout
from jaxpr_accum._build._region_p import Mode
from jaxpr_accum._planning._cost import Candidate


@dataclasses.dataclass(frozen=True)
class Decision:
    """One pass's plan: ``candidate`` (a split at its chunk) differentiated in ``mode`` (never
    ``AUTO``) for ``reason``, laid out as ``layout``; ``budget``: with ``memory=``, the chunk
    search that chose the chunk (``_budget.Budget``), else None."""

    candidate: Candidate
    mode: Mode
    reason: str
    layout: Layout
    budget: Any = None

    def to(self, mode: Mode, reason: str) -> Decision:
        """The same plan in another mode."""
        return dataclasses.replace(self, mode=mode, reason=reason)
