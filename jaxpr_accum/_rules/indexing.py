"""``gather`` and ``scatter`` where the axis is a batch dimension of the indexing.

Gather output dims are the index batch dims (every indices dim but the last, in order) with
the operand's window dims inserted at ``offset_dims``. The axis may be an index batch dim
(embedding lookup with per-row ids; ``operand_batching_dims`` pair it with an operand dim,
as ``vmap`` of ``take_along_axis`` produces), or a window dim the gather takes whole and does
not index along. Indexing *along* the axis (a permutation of rows, a lookup into a table
that has the axis) is a barrier. Scatter mirrors this with updates in place of the output.
"""

from __future__ import annotations

from typing import Any

from jaxpr_accum._rules.base import AxisLoc, Rule, register
from jaxpr_accum._rules.shape import _with


def _window_dims(rank: int, skipped: tuple) -> list:
    return [d for d in range(rank) if d not in skipped]


class Gather(Rule):
    def propagate(self, eqn: Any, view: Any) -> None:
        dn = eqn.params["dimension_numbers"]
        operand_shape = eqn.invars[0].aval.shape
        idx_rank = len(eqn.invars[1].aval.shape)
        out_rank = len(eqn.outvars[0].aval.shape)
        windows = _window_dims(
            len(operand_shape), dn.collapsed_slice_dims + dn.operand_batching_dims
        )
        out_batch = [d for d in range(out_rank) if d not in dn.offset_dims]
        sizes = eqn.params["slice_sizes"]

        loc = view.in_loc(0)
        if loc is not None:
            if loc.dim in dn.operand_batching_dims:
                p = dn.operand_batching_dims.index(loc.dim)
                i = dn.start_indices_batching_dims[p]
                view.set_in(1, AxisLoc(i, loc.inner))
            elif (
                loc.dim in windows
                and loc.dim not in dn.start_index_map
                and sizes[loc.dim] == operand_shape[loc.dim]
            ):
                view.set_out(0, AxisLoc(dn.offset_dims[windows.index(loc.dim)], loc.inner))
            else:
                view.barrier("`gather` indexes along the axis")
                return
        loc = view.in_loc(1)
        if loc is not None:
            if loc.dim == idx_rank - 1:
                view.barrier("`gather` index vectors run along the axis")
                return
            view.set_out(0, AxisLoc(out_batch[loc.dim], loc.inner))
            if loc.dim in dn.start_indices_batching_dims:
                p = dn.start_indices_batching_dims.index(loc.dim)
                view.set_in(0, AxisLoc(dn.operand_batching_dims[p], loc.inner))
        loc = view.out_loc(0)
        if loc is not None:
            if loc.dim in dn.offset_dims:
                view.set_in(0, AxisLoc(windows[dn.offset_dims.index(loc.dim)], loc.inner))
            else:
                view.set_in(1, AxisLoc(out_batch.index(loc.dim), loc.inner))

    def resize_params(self, eqn: Any, r: Any) -> dict:
        loc = r.in_locs[0]
        dn = eqn.params["dimension_numbers"]
        if loc is None or loc.dim in dn.operand_batching_dims:
            return eqn.params
        sizes = _with(eqn.params["slice_sizes"], loc.dim, r.rows(loc))
        return {**eqn.params, "slice_sizes": sizes}


class Scatter(Rule):
    """Operands: ``operand, indices, updates``; the output has the operand's shape."""

    def propagate(self, eqn: Any, view: Any) -> None:
        dn = eqn.params["dimension_numbers"]
        operand_shape = eqn.invars[0].aval.shape
        upd_shape = eqn.invars[2].aval.shape
        idx_rank = len(eqn.invars[1].aval.shape)
        windows = _window_dims(
            len(operand_shape), dn.inserted_window_dims + dn.operand_batching_dims
        )
        upd_scatter = [d for d in range(len(upd_shape)) if d not in dn.update_window_dims]

        for loc in (view.in_loc(0), view.out_loc(0)):
            if loc is None:
                continue
            view.set_in(0, loc)
            view.set_out(0, loc)
            if loc.dim in dn.operand_batching_dims:
                p = dn.operand_batching_dims.index(loc.dim)
                i = dn.scatter_indices_batching_dims[p]
                view.set_in(1, AxisLoc(i, loc.inner))
                view.set_in(2, AxisLoc(upd_scatter[i], loc.inner))
            elif (
                loc.dim in windows
                and loc.dim not in dn.scatter_dims_to_operand_dims
                and upd_shape[dn.update_window_dims[windows.index(loc.dim)]]
                == operand_shape[loc.dim]
            ):
                view.set_in(2, AxisLoc(dn.update_window_dims[windows.index(loc.dim)], loc.inner))
            else:
                view.barrier(f"`{eqn.primitive.name}` writes along the axis")
                return
        for i_op in (1, 2):
            loc = view.in_loc(i_op)
            if loc is None:
                continue
            if i_op == 1:
                if loc.dim == idx_rank - 1 or loc.dim not in dn.scatter_indices_batching_dims:
                    view.barrier(f"`{eqn.primitive.name}` scatters along the axis")
                    return
                continue
            if loc.dim in dn.update_window_dims:
                w = windows[dn.update_window_dims.index(loc.dim)]
                view.set_in(0, AxisLoc(w, loc.inner))
            elif upd_scatter.index(loc.dim) in dn.scatter_indices_batching_dims:
                p = dn.scatter_indices_batching_dims.index(upd_scatter.index(loc.dim))
                view.set_in(0, AxisLoc(dn.operand_batching_dims[p], loc.inner))
            else:
                view.barrier(f"`{eqn.primitive.name}` scatters along the axis")
                return


register("gather", Gather())
register(
    ["scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"],
    Scatter(),
)
