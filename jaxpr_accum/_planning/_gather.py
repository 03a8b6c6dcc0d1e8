"""``gather="auto"`` under a memory budget: sharded parameters gathered once before the loop
where the budget affords them whole at some chunk, else per chunk.

As the budget search keeps fused where it fits at some chunk (``_budget``), gathering once is
kept where it fits at some chunk: the search (``_budget.choose_chunk``) runs first with the
layouts gathering once; where no chunk fits, again with the layouts gathering per chunk
(FSDP's memory). Gathering once leaves per chunk only the gradients' reduce-scatters
(remat, fused; none under native), at a chunk that may be smaller. ``explain`` says which
and why (the layout's ``Gather.why``).

Invariants: the program chosen was itself compiled and measured within the budget (the
search's); nothing more is measured where no parameter is sharded, or where ``gather=`` is
not ``"auto"`` (``"once"`` and ``"chunk"`` fix the layouts the one search measures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._base._errors import SerializeError
from jaxpr_accum._build import _layout
from jaxpr_accum._build._shards import Gather
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._planning._budget import Request, choose_chunk


def fit(
    first: Decision, layout_for: Callable[[int], _layout.Layout], request: Request, gather: str
) -> Decision:
    """The budget search's decision (``_budget.choose_chunk``; ``first``: the mode's at the
    whole axis, ``layout_for``: the layout at a chunk), gathering once where that fits at
    some chunk under ``gather="auto"``."""
    whole = layout_for(first.candidate.split.size)
    sharded = isinstance(whole, _layout.ShardedLayout) and whole.gathered(first.candidate.split)
    if gather != "auto" or not sharded:
        return choose_chunk(first, layout_for, request)
    limit = format_bytes(request.limit)

    def gathering(once: bool, why: str) -> Callable[[int], _layout.Layout]:
        return lambda k: _gathering(layout_for(k), Gather(once, f"gather='auto': {why}"))

    try:
        decision = choose_chunk(first, gathering(True, ""), request)
    except SerializeError:  # no chunk fits them whole: per chunk
        why = f"gathered once they fit the memory budget {limit} at no chunk"
        return choose_chunk(first, gathering(False, why), request)
    budget = decision.budget
    assert budget is not None, "choose_chunk decides with its Budget"
    measured, k = format_bytes(budget.measured), budget.chunk
    why = f"gathered once they fit the memory budget {limit} (chunk {k}: {measured})"
    return dataclasses.replace(decision, layout=gathering(True, why)(k))


def _gathering(layout: _layout.Layout, gather: Gather) -> _layout.Layout:
    return layout.gathering(gather) if isinstance(layout, _layout.ShardedLayout) else layout


def carried(cached: Decision, layout: _layout.Layout) -> _layout.Layout:
    """``layout`` (detected again for a call that reuses ``cached``), gathering as ``cached``
    decided."""
    if isinstance(cached.layout, _layout.ShardedLayout):
        return _gathering(layout, cached.layout.gather)
    return layout
