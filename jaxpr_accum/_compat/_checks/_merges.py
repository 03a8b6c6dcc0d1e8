"""How a loop's run of checks joins the error (``_loops`` interprets the runs): per kind,
the site that fired soonest, then the first in the program (``_sites.in_program_order``),
under codes in the original's order.

- A forward pass's checks take codes ``_SPACING`` apart, in program order, reserved when it
  is merged (``_forward_codes`` keeps them per loop); an error already there stays, as in
  JAX (an earlier step's, where the function is called at each step of a ``lax.scan`` of
  yours, which shares the step's codes).
- A backward pass's checks in the forward computations it recomputes take the code of the
  forward pass's check at their place; a check the forward pass does not make (a
  derivative's: the derivative of ``sqrt`` divides by its value) takes a code just after
  the forward check before it, and replaces an error of its kind with a later code, which
  the original finds after it, unless that error was there when the loop's forward pass
  began (``_entry``). The backward pass's other checks come after, in the order met.
- A backward pass's checks that fused finds in its forward pass (it computes the gradient
  with the value) are merged where the loop's backward pass runs (``merge_found_early``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from jaxpr_accum._compat._checks._entry import replacing_later
from jaxpr_accum._compat._checks._sites import Sites, in_program_order

_CHECKIFY = "jax._src.checkify"
#: per loop, where its last forward pass put its checks among the codes: ``(base, place ->
#: code)``, ``_SPACING`` codes apart
_forward_codes: dict[int, tuple[int, dict[str, int]]] = {}
#: per loop, the codes its backward passes gave the checks its forward pass lacks, by place
_derived_codes: dict[int, dict[str, int]] = {}
_SPACING = 8


def merge_found_early(error: object, found: Iterable[tuple[object, Sites]]) -> object:
    """``error`` with the slots of backward-pass checks that forward passes found early."""
    for early, sites in found:
        error = in_program_order(error, early, sites, sites.ranks_where(lambda s: s.backward))
    return error


def merge_forward(error: object, loop: int, per_site_error: object, sites: Sites) -> object:
    """``error`` with the slots of a loop's forward pass, in program order, ``_SPACING``
    codes apart (``_forward_codes``); not those of a backward pass it holds (fused's)."""
    module: Any = importlib.import_module(_CHECKIFY)
    ranks = sites.ranks_where(lambda site: not site.backward)
    base = module.next_code()
    for _ in range(_SPACING * (len(ranks) + 1) - 1):
        module.next_code()
    codes = {rank: base + _SPACING * (i + 1) for i, rank in enumerate(ranks)}
    _forward_codes[loop] = base, {sites.sites[r].place: code for r, code in codes.items()}
    _derived_codes[loop] = {}
    return in_program_order(error, per_site_error, sites, ranks, codes)


def merge_backward(
    error: object, loop: int, per_site_error: object, sites: Sites, held: dict
) -> object:
    """``error`` with the slots of a loop's backward pass, in program order: first those of
    the forward computations it recomputes, each under a code just after that of the check
    before it in the loop's forward pass, as the original makes them there (one per place,
    whichever backward run meets it: two sites never share a code); then the rest.
    Only a check the forward pass lacks (a derivative's) replaces an error, one with a later
    code that ``held`` (per kind) does not say was there when the forward pass began."""
    module: Any = importlib.import_module(_CHECKIFY)
    forward = _forward_codes.get(loop)
    if forward is None:  # no forward pass of the loop met before: all in the order met
        return in_program_order(error, per_site_error, sites)
    base, by_place = forward
    given = _derived_codes.setdefault(loop, {})  # by every backward run of the loop
    codes, last, derived, again = {}, base, [], []
    for rank in sites.ranks_where(lambda site: site.recomputed):
        place = sites.sites[rank].place
        if place in by_place:  # a check of the forward pass: its code
            last = codes[rank] = by_place[place]
            again.append(rank)
            continue
        if place not in given:  # a check the forward pass lacks (a derivative's): a code
            free = set(range(last + 1, last + _SPACING)) - set(given.values())  # after last
            given[place] = min(free) if free else module.next_code()
        codes[rank] = given[place]
        derived.append(rank)
    error = in_program_order(error, per_site_error, sites, derived, codes, replacing_later(held))
    error = in_program_order(error, per_site_error, sites, again, codes)
    rest = sites.ranks_where(lambda site: not site.recomputed)
    return in_program_order(error, per_site_error, sites, rest)
