"""Axes born again at a stop of a split: the values a pairing of them would pair.

``reborn(split)`` finds, at each stop of ``split``, results whose length along a dimension
where an operand carries the chunked axis (``N``) is a multiple of it (``jnp.concatenate`` of
two views: ``c * N``) or a part of it (the halves ``z[: N // 2]``, ``z[N // 2 :]``, every
slice of the stop's operand, and the parts unpacked from ``z.reshape(c, N // c, ...)``:
``N / c``). ``seed_groups`` orders the analyses ``detect.find`` tries on them: every value of
one length at once (row ``i`` of each half in the same chunk), then each alone.

Invariant: a part is seeded where its rows lie (the dimension after the reshape's split for
the unpacked parts), so that the analysis of a group never carries the part's axis back into
the value it was taken from.
"""

from __future__ import annotations

from jaxpr_accum import _compat
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._analysis._stages import variables
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var

MAX_SEEDS = 4  # analyses tried for a pairing of an axis born again at a stop


def plain(loc: AxisLoc) -> bool:
    """The axis itself, whole (perhaps reversed: a rearrangement of its rows), not a factor
    or a segment of it (the halves of one batch are an axis of their own: ``_reborn``)."""
    return loc.inner == 1 and loc.outer == 1 and not is_mapped(loc._replace(rev=False))


def reborn(split: Split) -> list[tuple[Var, AxisLoc, int]]:
    """Axes born again at a stop of ``split``: a result that is ``c * N`` long (``c > 1``)
    where an operand carries the axis of size ``N`` (``jnp.concatenate`` of two views along
    the batch), or ``N / c`` long (the halves ``z[: N // 2]``, ``z[N // 2 :]`` of one batch,
    and the parts ``z.reshape(c, N // c, ...)[i]``: ``_parts_of_reshape``): the value, where,
    and its length."""
    n, loc = split.size, split.analysis.loc
    found: dict[tuple[Var, int], int] = {}
    for stop in split.stops:
        dims = {
            a.dim for v in variables(stop.eqn.invars) if (a := loc((), v)) is not None and plain(a)
        }
        parts = _parts_of_reshape(split.jaxpr, stop.eqn, dims, n)
        if parts:
            found.update(parts)
            continue
        for eqn in _siblings(split.jaxpr, stop.eqn):
            for out in eqn.outvars:
                shape = _compat.shape_of(out)
                for d in sorted(dims):
                    if d < len(shape) and n and shape[d] != n and _multiple(shape[d], n):
                        found.setdefault((out, d), shape[d])
    return [(v, AxisLoc(d), length) for (v, d), length in found.items()]


def _parts_of_reshape(jaxpr: Jaxpr, eqn: JaxprEqn, dims: set[int], n: int) -> dict:
    """Where ``eqn`` reshapes the axis at ``d`` (the only dim in ``dims``) into ``(c, N / c)``
    and every use of the result slices one part along ``d`` (``a, b = z.reshape(2, -1, D)``):
    ``{(part, d + 1): N / c}``, each part's rows at ``d + 1``, as the halves' slices; else
    empty."""
    if eqn.primitive is not _compat.primitive("reshape") or len(dims) != 1:
        return {}
    (d,) = dims
    shape_in, out = _compat.shape_of(eqn.invars[0]), eqn.outvars[0]
    shape = _compat.shape_of(out)
    split_here = (*shape_in[:d], 1, *shape_in[d:])
    if len(shape) != len(split_here) or shape[d] * shape[d + 1] != n or shape[d] < 2:
        return {}
    if shape[:d] != shape_in[:d] or shape[d + 2 :] != shape_in[d + 1 :]:
        return {}
    uses = [e for e in jaxpr.eqns if out in e.invars]
    one_part = _compat.primitive("slice")
    for e in uses:
        if e.primitive is not one_part or e.invars[0] is not out:
            return {}
        start, limit = e.params["start_indices"], e.params["limit_indices"]
        strides = e.params["strides"]
        if limit[d] - start[d] != 1 or any(s not in (None, 1) for s in strides or ()):
            return {}
        if any(start[i] != 0 or limit[i] != shape[i] for i in range(len(shape)) if i != d):
            return {}
    return {(e.outvars[0], d + 1): shape[d + 1] for e in uses}


def _siblings(jaxpr: Jaxpr, eqn: JaxprEqn) -> list[JaxprEqn]:
    """``eqn``, and where it is a ``slice``, every ``slice`` of the same operand (the other
    half of ``z[: N // 2]``, ``z[N // 2 :]``, which the analysis may not have stopped at)."""
    if eqn.primitive is not _compat.primitive("slice"):
        return [eqn]
    operand = eqn.invars[0]
    return [eqn] + [
        e
        for e in jaxpr.eqns
        if e is not eqn and e.primitive is eqn.primitive and e.invars[0] is operand
    ]


def _multiple(length: int, n: int) -> bool:
    """Whether ``length`` is ``c * n`` or ``n / c`` for a whole ``c > 1``."""
    return length > 1 and (length % n == 0 or n % length == 0)


def seed_groups(
    reborn: list[tuple[Var, AxisLoc, int]],
) -> list[tuple[int, list[tuple[Var, AxisLoc]]]]:
    """The analyses to try for the reborn axes, at most ``MAX_SEEDS``, each as the axis's
    length and its seeds: for each length, every value of that length seeded at once (the
    halves of one batch are paired with each other: row ``i`` of each half is in the same
    chunk), then each value alone."""
    by_length: dict[int, list[tuple[Var, AxisLoc]]] = {}
    for v, loc, length in reborn:
        by_length.setdefault(length, []).append((v, loc))
    groups = [(length, group) for length, group in by_length.items() if len(group) > 1]
    groups.extend((length, [(v, loc)]) for v, loc, length in reborn)
    return groups[:MAX_SEEDS]
