"""Where the serialized axis lives: one device, or sharded over mesh axes.

``Layout`` (one device) runs the chunk loop as is. ``ShardedLayout`` runs it under
``jax.shard_map`` over the mesh axes the serialized axis is sharded on: each device scans its
own shard in chunks of ``k / D`` with the global offset of its rows (so iotas and random
counters are those of the unchunked program); sums, invariant cotangents and Jacobians are
``psum``-ed once, after the loop. Every mesh axis is manual. A replicated invariant input
enters whole (``P()``) and nothing crosses devices inside the loop; a sharded one (FSDP,
tensor parallelism: its ``placement``) enters as its shard and, per chunk, is gathered in each
step and its cotangent reduce-scattered back to the shard there (``_shards``): those are the
only collectives inside the loop. Gathered once (``gather``: ``"once"``, or ``"auto"`` where a
memory budget affords it, ``_planning._gather``), it is gathered before the loop
(``before_loop``) and the loop reads it whole, still reduce-scattering its cotangent per
chunk (``native``: JAX's transpose of the gather, once after the loop). Either way its
cotangent leaves with the input's sharding.

``detect`` finds the layout of a call: from ``mesh_axis=``, or from the ``Explicit`` mesh axes
that the inputs' shardings put on the axis (seen alike eagerly and under ``jit``). The
placement of an invariant input is its value's ``Explicit`` sharding (at run time, for one
computed before the loop) or, for an input of the call, ``param_specs=`` (``Auto`` axes, whose
avals carry none).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import jax
import numpy as np
from jax import lax
from jax.sharding import AbstractMesh, Mesh, PartitionSpec

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import format_bytes, nbytes
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._base._errors import ArgumentError
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._build import _shards
from jaxpr_accum._build._loop import ChunkLoop
from jaxpr_accum._build._signature import Inputs, Signature
from jaxpr_accum._compat import Array, Var

MaybeArray = TypeVar("MaybeArray", Array, None)  # a value, or None (a zero cotangent)

#: ``gather=`` -> where the layout gathers before any budget decides (``_planning._gather``).
GATHERS = {
    "chunk": _shards.Gather(False, "gather='chunk'"),
    "once": _shards.Gather(True, "gather='once'"),
    "auto": _shards.Gather(
        False, "gather='auto' gathers once only under a memory= budget that fits it"
    ),
}


class Layout:
    """The axis on one device: the chunk loop runs as is."""

    devices = 1

    def loop(
        self,
        split: Split,
        signature: Signature,
        accum_dtype: np.dtype | None,
        chunk: int,
        shards: list,
    ) -> ChunkLoop:
        """The chunk loop of this device (inside ``map``'s function when sharded)."""
        return ChunkLoop(
            split, signature, accum_dtype, size=split.size, chunk=chunk, offset=0, shards=shards
        )

    def placement(self, v: Var, x: Array | None) -> _shards.Placement | str | None:
        """Where invariant input ``v`` (value ``x``) lives in the loop: sharded, whole on
        every device (None), or why a sharded one is gathered whole before the loop."""
        return None

    def enter(self, signature: Signature, inputs: Inputs) -> tuple[list, Inputs]:
        """``(placements, specs)``: the placement of each invariant input of the region (at
        ``inputs``; ``_shards``, None: whole) and the specs of ``map``'s function's inputs."""
        placements = [
            p if isinstance(p, _shards.Placement) else None
            for p in map(self.placement, signature.invariants, inputs.invariants)
        ]
        specs = Inputs(
            [self.spec_of(p) for p in placements], [self.spec(loc) for loc in signature.chunk_locs]
        )
        return placements, specs

    def spec_of(self, placement: _shards.Placement | None, lead: int = 0) -> PartitionSpec | None:
        """The ``shard_map`` spec of an invariant input placed so (or of its Jacobian rows:
        ``lead`` dimensions before it)."""
        return None

    def before_loop(self, values: list, placements: list) -> list:
        """``values`` (invariant inputs, or their tangents) as the loop reads them."""
        return values

    def map(self, fn: Callable, in_specs: object, out_specs: object) -> Callable:
        return fn

    def reduce(self, x: MaybeArray, placement: _shards.Placement | None = None) -> MaybeArray:
        return x

    def maximum(self, x: Array) -> Array:
        return x

    def spec(self, loc: AxisLoc | None) -> PartitionSpec | None:
        return None


class ShardedLayout(Layout):
    """The axis sharded over ``axes`` of ``mesh``: ``shard_map``, one device per shard."""

    def __init__(
        self,
        mesh: Mesh | AbstractMesh,
        axes: tuple[str, ...],
        specs: dict | None = None,
        gather: _shards.Gather = GATHERS["chunk"],
    ):
        self.mesh, self.axes, self.specs, self.gather = mesh, axes, specs or {}, gather
        self.devices = math.prod(mesh.shape[a] for a in axes)

    def gathering(self, gather: _shards.Gather) -> ShardedLayout:
        """This layout, gathering as ``gather`` says."""
        return ShardedLayout(self.mesh, self.axes, self.specs, gather)

    def loop(
        self,
        split: Split,
        signature: Signature,
        accum_dtype: np.dtype | None,
        chunk: int,
        shards: list,
    ) -> ChunkLoop:
        local = split.size // self.devices
        offset = lax.axis_index(self.axes) * local
        k = chunk // self.devices
        return ChunkLoop(
            split,
            signature,
            accum_dtype,
            size=local,
            chunk=k,
            offset=offset,
            shards=shards,
            batch_axes=self.axes,
            gathered=self.gather.once,
        )

    def before_loop(self, values: list, placements: list) -> list:
        """Gathered once: the sharded ``values`` whole (None stays None)."""
        if not self.gather.once:
            return values
        return [
            x if p is None or x is None else _shards.whole(x, p)
            for x, p in zip(values, placements, strict=True)
        ]

    def placement(self, v: Var, x: Array | None) -> _shards.Placement | str | None:
        """From ``x``'s ``Explicit`` sharding, else from ``param_specs=`` (``detect``)."""
        sharding = _compat.explicit_sharding(x)
        spec = self.specs.get(v) if sharding is None else sharding.spec
        if spec is None or all(e is None for e in spec):
            return None
        return _shards.placement_of(spec, _compat.shape_of(v), dict(self.mesh.shape))

    def described(self, split: Split) -> str:
        """The placements of the invariant inputs the region reads as passed in, for the
        report (those computed before the loop are placed as they are at run time)."""
        invariants = Signature.of(split).invariants
        found = [self.placement(v, None) for v in invariants]
        return _shards.describe(found, self.axes, self.gather, format_bytes(self.gathered(split)))

    def gathered(self, split: Split) -> int:
        """Bytes of the sharded invariant inputs of ``split``, whole (what a device gathers)."""
        invariants = Signature.of(split).invariants
        placed = [(v, self.placement(v, None)) for v in invariants]
        return sum(nbytes(v) for v, p in placed if isinstance(p, _shards.Placement))

    def spec_of(self, placement: _shards.Placement | None, lead: int = 0) -> PartitionSpec | None:
        return PartitionSpec() if placement is None else placement.spec(lead)

    def map(self, fn: Callable, in_specs: object, out_specs: object) -> Callable:
        """``fn`` on each device's shard. An input sharded over ``Explicit`` axes otherwise
        than its spec says (the batch's features over ``model`` too) is resharded to it
        first: every mesh axis is manual inside, where a dimension the spec leaves whole is
        whole (its cotangent goes back to the input's layout)."""
        mapped = jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )
        return lambda *args: mapped(*_compat.laid_out_as_specs(args, in_specs))

    def reduce(self, x: MaybeArray, placement: _shards.Placement | None = None) -> MaybeArray:
        """``x`` summed over the devices of the serialized axis (those of the placement of
        the input whose cotangent it is excepted: its steps summed over them)."""
        axes = _shards.unreduced(placement, self.axes)
        return x if x is None or not axes else lax.psum(x, axes)

    def maximum(self, x: Array) -> Array:
        return lax.pmax(x, self.axes)

    def spec(self, loc: AxisLoc | None) -> PartitionSpec | None:
        if loc is None:
            return PartitionSpec()
        return PartitionSpec(*([None] * loc.dim), self.axes)


def detect(
    split: Split,
    inputs: list,
    given: list,
    mesh_axis: tuple[str, ...] | None,
    chunk: int,
    gather: str = "chunk",
) -> Layout:
    """Where the axis lives for this call (``inputs``: the values of ``split.jaxpr``'s
    inputs, ``given``: their ``param_specs``; ``gather``: the setting): one device, or
    sharded over mesh axes."""
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
        names = _names(entry)
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
    specs = _invariant_specs(split, inputs, given, mesh)
    layout = ShardedLayout(mesh, axes, specs, GATHERS[gather])
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


def _invariant_specs(split: Split, inputs: list, given: list, mesh: Mesh | AbstractMesh) -> dict:
    """``{input variable: PartitionSpec}`` of the inputs without the axis that are sharded
    over ``Explicit`` axes or named by ``param_specs`` (``given``)."""
    specs = {
        v: spec if sharding is None else sharding.spec
        for v, x, spec in zip(split.jaxpr.invars, inputs, given, strict=True)
        if split.analysis.loc((), v) is None
        and ((sharding := _compat.explicit_sharding(x)) is not None or spec is not None)
    }
    named = {a for spec in specs.values() for entry in spec for a in _names(entry)}
    missing = sorted(named - set(mesh.axis_names))
    if missing:
        raise ArgumentError(
            f"`param_specs` names mesh axes {missing}, which the mesh does not have "
            f"(its axes: {tuple(mesh.axis_names)})"
        )
    return specs


def _names(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The mesh axes of one ``PartitionSpec`` entry (none for None)."""
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
