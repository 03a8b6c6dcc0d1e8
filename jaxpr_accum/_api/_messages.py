"""A call's plan warning, issued once per function (``warn_once``), with what caused it: the
``argnums`` hint where the named arguments look like parameters
(``_arguments.parameters_hint``), and the stop (the primitive and the user's source line)
where the region stacks values back to full size, else where the chunked axis is born."""

from __future__ import annotations

import dataclasses

from jaxpr_accum._analysis import _arguments
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._base._errors import warn
from jaxpr_accum._base._settings import Settings
from jaxpr_accum._report._plan import Plan


def with_hint(plan: Plan, settings: Settings, call: _arguments.Call) -> Plan:
    """``plan``, its warning (where it is not expected to save memory) led by the ``argnums``
    hint where there is one. A plan that saves gets no hint: chunking arguments without the
    others' batch size (the keys of an attention, the vocabulary of an output layer) is what
    such a plan is for."""
    hint = _arguments.parameters_hint(settings, call)
    if hint is None or plan.warning is None:
        return plan
    return dataclasses.replace(plan, warning=f"{hint}; and {plan.warning}")


def caused_by(plan: Plan, split: Split) -> str:
    """What the warning is about, where the program says it: the stop (the primitive and the
    user's source line) of a region that stacks values back to full size there; else where
    the chunked axis is born (an argument, or the primitive and line that create it)."""
    if not split.stacked or not plan.stops:
        return f"; the chunked axis is born at {plan.born}"
    more = len(plan.stops) - 1
    places = "place" if more == 1 else "places"
    others = f" (and {more} more {places}: explain lists them)" if more else ""
    return f"; the region stops at {plan.stops[0]}{others}"


def warn_once(warned: set[str], name: str, plan: Plan, split: Split | None) -> None:
    """Issue ``plan``'s warning as ``name``'s, unless ``warned`` (the function's) has it, and
    only where the call planned a non-empty axis (``split``)."""
    warning = plan.warning
    if warning and split is not None and split.size and warning not in warned:
        warned.add(warning)  # once per function, whatever the call's plan
        warn(f"{name}: {warning}{caused_by(plan, split)}")
