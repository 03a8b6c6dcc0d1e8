"""Building the chunked program from a plan.

``build(plan, grad, accum_dtype)`` returns ``run(*flat_inputs) -> flat_outputs``: the
prologue, then the *region*, then the epilogue, all evaluated under the caller's trace.

The region maps ``(invariants, chunked)`` to ``(sums, partials, stacked)``. Chunk ``c``
covers axis positions ``[c*k, (c+1)*k)``: ``N // k`` full chunks in a ``lax.scan`` and one
more call of the same body at the remainder length (no padding), every chunked input
sliced with ``dynamic_slice`` at its axis position. Sums are carried (16-bit floats in
float32); other monoid partials and axis-carrying outputs are stacked and put back in order.

Gradient modes:

- ``remat``: a ``jax.custom_vjp``. Its forward is the scan above and keeps nothing but its
  inputs. Its backward scans the chunks again: each chunk is recomputed under ``jax.vjp``
  and pulled back with its slice of the output cotangents; cotangents of invariant inputs
  are accumulated in the scan carry (in ``accum_dtype``), those of chunked inputs stacked.
- ``native``: the same scan with a ``jax.checkpoint``-ed body (slicing inside it, so only
  the chunk index is saved per step), differentiated by JAX itself: supports ``jvp`` and
  higher order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._compat import Literal
from jaxpr_accum._plan import BODY, EPILOGUE, PROLOGUE, RegionPlan
from jaxpr_accum._resize import Resizer
from jaxpr_accum._rules import AxisLoc

COMBINE: dict[str, Callable] = {
    "sum": lambda x: lax.reduce_sum(x, (0,)),
    "max": lambda x: lax.reduce_max(x, (0,)),
    "min": lambda x: lax.reduce_min(x, (0,)),
    "prod": lambda x: lax.reduce_prod(x, (0,)),
    "and": lambda x: lax.reduce_and(x, (0,)),
    "or": lambda x: lax.reduce_or(x, (0,)),
    "xor": lambda x: lax.reduce_xor(x, (0,)),
}


def is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def accumulator_dtype(dtype: Any, accum_dtype: Any) -> Any:
    if accum_dtype is not None:
        return jnp.dtype(accum_dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)


def take_chunk(x: Any, loc: AxisLoc, start: Any, k: int) -> Any:
    return lax.dynamic_slice_in_dim(x, start * loc.inner, k * loc.inner, axis=loc.dim)


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


class Region:
    """The chunked region of one plan: body evaluation, forward loop, gradient modes."""

    def __init__(self, plan: RegionPlan, accum_dtype: Any):
        self.plan = plan
        self.accum_dtype = accum_dtype
        self.body_indices = plan.indices(BODY)
        self.chunk_locs = [loc for _, loc in plan.chunked]
        self.stacked_locs = [loc for _, loc in plan.stacked]
        self.n_full, self.rem = divmod(plan.size, plan.chunk)

    # -- one chunk ------------------------------------------------------------------------
    def body(self, k: int, start: Any, invariants: Sequence, chunks: Sequence) -> tuple:
        plan = self.plan
        env: dict = dict(zip(plan.invariants, invariants, strict=True))
        env.update(zip((v for v, _ in plan.chunked), chunks, strict=True))
        Resizer(plan.analysis, k, start).eval_eqns((), plan.jaxpr.eqns, self.body_indices, env)
        return (
            [env[v] for v in plan.sums],
            [env[v] for v, _ in plan.partials],
            [env[v] for v, _ in plan.stacked],
        )

    def slices(self, chunked: Sequence, start: Any, k: int) -> list:
        return [
            take_chunk(x, loc, start, k) for x, loc in zip(chunked, self.chunk_locs, strict=True)
        ]

    def chunk_starts(self) -> list[tuple[int, int]]:
        """``(start, length)`` of the remainder call, if any."""
        return [(self.n_full * self.plan.chunk, self.rem)] if self.rem else []

    # -- forward -------------------------------------------------------------------------
    def forward(self, invariants: Sequence, chunked: Sequence, checkpoint: bool = False) -> tuple:
        k = self.plan.chunk

        def one(kk: int, start: Any, inv: Sequence, ch: Sequence) -> tuple:
            return self.body(kk, start, inv, self.slices(ch, start, kk))

        if checkpoint:
            one = jax.checkpoint(one, static_argnums=(0,))

        sums = [
            jnp.zeros(v.aval.shape, accumulator_dtype(v.aval.dtype, None)) for v in self.plan.sums
        ]
        scanned = None
        if self.n_full:

            def step(acc: list, c: Any) -> tuple:
                s, p, st = one(k, c * k, invariants, chunked)
                return [a + x.astype(a.dtype) for a, x in zip(acc, s, strict=True)], (p, st)

            sums, scanned = lax.scan(step, sums, jnp.arange(self.n_full))
        rest = None
        for start, length in self.chunk_starts():
            s, p, st = one(length, start, invariants, chunked)
            sums = [a + x.astype(a.dtype) for a, x in zip(sums, s, strict=True)]
            rest = (p, st)
        return self.assemble(sums, scanned, rest)

    def assemble(self, sums: list, scanned: Any, rest: Any) -> tuple:
        plan = self.plan
        sums = [a.astype(v.aval.dtype) for a, v in zip(sums, plan.sums, strict=True)]
        partials = []  # per chunk, stacked: combined outside the region so JAX differentiates it
        for i in range(len(plan.partials)):
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

    # -- remat: custom VJP ---------------------------------------------------------------
    def remat(self) -> Callable:
        @jax.custom_vjp
        def region(invariants: list, chunked: list) -> tuple:
            return self.forward(invariants, chunked)

        def fwd(invariants: list, chunked: list) -> tuple:
            return self.forward(invariants, chunked), (invariants, chunked)

        region.defvjp(fwd, self.backward)
        return region

    def backward(self, res: tuple, cts: tuple) -> tuple:
        invariants, chunked = res
        ct_sums, ct_partials, ct_stacked = cts
        plan, k = self.plan, self.plan.chunk
        diff_inv = [i for i, x in enumerate(invariants) if is_float(x)]
        diff_ch = [i for i, x in enumerate(chunked) if is_float(x)]
        out_float = (
            [is_float(a) for a in ct_sums],
            [jnp.issubdtype(v.aval.dtype, jnp.inexact) for v, _ in plan.partials],
            [jnp.issubdtype(v.aval.dtype, jnp.inexact) for v, _ in plan.stacked],
        )

        def pull(kk: int, start: Any, ct_p: list, ct_st: list) -> tuple:
            """Cotangents of the differentiable invariant inputs and chunk slices."""
            chunk = self.slices(chunked, start, kk)

            def f(d_inv: list, d_ch: list) -> list:
                inv, ch = list(invariants), list(chunk)
                for i, x in zip(diff_inv, d_inv, strict=True):
                    inv[i] = x
                for i, x in zip(diff_ch, d_ch, strict=True):
                    ch[i] = x
                outs = self.body(kk, start, inv, ch)
                return _pick(outs, out_float)

            _, pullback = jax.vjp(f, [invariants[i] for i in diff_inv], [chunk[i] for i in diff_ch])
            ct_all = (list(ct_sums), ct_p, ct_st)
            return pullback(_pick(ct_all, out_float))

        def ct_chunks(start: Any, kk: int) -> tuple:
            ct_st = [
                take_chunk(ct, loc, start, kk) if fl else None
                for ct, loc, fl in zip(ct_stacked, self.stacked_locs, out_float[2], strict=True)
            ]
            return ct_st

        acc = [
            jnp.zeros(invariants[i].shape, accumulator_dtype(invariants[i].dtype, self.accum_dtype))
            for i in diff_inv
        ]
        scanned = None
        if self.n_full:

            def step(acc: list, c_and_ctp: tuple) -> tuple:
                c, ct_p = c_and_ctp
                start = c * k
                d_inv, d_ch = pull(k, start, ct_p, ct_chunks(start, k))
                acc = [a + x.astype(a.dtype) for a, x in zip(acc, d_inv, strict=True)]
                return acc, d_ch

            ct_p_full = [
                ct[: self.n_full] if fl else None
                for ct, fl in zip(ct_partials, out_float[1], strict=True)
            ]
            acc, scanned = lax.scan(step, acc, (jnp.arange(self.n_full), ct_p_full))
        rest = None
        for start, length in self.chunk_starts():
            ct_p = [
                ct[self.n_full] if fl else None
                for ct, fl in zip(ct_partials, out_float[1], strict=True)
            ]
            d_inv, rest = pull(length, start, ct_p, ct_chunks(start, length))
            acc = [a + x.astype(a.dtype) for a, x in zip(acc, d_inv, strict=True)]

        ct_inv: list = [None] * len(invariants)
        for i, a in zip(diff_inv, acc, strict=True):
            ct_inv[i] = a.astype(invariants[i].dtype)
        ct_ch: list = [None] * len(chunked)
        for j, i in enumerate(diff_ch):
            loc = self.chunk_locs[i]
            ct_ch[i] = join(
                None if scanned is None else scanned[j], None if rest is None else rest[j], loc
            )
        return ct_inv, ct_ch

    # -- fused: value and per-chunk gradient in one pass --------------------------------
    def fused(self) -> Callable:
        plan, k = self.plan, self.plan.chunk
        float_sums = [
            i for i, v in enumerate(plan.sums) if jnp.issubdtype(v.aval.dtype, jnp.inexact)
        ]
        width = sum(math.prod(plan.sums[i].aval.shape) for i in float_sums)

        def chunk_jacobians(kk: int, start: Any, invariants: list, chunked: list) -> tuple:
            """This chunk's sums and the Jacobian rows of its float sums (one per entry)."""
            chunk = self.slices(chunked, start, kk)
            diff_inv = [i for i, x in enumerate(invariants) if is_float(x)]
            diff_ch = [i for i, x in enumerate(chunk) if is_float(x)]

            def f(d_inv: list, d_ch: list) -> tuple:
                inv, ch = list(invariants), list(chunk)
                for i, x in zip(diff_inv, d_inv, strict=True):
                    inv[i] = x
                for i, x in zip(diff_ch, d_ch, strict=True):
                    ch[i] = x
                sums = self.body(kk, start, inv, ch)[0]
                flat = jnp.concatenate([jnp.ravel(sums[i]).astype(jnp.float32) for i in float_sums])
                return flat, sums

            primals = ([invariants[i] for i in diff_inv], [chunk[i] for i in diff_ch])
            _, pullback, sums = jax.vjp(f, *primals, has_aux=True)
            if width == 1:
                d_inv, d_ch = pullback(jnp.ones((1,), jnp.float32))
                d_inv, d_ch = [x[None] for x in d_inv], [x[None] for x in d_ch]
            else:
                d_inv, d_ch = jax.vmap(pullback)(jnp.eye(width, dtype=jnp.float32))
            return sums, d_inv, d_ch, diff_inv, diff_ch

        def fwd(invariants: list, chunked: list) -> tuple:
            diff_inv = [i for i, x in enumerate(invariants) if is_float(x)]
            sums = [
                jnp.zeros(v.aval.shape, accumulator_dtype(v.aval.dtype, None)) for v in plan.sums
            ]
            jac = [
                jnp.zeros(
                    (width, *invariants[i].shape),
                    accumulator_dtype(invariants[i].dtype, self.accum_dtype),
                )
                for i in diff_inv
            ]

            def add(acc: list, xs: list) -> list:
                return [a + x.astype(a.dtype) for a, x in zip(acc, xs, strict=True)]

            scanned = None
            if self.n_full:

                def step(carry: tuple, c: Any) -> tuple:
                    s, d_inv, d_ch, _, _ = chunk_jacobians(k, c * k, invariants, chunked)
                    return (add(carry[0], s), add(carry[1], d_inv)), d_ch

                (sums, jac), scanned = lax.scan(step, (sums, jac), jnp.arange(self.n_full))
            rest = None
            for start, length in self.chunk_starts():
                s, d_inv, rest, _, _ = chunk_jacobians(length, start, invariants, chunked)
                sums, jac = add(sums, s), add(jac, d_inv)
            diff_ch = [i for i, x in enumerate(chunked) if is_float(x)]
            jac_ch = [
                join(
                    None if scanned is None else scanned[j],
                    None if rest is None else rest[j],
                    _shifted(self.chunk_locs[i]),
                )
                for j, i in enumerate(diff_ch)
            ]
            out = self.assemble(sums, None, None)
            return out, (invariants, chunked, jac, jac_ch)

        def bwd(res: tuple, cts: tuple) -> tuple:
            invariants, chunked, jac, jac_ch = res
            ct_sums = cts[0]
            weights = jnp.concatenate(
                [jnp.ravel(ct_sums[i]).astype(jnp.float32) for i in float_sums]
            )
            ct_inv: list = [None] * len(invariants)
            diff_inv = [i for i, x in enumerate(invariants) if is_float(x)]
            for i, j in zip(diff_inv, jac, strict=True):
                ct_inv[i] = jnp.tensordot(weights.astype(j.dtype), j, axes=1).astype(
                    invariants[i].dtype
                )
            ct_ch: list = [None] * len(chunked)
            diff_ch = [i for i, x in enumerate(chunked) if is_float(x)]
            for i, j in zip(diff_ch, jac_ch, strict=True):
                ct_ch[i] = jnp.tensordot(weights.astype(j.dtype), j, axes=1).astype(
                    chunked[i].dtype
                )
            return ct_inv, ct_ch

        @jax.custom_vjp
        def region(invariants: list, chunked: list) -> tuple:
            return self.forward(invariants, chunked)

        region.defvjp(fwd, bwd)
        return region

    # -- native: checkpointed scan, differentiated by JAX --------------------------------
    def native(self) -> Callable:
        def region(invariants: list, chunked: list) -> tuple:
            return self.forward(invariants, chunked, checkpoint=True)

        return region


def _shifted(loc: AxisLoc) -> AxisLoc:
    """The axis position once a leading (Jacobian row) dimension is added."""
    return AxisLoc(loc.dim + 1, loc.inner)


FUSED_MAX_WIDTH = 8


def fused_refusal(plan: RegionPlan) -> str | None:
    """Why the fused mode does not apply to ``plan``, or None if it does."""
    if plan.stacked or plan.partials:
        return "the region has outputs that are not sums (stacked values or max/min partials)"
    width = sum(
        math.prod(v.aval.shape) for v in plan.sums if jnp.issubdtype(v.aval.dtype, jnp.inexact)
    )
    if width == 0:
        return "the region has no floating-point sum to differentiate"
    if width > FUSED_MAX_WIDTH:
        return f"its sums have {width} entries (the fused mode takes at most {FUSED_MAX_WIDTH})"
    return None


def _pick(groups: Sequence, flags: Sequence) -> list:
    """The entries of ``groups`` (lists) whose flag in ``flags`` (parallel lists) is set."""
    return [
        x
        for group, group_flags in zip(groups, flags, strict=True)
        for x, flag in zip(group, group_flags, strict=True)
        if flag
    ]


def build(plan: RegionPlan, grad: str, accum_dtype: Any) -> Callable:
    """``run(*flat_inputs) -> flat outputs`` for the whole program."""
    region_obj = Region(plan, accum_dtype)
    region = {"native": region_obj.native, "fused": region_obj.fused, "remat": region_obj.remat}[
        grad
    ]()
    jaxpr = plan.jaxpr
    prologue, epilogue = plan.indices(PROLOGUE), plan.indices(EPILOGUE)

    def run(*flat_inputs: Any) -> list:
        env: dict = dict(zip(jaxpr.invars, flat_inputs, strict=True))
        _eval(jaxpr.eqns, prologue, env)
        inv = [env[v] for v in plan.invariants]
        ch = [env[v] for v, _ in plan.chunked]
        sums, partials, stacked = region(inv, ch)
        env.update(zip(plan.sums, sums, strict=True))
        for (v, kind), stacked_partials in zip(plan.partials, partials, strict=True):
            env[v] = COMBINE[kind](stacked_partials)
        env.update(zip((v for v, _ in plan.stacked), stacked, strict=True))
        _eval(jaxpr.eqns, epilogue, env)
        return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

    return run


def _eval(eqns: Sequence, indices: Sequence[int], env: dict) -> None:
    for idx in indices:
        eqn = eqns[idx]
        invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
        for v, x in zip(eqn.outvars, _compat.bind(eqn, invals), strict=True):
            env[v] = x
