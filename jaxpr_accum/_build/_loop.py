"""The chunk loop on one device: one chunk's body, and the loops of the forward passes.

``ChunkLoop`` runs the region for ``size`` positions starting at global position ``offset``
(the whole axis on one device; a shard of it under ``shard_map``). Chunk ``c`` covers
positions ``[c*k, (c+1)*k)``: ``size // k`` full chunks run in a ``lax.scan`` and the
remainder runs once more through the same body at its own length (no padding). Every chunked
input is sliced with ``dynamic_slice`` at its axis position. Inputs and outputs are the named
groups of ``_signature``.

- ``forward``: sums carried (16-bit floats in float32), other monoid partials stacked per
  chunk, axis-carrying outputs stacked and put back in order (``_stack``), streamed sums accumulated
  online (``_stream``);
- ``tangents`` (forward mode): each chunk under ``jax.jvp``, the tangents of its outputs
  accumulated as the values are (a streamed term's tangent rescaled by its final stabiliser).
  The backward passes are in ``_backward`` (remat) and ``_jacobians`` (fused).
  A sharded invariant input (``shards``) is held as this device's shard and gathered in each
  step (``chunk_inputs``) or, ``gathered``, enters whole; the backward passes scatter its
  cotangent back to the shard in the step, into a shard-sized accumulator (``_shards``).

Invariant: a chunk's body evaluates exactly the split's body equations on that chunk's rows,
so every output position is computed once, from the same values as unchunked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpr_accum import _compat, _stream
from jaxpr_accum._analysis._split import BODY, Split
from jaxpr_accum._base._dtypes import accumulator_dtype, has_float_dtype
from jaxpr_accum._build import _shards
from jaxpr_accum._build._cells import Chunk, cells, eval_body, split_body
from jaxpr_accum._build._signature import Inputs, Outputs, Signature
from jaxpr_accum._build._stack import stacked_outputs
from jaxpr_accum._compat import Array
from jaxpr_accum._engine._resize import shifted, take_chunk


class ChunkOut(NamedTuple):
    """One chunk's results (``parts``, ``stabs``: the streamed terms' coefficients, stabilisers)."""

    sums: list
    partials: list
    stacked: list
    parts: list
    stabs: list


def add_into(acc: list[Array], xs: Sequence[Array]) -> list[Array]:
    """Each of ``xs`` (one chunk's parts) into its accumulator: under ``checkify``, a NaN
    made here is reported as made by the reduction the sum stands for."""
    with _compat.accumulated():
        return [a + x.astype(a.dtype) for a, x in zip(acc, xs, strict=True)]


def wanted(values: Sequence, perturbed: Sequence[bool] | None) -> list[int]:
    """Indices of the floats of ``values`` that the caller perturbs (all when not known)."""
    flags = [True] * len(values) if perturbed is None else perturbed
    return [i for i, x in enumerate(values) if has_float_dtype(x) and flags[i]]


class ChunkLoop:
    """The chunked region on one device: ``size`` positions from global position ``offset``;
    ``shards``: invariant inputs' placements (``gathered``: gathered before the loop),
    ``batch_axes``: the axis's mesh axes."""

    def __init__(
        self,
        split: Split,
        signature: Signature,
        accum_dtype: np.dtype | None,
        *,
        size: int,
        chunk: int,
        offset: Array | int,
        shards: Sequence[_shards.Placement | None],
        batch_axes: tuple[str, ...] = (),
        gathered: bool = False,
    ):
        self.split, self.signature, self.accum_dtype = split, signature, accum_dtype
        self.size, self.chunk, self.offset = size, chunk, offset
        self.shards, self.batch_axes, self.gathered = list(shards), batch_axes, gathered
        self.body_indices = split.indices(BODY)
        self.chunk_locs, self.terms = signature.chunk_locs, signature.streams.terms
        self.stacked_locs = [loc for _, loc in signature.stacked]
        self.n_full, self.rem = divmod(size, chunk)
        self.cells = cells(split.analysis, offset, size, chunk)
        self.parts = split_body(split, signature, self.body_indices, self.cells)

    # -- one chunk ------------------------------------------------------------------------
    def body(self, k: int, start: Array | int, inputs: Inputs) -> ChunkOut:
        """The region's equations on chunk ``[start, start + k)`` (``inputs.chunked`` holds
        the chunk's slices), in the cell of the row maps that holds it (``_cells``)."""
        sig, split = self.signature, self.split
        env = dict(zip((v for v, _ in sig.chunked), inputs.chunked, strict=True))
        invariants = dict(zip(sig.invariants, inputs.invariants, strict=True))
        # values reduced over the whole axis are deferred for streamed equations (``_stream``)
        known = env.keys() | invariants.keys()
        env.update((v, _stream.DEFERRED) for v in split.deferred if v not in known)
        with _compat.chunk_scope():  # where ``checkify``'s clock of the chunk restarts
            return eval_body(
                split,
                Chunk(k, shifted(start, self.offset), self.cells),
                self.parts,
                env,
                invariants=invariants,
                streamed=_stream.emitter(split.deferred),
                finish=self.chunk_out,
            )

    def chunk_out(self, env: dict) -> ChunkOut:
        sig, split = self.signature, self.split
        terms = [t for sink in split.sinks for t in env[sink.var].terms]
        return ChunkOut(
            [env[v] for v in sig.sums],
            [env[v] for v, _ in sig.partials],
            [env[v] for v, _ in sig.stacked],
            [t.coef for t in terms],
            [t.stab for t in terms],
        )

    def slices(self, chunked: Sequence[Array | None], start: Array | int, k: int) -> list:
        """The chunk at ``start`` of length ``k`` of each chunked input (None stays None)."""
        return [
            None if x is None else take_chunk(x, loc, start, k)
            for x, loc in zip(chunked, self.chunk_locs, strict=True)
        ]

    def scatter(self, cts: Sequence, indices: Sequence[int], lead: int = 0) -> list:
        """The cotangents of the whole invariant inputs at ``indices``, back to the shards."""
        return _shards.scatter_all(cts, [self.shards[i] for i in indices], self.batch_axes, lead)

    def chunk_inputs(self, inputs: Inputs, start: Array | int, k: int) -> Inputs:
        invariants = _shards.gather_all(inputs.invariants, self.shards, start, self.gathered)
        return Inputs(invariants, self.slices(inputs.chunked, start, k))

    def over_chunks(
        self, step: Callable, carry: object, xs: object = (), reads: object = ()
    ) -> tuple:
        """Run ``step(carry, k, start, x) -> (carry, y)`` over every chunk of this shard.

        The full chunks run in a ``lax.scan`` (``x``: ``xs``'s leaves indexed by the chunk),
        the remainder once more at its own length. Returns ``(carry, ys of the full chunks or
        None, y of the remainder or None)``. ``reads``: the arrays ``step`` closes over (where
        vary over manual axes or are sharded over ``Explicit`` ones, the carry starts typed as
        its updates, ``typed_carry``).
        """
        k, n = self.chunk, self.n_full
        if _compat.typed(carry, xs, reads):
            x0, kk = jax.tree_util.tree_map(lambda a: a[0], xs), k if n else self.rem
            carry = _compat.typed_carry(lambda c: step(c, kk, jnp.int32(0), x0)[0], carry)
        scanned: object = None
        rest: object = None
        if n:

            def scan_step(c: object, index_and_x: tuple) -> tuple:
                index, x = index_and_x
                return step(c, k, index * k, x)

            head = jax.tree_util.tree_map(lambda a: a[:n], xs)
            carry, scanned = lax.scan(scan_step, carry, (jnp.arange(n), head))
        if self.rem:
            x = jax.tree_util.tree_map(lambda a: a[n], xs)
            carry, rest = step(carry, self.rem, n * k, x)
        return carry, scanned, rest

    # -- accumulators --------------------------------------------------------------------
    def zero_sums(self) -> list:
        return [
            jnp.zeros(_compat.shape_of(v), accumulator_dtype(_compat.dtype_of(v), None))
            for v in self.signature.sums
        ]

    def zero_streams(self) -> tuple[list, list]:
        """Accumulators of the streamed terms, and their running stabilisers (``-inf``)."""
        accs, stabs = [], []
        for sink, factor in self.terms:
            dtype = accumulator_dtype(_compat.dtype_of(sink.var), None)
            accs.append(jnp.zeros(sink.shape, dtype))
            compact = [sink.shape[d] for d in factor.where] if factor is not None else None
            stabs.append(None if compact is None else jnp.full(compact, -jnp.inf, dtype))
        return accs, stabs

    def add_streams(self, carry: tuple, parts: Sequence, stabs: Sequence) -> tuple:
        out = [
            _stream.accumulate(acc, s_run, part, s_chunk, factor)
            for acc, s_run, part, s_chunk, (_, factor) in zip(
                *carry, parts, stabs, self.terms, strict=True
            )
        ]
        return [a for a, _ in out], [s for _, s in out]

    # -- forward -------------------------------------------------------------------------
    def forward(self, inputs: Inputs, checkpoint: bool = False) -> Outputs:
        """The region's outputs on this shard (sums in their accumulator dtypes)."""

        def one(kk: int, start: Array | int, inputs: Inputs) -> ChunkOut:
            return self.body(kk, start, self.chunk_inputs(inputs, start, kk))

        if checkpoint:
            one = jax.checkpoint(one, static_argnums=(0,))

        def step(carry: tuple, kk: int, start: Array | int, _: object) -> tuple:
            out = one(kk, start, inputs)
            sums = add_into(carry[0], out.sums)
            streams = self.add_streams(carry[1], out.parts, out.stabs)
            return (sums, streams), (out.partials, out.stacked)

        (sums, (accs, stabs)), scanned, rest = self.over_chunks(
            step, (self.zero_sums(), self.zero_streams()), reads=inputs
        )
        n_partials = len(self.signature.partials)
        partials, stacked = stacked_outputs(scanned, rest, n_partials, self.stacked_locs)
        return Outputs(sums, partials, stacked, accs, self.signature.streams.exp_only(stabs))

    def differentiable(self, chunk: Inputs, k: int, start: Array | int, needed: Inputs) -> tuple:
        """``(f, primals)``: the chunk as a function of its inputs at indices ``needed``, those."""

        def f(d_inv: list, d_ch: list) -> ChunkOut:
            inv, ch = list(chunk.invariants), list(chunk.chunked)
            for i, x in zip(needed.invariants, d_inv, strict=True):
                inv[i] = x
            for i, x in zip(needed.chunked, d_ch, strict=True):
                ch[i] = x
            return self.body(k, start, Inputs(inv, ch))

        primals = (
            [chunk.invariants[i] for i in needed.invariants],
            [chunk.chunked[i] for i in needed.chunked],
        )
        return f, primals

    def tangents(self, inputs: Inputs, tangents: Inputs, finals: Sequence) -> Outputs:
        """Forward mode on this shard: the tangents of the region's differentiable outputs
        (``Outputs`` without finals) for ``tangents`` of the inputs (None: no tangent).
        ``finals``: the streamed terms' final stabilisers, one per term (None without
        ``Exp``), which rescale each chunk's tangent as they rescale its value."""
        needed = Inputs(
            [i for i, t in enumerate(tangents.invariants) if t is not None],
            [i for i, t in enumerate(tangents.chunked) if t is not None],
        )
        flags = self.signature.differentiable()

        def step(carry: tuple, kk: int, start: Array | int, _: object) -> tuple:
            chunk = self.chunk_inputs(inputs, start, kk)
            f, primals = self.differentiable(chunk, kk, start, needed)
            t_ch = self.slices(tangents.chunked, start, kk)
            t_inv = _shards.gather_all(tangents.invariants, self.shards, start, self.gathered)
            dots = ([t_inv[i] for i in needed.invariants], [t_ch[i] for i in needed.chunked])
            out, dout = jax.jvp(f, primals, dots)
            parts = [
                _stream.chunk_cotangent(t, s, s_final, factor)
                for t, s, s_final, (_, factor) in zip(
                    dout.parts, out.stabs, finals, self.terms, strict=True
                )
            ]
            sums = [s for s, f in zip(dout.sums, flags.sums, strict=True) if f]
            return (add_into(carry[0], sums), add_into(carry[1], parts)), (
                [p for p, f in zip(dout.partials, flags.partials, strict=True) if f],
                [s for s, f in zip(dout.stacked, flags.stacked, strict=True) if f],
            )

        zero_sums = [z for z, f in zip(self.zero_sums(), flags.sums, strict=True) if f]
        (sums, accs), scanned, rest = self.over_chunks(
            step, (zero_sums, self.zero_streams()[0]), reads=(inputs, tangents, finals)
        )
        locs = [loc for loc, f in zip(self.stacked_locs, flags.stacked, strict=True) if f]
        partials, stacked = stacked_outputs(scanned, rest, sum(flags.partials), locs)
        return Outputs(sums, partials, stacked, accs, [])
