"""Sharded loop-invariant inputs (FSDP, tensor parallelism): each device holds its shard
and gathers the whole input in each chunk's step (per chunk), or once before the loop.

A ``Placement`` is the mesh axes of each dimension of an invariant input (its
``PartitionSpec``, every mesh axis manual under the layout's ``shard_map``). A ``Gather``
says where the layout gathers (``once``) and why. Per chunk:

- ``gather``: the shard, tied to the loop counter (``tie``: an optimization barrier, so that
  XLA cannot hoist the loop-invariant gather out of the loop and carry the whole input), is
  all-gathered along each sharded dimension (``tiled``). JAX's transpose of that gather is a
  reduce-scatter over every axis of the placement: right where JAX differentiates the loop
  (``native``, the JVP rule), whose ``shard_map`` divides a replicated cotangent among the
  devices that computed it;
- ``scatter``: the cotangent of the whole input, as the hand-written backward passes
  (``_backward``, ``_jacobians``) compute it on every device, back to the device's shard:
  reduce-scattered over the serialized axis's mesh axes (the devices hold different rows, so
  their cotangents add up) and sliced over the others (the devices along them computed the
  same chunk: their cotangents are equal, and adding them would count it twice).

Once before the loop: the shard is gathered (``whole``, untied) before the loop and the loop
reads the whole input; the backward passes still ``scatter`` its cotangent in each step into
a shard-sized accumulator (``held``). (Whole accumulators reduce-scattered once after the
loop measured 53.5 MiB per device against 30.4 on the FSDP benchmark's model, for the same
step time: ``docs/multi-device.md``.)
Under ``native``, JAX's transpose of the gather reduce-scatters the cotangent, accumulated
whole by JAX's own backward of the loop, once after it.

Invariant: a device's accumulator of a sharded input's cotangent is its shard of the whole
cotangent summed over the serialized axis's devices in its placement; ``unreduced`` names the
serialized axis's mesh axes it is still to be summed over after the loop (those the placement
does not use). ``describe`` counts the collectives per chunk or before the loop for
``explain``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
from jax import lax
from jax.sharding import PartitionSpec

from jaxpr_accum._compat import Array


class Placement(NamedTuple):
    """The mesh axes of each dimension of an input (``()``: not sharded), and the sizes of
    those mesh axes."""

    dims: tuple[tuple[str, ...], ...]
    sizes: tuple[tuple[int, ...], ...]

    def spec(self, lead: int = 0) -> PartitionSpec:
        """The ``PartitionSpec`` (after ``lead`` unsharded leading dimensions)."""
        entries = [None if not axes else axes[0] if len(axes) == 1 else axes for axes in self.dims]
        return PartitionSpec(*([None] * lead), *entries)

    def axes(self) -> set[str]:
        return {a for axes in self.dims for a in axes}

    def n_gathers(self) -> int:
        """Collectives per gather (one per sharded dimension)."""
        return sum(bool(axes) for axes in self.dims)


def placement_of(spec: PartitionSpec, shape: Sequence[int], mesh_shape: dict) -> Placement | str:
    """The placement of an input of ``shape`` with ``spec`` on a mesh of ``mesh_shape``, or
    why it stays replicated (a dimension its shards do not divide: ``shard_map`` needs even
    shards, and padding would change the shapes every equation reading it computes with)."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    dims = tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries)
    sizes = tuple(tuple(mesh_shape[a] for a in axes) for axes in dims)
    for n, axes, s in zip(shape, dims, sizes, strict=True):
        if n % math.prod(s):
            return f"its dimension of {n} is not divided by the {math.prod(s)} shards of {axes}"
    return Placement(dims, sizes)


class Gather(NamedTuple):
    """Where a layout gathers its sharded inputs: ``once`` before the loop, else per chunk;
    ``why``, for ``explain``."""

    once: bool
    why: str


@jax.custom_jvp
def tie(x: Array, counter: Array | int) -> Array:
    """``x``, made to depend on the loop ``counter`` (an optimization barrier of both)."""
    return lax.optimization_barrier((x, counter))[0]


@tie.defjvp
def _tie_jvp(primals: tuple, tangents: tuple) -> tuple:
    return tie(*primals), tangents[0]


def gather(x: Array, placement: Placement, counter: Array | int) -> Array:
    """The whole input from this device's shard ``x``, gathered inside the loop step."""
    return whole(tie(x, counter), placement)


def whole(x: Array, placement: Placement) -> Array:
    """The whole input from this device's shard ``x`` (all-gathered where it is)."""
    for dim, axes in enumerate(placement.dims):
        if axes:
            x = lax.all_gather(x, axes, axis=dim, tiled=True)
    return x


def held(x: Array, placement: Placement | None, gathered: bool) -> tuple:
    """The shape of a device's accumulator of the cotangent of ``x`` (an invariant input as
    the loop reads it, whole where ``gathered`` before the loop): its shard's."""
    if placement is None or not gathered:
        return x.shape
    return tuple(n // math.prod(s) for n, s in zip(x.shape, placement.sizes, strict=True))


def scatter(ct: Array, placement: Placement, batch_axes: Sequence[str], lead: int = 0) -> Array:
    """This device's shard of the whole cotangent ``ct`` (after ``lead`` leading
    dimensions), summed over ``batch_axes`` in the placement (module docstring)."""
    for dim, (axes, sizes) in enumerate(zip(placement.dims, placement.sizes, strict=True)):
        d = dim + lead
        for axis, size in zip(axes, sizes, strict=True):  # major to minor, as tiled gathers
            if axis in batch_axes:
                ct = lax.psum_scatter(ct, axis, scatter_dimension=d, tiled=True)
            else:
                block = ct.shape[d] // size
                ct = lax.dynamic_slice_in_dim(ct, lax.axis_index(axis) * block, block, d)
    return ct


def unreduced(placement: Placement | None, batch_axes: Sequence[str]) -> tuple[str, ...]:
    """The serialized axis's mesh axes a cotangent is still summed over after the loop."""
    used = placement.axes() if placement is not None else set()
    return tuple(a for a in batch_axes if a not in used)


def gather_all(
    values: Sequence, placements: Sequence, counter: Array | int, gathered: bool = False
) -> list:
    """``values`` whole: the sharded ones gathered (``gather``; None stays None), unless
    ``gathered`` before the loop."""
    if gathered:
        return list(values)
    return [
        x if p is None or x is None else gather(x, p, counter)
        for x, p in zip(values, placements, strict=True)
    ]


def scatter_all(
    cts: Sequence, placements: Sequence, batch_axes: Sequence[str], lead: int = 0
) -> list:
    """The cotangents ``cts`` of whole inputs placed so, back to the shards (``scatter``)."""
    return [
        ct if p is None else scatter(ct, p, batch_axes, lead)
        for ct, p in zip(cts, placements, strict=True)
    ]


def describe(found: Sequence, batch_axes: Sequence[str], where: Gather, nbytes: str) -> str:
    """The report's sentence on the invariant inputs' placements (``found``: a
    ``Placement``, None or a reason each; ``nbytes``: the sharded ones' whole size); "" when
    none is sharded."""
    sharded = [p for p in found if isinstance(p, Placement)]
    whole_ = [p for p in found if isinstance(p, str)]
    parts = []
    if sharded:
        gathers = sum(p.n_gathers() for p in sharded)
        scatters = sum(a in batch_axes for p in sharded for axes in p.dims for a in axes)
        scattered = (
            f"({scatters} reduce-scatter(s) over {tuple(batch_axes)}, a local slice over other "
            "mesh axes)"
        )
        if where.once:
            parts.append(
                f"{len(sharded)} sharded loop-invariant input(s) (FSDP / tensor parallelism) "
                f"are gathered once before the loop ({nbytes} gathered): {where.why}; each "
                f"pass over the chunks all-gathers them before its loop ({gathers} "
                "all-gather(s)) and reads them whole; per chunk, the backward brings their "
                f"gradients back to the shards {scattered}, the only collectives inside the "
                "loop (native: once after the loop); their gradients leave sharded like them"
            )
        else:
            parts.append(
                f"{len(sharded)} loop-invariant input(s) stay sharded (FSDP / tensor "
                f"parallelism), gathered per chunk ({nbytes} gathered in each step): "
                f"{where.why}; each device holds its shard across the loop and accumulates its "
                "shard of their gradients; per chunk, each pass over the chunks all-gathers "
                f"them in the chunk's step ({gathers} all-gather(s)) and the backward brings "
                f"their gradients back to the shards {scattered}: FSDP's own cost, the only "
                "collectives inside the loop; their gradients leave sharded like them"
            )
    if whole_:
        parts.append(f"{len(whole_)} sharded input(s) gathered whole before the loop: {whole_[0]}")
    return "; ".join(parts)
