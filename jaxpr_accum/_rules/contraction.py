"""Contractions: ``dot_general`` and ``conv_general_dilated``.

``dot_general`` output dimensions are ``batch + lhs free + rhs free``. The axis may be a
batch dimension (both operands carry it, and so does the output), a free dimension of one
operand (the output carries it; the other operand must not), or a contracting dimension
(both operands carry it; the output is a per-chunk partial *sum*). A convolution keeps the
axis only as the lhs batch dimension (what ``vmap`` of a conv produces after merging it into
the batch); anything else slides a window or mixes features across the axis.
"""

from __future__ import annotations

from typing import Any

from jaxpr_accum._table import Rule, register


class DotGeneral(Rule):
    middle_factor_ok = True  # batch, free or contracted (a sum): never indexed along

    def propagate(self, eqn: Any, view: Any) -> None:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs_rank = len(eqn.invars[0].aval.shape)
        rhs_rank = len(eqn.invars[1].aval.shape)
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
                if view.in_loc(1 - me) is not None and view.in_loc(1 - me).dim not in (
                    other[0] + other[1]
                ):
                    view.barrier("`dot_general` pairs the axis with itself (an outer product)")
                    return
                view.set_out(0, loc._replace(dim=offset + free.index(loc.dim)))


class Conv(Rule):
    def propagate(self, eqn: Any, view: Any) -> None:
        dn = eqn.params["dimension_numbers"]
        lhs_batch, out_batch = dn.lhs_spec[0], dn.out_spec[0]
        if view.in_loc(1) is not None:
            view.barrier("the convolution's kernel carries the axis")
            return
        lhs, out = view.in_loc(0), view.out_loc(0)
        for loc, batch in ((lhs, lhs_batch), (out, out_batch)):
            if loc is not None and loc.dim != batch:
                view.barrier("the convolution slides or mixes along the axis")
                return
        if eqn.params.get("batch_group_count", 1) != 1:
            view.barrier("the convolution groups its batch (a weight gradient)")
            return
        if lhs is not None:
            view.set_out(0, lhs._replace(dim=out_batch))
        if out is not None:
            view.set_in(0, out._replace(dim=lhs_batch))


register("dot_general", DotGeneral())
register("conv_general_dilated", Conv())
