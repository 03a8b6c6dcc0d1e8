"""Rows of a root rearranged along the axis, as the column side of a pairing: ``z[::-1]``,
``jnp.roll(z, s, 0)``, ``z[perm]``.

Such a value mixes positions along the axis, so the one-pass analysis stops at it and the
pairing after it is not seen (``z @ z[::-1].T`` reads the axis on one side only). On the
column side of pass 2, though, the root is the whole stacked value (the column copy), and a
rearrangement of a whole value is an ordinary loop-invariant computation. So a
*rearrangement* counts as a layout of its source ``X`` (``rearranged``):

- ``rev`` along the axis;
- ``concatenate`` along the axis of ``slice``s of ``X`` (stride 1, whole on every other
  dimension) as long as ``X`` along it (``jnp.roll``, halves swapped);
- ``gather`` from ``X`` whose indices do not carry the axis and whose result has ``X``'s shape
  (``z[perm]`` with ``perm`` from ``iota``, a closed-over array or an argument).

``substituted(jaxpr, analysis)`` is the program for finding pairings: each rearrangement of a
value that carries the axis replaced by a ``copy`` of its source, so the analysis carries the
axis through it and sees the pairing. Only the finding uses it; the passes are cut from the
program itself, and pass 2 re-emits the rearrangement on the column copy (``rewrite``), so
what it computes is what the original computes whatever the indices are.
"""

from __future__ import annotations

import functools

from jaxpr_accum import _compat
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var
from jaxpr_accum._engine._axes import Analysis


@functools.cache
def _primitives() -> dict:
    names = ("rev", "concatenate", "slice", "gather", "copy")
    return {n: _compat.primitive(n) for n in names}


def rearranged(jaxpr: Jaxpr, eqn: JaxprEqn, defined: dict, dim: int | None = None) -> tuple | None:
    """``(X, the indices of the slice equations it reads)`` when ``eqn`` rearranges the rows
    of ``X`` along dimension ``dim`` (any dimension when None) into a value of ``X``'s shape;
    None otherwise."""
    p = _primitives()
    out = _compat.shape_of(eqn.outvars[0])
    if eqn.primitive is p["rev"] and isinstance(eqn.invars[0], Var):
        dims = eqn.params["dimensions"]
        return (eqn.invars[0], ()) if dim is None or dim in dims else None
    if eqn.primitive is p["gather"] and isinstance(eqn.invars[0], Var):
        x = eqn.invars[0]
        return (x, ()) if _compat.shape_of(x) == out else None
    if eqn.primitive is not p["concatenate"]:
        return None
    d = eqn.params["dimension"]
    if dim is not None and dim != d:
        return None
    sources, slices = set(), []
    for v in eqn.invars:
        link = jaxpr.eqns[defined[v]] if isinstance(v, Var) and v in defined else None
        if link is None or link.primitive is not p["slice"] or not _whole_but(link, d):
            return None
        sources.add(link.invars[0])
        slices.append(defined[v])
    if len(sources) != 1 or _compat.shape_of(next(iter(sources))) != out:
        return None
    return next(iter(sources)), tuple(slices)


def _whole_but(link: JaxprEqn, d: int) -> bool:
    """A ``slice`` with stride 1 that takes every position of every dimension but ``d``."""
    p, shape = link.params, _compat.shape_of(link.invars[0])
    strides = p.get("strides") or (1,) * len(shape)
    whole = all(
        (p["start_indices"][i], p["limit_indices"][i]) == (0, shape[i])
        for i in range(len(shape))
        if i != d
    )
    return whole and all(s == 1 for s in strides)


def substituted(jaxpr: Jaxpr, analysis: Analysis) -> Jaxpr | None:
    """The program with each rearrangement of a value carrying ``analysis``'s axis, along it,
    whose result does not carry it, replaced by a ``copy`` of its source; None when there
    is none."""
    defined = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    eqns, changed = list(jaxpr.eqns), False
    for idx, eqn in enumerate(jaxpr.eqns):
        if len(eqn.outvars) != 1 or analysis.loc((), eqn.outvars[0]) is not None:
            continue
        found = rearranged(jaxpr, eqn, defined)
        loc = None if found is None else analysis.loc((), found[0])
        if found is None or loc is None or loc.inner != 1 or loc.outer != 1:
            continue
        if rearranged(jaxpr, eqn, defined, loc.dim) is None:
            continue
        if eqn.primitive is _primitives()["gather"] and analysis.loc((), eqn.invars[1]):
            continue
        eqns[idx] = eqn.replace(primitive=_primitives()["copy"], invars=[found[0]], params={})
        changed = True
    return jaxpr.replace(eqns=eqns) if changed else None
