"""``gather`` where the axis is a batch dimension of the indexing, or the row it looks up.

Gather output dims are the index batch dims (every indices dim but the last, in order) with
the operand's window dims inserted at ``offset_dims``. The axis may be an index batch dim
(embedding lookup with per-row ids; ``operand_batching_dims`` pair it with an operand dim,
as ``vmap`` of ``take_along_axis`` produces), or a window dim the gather takes whole and does
not index along.

*Per-row lookups*: ``logp[jnp.arange(N), y]`` indexes the operand along the axis, but with
the row's own position (an ``iota`` along the axis, through JAX's negative-index
normalisation, broadcasts and the concatenation of index vectors). That is proven from the
program (``position_dim``), not assumed: the lookup is then positionwise, and at chunk size
the position component of each index vector is shifted by the chunk's start, so it addresses
the chunk's own rows. Any other indexing *along* the axis (a permutation of rows, a lookup
into a table that has the axis) is a barrier. Scatter is ``scatter.py``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array, Atom, JaxprEqn
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._table import Rule, register
from jaxpr_accum._engine._view import Ctx, EqnResize, View
from jaxpr_accum._rules.shape import replaced_at

_IOTA, _CONVERT, _BROADCAST, _SELECT, _LT, _CONCAT = (
    _compat.primitive(n)
    for n in ("iota", "convert_element_type", "broadcast_in_dim", "select_n", "lt", "concatenate")
)


def position_dim(analysis: Analysis, ctx: Ctx, v: Atom, depth: int = 0) -> int | None:
    """The dimension ``d`` along which integer value ``v`` counts its own position
    (``v[..., i, ...] == i`` at dim ``d`` for every element), proven from its definition."""
    eqn = None if depth > 32 else analysis.definition(ctx, v)
    if eqn is None:
        return None
    prim, ins = eqn.primitive, eqn.invars
    if prim is _IOTA:
        return eqn.params["dimension"]
    if prim is _CONVERT and jnp.issubdtype(_compat.dtype_of(eqn.outvars[0]), jnp.integer):
        return position_dim(analysis, ctx, ins[0], depth + 1)
    if prim is _BROADCAST:
        d = position_dim(analysis, ctx, ins[0], depth + 1)
        if d is None:
            return None
        out = eqn.params["broadcast_dimensions"][d]
        same = _compat.shape_of(ins[0])[d] == _compat.shape_of(eqn.outvars[0])[out]
        return out if same else None
    if prim is _SELECT and len(ins) == 3:  # select_n(p < 0, p, p + n): p itself, as p >= 0
        pred = analysis.definition(ctx, ins[0])
        if (
            pred is not None
            and pred.primitive is _LT
            and pred.invars[0] is ins[1]
            and isinstance(pred.invars[1], _compat.Literal)
            and pred.invars[1].val == 0
        ):
            return position_dim(analysis, ctx, ins[1], depth + 1)
    return None


def component_position(analysis: Analysis, ctx: Ctx, indices: Atom, component: int) -> int | None:
    """``position_dim`` of component ``component`` of the index vectors ``indices``
    (the last dimension), looking through the concatenation that assembled them."""
    v = indices
    for _ in range(32):
        eqn = analysis.definition(ctx, v)
        rank = len(_compat.shape_of(v))
        if eqn is None or eqn.primitive is not _CONCAT or eqn.params["dimension"] != rank - 1:
            break
        for part in eqn.invars:
            width = _compat.shape_of(part)[-1]
            if component < width:
                v = part
                break
            component -= width
    if isinstance(v, _compat.Literal) or _compat.shape_of(v)[-1] != 1:
        return None
    return position_dim(analysis, ctx, v)


def _per_row(eqn: JaxprEqn, analysis: Analysis, ctx: Ctx, operand_dim: int) -> int | None:
    """For a gather indexing operand dim ``operand_dim`` with each row's own position: the
    index dimension that holds the rows (else None)."""
    dn = eqn.params["dimension_numbers"]
    if operand_dim not in dn.start_index_map or operand_dim not in dn.collapsed_slice_dims:
        return None
    indices = eqn.invars[1]
    d = component_position(analysis, ctx, indices, dn.start_index_map.index(operand_dim))
    if d is None or d == len(_compat.shape_of(indices)) - 1:
        return None
    return d


def _lookup(eqn: JaxprEqn, loc: AxisLoc) -> bool:
    """A lookup of single positions of the axis (``take_along_axis`` with labels, ``x[:, y]``):
    per chunk it can pick the indices that fall in the chunk (``_lookup_in_chunk``)."""
    dn = eqn.params["dimension_numbers"]
    return (
        loc.inner == 1
        and loc.dim in dn.start_index_map
        and loc.dim in dn.collapsed_slice_dims
        and eqn.params["slice_sizes"][loc.dim] == 1
    )


def widened(indices: Array) -> Array:
    """``indices`` in at least 32 bits, so that shifting them by a chunk's start (on an axis
    longer than a narrow dtype counts) cannot wrap."""
    if jnp.dtype(indices.dtype).itemsize >= 4:
        return indices
    return lax.convert_element_type(indices, jnp.int32)


def shifted_rows(indices: Array, component: int, offset: Array | int) -> Array:
    """The index vectors ``indices`` (``widened``) with component ``component`` less
    ``offset``: the rows of the whole axis as the rows of the chunk that starts there."""
    indices = widened(indices)
    shift = np.zeros(indices.shape[-1], np.int64)
    shift[component] = 1
    offset = lax.convert_element_type(offset, indices.dtype)
    return indices - offset * jnp.asarray(shift, indices.dtype)


def _lookup_in_chunk(eqn: JaxprEqn, r: EqnResize, operand: Array, indices: Array) -> Array:
    """This chunk's share of a lookup along the axis: the value where the index falls in the
    chunk, else 0, so that the chunks' shares add up to the lookup (each index is in exactly
    one chunk, and ``x + 0 == x``). An index outside the axis takes the gather's own
    treatment: clamped (``clip``; ``promise_in_bounds`` too, where XLA's transpose then drops
    the cotangent) or the fill value, added once, by the chunk at position 0 (``fill``)."""
    dn, mode = eqn.params["dimension_numbers"], eqn.params["mode"]
    loc = r.in_locs[0]
    assert loc is not None  # a lookup along the axis: the operand carries it
    component = dn.start_index_map.index(loc.dim)
    indices = widened(indices)
    position = indices[..., component]
    size = r.analysis.size
    filling = mode == lax.GatherScatterMode.FILL_OR_DROP
    outside = (position < 0) | (position >= size)
    if not filling:
        position = jnp.clip(position, 0, size - 1)
    start = lax.convert_element_type(r.start, position.dtype)
    local = position - start
    inside = (local >= 0) & (local < r.k)
    indices = indices.at[..., component].set(jnp.clip(local, 0, r.k - 1))
    # clamped indices may now repeat: never let the gradient's scatter assume otherwise
    params = {**eqn.params, "unique_indices": False, "indices_are_sorted": False}
    found = _compat.bind(eqn, [operand, indices], params)[0]
    out_rank = len(_compat.shape_of(eqn.outvars[0]))
    batch = tuple(d for d in range(out_rank) if d not in dn.offset_dims)

    def spread(mask: Array) -> Array:
        return lax.broadcast_in_dim(mask, found.shape, batch)

    if mode == lax.GatherScatterMode.PROMISE_IN_BOUNDS:
        # what XLA does with a broken promise: the lookup clamps, its transpose drops
        found = jnp.where(spread(outside), lax.stop_gradient(found), found)
    share = jnp.where(spread(inside), found, jnp.zeros_like(found))
    if filling:
        fill = _compat.gather_fill_value(eqn)
        first = spread(outside & (r.start == 0))
        share = jnp.where(first, jnp.full_like(found, fill), share)
    return share


def window_dims(rank: int, skipped: tuple[int, ...]) -> list[int]:
    return [d for d in range(rank) if d not in skipped]


class Gather(Rule):
    # copies of the axis side by side (``blocks``) are positionwise in a batch dimension or a
    # window taken whole; indexing along them is a barrier
    middle_factor_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        dn = eqn.params["dimension_numbers"]
        operand_shape = _compat.shape_of(eqn.invars[0])
        idx_rank = len(_compat.shape_of(eqn.invars[1]))
        out_rank = len(_compat.shape_of(eqn.outvars[0]))
        windows = window_dims(
            len(operand_shape), dn.collapsed_slice_dims + dn.operand_batching_dims
        )
        out_batch = [d for d in range(out_rank) if d not in dn.offset_dims]
        sizes = eqn.params["slice_sizes"]

        loc = view.in_loc(0)
        if loc is not None:
            if loc.dim in dn.operand_batching_dims:
                p = dn.operand_batching_dims.index(loc.dim)
                i = dn.start_indices_batching_dims[p]
                view.set_in(1, loc._replace(dim=i))
            elif (
                loc.dim in windows
                and loc.dim not in dn.start_index_map
                and sizes[loc.dim] == operand_shape[loc.dim]
            ):
                view.set_out(0, loc._replace(dim=dn.offset_dims[windows.index(loc.dim)]))
            elif loc.outer > 1:
                view.barrier("`gather` indexes along copies of the axis side by side")
                return
            elif (row := _per_row(eqn, view.analysis, view.ctx, loc.dim)) is not None:
                view.set_in(1, loc._replace(dim=row))  # each row looks itself up
            elif _lookup(eqn, loc) and view.in_loc(1) is None and view.out_loc(0) is None:
                view.reduce(0, "sum")  # each index is found in exactly one chunk
                return
            else:
                view.barrier("`gather` indexes along the axis")
                return
        loc = view.in_loc(1)
        if loc is not None:
            if loc.dim == idx_rank - 1:
                view.barrier("`gather` index vectors run along the axis")
                return
            view.set_out(0, loc._replace(dim=out_batch[loc.dim]))
            if loc.dim in dn.start_indices_batching_dims:
                p = dn.start_indices_batching_dims.index(loc.dim)
                view.set_in(0, loc._replace(dim=dn.operand_batching_dims[p]))
        loc = view.out_loc(0)
        if loc is not None:
            if loc.dim in dn.offset_dims:
                view.set_in(0, loc._replace(dim=windows[dn.offset_dims.index(loc.dim)]))
            else:
                view.set_in(1, loc._replace(dim=out_batch.index(loc.dim)))

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        loc = r.in_locs[0]
        dn = eqn.params["dimension_numbers"]
        if loc is None or loc.dim in dn.operand_batching_dims:
            return _compat.bind(eqn, invals)
        if r.analysis.reductions.get(r.key):
            return [_lookup_in_chunk(eqn, r, *invals)]
        if _per_row(eqn, r.analysis, r.ctx, loc.dim) is not None:
            component = dn.start_index_map.index(loc.dim)
            local = shifted_rows(invals[1], component, r.start * loc.inner)
            return _compat.bind(eqn, [invals[0], local])
        sizes = replaced_at(eqn.params["slice_sizes"], loc.dim, r.rows(loc))
        return _compat.bind(eqn, invals, {**eqn.params, "slice_sizes": sizes})


register("gather", Gather())
