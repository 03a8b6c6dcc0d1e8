"""How a loop's run of checks joins the error (``_loops`` interprets the runs): per kind,
the site that fired soonest, then the first in the program (``_sites.in_program_order``),
under codes in the original's order.

- A forward pass's checks take codes ``_SPACING`` apart, in program order (by segment first,
  ``_between``, where the pass met copies of the body in turn), reserved when it
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
- A gap between two forward codes holds three bands of ``HALF`` codes: a derivative's
  checks after the forward check before them, then the checks of the parts that run after
  the loop though the program has them before the body's last (``_between``), then a
  derivative's checks that the program has after such a part (a later ``segment``).
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
#: per loop, its forward pass's codes with their sites' segments, in program order (the
#: program's sites, not the package's own), and the codes given to the checks of the parts
#: between the body's equations (``_between``)
_segments: dict[int, list[tuple[int, int]]] = {}
_between_codes: dict[int, set[int]] = {}
HALF = 64  # codes per band: a part between the body's may hold many checks
_SPACING = 3 * HALF


def merge_found_early(error: object, found: Iterable[tuple[object, Sites]]) -> object:
    """``error`` with the slots of backward-pass checks that forward passes found early."""
    for early, sites in found:
        error = in_program_order(error, early, sites, sites.ranks_where(lambda s: s.backward))
    return error


def merge_forward(
    error: object, loop: int, per_site_error: object, sites: Sites, first: bool
) -> object:
    """``error`` with the slots of a loop's forward pass, in program order, ``_SPACING``
    codes apart (``_forward_codes``); not those of a backward pass it holds (fused's).
    ``first``: the first of the parts of one forward pass (JAX hoists a part out of a loop
    that it linearizes), whose segments (``_segments``) the others extend."""
    module: Any = importlib.import_module(_CHECKIFY)
    # by segment first (copies of the body met in turn), the package's own sites last
    forward = sites.ranks_where(lambda site: not site.backward)
    ranks = sorted(forward, key=lambda r: (sites.sites[r].own, sites.sites[r].segment))
    base = module.next_code()
    for _ in range(_SPACING * (len(ranks) + 1) - 1):
        module.next_code()
    codes = {rank: base + _SPACING * (i + 1) for i, rank in enumerate(ranks)}
    _forward_codes[loop] = base, {sites.sites[r].place: code for r, code in codes.items()}
    _derived_codes[loop], _between_codes[loop] = {}, set()
    part = [(codes[r], sites.sites[r].segment) for r in ranks if not sites.sites[r].own]
    _segments[loop] = part if first else _segments.get(loop, []) + part
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
    segment = dict(segments(loop))  # of each forward check of the program, by its code
    for rank in sites.ranks_where(lambda site: site.recomputed):
        place = sites.sites[rank].place
        if place in by_place:  # a check of the forward pass: its code
            last = codes[rank] = by_place[place]
            again.append(rank)
            continue
        if place not in given:  # a check the forward pass lacks (a derivative's): a code
            # after last, or after the parts between that come before it (``_between``)
            after_parts = sites.sites[rank].segment > segment.get(last, 0)  # base, own: 0
            band = (
                range(last + 2 * HALF, last + 3 * HALF)
                if after_parts
                else range(last + 1, last + HALF)
            )
            free = set(band) - set(given.values())
            given[place] = min(free) if free else module.next_code()
        codes[rank] = given[place]
        derived.append(rank)
    error = in_program_order(error, per_site_error, sites, derived, codes, replacing_later(held))
    error = in_program_order(error, per_site_error, sites, again, codes)
    rest = sites.ranks_where(lambda site: not site.recomputed)
    return in_program_order(error, per_site_error, sites, rest)


def segments(loop: int) -> list[tuple[int, int]]:
    """The codes of ``loop``'s last forward pass's checks, with their sites' segments."""
    return _segments.get(loop, [])


def between_codes(loop: int) -> set[int]:
    """The codes given since ``loop``'s last forward pass to the checks of parts that run
    after it though the program has them between the body's (``_between``)."""
    return _between_codes.setdefault(loop, set())
