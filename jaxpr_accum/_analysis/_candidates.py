"""Which axis: seeding from ``argnums``, or the candidates of ``size=`` / automatic mode.

With ``argnums``, position ``axis`` of every array leaf of those arguments is seeded and one
split is made. Otherwise each dimension of an input or intermediate value (at position
``axis``, or any with ``axis=None``) whose size qualifies (equal to ``size``; else longer than
``chunk``) starts an analysis; values already reached by an earlier candidate are skipped.
Each split is a ``Candidate`` at the chunk (``_estimate``); the usable one that saves the most
(``Candidate.net_saving``: the bytes its chunking keeps per chunk instead of at full size,
less the stacked outputs and the accumulators the loop adds) is chosen (ties: the larger
axis, then the one born first); ``explain`` lists the others. No usable candidate is a
``SerializeError`` that names, per candidate, where its region stopped.
"""

from __future__ import annotations

import dataclasses

from jaxpr_accum import _compat
from jaxpr_accum._analysis import _fanout
from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._analysis._split import Split, make_split
from jaxpr_accum._analysis._trace import Traced
from jaxpr_accum._base._errors import SerializeError
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._base._settings import Settings
from jaxpr_accum._compat import Jaxpr, Var


def choose_split(
    traced: Traced, settings: Settings, stream: bool = True
) -> tuple[Candidate, list[Candidate]]:
    """``(chosen candidate, usable candidates)`` for a traced call under ``settings``
    (``stream=False``: without streamed normalisers). With ``memory=`` the chunk is chosen
    later: candidates are compared at chunk 1."""
    jaxpr, nc = traced.jaxpr, traced.n_consts
    names = input_names(traced)
    chunk, axis, size = settings.chunk or 1, settings.axis, settings.size
    if traced.seed_axes is not None:  # argnums / in_axes name the axis of input leaves
        seeds = [
            (v, AxisLoc(ax % len(_compat.shape_of(v))))
            for v, ax in zip(jaxpr.invars[nc:], traced.seed_axes, strict=True)
            if ax is not None
        ]
        n = _compat.shape_of(seeds[0][0])[seeds[0][1].dim]
        fanned, analysis = _fanout.analyse(jaxpr, n, seeds)
        born = _listed(sorted({f"{names[v]} at axis {loc.dim}" for v, loc in seeds}))
        candidates = [make_split(fanned, analysis, born, stream)]
        what = (
            f"`argnums` {settings.argnums}"
            if settings.argnums is not None
            else f"`in_axes` {settings.in_axes!r}"
        )
    else:
        candidates = find_candidates(
            jaxpr, chunk, axis=axis, size=size, arg_names=names, stream=stream
        )
        what = (
            f"an axis of size {size}"
            if size is not None
            else f"an axis longer than `chunk` {chunk}"
        )
        if not candidates:
            where = "at any position" if axis is None else f"born at position {axis}"
            hint = (
                "check `size` and `axis`, or pass `argnums=`"
                if size is not None
                else "pass `argnums=` or `size=` to name it"
            )
            if axis is not None:
                hint += "; `axis=None` looks at every position"
            raise SerializeError(f"found no {what[3:]} {where}; {hint}")
    usable = [at_chunk(c, chunk) for c in candidates if c.usable]
    if not usable:
        raise nothing_chunkable(candidates, what)
    chosen = best(usable)
    if traced.seed_axes is None and axis is not None:
        advice = _elsewhere(
            jaxpr, usable, chunk=chunk, size=size, names=names, beat=chosen.net_saving
        )
        if advice:
            advised = dataclasses.replace(chosen, advice=advice)
            usable = [advised if c is chosen else c for c in usable]
            chosen = advised
    return chosen, usable


def _elsewhere(
    jaxpr: Jaxpr,
    considered: list[Candidate],
    *,
    chunk: int,
    size: int | None,
    names: dict,
    beat: int,
) -> str:
    """Advice for a choice at position ``axis`` (``size=``, or automatic): the best axis of
    the same ``size`` born at another position (a population drawn at dimension 1, a
    time-major batch), where it is expected to save more than the choice (``beat``) and
    anything at all; "" where there is none. ``_worth.for_advised`` warns with it where the
    choice measures a saving under 10%, as the estimate's warning does where it expects
    none."""
    seen = {c.split.born for c in considered}
    others = [
        at_chunk(s, chunk)
        for s in find_candidates(jaxpr, chunk, axis=None, size=size, arg_names=names)
        if s.usable and s.born not in seen
    ]
    others = [c for c in others if c.net_saving > max(beat, 0)]
    if not others:
        return ""
    other = best(others)
    return (
        f"; the axis of size {other.split.size} at {other.split.born} is expected to save "
        f"{format_bytes(other.net_saving)}: pass `axis=None` to consider every position, or "
        "name it with `argnums`/`axis` or `in_axes`"
    )


def at_chunk(split: Split, chunk: int) -> Candidate:
    """``split`` at ``chunk`` rows of the axis ``size=`` named: ``chunk / copies`` positions
    where that axis is copies of the split's side by side."""
    return Candidate(split, max(1, chunk // split.copies))


def input_names(traced: Traced) -> dict:
    """A readable name for each top-level input: ``params['Dense_0']['kernel']``, ``x``,
    ``closed-over value 2``."""
    jaxpr, nc = traced.jaxpr, traced.n_consts
    names = {v: f"closed-over value {i}" for i, v in enumerate(jaxpr.invars[:nc])}
    names.update(zip(jaxpr.invars[nc:], traced.leaf_names, strict=True))
    return names


def _listed(names: list[str], most: int = 3) -> str:
    """``a, b, c`` or ``a, b, c and 7 more``."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def describe_origin(jaxpr: Jaxpr, v: Var, dim: int, arg_names: dict) -> str | None:
    """Where ``v`` is born, as the user wrote it: an argument, or an equation and its source
    line; None when ``jaxpr`` neither takes nor computes it."""
    if v in arg_names:
        return f"dimension {dim} of {arg_names[v]}"
    for eqn in jaxpr.eqns:
        if v in eqn.outvars:
            return f"dimension {dim} of `{eqn.primitive.name}` at {_compat.source_line(eqn)}"
    return None


def origins(jaxpr: Jaxpr) -> list[Var]:
    """Every top-level value in program order: inputs, then equation results."""
    out = list(jaxpr.invars)
    for eqn in jaxpr.eqns:
        out.extend(v for v in eqn.outvars if not isinstance(v, _compat.DropVar))
    return out


def find_candidates(
    jaxpr: Jaxpr,
    chunk: int,
    *,
    axis: int | None,
    size: int | None,
    arg_names: dict,
    stream: bool = True,
) -> list[Split]:
    """Plans for every distinct candidate axis, in order of birth."""
    values = origins(jaxpr)
    order = {v: i for i, v in enumerate(values)}
    covered: set = set()
    splits = []
    for v in values:
        shape = _compat.shape_of(v)
        for d, n in enumerate(shape):
            if size is not None and n != size:
                continue
            if size is None and n <= chunk:
                continue
            if axis is not None and d != axis % max(len(shape), 1):
                continue
            if (v, d) in covered:
                continue
            fanned, analysis = _fanout.analyse(jaxpr, n, [(v, AxisLoc(d))])
            reached = [(u, loc) for (ctx, u), loc in analysis.locs.items() if ctx == ()]
            # past a conflict from this seed on, a later seed may reach values otherwise (a
            # copy per reader of what this one fixes): only the values before it are covered
            at = order[v]
            stop = min(
                (order[u] for c, u in analysis.conflicts if c == () and order.get(u, -1) >= at),
                default=None,
            )
            covered.update(
                (u, loc.dim)
                for u, loc in reached
                if loc == AxisLoc(loc.dim) and (stop is None or order.get(u, stop) < stop)
            )
            whole = [(u, loc) for u, loc in reached if not is_mapped(loc)] or reached
            first, first_loc = min(whole, key=lambda p: order.get(p[0], len(order)))
            if axis is not None and first_loc != AxisLoc(d):
                continue
            # the first value that carries the axis whole, else the seed (of the user's program)
            born = (
                describe_origin(fanned, first, first_loc.dim, arg_names)
                or describe_origin(jaxpr, v, d, arg_names)
                or f"dimension {d} of a value of shape {shape}"
            )
            splits.append(make_split(fanned, analysis, born, stream))
            if size is not None and splits[-1].stops:  # the parts' rows paired: as copies
                splits.extend(_as_copies(jaxpr, v, d, born=born, stream=stream))
    return splits


def _as_copies(jaxpr: Jaxpr, v: Var, d: int, *, born: str, stream: bool) -> list[Split]:
    """Where ``v`` is a concatenation along ``d`` of equal parts (DPO's chosen and rejected
    rows, two views of one batch), the split of the parts' own axis, with ``v`` holding it
    once per part (``_rules/blocks``): chunk ``c`` takes its rows from every part, so the
    rows the program pairs across the parts lie in one chunk. None otherwise."""
    eqn = next((e for e in jaxpr.eqns if v in e.outvars), None)
    if eqn is None or eqn.primitive.name != "concatenate" or eqn.params["dimension"] != d:
        return []
    lengths = {_compat.shape_of(u)[d] for u in eqn.invars}
    parts = len(eqn.invars)
    if parts < 2 or len(lengths) != 1 or not (n := lengths.pop()):
        return []
    fanned, analysis = _fanout.analyse(jaxpr, n, [(v, AxisLoc(d, 1, parts))])
    born = f"{born}, as {parts} copies side by side of an axis of size {n}"
    return [dataclasses.replace(make_split(fanned, analysis, born, stream), copies=parts)]


def best(candidates: list[Candidate]) -> Candidate:
    """The candidate expected to save the most (ties: the larger axis, the first born)."""
    ranked = enumerate(candidates)
    return min(ranked, key=lambda ic: (-ic[1].net_saving, -ic[1].split.size, ic[0]))[1]


def nothing_chunkable(splits: list[Split], what: str) -> SerializeError:
    lines = [f"nothing can be chunked along {what}."]
    for split in splits:
        lines.append(f"axis of size {split.size} born at {split.born}:")
        # the stops that forced others first: a retreat names its cause
        stops = sorted(split.stops, key=lambda stop: stop.cause is not None)
        lines.extend(f"  stopped by {stop}" for stop in stops[:3])
        if not split.stops:
            lines.append("  no equation carries it per chunk")
    return SerializeError("\n".join(lines))
