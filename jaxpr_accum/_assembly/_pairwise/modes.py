"""Each pass's gradient mode, and the two passes built with them.

``choose_and_build(two, requested, layout, accum_dtype=, measure=)`` decides each pass as
for any plan (``_choice.choose``: pass 1 stacks values, so it is remat or native; pass 2 often
ends in sums, where auto may pick fused). Auto's pick of fused for a pass is then confirmed as it is
for one pass (``_choice.confirm_fused``): the whole program's ``value_and_grad`` is measured
with that pass fused and with it remat (XLA's temp bytes, ``measure``), and fused stays only
while it is within 10% of remat.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxpr_accum._assembly._fallback import stage
from jaxpr_accum._assembly._pairwise.build import build
from jaxpr_accum._assembly._pairwise.plan import TwoPass
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._build._region_p import Mode
from jaxpr_accum._modes import _choice
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._modes._remat import REMAT


def choose_and_build(
    two: TwoPass,
    requested: Mode,
    layout: Layout,
    *,
    accum_dtype: Any,
    measure: Callable[[Callable], int | None] | None,
) -> tuple[Callable, list[Decision]]:
    """``(run, each pass's decision)``; ``measure``: XLA's temp bytes of a program's
    ``value_and_grad`` (None when nothing is differentiated: no confirmation)."""
    with stage("choosing the gradient modes"):
        decisions = [_choice.choose(c, requested, layout) for c in two.passes]
    with stage("building"):
        run = build(two, decisions, accum_dtype)
    for i, decision in enumerate(decisions):
        if not decision.unconfirmed or measure is None:
            continue
        with stage("measuring fused against remat"):
            in_remat = list(decisions)
            in_remat[i] = decision.to(REMAT, decision.reason)
            remat = build(two, in_remat, accum_dtype)
            decisions[i] = _choice.confirm_fused(decision, measure(run), measure(remat))
            run = remat if decisions[i].mode is REMAT else run
    return run, decisions
