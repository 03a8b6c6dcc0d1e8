"""Contractions: ``dot_general`` and ``conv_general_dilated``.

``dot_general`` output dimensions are ``batch + lhs free + rhs free``. The axis may be a
batch dimension (both operands carry it, and so does the output), a free dimension of one
operand (the output carries it; the other operand must not), or a contracting dimension
(both operands carry it; the output is a per-chunk partial *sum*).

A convolution keeps the axis in two forms; anything else slides a window or mixes features
across the axis. (1) As the lhs batch dimension, ungrouped batch (what ``vmap`` of a conv
produces after merging the axis into the batch). (2) As its *groups*: ``vmap`` of a conv whose
operands are both batched (a per-example weight gradient) moves the axis into the feature
groups (``feature_group_count *= N``: lhs feature dimension, rhs output features, output
features) or, for a conv already grouping its batch, into the batch groups (lhs batch
dimension). Groups are the major factor of those dimensions and group ``g`` of the output
reads only group ``g`` of each operand, so when ``N`` divides the group count (``N * q``
groups) the axis is the major factor of all three dimensions and a chunk of ``k`` positions is
the conv with ``k * q`` groups. On CPU the chunked conv is emitted canonical (``_conv``): inside
the loop XLA would not canonicalize it for its fast kernel.
"""

from __future__ import annotations

import jax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array, JaxprEqn
from jaxpr_accum._engine import _conv
from jaxpr_accum._engine._table import Rule, register
from jaxpr_accum._engine._view import EqnResize, View


class DotGeneral(Rule):
    middle_factor_ok = True  # batch, free or contracted (a sum): never indexed along

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs_rank = len(_compat.shape_of(eqn.invars[0]))
        rhs_rank = len(_compat.shape_of(eqn.invars[1]))
        lfree = [d for d in range(lhs_rank) if d not in lc and d not in lb]
        rfree = [d for d in range(rhs_rank) if d not in rc and d not in rb]
        nb, nl = len(lb), len(lfree)
        lhs, rhs, out = view.in_loc(0), view.in_loc(1), view.out_loc(0)

        if out is not None:
            if out.dim < nb:
                view.set_in(0, out._replace(dim=lb[out.dim]))
                view.set_in(1, out._replace(dim=rb[out.dim]))
            elif out.dim < nb + nl:
                view.set_in(0, out._replace(dim=lfree[out.dim - nb]))
            else:
                view.set_in(1, out._replace(dim=rfree[out.dim - nb - nl]))
        for loc, mine, other, free, offset, me in (
            (lhs, (lc, lb), (rc, rb), lfree, nb, 0),
            (rhs, (rc, rb), (lc, lb), rfree, nb + nl, 1),
        ):
            if loc is None:
                continue
            contract, batch = mine
            if loc.dim in batch:
                p = batch.index(loc.dim)
                view.set_in(1 - me, loc._replace(dim=other[1][p]))
                view.set_out(0, loc._replace(dim=p))
            elif loc.dim in contract:
                p = contract.index(loc.dim)
                view.set_in(1 - me, loc._replace(dim=other[0][p]))
                view.reduce(0, "sum")
            else:
                partner = view.in_loc(1 - me)
                if partner is not None and partner.dim not in other[0] + other[1]:
                    view.barrier("`dot_general` pairs the axis with itself (an outer product)")
                    return
                view.set_out(0, loc._replace(dim=offset + free.index(loc.dim)))


def _groups(eqn: JaxprEqn) -> tuple[str, int, tuple[int, int, int]]:
    """The conv's grouping: parameter name, count, and the lhs, rhs and output dimensions the
    groups are the major factor of (``feature_group_count`` and ``batch_group_count`` are never
    both above 1)."""
    p, dn = eqn.params, eqn.params["dimension_numbers"]
    if p["batch_group_count"] > 1:
        return (
            "batch_group_count",
            p["batch_group_count"],
            (dn.lhs_spec[0], dn.rhs_spec[0], dn.out_spec[1]),
        )
    return (
        "feature_group_count",
        p["feature_group_count"],
        (dn.lhs_spec[1], dn.rhs_spec[0], dn.out_spec[1]),
    )


def _grouped_locs(eqn: JaxprEqn, size: int) -> list[AxisLoc] | None:
    """The axis as the major factor of the group dimensions, or None (groups not a multiple of
    the axis)."""
    _, count, dims = _groups(eqn)
    if count == 1 or count % size:
        return None
    shapes = [_compat.shape_of(v) for v in (eqn.invars[0], eqn.invars[1], eqn.outvars[0])]
    return [AxisLoc(d, s[d] // size) for d, s in zip(dims, shapes, strict=True)]


class Conv(Rule):
    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        found = [view.in_loc(0), view.in_loc(1), view.out_loc(0)]
        if all(loc is None for loc in found):
            return
        grouped = _grouped_locs(eqn, view.size)
        if grouped is not None and all(f in (None, g) for f, g in zip(found, grouped, strict=True)):
            view.set_in(0, grouped[0])
            view.set_in(1, grouped[1])
            view.set_out(0, grouped[2])
            return
        dn = eqn.params["dimension_numbers"]
        lhs_batch, out_batch = dn.lhs_spec[0], dn.out_spec[0]
        lhs, rhs, out = found
        if rhs is not None:
            view.barrier("the convolution's kernel carries the axis outside its groups")
            return
        for loc, batch in ((lhs, lhs_batch), (out, out_batch)):
            if loc is not None and loc.dim != batch:
                view.barrier("the convolution slides or mixes along the axis")
                return
        if eqn.params["batch_group_count"] != 1:
            view.barrier("the convolution groups its batch, in groups other than the axis")
            return
        if lhs is not None:
            view.set_out(0, lhs._replace(dim=out_batch))
        if out is not None:
            view.set_in(0, out._replace(dim=lhs_batch))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        params = dict(eqn.params)
        if r.in_locs[1] is not None:  # the axis is the groups: k * q of them
            name, count, _ = _groups(eqn)
            params[name] = count // r.analysis.size * r.k
        if jax.default_backend() == "cpu" and _conv.is_float_conv(invals):
            with _compat.user_context(eqn):
                return [_conv.canonical_conv(*invals, **params)]
        return _compat.bind(eqn, invals, params)


register("dot_general", DotGeneral())
register("conv_general_dilated", Conv())
