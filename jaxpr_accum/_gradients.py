"""Gradient strategies for the chunked region, and the choice among them.

- ``remat``: a ``jax.custom_vjp``. Its forward is the chunk loop and keeps nothing but its
  inputs; its backward runs the loop again, recomputing each chunk under ``jax.vjp``.
- ``fused``: when every output is a sum of a few entries, the forward computes each chunk's
  value *and* its Jacobian rows (one forward and one backward per chunk), adding them up; the
  backward only contracts them with the incoming cotangent. Exact only where the chunk's
  pullback is linear in the cotangent, so a region with a custom VJP is refused.
- ``native``: the loop with a ``jax.checkpoint``-ed body, differentiated by JAX itself
  (``jvp`` and higher order too).
- ``auto``: fused where the gradients it holds fit in half of one chunk's estimated
  activations, else remat (``choose``).

The custom VJPs use symbolic zeros: only inputs the caller differentiates are differentiated
(a ``while_loop`` on an undifferentiated input stays legal). Invariant: the residual *pytree
structure* never depends on which inputs are perturbed (see ``_mask``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat, _stream
from jaxpr_accum._cost import format_bytes, nbytes
from jaxpr_accum._fused import (
    gradient_sums,
    jacobian_row_dtype,
    jacobian_width,
    with_row_dim,
)
from jaxpr_accum._fused import (
    jacobians as fused_jacobians,
)
from jaxpr_accum._lattice import AxisLoc
from jaxpr_accum._layout import Layout
from jaxpr_accum._loop import (
    differentiated,
    float_outputs,
    pack_streams,
    stream_terms,
    unpack_streams,
)
from jaxpr_accum._plan import BODY, Split
from jaxpr_accum._rules.custom_derivatives import function_name, is_custom_vjp

FUSED_MAX_WIDTH = 8


def _custom_vjp_in_body(split: Split) -> str | None:
    """The name of a custom VJP called (at any depth) by the region's body, or None."""

    def search(eqns: Sequence) -> str | None:
        for eqn in eqns:
            if is_custom_vjp(eqn):
                return function_name(eqn)
            for _, sub in _compat.sub_jaxprs(eqn.params):
                found = search(_compat.open_jaxpr(sub).eqns)
                if found is not None:
                    return found
        return None

    return search([split.jaxpr.eqns[i] for i in split.indices(BODY)])


def fused_refusal(split: Split, max_width: int = FUSED_MAX_WIDTH) -> str | None:
    """Why the fused mode does not apply to ``split``, or None if it does.

    Asked for explicitly, it takes up to ``FUSED_MAX_WIDTH`` gradient-carrying entries (one
    accumulator per entry and differentiated input); ``choose`` weighs it under ``auto``.
    """
    if split.stacked or split.partials:
        return "the region has outputs that are not sums (stacked values or max/min partials)"
    if split.sinks:
        return (
            "the region streams a normaliser: its sums are rescaled chunk by chunk as the "
            "running max grows, which Jacobian rows taken once per chunk cannot follow"
        )
    custom = _custom_vjp_in_body(split)
    if custom is not None:
        return (
            f"the region calls the custom VJP `{custom}`, whose backward rule need not be "
            "linear in the cotangent (gradient clipping is not): Jacobian rows taken with unit "
            "cotangents would change it"
        )
    flags = gradient_sums(split)
    width = jacobian_width(split)
    if width == 0:
        return "the region has no floating-point sum that carries a gradient"
    if any(
        jnp.issubdtype(v.aval.dtype, jnp.complexfloating)
        for v, f in zip(split.sums, flags, strict=True)
        if f
    ):
        return (
            "a sum is complex: its gradient is not complex-linear in the cotangent, so "
            "Jacobian rows for real cotangents would drop the imaginary direction"
        )
    if width > max_width:
        return (
            f"its gradient-carrying sums have {width} entries and the fused mode would keep one "
            f"input-sized gradient per entry (it takes at most {max_width} here)"
        )
    return None


def choose(split: Split, requested: str) -> tuple[str, str]:
    """``(mode, why)``: the gradient mode for ``requested``.

    ``auto`` takes fused where it applies and its accumulators cost no more than half of
    one chunk's estimated activations: fused keeps one input-sized gradient per
    gradient-carrying entry from the forward pass until the backward, where remat holds none
    across and pays a second forward pass instead. The estimate counts every axis-carrying
    intermediate, of which XLA's fusion keeps fewer live (measured on Haiku's VAE: 1.5 MB
    against 4.5 MB estimated), hence the half. ``fused`` falls back to remat where it does
    not apply.
    """
    if requested in ("remat", "native"):
        return requested, "requested"
    refusal = fused_refusal(split, FUSED_MAX_WIDTH)
    if refusal is not None:
        return "remat", f"fused does not apply: {refusal}"
    width = jacobian_width(split)
    held = width * _differentiable_bytes(split)
    chunk_activations = split.body_bytes * min(split.chunk, split.size) // max(split.size, 1)
    sums = f"{width} gradient-carrying sum entr" + ("y" if width == 1 else "ies")
    if requested == "auto" and held > chunk_activations // 2:
        return "remat", (
            f"auto: fused would hold {format_bytes(held)} of gradients ({sums}) from the "
            f"forward pass to the backward, more than half of one chunk's estimated "
            f"activations ({format_bytes(chunk_activations)})"
        )
    why = f"value and gradient in one pass ({sums})"
    return "fused", ("auto: " if requested == "auto" else "requested: ") + why


def _differentiable_bytes(split: Split) -> int:
    inputs = [*split.invariants, *(v for v, _ in split.chunked)]
    return sum(nbytes(v) for v in inputs if jnp.issubdtype(v.aval.dtype, jnp.inexact))


def _aligned(values: Sequence, indices: Sequence[int], n: int) -> list:
    """``values`` placed at ``indices`` of a length-``n`` list, empty placeholders elsewhere."""
    out: list = [jnp.zeros((0,), jnp.bool_)] * n
    for i, x in zip(indices, values, strict=True):
        out[i] = x
    return out


def _unwrap(primals: list) -> tuple[list, list[bool]]:
    """Values and perturbed flags of ``custom_vjp`` primals (``symbolic_zeros=True``)."""
    return [p.value for p in primals], [bool(p.perturbed) for p in primals]


def _mask(flags: Sequence[bool]) -> list:
    """Perturbed flags as residual *shapes*: one empty array per flag, of length 1 if set.

    JAX memoises a ``custom_vjp``'s forward per perturbation pattern but keeps only the
    latest call's residual *pytree structure*; a structure that depended on the flags would
    be paired with another pattern's forward (a stale mask: zero or misplaced gradients).
    Shapes live in the memoised forward jaxpr itself, so they always match it.
    """
    return [jnp.zeros((1 if f else 0,), jnp.bool_) for f in flags]


def _flags(mask: Sequence) -> list[bool]:
    return [m.shape[0] == 1 for m in mask]


def make_region(split: Split, grad: str, accum_dtype: Any, layout: Layout) -> Callable:
    """``region(invariants, chunked) -> (sums, stacked partials, stacked)``.

    The custom VJPs use symbolic zeros: only inputs the caller differentiates are
    differentiated (a ``while_loop`` on an input nobody differentiates stays legal), and
    outputs nobody differentiates get zero cotangents.
    """
    spec = layout.spec
    inv_specs = [spec(None) for _ in split.invariants]
    ch_specs = [spec(loc) for _, loc in split.chunked]
    terms = stream_terms(split)
    exp_terms = [f for _, f in terms if f is not None]
    out_specs = (
        [spec(None) for _ in split.sums],
        [spec(AxisLoc(0)) for _ in split.partials],
        [spec(loc) for _, loc in split.stacked],
        [spec(None) for _ in [*terms, *exp_terms]],
    )
    out_float = float_outputs(split)
    final_specs = [spec(None) for _ in terms]

    def reduce_sums(sums: list) -> list:
        return [
            layout.reduce(s).astype(v.aval.dtype) for s, v in zip(sums, split.sums, strict=True)
        ]

    def reduce_streams(streams: list) -> list:
        """The devices' streamed accumulators merged (``_stream.merge_devices``)."""
        merged = [
            _stream.merge_devices(acc, s, f, layout.reduce, layout.maximum)
            for acc, s, (_, f) in zip(*unpack_streams(split, streams), terms, strict=True)
        ]
        return pack_streams(split, [a for a, _ in merged], [s for _, s in merged])

    def forward_local(checkpoint: bool) -> Callable:
        def fn(invariants: list, chunked: list) -> tuple:
            region = layout.loop(split, accum_dtype)
            sums, partials, stacked, streams = region.forward(invariants, chunked, checkpoint)
            return reduce_sums(sums), partials, stacked, reduce_streams(streams)

        return layout.map(fn, (inv_specs, ch_specs), out_specs)

    if grad == "native":
        return forward_local(checkpoint=True)

    forward = forward_local(checkpoint=False)

    @jax.custom_vjp
    def region(invariants: list, chunked: list) -> tuple:
        return forward(invariants, chunked)

    def cast_back(cts: list, like: list) -> list:
        return [None if c is None else c.astype(x.dtype) for c, x in zip(cts, like, strict=True)]

    if grad == "remat":

        def fwd(invariants: list, chunked: list) -> tuple:
            (inv, need_inv), (ch, need_ch) = _unwrap(invariants), _unwrap(chunked)
            out = forward(inv, ch)
            _, finals = unpack_streams(split, out[3])
            return out, (inv, ch, finals, _mask(need_inv), _mask(need_ch))

        def bwd(res: tuple, cts: tuple) -> tuple:
            inv, ch, finals, need_inv, need_ch = res
            needed = (_flags(need_inv), _flags(need_ch))
            cts = tuple(  # zeros stay None: the loop makes them at its shard's shapes
                [
                    None if not f or _compat.is_symbolic_zero(c) else c
                    for c, f in zip(group, flags, strict=True)
                ]
                for group, flags in zip(cts, out_float, strict=True)
            )

            def backward_local(invariants: list, chunked: list, cts: tuple, finals: list) -> tuple:
                local = layout.loop(split, accum_dtype, needed)
                ct_inv, ct_ch = local.backward(invariants, chunked, cts, finals)
                return [layout.reduce(c) for c in ct_inv], ct_ch

            backward = layout.map(
                backward_local,
                (inv_specs, ch_specs, out_specs, final_specs),
                (inv_specs, ch_specs),
            )
            ct_inv, ct_ch = backward(inv, ch, cts, finals)
            return cast_back(ct_inv, inv), cast_back(ct_ch, ch)

    else:  # fused

        def fwd(invariants: list, chunked: list) -> tuple:
            (inv, need_inv), (ch, need_ch) = _unwrap(invariants), _unwrap(chunked)
            needed = (need_inv, need_ch)

            def jacobians_local(invariants: list, chunked: list) -> tuple:
                local = layout.loop(split, accum_dtype, needed)
                sums, jac, jac_ch = fused_jacobians(local, invariants, chunked)
                return reduce_sums(sums), [layout.reduce(j) for j in jac], jac_ch

            wanted_ch = differentiated(ch, need_ch)
            jac_ch_specs = [spec(with_row_dim(split.chunked[i][1])) for i in wanted_ch]
            jacobians = layout.map(
                jacobians_local,
                (inv_specs, ch_specs),
                ([spec(None) for _ in split.sums], spec(None), jac_ch_specs),
            )
            sums, jac, jac_ch = jacobians(inv, ch)
            # One residual per input (an empty placeholder where not differentiated), so the
            # residual structure does not depend on what is perturbed (see ``_mask``).
            jac_all = _aligned(jac, differentiated(inv, need_inv), len(inv))
            jac_ch_all = _aligned(jac_ch, wanted_ch, len(ch))
            outputs = (sums, [], [], [])
            return outputs, (inv, ch, jac_all, jac_ch_all, _mask(need_inv), _mask(need_ch))

        def bwd(res: tuple, cts: tuple) -> tuple:
            inv, ch, jac, jac_ch, need_inv, need_ch = res
            weights = jnp.concatenate(
                [
                    jnp.ravel(_compat.instantiate(c)).astype(jacobian_row_dtype(split))
                    for c, f in zip(cts[0], gradient_sums(split), strict=True)
                    if f
                ]
            )

            def contract(values: list, jacs: list, mask: Sequence) -> list:
                out: list = [None] * len(values)
                for i in differentiated(values, _flags(mask)):
                    out[i] = jnp.tensordot(weights.astype(jacs[i].dtype), jacs[i], axes=1)
                return out

            return (
                cast_back(contract(inv, jac, need_inv), inv),
                cast_back(contract(ch, jac_ch, need_ch), ch),
            )

    region.defvjp(fwd, bwd, symbolic_zeros=True)
    return region
