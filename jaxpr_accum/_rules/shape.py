"""Shape primitives: map the axis position through the reshuffle; resize shape parameters.

``reshape`` is where merged dimensions come from: ``vmap`` of a conv or a matmul merges
``[N, B, ...]`` into ``[N*B, ...]``. The axis survives a reshape exactly when its block of
elements stays contiguous and on a dimension boundary: the dimensions before it hold the
same number of elements before and after, and the dimension that receives it has a size
divisible by ``N`` (the axis is then its major factor, ``inner = size // N``). Anything else
(splitting the axis itself) interleaves positions: a barrier. Merging the axis into the
dimensions before it (``[T, B, H] -> [T * B, H]``, ``hk.BatchApply``) makes it a *middle*
factor (``AxisLoc.outer``): the chunk is then strided in that dimension, which only the
rules that never index along it accept (``Rule.middle_factor_ok``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, positions
from jaxpr_accum._compat import Array, JaxprEqn, Params
from jaxpr_accum._engine._resize import scaled
from jaxpr_accum._engine._table import Rule, agreed, register, shared_loc
from jaxpr_accum._engine._view import EqnResize, View

T = TypeVar("T")
Carriers: TypeAlias = Callable[[JaxprEqn], list[int]]  # the operands that carry the axis
Allowed: TypeAlias = Callable[[JaxprEqn, int], bool]  # may the axis sit at this dimension?


def replaced_at(seq: Sequence[T], dim: int, value: T) -> tuple[T, ...]:
    """``seq`` as a tuple, its item ``dim`` replaced by ``value`` (a shape at chunk size)."""
    items = list(seq)
    items[dim] = value
    return tuple(items)


def carried_loc(loc: AxisLoc | None) -> AxisLoc:
    """``loc`` of a result that carries the axis (an equation is resized only if it does)."""
    assert loc is not None
    return loc


def reshape_loc(
    src: tuple[int, ...], dst: tuple[int, ...], loc: AxisLoc, size: int
) -> AxisLoc | None:
    """Where the axis at ``loc`` of shape ``src`` lands in shape ``dst``, or None.

    In row-major order the axis is a block: ``before`` elements of the dimensions (and
    factors) above it, then ``N`` positions of ``per_position`` elements each. It lands on
    dimension ``e`` of ``dst`` when that dimension holds the whole block: the dimensions
    before ``e`` divide ``before`` (the quotient is the new ``outer``), those after divide
    ``per_position`` (the new ``inner``), and ``dst[e] == outer * N * inner``."""
    before = math.prod(src[: loc.dim]) * loc.outer
    per_position = loc.inner * math.prod(src[loc.dim + 1 :])
    for e, extent in enumerate(dst):
        above, below = math.prod(dst[:e]), math.prod(dst[e + 1 :])
        if before % above or per_position % below:
            continue
        outer, inner = before // above, per_position // below
        if extent == outer * size * inner:
            return AxisLoc(e, inner, outer)
    return None


class Reshape(Rule):
    middle_factor_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        # ``dimensions`` transposes the operand first (``vmap`` moving the axis beside the
        # dimension it merges into): the axis moves with it.
        operand_shape = _compat.shape_of(eqn.invars[0])
        perm = eqn.params.get("dimensions") or tuple(range(len(operand_shape)))
        src = tuple(operand_shape[d] for d in perm)
        dst, loc = _compat.shape_of(eqn.outvars[0]), view.in_loc(0)
        for known, a, b, setter, back in (
            (loc and loc._replace(dim=perm.index(loc.dim)), src, dst, view.set_out, None),
            (view.out_loc(0), dst, src, view.set_in, perm),
        ):
            if known is None:
                continue
            mapped = reshape_loc(a, b, known, positions(known, view.size))
            if mapped is None:
                view.barrier(f"`reshape` {a} -> {b} splits the axis")
                return
            mapped = mapped._replace(lo=known.lo, span=known.span, rev=known.rev)
            setter(0, mapped if back is None else mapped._replace(dim=back[mapped.dim]))

    def resize_params(self, eqn: JaxprEqn, r: EqnResize) -> Params:
        loc = carried_loc(r.out_locs[0])
        return {
            **eqn.params,
            "new_sizes": replaced_at(eqn.params["new_sizes"], loc.dim, r.rows(loc)),
        }


class BroadcastInDim(Rule):
    """Operand dim ``i`` becomes output dim ``broadcast_dimensions[i]``; other output dims, and
    operand dims of size 1 that grow, are *born* here: at chunk size they are born shorter."""

    middle_factor_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        bdims = eqn.params["broadcast_dimensions"]
        shape = eqn.params["shape"]
        operand_shape = _compat.shape_of(eqn.invars[0])
        loc = view.in_loc(0)
        if loc is not None:
            view.set_out(0, loc._replace(dim=bdims[loc.dim]))
        loc = view.out_loc(0)
        if loc is not None and loc.dim in bdims:
            i = bdims.index(loc.dim)
            if operand_shape[i] == shape[loc.dim]:
                view.set_in(0, loc._replace(dim=i))

    def resize_params(self, eqn: JaxprEqn, r: EqnResize) -> Params:
        loc = carried_loc(r.out_locs[0])
        return {**eqn.params, "shape": replaced_at(eqn.params["shape"], loc.dim, r.rows(loc))}


class Permutation(Rule):
    """``transpose``: output dim ``j`` is operand dim ``permutation[j]``."""

    middle_factor_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        perm = eqn.params["permutation"]
        loc = view.in_loc(0)
        if loc is not None:
            view.set_out(0, loc._replace(dim=perm.index(loc.dim)))
        loc = view.out_loc(0)
        if loc is not None:
            view.set_in(0, loc._replace(dim=perm[loc.dim]))


class DropDims(Rule):
    """``squeeze``: removes size-1 dimensions; the axis only where it is a one-row segment."""

    middle_factor_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        dropped = set(eqn.params["dimensions"])
        kept = [d for d in range(len(_compat.shape_of(eqn.invars[0]))) if d not in dropped]
        loc = view.in_loc(0)
        if loc is not None and loc.dim in dropped:  # a one-row segment of it (``_lattice``)
            view.barrier("`squeeze` drops the axis")
        elif loc is not None:
            view.set_out(0, loc._replace(dim=kept.index(loc.dim)))
        loc = view.out_loc(0)
        if loc is not None:
            view.set_in(0, loc._replace(dim=kept[loc.dim]))


class SameShape(Rule):
    """Operands listed in ``carriers`` and every output share one position; the primitive is
    fine as long as ``allowed(eqn, dim)`` says it does not act along that dimension."""

    def __init__(self, carriers: Carriers, allowed: Allowed, what: str):
        self.carriers, self.allowed, self.what = carriers, allowed, what

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        carriers = self.carriers(eqn)
        loc = shared_loc(eqn, view, carriers)
        if loc is None:
            return
        if not self.allowed(eqn, loc.dim):
            view.barrier(f"`{eqn.primitive.name}` {self.what}")
            return
        for i in carriers:
            view.set_in(i, loc)
        for j in range(len(eqn.outvars)):
            view.set_out(j, loc)


def first_operand(eqn: JaxprEqn) -> list[int]:
    """``Carriers``: the first operand carries the axis."""
    return [0]


def every_operand(eqn: JaxprEqn) -> list[int]:
    """``Carriers``: every operand carries the axis."""
    return list(range(len(eqn.invars)))


class DynamicSlice(SameShape):
    def __init__(self) -> None:
        super().__init__(first_operand, self._full, "slices along the axis")

    @staticmethod
    def _full(eqn: JaxprEqn, d: int) -> bool:
        return eqn.params["slice_sizes"][d] == _compat.shape_of(eqn.invars[0])[d]

    def resize_params(self, eqn: JaxprEqn, r: EqnResize) -> Params:
        loc = carried_loc(r.out_locs[0])
        sizes = replaced_at(eqn.params["slice_sizes"], loc.dim, r.rows(loc))
        return {**eqn.params, "slice_sizes": sizes}


class Iota(Rule):
    """``iota`` is born with the axis; along its counting dimension a chunk counts from its
    own first position (a row-mapped one: its window's first row), so the resized iota adds
    the chunk's offset."""

    row_map_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        pass  # no operands: its output's position is learnt from its users

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        loc = carried_loc(r.out_locs[0])
        params = {**eqn.params, "shape": replaced_at(eqn.params["shape"], loc.dim, r.rows(loc))}
        (out,) = _compat.bind(eqn, invals, params)
        if eqn.params["dimension"] == loc.dim:
            first, _ = r.window(loc)
            offset = lax.convert_element_type(scaled(first, loc.inner), out.dtype)
            out = out + offset
        return [out]


def _pad_allowed(eqn: JaxprEqn, d: int) -> bool:
    return tuple(eqn.params["padding_config"][d]) == (0, 0, 0)


def _tile_allowed(eqn: JaxprEqn, d: int) -> bool:
    return eqn.params["reps"][d] == 1


def _dus_allowed(eqn: JaxprEqn, d: int) -> bool:
    return _compat.shape_of(eqn.invars[1])[d] == _compat.shape_of(eqn.invars[0])[d]


class Stack(Rule):
    """``stack``: operands gain a new dimension ``axis`` (the axis shifts past it)."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        new = eqn.params["axis"]
        found = [view.in_loc(i) for i in range(len(eqn.invars))]
        out = view.out_loc(0)
        if out is not None:
            if out.dim == new:
                view.barrier("`stack` stacks along the axis")
                return
            found.append(out._replace(dim=out.dim - (out.dim > new)))
        loc = agreed(eqn, view, found)
        if loc is None:
            return
        for i in range(len(eqn.invars)):
            view.set_in(i, loc)
        view.set_out(0, loc._replace(dim=loc.dim + (loc.dim >= new)))


class Unstack(Rule):
    """``unstack``: dimension ``axis`` is removed; each output is one slice of it."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        gone = eqn.params["axis"]
        loc = view.in_loc(0)
        if loc is not None:
            if loc.dim == gone:
                view.barrier("`unstack` unstacks the axis")
                return
            for j in range(len(eqn.outvars)):
                view.set_out(j, loc._replace(dim=loc.dim - (loc.dim > gone)))
        for j in range(len(eqn.outvars)):
            out = view.out_loc(j)
            if out is not None:
                view.set_in(0, out._replace(dim=out.dim + (out.dim >= gone)))


def not_at_param(name: str) -> Allowed:
    """``Allowed``: the axis may sit at any dimension but the one the parameter ``name``
    names (counted from the end when negative)."""
    return lambda eqn, d: eqn.params[name] % len(_compat.shape_of(eqn.invars[0])) != d


register("reshape", Reshape())
register("broadcast_in_dim", BroadcastInDim())
register("transpose", Permutation())
register("squeeze", DropDims())
register("dynamic_slice", DynamicSlice())
register("iota", Iota())
register("pad", SameShape(first_operand, _pad_allowed, "pads along the axis"))
register("tile", SameShape(first_operand, _tile_allowed, "repeats the axis"))
register("stack", Stack())
register("unstack", Unstack())
register(
    "dynamic_update_slice",
    SameShape(lambda e: [0, 1], _dus_allowed, "updates part of the axis"),
)
