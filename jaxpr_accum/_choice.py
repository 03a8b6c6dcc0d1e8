"""Choosing the gradient mode: ``choose(candidate, requested) -> (mode, why)``.

This module only chooses; each mode is built by its own module (``_remat``, ``_fused``;
``native`` is the chunk loop with checkpointed bodies, differentiated by JAX itself).

- ``remat`` and ``native`` are taken as requested.
- ``fused`` applies where every output of the region is a sum of a few floating entries and
  no custom VJP, streamed normaliser or complex sum is in the body (``fused_refusal``);
  requested where it does not apply, remat runs instead.
- ``auto`` takes fused where it applies and the gradients it holds fit in half of one chunk's
  estimated activations, else remat.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._cost import Candidate, format_bytes, nbytes
from jaxpr_accum._jacobians import gradient_sums, jacobian_width
from jaxpr_accum._plan import BODY, Split

FUSED_MAX_WIDTH = 8


def _custom_vjp_in_body(split: Split) -> str | None:
    """The name of a custom VJP called (at any depth) by the region's body, or None."""

    def search(eqns: Sequence) -> str | None:
        for eqn in eqns:
            if _compat.is_custom_vjp_call(eqn):
                return _compat.custom_call_identity(eqn)[0]
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


def choose(candidate: Candidate, requested: str) -> tuple[str, str]:
    """``(mode, why)``: the gradient mode for ``requested``.

    ``auto`` takes fused where it applies and its accumulators cost no more than half of
    one chunk's estimated activations: fused keeps one input-sized gradient per
    gradient-carrying entry from the forward pass until the backward, where remat holds none
    across and pays a second forward pass instead. The estimate counts every axis-carrying
    intermediate, of which XLA's fusion keeps fewer live (measured on Haiku's VAE: 1.5 MB
    against 4.5 MB estimated), hence the half. ``fused`` falls back to remat where it does
    not apply.
    """
    split = candidate.split
    if requested in ("remat", "native"):
        return requested, "requested"
    refusal = fused_refusal(split, FUSED_MAX_WIDTH)
    if refusal is not None:
        return "remat", f"fused does not apply: {refusal}"
    width = jacobian_width(split)
    held = width * _differentiable_bytes(split)
    chunk = min(candidate.chunk, split.size)
    chunk_activations = split.body_bytes * chunk // max(split.size, 1)
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
