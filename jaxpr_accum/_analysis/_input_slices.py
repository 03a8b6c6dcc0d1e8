"""Slices of a chunked input: each reads the whole input through a root of its own.

A top-level input seeded with the axis is read per chunk on the chunk's rows. A ``slice``
that takes part of the axis of it (halves of ``x`` rejoined, a roll of ``x`` by hand, its
first rows beside its last) reads other rows: with the input itself as its operand, the input
would be needed at two row maps (``_rules/rows``: a slice's operand lives on the slice's rows),
a conflict no copy resolves, since an input cannot be copied. So each such slice reads the
input through a *root* (``root_of``, ``_rules.rows.is_root``): the whole input, taken before
the loop, of which each chunk reads the window its slice needs; the input keeps its other
readers.

Which positions a slice's rows are is learnt from its readers where the program ties them to
the axis otherwise (a roll of ``x`` multiplied by ``x``: the rolled rows sit where the product
puts them). Where nothing else does (halves of ``x`` rejoined, nothing reading ``x`` whole),
``anchors`` gives each slice's result the positions it takes of the input.
"""

from __future__ import annotations

import jax
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var
from jaxpr_accum._rules.rows import sub_loc

Seeds = list[tuple[Var, AxisLoc]]


def root_of(x: Var, like: JaxprEqn) -> JaxprEqn:
    """A *root* of input ``x``: a slice that keeps all of it (``_rules.rows.is_root``), under
    ``like``'s source information. It carries no row map of ``x``, so each reader reads the
    rows it needs of the whole input."""
    shape = _compat.shape_of(x)
    traced = jax.make_jaxpr(lambda a: lax.slice(a, (0,) * len(shape), shape))(
        jax.ShapeDtypeStruct(shape, _compat.dtype_of(x))
    )
    (eqn,) = traced.jaxpr.eqns
    return eqn.replace(invars=[x], outvars=[_compat.new_var(x.aval)], source_info=like.source_info)


def through_roots(jaxpr: Jaxpr, seeds: Seeds, size: int) -> tuple[Jaxpr, Seeds]:
    """``(jaxpr, anchors)``: every slice that takes part of the axis of a seeded input reads
    it through a root of its own; ``anchors``: each such slice's result with the positions it
    takes of the input."""
    inputs = set(jaxpr.invars)
    seeded = {x: loc for x, loc in seeds if x in inputs and _whole(loc)}
    eqns, roots, anchors = list(jaxpr.eqns), [], []
    for i, eqn in enumerate(eqns):
        x = eqn.invars[0] if eqn.primitive.name == "slice" else None
        loc = seeded.get(x) if isinstance(x, Var) else None
        if loc is None or not isinstance(x, Var) or not _takes_part(eqn, loc.dim):
            continue
        roots.append(root_of(x, eqn))
        eqns[i] = eqn.replace(invars=[roots[-1].outvars[0]])
        a, b = eqn.params["start_indices"][loc.dim], eqn.params["limit_indices"][loc.dim]
        anchors.append((eqn.outvars[0], sub_loc(loc, size, a, b)))
    return jaxpr.replace(eqns=[*roots, *eqns]), anchors


def _whole(loc: AxisLoc) -> bool:
    return not is_mapped(loc) and loc.inner == loc.outer == 1


def _takes_part(eqn: JaxprEqn, d: int) -> bool:
    """Whether a unit-stride ``slice`` keeps part of dimension ``d`` (and some of it)."""
    strides = eqn.params.get("strides")
    a, b = eqn.params["start_indices"][d], eqn.params["limit_indices"][d]
    length = _compat.shape_of(eqn.invars[0])[d]
    return (strides is None or strides[d] == 1) and (a, b) != (0, length) and b > a
