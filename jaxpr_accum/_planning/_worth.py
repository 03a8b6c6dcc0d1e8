"""Never worse: a plan not expected to save memory runs the function as written, with no loop.

Under ``grad="auto"`` a candidate whose estimate (``_estimate.Candidate.warning``) says it saves
nothing is not built into a loop. Where the estimate is certain (the axis is empty, one chunk
covers it, or none of the region's intermediates is materialised at full size) that is the
decision; where it rests on the cost model's arithmetic (stacked outputs and accumulators
against the activations avoided, or a plan that stops with most of the function's memory
left after its loop, ``_cost.MARGIN``), both programs are compiled and XLA's temp bytes of
their ``value_and_grad`` with respect to the floating arguments decide: the loop is kept only
if it measures at least ``MARGIN`` smaller. ``explain`` says why, and the first call warns.

A program that pairs the axis with itself (``_pairwise``) and whose plan still stops
somewhere is held to more (``for_paired``): the pairs it could not chunk are the
largest values of such a program, so the estimate is not trusted and both programs are
measured; the loop is kept only if it measures at least ``MARGIN`` below the function as
written, and the warning names where the plan stopped.

A choice at position ``axis`` (``size=`` or automatic) for which an axis born at another
position is expected to save more (``Candidate.advice``, ``_candidates``) is held to the same
margin (``for_advised``): both programs are measured, and where the loop saves less than
``MARGIN`` the warning names the other axis and ``axis=None``, which selects it; under auto
the function then runs as written.

An explicit gradient mode (``grad="remat"``, ``"fused"`` or ``"native"``) is a request for
that loop: it runs whatever the estimate, with the same warning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeAlias

from jaxpr_accum._analysis._cost import MARGIN, format_bytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._analysis._stages import Stop
from jaxpr_accum._modes._mode import AUTO, Mode
from jaxpr_accum._pairwise.plan import TwoPass

FORCE_HINT = "; pass grad='remat' (or 'fused' / 'native') to run the chunked loop anyway"


#: What is weighed: a ``_estimate.Candidate``, or the two passes of ``_pairwise.TwoPass``.
Estimate: TypeAlias = Candidate | TwoPass


@dataclasses.dataclass(frozen=True)
class Programs:
    """The chunked program ``run`` and the function as written (``original``), with
    ``measure(fun)``: XLA's temp bytes of ``fun``'s ``value_and_grad`` (None: not measurable
    in isolation, and the estimate decides)."""

    run: Callable
    original: Callable
    measure: Callable[[Callable], int | None]

    def measured(self) -> tuple[int, int] | None:
        """``(run's figure, the original's)``; None where either is not measurable."""
        chunked, written = self.measure(self.run), self.measure(self.original)
        return None if chunked is None or written is None else (chunked, written)

    def shortfall(self) -> str | None:
        """Where ``run`` is measured to save less than ``MARGIN`` of the function as written:
        the two figures, as a phrase; else (or where either is not measurable) None."""
        figures = self.measured()
        if figures is None or figures[0] < (1 - MARGIN) * figures[1]:
            return None
        chunked, written = figures
        return (
            f"this plan saves less than {MARGIN:.0%} of the memory: measured "
            f"{format_bytes(chunked)} chunked against {format_bytes(written)} as written"
        )


def as_written_instead(
    candidate: Estimate,
    requested: Mode,
    programs: Programs,
) -> str | None:
    """Why the function should run as written instead of ``programs.run`` (None: keep the
    loop)."""
    warning = candidate.warning()
    if candidate.builds_no_loop():  # an empty axis: the program as written, whatever the mode
        return f"{warning}; the function runs as written"
    if warning is None or requested is not AUTO:
        return None
    if not candidate.no_saving_is_certain():
        figures = programs.measured()
        if figures is not None:  # else the estimate decides
            chunked, written = figures
            if chunked < (1 - MARGIN) * written:
                return None
            return (
                f"{warning}; measured: {format_bytes(chunked)} chunked against "
                f"{format_bytes(written)} as written, so the function runs as written{FORCE_HINT}"
            )
    return f"{warning}; the function runs as written{FORCE_HINT}"


def for_paired(
    why: str | None,
    stops: Sequence[Stop],
    requested: Mode,
    programs: Programs,
) -> str | None:
    """``as_written_instead``'s verdict ``why`` for a program that pairs the axis with itself,
    whose plan stops at ``stops``: a plan to run as written is told where it stops; a loop
    kept is dropped where it measures less than ``MARGIN`` below the function as written
    (kept when there is no stop, the mode was requested, or nothing is measurable)."""
    where = "; ".join(str(stop) for stop in stops)
    if why is not None:
        return f"{why} (the plan stops at {where})" if stops else why
    if not stops or requested is not AUTO:
        return None
    short = programs.shortfall()
    return (
        None
        if short is None
        else f"{short}, as it stops at {where}; the function runs as written{FORCE_HINT}"
    )


def for_advised(advice: str, programs: Programs) -> str | None:
    """For a choice with ``advice`` (another axis expected to save more; "" where none)
    whose loop is kept: why it is not worth it (measured, less than ``MARGIN`` below the
    function as written), else None. Auto then runs the function as written; an explicit
    mode runs the loop with the warning."""
    if not advice:
        return None
    return programs.shortfall()
