"""Each pass's gradient mode, and the two passes built with them.

``choose_and_build(two, requested, layout, diff, accum_dtype=)`` decides each pass as for any
plan (``_choice.choose``, by the estimate alone: nothing is compiled to choose; pass 1
stacks values, so it is remat or native; pass 2 often ends in sums, where auto may pick
fused). Each pass is weighed for what the caller differentiates (``diff``: indices of the
program's inputs), translated to the pass's own inputs (``pass_diffs``): pass 1 reads the
program's inputs; pass 2 reads them, the stacked values (rows and column copies) and the
constants, and an input of pass 2 is differentiated where the value it is fed depends on a
differentiated program input (``_choice.differentiated``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jaxpr_accum._base._errors import stage
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._modes import _choice
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._modes._mode import Mode
from jaxpr_accum._pairwise.build import build
from jaxpr_accum._pairwise.plan import TwoPass


def pass_diffs(two: TwoPass, diff: Sequence[int]) -> list[list[int]]:
    """For each pass (``two.passes``), the indices of its inputs that depend on the program
    inputs at ``diff``."""
    jaxpr = two.single.split.jaxpr
    reached = _choice.differentiated(jaxpr, diff, jaxpr.eqns)
    second = [two.columns.get(v, v) for v in two.second.split.jaxpr.invars]  # as ``build``
    return ([list(diff)] if two.first is not None else []) + [
        [i for i, v in enumerate(second) if v in reached]
    ]


def choose_and_build(
    two: TwoPass,
    requested: Mode,
    layout: Layout,
    diff: Sequence[int],
    *,
    accum_dtype: np.dtype | None,
) -> tuple[Callable, list[Decision]]:
    """``(run, each pass's decision)``."""
    with stage("choosing the gradient modes"):
        decisions = [
            _choice.choose(c, requested, layout, d)
            for c, d in zip(two.passes, pass_diffs(two, diff), strict=True)
        ]
    with stage("building"):
        run = build(two, decisions, accum_dtype)
    return run, decisions
