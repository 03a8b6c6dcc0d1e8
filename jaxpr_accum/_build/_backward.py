"""The remat backward pass on one device: each chunk recomputed under ``jax.vjp`` and pulled
back with its share of the output cotangents.

Cotangents of invariant inputs are accumulated in the loop's carry (in ``accum_dtype``:
float32 for 16-bit floats by default); those of chunked inputs are stacked chunk by chunk
(or, for inputs chunked along a later dimension, written in place into one input-sized
buffer, which avoids a transpose). A chunk's share of an output cotangent is: the whole
cotangent for a sum, its own entry for a per-chunk partial, its rows for a stacked output,
and for a streamed term the accumulator's cotangent rescaled by ``exp(s_chunk - s_final)``.

A sharded invariant input is gathered whole in each chunk (or once before the loop) and
pulled back whole; its cotangent is brought back to the device's shard in the step
(``ChunkLoop.scatter``), so its accumulator is shard-sized (``_shards.held``).

Outputs whose cotangent is zero (None) are not differentiated at all: a pullback fed zeros
can still make NaNs (a max whose recomputed location test fails). Invariant: the cotangent of
each input is the sum over chunks of the chunk's pullback, which is the unchunked pullback
because every position is computed by exactly one chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxpr_accum import (
    _compat,
    _stream,
)
from jaxpr_accum._base._dtypes import accumulator_dtype
from jaxpr_accum._build import _shards
from jaxpr_accum._build._loop import ChunkLoop, add_into, wanted
from jaxpr_accum._build._signature import Inputs, Outputs
from jaxpr_accum._build._stack import join
from jaxpr_accum._compat import Array
from jaxpr_accum._engine._conv import canonicalize
from jaxpr_accum._engine._resize import scaled, take_chunk


def _present(cts: Outputs, flags: Outputs) -> list[tuple[int, int]]:
    """``(group, index)`` of every differentiable output whose cotangent is not zero."""
    return [
        (g, j)
        for g, (group, group_flags) in enumerate(zip(cts[:4], flags[:4], strict=True))
        for j, (ct, flag) in enumerate(zip(group, group_flags, strict=True))
        if flag and ct is not None
    ]


def backward(
    loop: ChunkLoop, inputs: Inputs, cts: Outputs, finals: Sequence, perturbed: Inputs
) -> Inputs:
    """Cotangents of this shard's inputs (invariant ones in their accumulator dtype), None
    for those not differentiated.

    ``cts``: cotangents of the outputs (None: zero; partials one per chunk of this shard);
    ``finals``: the streamed terms' final stabilisers, one per term (None without ``Exp``);
    ``perturbed``: per input, whether the caller differentiates it.
    """
    diff = Inputs(
        wanted(inputs.invariants, perturbed.invariants), wanted(inputs.chunked, perturbed.chunked)
    )
    pull = _Pullback(loop, inputs, cts, finals, diff)
    acc = [
        jnp.zeros(
            _shards.held(inputs.invariants[i], loop.shards[i], loop.gathered),
            accumulator_dtype(inputs.invariants[i].dtype, loop.accum_dtype),
        )
        for i in diff.invariants
    ]
    # Cotangents of inputs chunked along a later dimension are written in place: stacked,
    # they would need a transpose (a second input-sized buffer) to be put back in order.
    in_place = [j for j, i in enumerate(diff.chunked) if loop.chunk_locs[i].dim != 0]
    buffers = [jnp.zeros_like(inputs.chunked[diff.chunked[j]]) for j in in_place]

    def step(carry: tuple, kk: int, start: Array | int, ct_partials: list) -> tuple:
        acc, buffers = carry
        d_inv, d_ch = pull(kk, start, ct_partials)
        buffers = [
            lax.dynamic_update_slice_in_dim(
                buf,
                d_ch[j].astype(buf.dtype),
                scaled(start, loop.chunk_locs[diff.chunked[j]].inner),
                loop.chunk_locs[diff.chunked[j]].dim,
            )
            for buf, j in zip(buffers, in_place, strict=True)
        ]
        stacked = [x for j, x in enumerate(d_ch) if j not in in_place]
        return (add_into(acc, d_inv), buffers), stacked

    (acc, buffers), scanned, rest = loop.over_chunks(
        step, (acc, buffers), list(cts.partials), reads=(inputs, cts, finals)
    )
    ct_inv: list = [None] * len(inputs.invariants)
    for i, a in zip(diff.invariants, acc, strict=True):
        ct_inv[i] = a
    ct_ch: list = [None] * len(inputs.chunked)
    stacked = iter(range(len(diff.chunked) - len(in_place)))
    for j, i in enumerate(diff.chunked):
        if j in in_place:
            ct_ch[i] = buffers[in_place.index(j)]
            continue
        n = next(stacked)
        ct_ch[i] = join(
            None if scanned is None else scanned[n],
            None if rest is None else rest[n],
            loop.chunk_locs[i],
        )
    return Inputs(ct_inv, ct_ch)


class _Pullback:
    """One chunk recomputed under ``jax.vjp`` and pulled back with its share of the output
    cotangents: ``(cotangents of the differentiated invariant inputs, of the chunked ones)``."""

    def __init__(
        self, loop: ChunkLoop, inputs: Inputs, cts: Outputs, finals: Sequence, diff: Inputs
    ):
        self.loop, self.inputs, self.cts, self.finals, self.diff = loop, inputs, cts, finals, diff
        self.present = _present(cts, loop.signature.differentiable())

    def __call__(self, kk: int, start: Array | int, ct_partials: list) -> tuple:
        loop, cts, present = self.loop, self.cts, self.present
        chunk = loop.chunk_inputs(self.inputs, start, kk)
        f, primals = loop.differentiable(chunk, kk, start, self.diff)

        def picked(a: list, b: list) -> tuple:
            out = f(a, b)
            return [out[g][j] for g, j in present], out.stabs

        with _compat.recomputed():  # under ``checkify``: checks the original's forward makes
            _, pullback, stabs = jax.vjp(picked, *primals, has_aux=True)  # type: ignore[var-annotated]
        ct_stacked = [
            None if ct is None else take_chunk(ct, loc, start, kk)
            for ct, loc in zip(cts.stacked, loop.stacked_locs, strict=True)
        ]
        groups = (cts.sums, ct_partials, ct_stacked, self.stream_shares(stabs))
        d_inv, d_ch = canonicalize(pullback, loop.split.may_convolve)(
            [groups[g][j] for g, j in present]
        )
        return loop.scatter(d_inv, self.diff.invariants), d_ch

    def stream_shares(self, stabs: Sequence) -> list:
        """Each streamed term's share: the accumulator's cotangent rescaled by
        ``exp(s_chunk - s_final)``, in the dtype of the term's sink."""
        return [
            None
            if ct is None
            else _stream.chunk_cotangent(ct, s, s_final, factor).astype(_compat.dtype_of(sink.var))
            for ct, s, s_final, (sink, factor) in zip(
                self.cts.streams, stabs, self.finals, self.loop.terms, strict=True
            )
        ]
