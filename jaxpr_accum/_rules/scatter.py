"""``scatter`` and its combining forms (``scatter-add``, ``-mul``, ``-min``, ``-max``) where the
operand or the output carries the axis.

The output has the operand's shape and carries the axis where the operand does. The axis may
be an operand batching dimension (paired with an index and an update dimension, as ``vmap``
of an ``.at[].set`` produces), or a window dimension written whole, or a dimension the
scatter writes single rows of:

- *per-row writes*: the index vectors carry the axis at a batch dimension, and their
  component for the axis's operand dimension is the row's own position there (``position_dim``,
  proven from the program, as for ``gather``): row ``i``'s updates go to row ``i``. At chunk
  size that component is shifted by the chunk's start, so it addresses the chunk's own rows;
- *writes of whole indices into rows* (``s.at[diag, diag].set(v)``, ``s.at[roll(diag),
  diag].set(v)``): neither the indices nor the updates carry the axis. Each chunk applies
  the writes whose row falls in it: the row component, localised to the chunk (every component
  clamped to the whole operand first under ``mode=CLIP``, as JAX does; narrow index dtypes
  widened to 32 bits, so that the shift never wraps), addresses a row outside the chunk
  for every other write, and a scatter skips those (``FILL_OR_DROP``, XLA's own treatment of
  an index out of bounds; the shift keeps ``unique_indices`` and ``indices_are_sorted``
  true). Every write lands in exactly one chunk, as in the original; its
  gradient is JAX's for the localised scatter, so an update's cotangent comes from the one
  chunk that holds its row. A row out of bounds under ``promise_in_bounds`` (undefined in
  JAX) is dropped, and its update gets no gradient.

Any other scatter along the axis (updates or indices that carry the axis at a dimension that
is not a row's own) is a barrier.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped
from jaxpr_accum._compat import Array, JaxprEqn
from jaxpr_accum._engine._table import Rule, register
from jaxpr_accum._engine._view import EqnResize, View
from jaxpr_accum._rules.indexing import (
    component_position,
    shifted_rows,
    widened,
    window_dims,
)


def _single_rows(eqn: JaxprEqn, loc: AxisLoc) -> bool:
    """Whether the scatter writes single rows of operand dimension ``loc.dim``, the axis
    itself there (not a factor or a segment of it)."""
    dn = eqn.params["dimension_numbers"]
    return (
        loc.inner == 1
        and loc.outer == 1
        and not is_mapped(loc)
        and loc.dim in dn.inserted_window_dims
        and loc.dim in dn.scatter_dims_to_operand_dims
    )


def _own_row_dim(eqn: JaxprEqn, view: View, indices: AxisLoc) -> int | None:
    """The operand dimension each index vector writes at its own position along the axis
    (index dimension ``indices.dim``), a single row of a dimension as long as the axis; else
    None."""
    dn = eqn.params["dimension_numbers"]
    if indices.inner != 1 or indices.outer != 1 or is_mapped(indices):
        return None
    operand_shape = _compat.shape_of(eqn.invars[0])
    for component, dim in enumerate(dn.scatter_dims_to_operand_dims):
        if dim not in dn.inserted_window_dims or operand_shape[dim] != view.size:
            continue
        if component_position(view.analysis, view.ctx, eqn.invars[1], component) == indices.dim:
            return dim
    return None


class Scatter(Rule):
    """Operands: ``operand, indices, updates``; the output has the operand's shape."""

    middle_factor_ok = True  # only batch dimensions and whole windows: positionwise

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        dn = eqn.params["dimension_numbers"]
        operand_shape = _compat.shape_of(eqn.invars[0])
        upd_shape = _compat.shape_of(eqn.invars[2])
        idx_rank = len(_compat.shape_of(eqn.invars[1]))
        windows = window_dims(
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
                view.set_in(1, loc._replace(dim=i))
                view.set_in(2, loc._replace(dim=upd_scatter[i]))
            elif (
                loc.dim in windows
                and loc.dim not in dn.scatter_dims_to_operand_dims
                and upd_shape[dn.update_window_dims[windows.index(loc.dim)]]
                == operand_shape[loc.dim]
            ):
                view.set_in(2, loc._replace(dim=dn.update_window_dims[windows.index(loc.dim)]))
            elif not _single_rows(eqn, loc):
                view.barrier(f"`{eqn.primitive.name}` writes along the axis")
                return
        indices = view.in_loc(1)
        if indices is not None:
            if indices.dim == idx_rank - 1:
                view.barrier(f"`{eqn.primitive.name}` scatters along the axis")
                return
            if indices.dim not in dn.scatter_indices_batching_dims:
                self._own_rows(eqn, view, indices, upd_scatter)
                return
        updates = view.in_loc(2)
        if updates is None:
            return
        if updates.dim in dn.update_window_dims:
            view.set_in(0, updates._replace(dim=windows[dn.update_window_dims.index(updates.dim)]))
            return
        i = upd_scatter.index(updates.dim)
        if i in dn.scatter_indices_batching_dims:
            p = dn.scatter_indices_batching_dims.index(i)
            view.set_in(0, updates._replace(dim=dn.operand_batching_dims[p]))
        else:
            self._own_rows(eqn, view, updates._replace(dim=i), upd_scatter)

    @staticmethod
    def _own_rows(eqn: JaxprEqn, view: View, indices: AxisLoc, upd_scatter: list[int]) -> None:
        """Per-row writes, with the axis at index dimension ``indices.dim`` (see the module
        docstring); else a barrier."""
        dim = _own_row_dim(eqn, view, indices)
        operand = view.in_loc(0)
        if dim is None or (operand is not None and operand.dim != dim):
            view.barrier(f"`{eqn.primitive.name}` scatters along the axis")
            return
        row = indices._replace(dim=dim)
        view.set_in(0, row)
        view.set_out(0, row)
        view.set_in(1, indices)
        view.set_in(2, indices._replace(dim=upd_scatter[indices.dim]))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        loc, indices_loc = r.in_locs[0], r.in_locs[1]
        if loc is None or not _single_rows(eqn, loc):
            return _compat.bind(eqn, invals)
        operand, indices, updates = invals
        dn = eqn.params["dimension_numbers"]
        component = dn.scatter_dims_to_operand_dims.index(loc.dim)
        if indices_loc is not None:  # per-row writes: the chunk's own rows
            local = shifted_rows(indices, component, r.start)
            return _compat.bind(eqn, [operand, local, updates])
        if eqn.params["mode"] == lax.GatherScatterMode.CLIP:
            indices = _clamped(eqn, widened(indices))  # over the whole operand, as JAX clamps
        local = shifted_rows(indices, component, r.start)
        # shifting the rows keeps distinct rows distinct and sorted rows sorted
        params = {**eqn.params, "mode": lax.GatherScatterMode.FILL_OR_DROP}
        return _compat.bind(eqn, [operand, local, updates], params)


def _clamped(eqn: JaxprEqn, indices: Array) -> Array:
    """Every component of the index vectors clamped so that its window fits the whole
    operand (what ``mode=CLIP`` does before the scatter)."""
    dn = eqn.params["dimension_numbers"]
    operand_shape = _compat.shape_of(eqn.invars[0])
    updates_shape = _compat.shape_of(eqn.invars[2])
    windows = iter(dn.update_window_dims)
    sizes = [
        1
        if d in dn.inserted_window_dims or d in dn.operand_batching_dims
        else updates_shape[next(windows)]
        for d in range(len(operand_shape))
    ]
    upper = [operand_shape[d] - sizes[d] for d in dn.scatter_dims_to_operand_dims]
    return jnp.clip(indices, 0, jnp.asarray(upper, indices.dtype))


register(
    ["scatter", "scatter-add", "scatter-sub", "scatter-mul", "scatter-min", "scatter-max"],
    Scatter(),
)
