"""Each pass's gradient mode, and the two passes built with them.

``choose_and_build(two, requested, accum_dtype, measure)`` picks each pass's mode as for any
plan (``_choice.choose``: pass 1 stacks values, so it is remat or native; pass 2 often ends in
sums, where auto may pick fused). Auto's pick of fused for a pass is then confirmed as it is
for one pass (``_choice.confirm_fused``): the whole program's ``value_and_grad`` is measured
with that pass fused and with it remat (XLA's temp bytes, ``measure``), and fused stays only
while it is within 10% of remat.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jaxpr_accum import _choice
from jaxpr_accum._fallback import stage
from jaxpr_accum._pairwise.build import build
from jaxpr_accum._pairwise.plan import TwoPass


def choose_and_build(
    two: TwoPass,
    requested: str,
    accum_dtype: Any,
    measure: Callable[[Callable], int | None] | None,
) -> tuple[Callable, list[tuple[str, str]]]:
    """``(run, [(mode, why) per pass])``; ``measure``: XLA's temp bytes of a program's
    ``value_and_grad`` (None when nothing is differentiated: no confirmation)."""
    with stage("choosing the gradient modes"):
        grads = [_choice.choose(c, requested) for c in two.passes]
    with stage("building"):
        run = build(two, [g for g, _ in grads], accum_dtype)
    for i, (grad, why) in enumerate(grads):
        if requested != "auto" or grad != "fused" or measure is None:
            continue
        with stage("measuring fused against remat"):
            modes = [g for g, _ in grads]
            modes[i] = "remat"
            remat = build(two, modes, accum_dtype)
            grads[i] = _choice.confirm_fused(why, measure(run), measure(remat))
            run = remat if grads[i][0] == "remat" else run
    return run, grads
