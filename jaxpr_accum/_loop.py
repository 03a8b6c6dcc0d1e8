"""The chunk loop on one device: one chunk's body, and the loops of each gradient pass.

``Region`` maps ``(invariants, chunked)`` to ``(sums, partials, stacked)`` for ``size``
positions starting at global position ``offset`` (the whole axis on one device; a shard of
it under ``shard_map``). Chunk ``c`` covers positions ``[c*k, (c+1)*k)``: ``size // k`` full
chunks run in a ``lax.scan`` and the remainder runs once more through the same body at its own
length (no padding). Every chunked input is sliced with ``dynamic_slice`` at its axis position.

- ``forward``: sums carried (16-bit floats in float32), other monoid partials stacked per
  chunk (combined after the region, so JAX differentiates the combination), axis-carrying
  outputs stacked and put back in order;
- ``backward`` (remat): each chunk recomputed under ``jax.vjp`` and pulled back with its slice
  of the output cotangents; cotangents of invariant inputs accumulated in the carry (in
  ``accum_dtype``), those of chunked inputs stacked;

Invariant: a chunk's body evaluates exactly the split's body equations on that chunk's rows,
so every output position is computed once, from the same values as unchunked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxpr_accum import _stream
from jaxpr_accum._conv import canonicalize
from jaxpr_accum._lattice import AxisLoc
from jaxpr_accum._plan import BODY, Split
from jaxpr_accum._resize import Resizer, scaled, shifted, take_chunk


def is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def accumulator_dtype(dtype: Any, accum_dtype: Any) -> Any:
    if accum_dtype is not None:
        return jnp.dtype(accum_dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)


def unstack(ys: Any, loc: AxisLoc) -> Any:
    """``[n, ..., k*m at loc.dim, ...]`` -> ``[..., n*k*m, ...]`` in chunk order."""
    moved = jnp.moveaxis(ys, 0, loc.dim)
    shape = list(moved.shape)
    shape[loc.dim : loc.dim + 2] = [shape[loc.dim] * shape[loc.dim + 1]]
    return moved.reshape(shape)


def join(full: Any, rest: Any, loc: AxisLoc) -> Any:
    """Put the scanned chunks (``full``: stacked ys, or None) and the remainder back in order."""
    parts = ([] if full is None else [unstack(full, loc)]) + ([] if rest is None else [rest])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=loc.dim)


def add_into(acc: list, xs: Sequence) -> list:
    return [a + x.astype(a.dtype) for a, x in zip(acc, xs, strict=True)]


def stream_terms(split: Split) -> list[tuple[_stream.Sink, _stream.Exp | None]]:
    """``(sink, Exp factor or None)`` of every term of the streamed sums, in order."""
    return [(sink, t.exp) for sink in split.sinks for t in sink.terms]


def pack_streams(split: Split, accs: Sequence, stabilisers: Sequence) -> list:
    """The region's streamed outputs: every term's accumulator, then the final stabiliser of
    each ``Exp`` term (``stabilisers`` has one entry per term, None where it has no ``Exp``)."""
    return [*accs, *(s for s, (_, f) in zip(stabilisers, stream_terms(split), strict=True) if f)]


def unpack_streams(split: Split, streams: Sequence) -> tuple[list, list]:
    """``(accumulators, stabilisers)`` per term, from ``pack_streams``'s layout."""
    terms = stream_terms(split)
    finals = iter(streams[len(terms) :])
    return list(streams[: len(terms)]), [None if f is None else next(finals) for _, f in terms]


def float_outputs(split: Split, per_chunk: bool = False) -> tuple:
    """Which outputs are differentiable, by group: sums, partials, stacked, and the streamed
    sums' terms: a chunk's parts (``per_chunk``), or the region's accumulators followed by
    their final stabilisers (constants)."""

    def flags(vs: Any) -> list[bool]:
        return [jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in vs]

    terms = stream_terms(split)
    streams = [True] * len(terms)
    if not per_chunk:
        streams += [False for _, f in terms if f is not None]
    return (
        flags(split.sums),
        flags(v for v, _ in split.partials),
        flags(v for v, _ in split.stacked),
        streams,
    )


def pick(groups: Sequence, flags: Sequence) -> list:
    """The entries of ``groups`` (lists) whose flag in ``flags`` (parallel lists) is set."""
    return [
        x
        for group, group_flags in zip(groups, flags, strict=True)
        for x, flag in zip(group, group_flags, strict=True)
        if flag
    ]


def differentiated(values: Sequence, perturbed: Sequence[bool] | None) -> list[int]:
    """Indices of ``values`` to differentiate: floats that the caller perturbs (all floats
    when that is not known)."""
    return [i for i, x in enumerate(values) if is_float(x) and (perturbed is None or perturbed[i])]


Needed = tuple[Sequence[bool], Sequence[bool]] | None  # inputs to differentiate, per group


class ChunkLoop:
    """The chunked region on one device: ``size`` positions from global position ``offset``."""

    def __init__(
        self,
        split: Split,
        accum_dtype: Any,
        size: int,
        chunk: int,
        offset: Any,
        needed: Needed = None,
    ):
        self.split, self.accum_dtype, self.needed = split, accum_dtype, needed
        self.size, self.chunk, self.offset = size, chunk, offset
        self.body_indices = split.indices(BODY)
        self.chunk_locs = [loc for _, loc in split.chunked]
        self.stacked_locs = [loc for _, loc in split.stacked]
        self.n_full, self.rem = divmod(size, chunk)
        self.out_float = float_outputs(split, per_chunk=True)
        self.terms = stream_terms(split)

    # -- one chunk ------------------------------------------------------------------------
    def body(self, k: int, start: Any, invariants: Sequence, chunks: Sequence) -> tuple:
        """``((sums, partials, stacked, parts), stabilisers)`` of one chunk: ``parts`` are the
        streamed sums' terms (``_stream``), with the stabilisers of their ``Exp`` factors."""
        split = self.split
        env: dict = dict(zip(split.invariants, invariants, strict=True))
        env.update(zip((v for v, _ in split.chunked), chunks, strict=True))
        env.update((v, _stream.DEFERRED) for v in split.deferred)
        resizer = Resizer(split.analysis, k, shifted(start, self.offset))
        streamed = split.streamed

        def special(idx: int) -> Any:
            return _stream.emit if idx in streamed else None

        resizer.eval_eqns((), split.jaxpr.eqns, env, self.body_indices, special)
        terms = [t for sink in split.sinks for t in env[sink.var].terms]
        outputs = (
            [env[v] for v in split.sums],
            [env[v] for v, _ in split.partials],
            [env[v] for v, _ in split.stacked],
            [t.coef for t in terms],
        )
        return outputs, [t.stab for t in terms]

    def slices(self, chunked: Sequence, start: Any, k: int) -> list:
        return [
            take_chunk(x, loc, start, k) for x, loc in zip(chunked, self.chunk_locs, strict=True)
        ]

    def over_chunks(self, step: Callable, carry: Any, per_chunk: Any = ()) -> tuple:
        """Run ``step(carry, k, start, x) -> (carry, y)`` over every chunk of this shard.

        The full chunks run in a ``lax.scan`` (``x``: ``per_chunk``'s leaves indexed by the
        chunk), the remainder once more at its own length. Returns ``(carry, ys of the full
        chunks or None, y of the remainder or None)``.
        """
        k, n = self.chunk, self.n_full
        scanned = rest = None
        if n:

            def scan_step(c: Any, index_and_x: tuple) -> tuple:
                index, x = index_and_x
                return step(c, k, index * k, x)

            head = jax.tree_util.tree_map(lambda a: a[:n], per_chunk)
            carry, scanned = lax.scan(scan_step, carry, (jnp.arange(n), head))
        if self.rem:
            x = jax.tree_util.tree_map(lambda a: a[n], per_chunk)
            carry, rest = step(carry, self.rem, n * k, x)
        return carry, scanned, rest

    def wanted(self, values: Sequence, group: int) -> list[int]:
        """Indices of the inputs (``group`` 0: invariant, 1: chunked) to differentiate."""
        return differentiated(values, None if self.needed is None else self.needed[group])

    def differentiable(self, invariants: Sequence, chunk: Sequence, k: int, start: Any) -> tuple:
        """``(f, primals, diff_inv, diff_ch)``: the chunk as a function of its wanted inputs."""
        diff_inv, diff_ch = self.wanted(invariants, 0), self.wanted(chunk, 1)

        def f(d_inv: list, d_ch: list) -> tuple:
            inv, ch = list(invariants), list(chunk)
            for i, x in zip(diff_inv, d_inv, strict=True):
                inv[i] = x
            for i, x in zip(diff_ch, d_ch, strict=True):
                ch[i] = x
            return self.body(k, start, inv, ch)

        primals = ([invariants[i] for i in diff_inv], [chunk[i] for i in diff_ch])
        return f, primals, diff_inv, diff_ch

    def zero_sums(self) -> list:
        return [
            jnp.zeros(v.aval.shape, accumulator_dtype(v.aval.dtype, None)) for v in self.split.sums
        ]

    def zero_streams(self) -> tuple[list, list]:
        """Accumulators of the streamed terms, and their running stabilisers (``-inf``)."""
        accs, stabs = [], []
        for sink, factor in self.terms:
            dtype = accumulator_dtype(sink.var.aval.dtype, None)
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
    def forward(self, invariants: Sequence, chunked: Sequence, checkpoint: bool = False) -> tuple:
        def one(kk: int, start: Any, inv: Sequence, ch: Sequence) -> tuple:
            return self.body(kk, start, inv, self.slices(ch, start, kk))

        if checkpoint:
            one = jax.checkpoint(one, static_argnums=(0,))

        def step(carry: tuple, kk: int, start: Any, _: Any) -> tuple:
            (s, p, st, parts), stabs = one(kk, start, invariants, chunked)
            return (add_into(carry[0], s), self.add_streams(carry[1], parts, stabs)), (p, st)

        (sums, streams), scanned, rest = self.over_chunks(
            step, (self.zero_sums(), self.zero_streams())
        )
        accs, stabs = streams
        return (*self.assemble(sums, scanned, rest), pack_streams(self.split, accs, stabs))

    def assemble(self, sums: list, scanned: Any, rest: Any) -> tuple:
        split = self.split
        partials = []  # per chunk, stacked: combined outside the region so JAX differentiates it
        for i in range(len(split.partials)):
            parts = ([] if scanned is None else [scanned[0][i]]) + (
                [] if rest is None else [rest[0][i][None]]
            )
            partials.append(jnp.concatenate(parts, axis=0))
        stacked = [
            join(
                None if scanned is None else scanned[1][i],
                None if rest is None else rest[1][i],
                loc,
            )
            for i, loc in enumerate(self.stacked_locs)
        ]
        return sums, partials, stacked

    # -- remat backward ------------------------------------------------------------------
    def backward(
        self, invariants: Sequence, chunked: Sequence, cts: tuple, finals: Sequence = ()
    ) -> tuple:
        """Cotangents ``(invariants [accum dtype or None], chunked [or None])`` of this shard.

        ``cts`` holds the cotangents of the float outputs (None for the others); partials'
        cotangents are per chunk of this shard. ``finals``: the streamed terms' final
        stabilisers (one per term, None without ``Exp``), which rescale their cotangents.
        """
        ct_sums, ct_partials, ct_stacked, ct_streams = cts
        ct_accs, _ = unpack_streams(self.split, ct_streams)

        def pull(kk: int, start: Any, ct_p: list) -> tuple:
            chunk = self.slices(chunked, start, kk)
            f, primals, _, _ = self.differentiable(invariants, chunk, kk, start)
            ct_st = [
                None if ct is None else take_chunk(ct, loc, start, kk)
                for ct, loc in zip(ct_stacked, self.stacked_locs, strict=True)
            ]
            # Outputs with a zero cotangent (None) are not differentiated at all: a pullback
            # fed zeros can still make NaNs (a max whose recomputed location test fails).
            present = pick((ct_sums, ct_p, ct_st, ct_accs), self.out_float)
            keep = [i for i, ct in enumerate(present) if ct is not None]

            def picked(a: list, b: list) -> tuple:
                outputs, stabs = f(a, b)
                flat = pick(outputs, self.out_float)
                return [flat[i] for i in keep], stabs

            _, pullback, stabs = jax.vjp(picked, *primals, has_aux=True)
            ct_parts = [
                None
                if ct is None
                else _stream.chunk_cotangent(ct, s, s_final, factor).astype(sink.var.aval.dtype)
                for ct, s, s_final, (sink, factor) in zip(
                    ct_accs, stabs, finals, self.terms, strict=True
                )
            ]
            cts = pick((ct_sums, ct_p, ct_st, ct_parts), self.out_float)
            return canonicalize(pullback)([cts[i] for i in keep])

        diff_inv, diff_ch = self.wanted(invariants, 0), self.wanted(chunked, 1)
        acc = [
            jnp.zeros(invariants[i].shape, accumulator_dtype(invariants[i].dtype, self.accum_dtype))
            for i in diff_inv
        ]

        # Cotangents of inputs chunked along a later dimension are written in place: stacked,
        # they would need a transpose (a second input-sized buffer) to be put back in order.
        in_place = [j for j, i in enumerate(diff_ch) if self.chunk_locs[i].dim != 0]
        buffers = [jnp.zeros_like(chunked[diff_ch[j]]) for j in in_place]

        def step(carry: tuple, kk: int, start: Any, ct_p: list) -> tuple:
            acc, buffers = carry
            d_inv, d_ch = pull(kk, start, ct_p)
            buffers = [
                lax.dynamic_update_slice_in_dim(
                    buf,
                    d_ch[j].astype(buf.dtype),
                    scaled(start, self.chunk_locs[diff_ch[j]].inner),
                    self.chunk_locs[diff_ch[j]].dim,
                )
                for buf, j in zip(buffers, in_place, strict=True)
            ]
            return (add_into(acc, d_inv), buffers), [
                x for j, x in enumerate(d_ch) if j not in in_place
            ]

        (acc, buffers), scanned, rest = self.over_chunks(step, (acc, buffers), list(ct_partials))

        ct_inv: list = [None] * len(invariants)
        for i, a in zip(diff_inv, acc, strict=True):
            ct_inv[i] = a
        ct_ch: list = [None] * len(chunked)
        stacked = iter(range(len(diff_ch) - len(in_place)))
        for j, i in enumerate(diff_ch):
            if j in in_place:
                ct_ch[i] = buffers[in_place.index(j)]
                continue
            n = next(stacked)
            ct_ch[i] = join(
                None if scanned is None else scanned[n],
                None if rest is None else rest[n],
                self.chunk_locs[i],
            )
        return ct_inv, ct_ch
