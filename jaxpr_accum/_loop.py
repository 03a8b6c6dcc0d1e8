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
- ``jacobians`` (fused): each chunk's value and the Jacobian rows of its float sums.

Invariant: a chunk's body evaluates exactly the split's body equations on that chunk's rows,
so every output position is computed once, from the same values as unchunked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxpr_accum._compat import Literal
from jaxpr_accum._conv import canonicalize
from jaxpr_accum._lattice import AxisLoc
from jaxpr_accum._plan import BODY, Split
from jaxpr_accum._resize import Resizer, shifted, take_chunk


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


def float_outputs(split: Split) -> tuple[list[bool], list[bool], list[bool]]:
    def flags(vs: Any) -> list[bool]:
        return [jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in vs]

    return (
        flags(split.sums),
        flags(v for v, _ in split.partials),
        flags(v for v, _ in split.stacked),
    )


def pick(groups: Sequence, flags: Sequence) -> list:
    """The entries of ``groups`` (lists) whose flag in ``flags`` (parallel lists) is set."""
    return [
        x
        for group, group_flags in zip(groups, flags, strict=True)
        for x, flag in zip(group, group_flags, strict=True)
        if flag
    ]


def gradient_sums(split: Split) -> list[bool]:
    """Which of the region's sums carry gradients: computed from a floating input of the
    region through floating values only. A token count made from integer labels, or an
    accuracy (through ``argmax`` and a comparison), carries none."""

    def is_float(v: Any) -> bool:
        return jnp.issubdtype(v.aval.dtype, jnp.inexact)

    dependent = {v for v in [*split.invariants, *(v for v, _ in split.chunked)] if is_float(v)}
    for i in split.indices(BODY):
        eqn = split.jaxpr.eqns[i]
        if any(v in dependent for v in eqn.invars if not isinstance(v, Literal)):
            dependent.update(v for v in eqn.outvars if is_float(v))
    return [v in dependent for v in split.sums]


def jacobian_width(split: Split) -> int:
    """Entries of the sums whose Jacobian rows the fused mode keeps."""
    return sum(
        math.prod(v.aval.shape) for v, g in zip(split.sums, gradient_sums(split), strict=True) if g
    )


def jacobian_row_dtype(split: Split) -> Any:
    """The dtype of the fused Jacobian rows: the gradient-carrying sums' own, at least f32."""
    flags = gradient_sums(split)
    dtypes = [v.aval.dtype for v, f in zip(split.sums, flags, strict=True) if f]
    return jnp.result_type(jnp.float32, *dtypes)


def differentiated(values: Sequence, perturbed: Sequence[bool] | None) -> list[int]:
    """Indices of ``values`` to differentiate: floats that the caller perturbs (all floats
    when that is not known)."""
    return [i for i, x in enumerate(values) if is_float(x) and (perturbed is None or perturbed[i])]


def with_row_dim(loc: AxisLoc) -> AxisLoc:
    """The axis position once a leading (Jacobian row) dimension is added."""
    return AxisLoc(loc.dim + 1, loc.inner)


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
        self.out_float = float_outputs(split)

    # -- one chunk ------------------------------------------------------------------------
    def body(self, k: int, start: Any, invariants: Sequence, chunks: Sequence) -> tuple:
        split = self.split
        env: dict = dict(zip(split.invariants, invariants, strict=True))
        env.update(zip((v for v, _ in split.chunked), chunks, strict=True))
        resizer = Resizer(split.analysis, k, shifted(start, self.offset))
        resizer.eval_eqns((), split.jaxpr.eqns, env, self.body_indices)
        return (
            [env[v] for v in split.sums],
            [env[v] for v, _ in split.partials],
            [env[v] for v, _ in split.stacked],
        )

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

    # -- forward -------------------------------------------------------------------------
    def forward(self, invariants: Sequence, chunked: Sequence, checkpoint: bool = False) -> tuple:
        def one(kk: int, start: Any, inv: Sequence, ch: Sequence) -> tuple:
            return self.body(kk, start, inv, self.slices(ch, start, kk))

        if checkpoint:
            one = jax.checkpoint(one, static_argnums=(0,))

        def step(acc: list, kk: int, start: Any, _: Any) -> tuple:
            s, p, st = one(kk, start, invariants, chunked)
            return add_into(acc, s), (p, st)

        return self.assemble(*self.over_chunks(step, self.zero_sums()))

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
    def backward(self, invariants: Sequence, chunked: Sequence, cts: tuple) -> tuple:
        """Cotangents ``(invariants [accum dtype or None], chunked [or None])`` of this shard.

        ``cts`` holds the cotangents of the float outputs (None for the others); partials'
        cotangents are per chunk of this shard.
        """
        ct_sums, ct_partials, ct_stacked = cts

        def pull(kk: int, start: Any, ct_p: list) -> tuple:
            chunk = self.slices(chunked, start, kk)
            f, primals, _, _ = self.differentiable(invariants, chunk, kk, start)
            _, pullback = jax.vjp(lambda a, b: pick(f(a, b), self.out_float), *primals)
            pullback = canonicalize(pullback)
            ct_st = [
                None if ct is None else take_chunk(ct, loc, start, kk)
                for ct, loc in zip(ct_stacked, self.stacked_locs, strict=True)
            ]
            return pullback(pick((ct_sums, ct_p, ct_st), self.out_float))

        diff_inv, diff_ch = self.wanted(invariants, 0), self.wanted(chunked, 1)
        acc = [
            jnp.zeros(invariants[i].shape, accumulator_dtype(invariants[i].dtype, self.accum_dtype))
            for i in diff_inv
        ]

        def step(acc: list, kk: int, start: Any, ct_p: list) -> tuple:
            d_inv, d_ch = pull(kk, start, ct_p)
            return add_into(acc, d_inv), d_ch

        acc, scanned, rest = self.over_chunks(step, acc, list(ct_partials))

        ct_inv: list = [None] * len(invariants)
        for i, a in zip(diff_inv, acc, strict=True):
            ct_inv[i] = a
        ct_ch: list = [None] * len(chunked)
        for j, i in enumerate(diff_ch):
            ct_ch[i] = join(
                None if scanned is None else scanned[j],
                None if rest is None else rest[j],
                self.chunk_locs[i],
            )
        return ct_inv, ct_ch

    # -- fused forward -------------------------------------------------------------------
    def jacobians(self, invariants: Sequence, chunked: Sequence) -> tuple:
        """This shard's sums and the Jacobian rows of the float sums w.r.t. its inputs."""
        float_sums = [i for i, g in enumerate(gradient_sums(self.split)) if g]
        width = jacobian_width(self.split)
        row_dtype = jacobian_row_dtype(self.split)
        eye = jnp.eye(width, dtype=row_dtype)

        def rows(kk: int, start: Any) -> tuple:
            chunk = self.slices(chunked, start, kk)
            f, primals, _, _ = self.differentiable(invariants, chunk, kk, start)

            def flat(a: list, b: list) -> tuple:
                sums = f(a, b)[0]
                return jnp.concatenate(
                    [jnp.ravel(sums[i]).astype(row_dtype) for i in float_sums]
                ), sums

            _, pullback, sums = jax.vjp(flat, *primals, has_aux=True)
            if width == 1:  # no vmap: batching would make the convolutions non-canonical
                d_inv, d_ch = canonicalize(pullback)(eye[0])
                return sums, [x[None] for x in d_inv], [x[None] for x in d_ch]
            return (sums, *canonicalize(jax.vmap(pullback))(eye))

        diff_inv = self.wanted(invariants, 0)
        jac = [
            jnp.zeros(
                (width, *invariants[i].shape),
                accumulator_dtype(invariants[i].dtype, self.accum_dtype),
            )
            for i in diff_inv
        ]

        def step(carry: tuple, kk: int, start: Any, _: Any) -> tuple:
            s, d_inv, d_ch = rows(kk, start)
            return (add_into(carry[0], s), add_into(carry[1], d_inv)), d_ch

        (sums, jac), scanned, rest = self.over_chunks(step, (self.zero_sums(), jac))
        diff_ch = self.wanted(chunked, 1)
        jac_ch = [
            join(
                None if scanned is None else scanned[j],
                None if rest is None else rest[j],
                with_row_dim(self.chunk_locs[i]),
            )
            for j, i in enumerate(diff_ch)
        ]
        return sums, jac, jac_ch
