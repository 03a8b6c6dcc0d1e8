"""Where the serialized axis lives: one device, or sharded over mesh axes.

``Layout`` (one device) runs the chunk loop as is. ``ShardedLayout`` runs it under
``jax.shard_map`` over the mesh axes the serialized axis is sharded on: each device scans its
own shard in chunks of ``k / D`` with the global offset of its rows (so iotas and random
counters are those of the unchunked program); sums, invariant cotangents and Jacobians are
``psum``-ed once, after the loop; nothing crosses devices inside it.

``detect`` finds the layout of a call: from ``mesh_axis=``, or from the ``Explicit`` mesh axes
that the inputs' shardings put on the axis (seen alike eagerly and under ``jit``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.sharding import PartitionSpec

from jaxpr_accum import _compat
from jaxpr_accum._base._errors import ArgumentError
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._build._loop import ChunkLoop
from jaxpr_accum._planning._plan import Split


class Layout:
    """The axis on one device: the chunk loop runs as is."""

    devices = 1

    def loop(self, split: Split, signature: Any, accum_dtype: Any, chunk: int) -> ChunkLoop:
        """The chunk loop of this device (inside ``map``'s function when sharded)."""
        return ChunkLoop(split, signature, accum_dtype, split.size, chunk, 0)

    def map(self, fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
        return fn

    def reduce(self, x: Any) -> Any:
        return x

    def maximum(self, x: Any) -> Any:
        return x

    def spec(self, loc: AxisLoc | None) -> Any:
        return None


class ShardedLayout(Layout):
    """The axis sharded over ``axes`` of ``mesh``: ``shard_map``, one device per shard."""

    def __init__(self, mesh: Any, axes: tuple[str, ...]):
        self.mesh, self.axes = mesh, axes
        self.devices = math.prod(mesh.shape[a] for a in axes)

    def loop(self, split: Split, signature: Any, accum_dtype: Any, chunk: int) -> ChunkLoop:
        local = split.size // self.devices
        offset = lax.axis_index(self.axes) * local
        return ChunkLoop(split, signature, accum_dtype, local, chunk // self.devices, offset)

    def map(self, fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )

    def reduce(self, x: Any) -> Any:
        return None if x is None else lax.psum(x, self.axes)

    def maximum(self, x: Any) -> Any:
        return lax.pmax(x, self.axes)

    def spec(self, loc: AxisLoc | None) -> Any:
        if loc is None:
            return PartitionSpec()
        return PartitionSpec(*([None] * loc.dim), self.axes)


def detect(split: Split, inputs: list, mesh_axis: tuple[str, ...] | None, chunk: int) -> Layout:
    """Where the axis lives for this call (``inputs``: the values of ``split.jaxpr``'s
    inputs): one device, or sharded over mesh axes."""
    carrying = [
        (x, loc)
        for v, x in zip(split.jaxpr.invars, inputs, strict=True)
        if (loc := split.analysis.loc((), v)) is not None
    ]
    axes, mesh = mesh_axis, None
    for x, loc in carrying:
        sharding = _compat.named_sharding(x)
        if sharding is None:
            continue
        entry = sharding.spec[loc.dim] if loc.dim < len(sharding.spec) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if axes is None and names and _compat.explicit_axes(sharding.mesh, names):
            axes = names  # only explicit axes are seen alike eagerly and under jit
        mesh = mesh or sharding.mesh
    if axes is None:
        return Layout()
    context = jax.sharding.get_abstract_mesh()
    if context.axis_names:
        mesh = context
    if mesh is None:
        raise ArgumentError(
            f"`mesh_axis` {axes} needs a mesh: call under `jax.set_mesh(mesh)` or pass "
            "inputs sharded with a `NamedSharding`"
        )
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ArgumentError(
            f"`mesh_axis` names {missing}, which the mesh does not have "
            f"(its axes: {tuple(mesh.axis_names)})"
        )
    layout = ShardedLayout(mesh, axes)
    d = layout.devices
    if d == 1:
        return Layout()
    if split.size % d:
        raise ArgumentError(
            f"the serialized axis has size {split.size}, which {d} shards over {axes} do not divide"
        )
    if chunk % d:
        lower, upper = chunk // d * d, (chunk // d + 1) * d
        nearest = f"{lower} and {upper}" if lower else f"{upper} (the smallest)"
        raise ArgumentError(
            f"`chunk` {chunk} must be a multiple of the {d} shards of mesh axis "
            f"{axes}; the nearest valid chunk sizes are {nearest}"
        )
    return layout

