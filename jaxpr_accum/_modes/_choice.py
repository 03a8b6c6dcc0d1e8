"""Choosing the gradient mode: ``choose(candidate, requested, layout, diff) -> Decision``.

The ``Decision`` (``_decision``) is one pass's plan. Auto's pick of fused is settled in
``choose`` where the estimate decides alone (``by_estimate``); elsewhere it is
``unconfirmed``, and the measurement of both modes settles it (``confirm_fused``, which
returns a new decision). The call and ``explain`` reach the same decision for the same
differentiation (``diff``, which ``explain(..., grad_argnums=...)`` gives).

Each decision's reason is written for ``explain``: a first line that is one sentence a user
can act on (the mode, why, and what the other mode would cost), then lines of detail (the
estimate's and the measurement's figures).

This module only chooses; each mode is built by its own module (``_remat``, ``_fused``;
``native`` is the chunk loop with checkpointed bodies, differentiated by JAX itself).

- ``remat`` and ``native`` are taken as requested.
- ``fused`` applies where every output of the region is a sum of a few floating entries and
  no custom VJP, streamed normaliser or complex sum is in the body (``fused_refusal``);
  requested where it does not apply, remat runs instead.
- ``auto`` weighs what each mode adds over the other. Fused adds memory: the Jacobian rows of
  every gradient-carrying entry beyond the first, the invariant inputs' gradients held from
  the forward pass while the program after the loop runs its backward, and, for layers
  written per example and ``vmap``-ped, one chunk's largest activation
  (``Weighed.fused_extra_bytes``). Remat adds time: one more forward pass per chunk; fused
  instead pulls back one Jacobian row per entry, which is faster only for a single entry
  (measured on XLA:CPU: 0.8x remat's time with one entry, 1.4x with two, 1.9x with three).
  So auto takes fused where there is one gradient-carrying entry and fused's extra memory is
  within ``MEMORY_SLACK`` (10%) of remat's estimated peak (``Weighed.remat_bytes``), else
  remat (within 10% of the smaller memory, and of the faster of the two that are).

  The activation: XLA schedules a chunk's forward pass and pullback (fused's loop, remat's
  backward loop) with one chunk's activation more or fewer live at the peak (which of the
  last layer's weight gradient and input cotangent runs first), and which mode gets it
  depends on how the model is written. Measured (``value_and_grad`` with respect to the
  weights, one activation 256 KiB): ``eqx.nn.MLP(16, 4, 256, 3)`` (``W @ x`` per example,
  ``vmap``-ped, ReLUs), 2048 rows in chunks of 256: fused 1.78 MiB, remat 1.52 (1.17x); the
  same MLP on the batch (``x @ W``): fused 1.52, remat 1.77; with ``tanh``, or the
  Monte-Carlo encoder-decoder's convolutions: equal. So the estimate counts it for the first
  form only (``Split.per_example_layers``). Known gaps: a 2-layer language model with an 8k
  vocabulary measures fused one chunk's logits above remat (1.16-1.24x), auto takes fused; the
  per-example form written on the transposed batch (``W.T @ x.T``) measures fused one below.

  The estimate can also miss what XLA's buffer assignment does with fused's Jacobian rows.
  On the cases of ``benchmarks/auto_choice.py`` it missed (measured: up to 1.5x remat where
  it estimates no extra) where the caller differentiates the region's chunked inputs (the
  data, not only the parameters), whose gradients fused stacks from the forward pass. So the
  estimate decides alone where those gradients are within ``MEMORY_SLACK`` of remat's
  estimate (``estimate_decides``): no compile, planning costs what the analysis costs.
  Elsewhere a pick of fused is confirmed on the first call by compiling both modes'
  ``value_and_grad`` and comparing XLA's temp bytes (``confirm_fused``): fused stays while it
  measures within 10% of remat (the region compiled alone would not: the difference arises
  where its gradients meet the program around it).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._build._region_p import AUTO, NATIVE, Mode
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._modes._fused import FUSED
from jaxpr_accum._modes._remat import REMAT
from jaxpr_accum._planning._cost import Candidate, float_bytes, format_bytes
from jaxpr_accum._planning._plan import PROLOGUE, Split
from jaxpr_accum._planning._stages import variables

FUSED_MAX_WIDTH = 8
MEMORY_SLACK = 0.1  # auto takes fused while it is estimated within this much of remat


def mode_named(name: str) -> Mode:
    """The mode ``grad=name`` asks for (``name`` is one of ``_settings.GRAD_MODES``)."""
    return next(m for m in (AUTO, REMAT, FUSED, NATIVE) if m.name == name)


@dataclasses.dataclass(frozen=True)
class Weighed:
    """What auto weighs of a candidate, read off its split once (``weigh``): which sums carry
    gradients (``flags``) and their entries (``width``), and the byte sizes of the estimate
    (see the module docstring): one chunk's materialised activations, the largest of them
    where XLA's schedule holds one more under fused (per-example layers; else 0), the
    floating invariant inputs (their gradients' accumulators), every floating input of the
    region, the materialised results of the program after the loop, the outputs stacked
    back."""

    flags: tuple[bool, ...]
    width: int
    chunk_bytes: int
    schedule_bytes: int
    invariant_bytes: int
    input_bytes: int
    epilogue_bytes: int
    stacked_bytes: int

    @property
    def remat_bytes(self) -> int:
        """Remat's estimated peak: one chunk's activations and the invariant inputs'
        gradient accumulators, or the program after the loop, whichever is more, plus the
        outputs stacked back to full size."""
        peak = max(self.chunk_bytes + self.invariant_bytes, self.epilogue_bytes)
        return max(peak + self.stacked_bytes, 1)

    @property
    def fused_extra_bytes(self) -> int:
        """What fused is estimated to hold beyond remat: the Jacobian rows of every
        gradient-carrying entry beyond the first; where the program after the loop
        materialises more than one chunk's activations, the invariant inputs' gradients it
        holds from the forward pass while that part runs its backward; and the activation
        XLA's schedule holds beyond remat's (``schedule_bytes``)."""
        held_over = self.invariant_bytes if self.epilogue_bytes > self.chunk_bytes else 0
        return (self.width - 1) * self.input_bytes + held_over + self.schedule_bytes


def weigh(candidate: Candidate) -> Weighed:
    """``candidate``'s ``Weighed``."""
    split = candidate.split
    rows, size = min(candidate.chunk, split.size), max(split.size, 1)
    return Weighed(
        flags=split.gradient_sums,
        width=split.gradient_width,
        chunk_bytes=split.held_bytes * rows // size,
        schedule_bytes=split.largest_held_bytes * rows // size if split.per_example_layers else 0,
        invariant_bytes=split.invariant_bytes,
        input_bytes=split.input_bytes,
        epilogue_bytes=split.epilogue_bytes,
        stacked_bytes=split.stacked_bytes,
    )


def fused_refusal(split: Split, weighed: Weighed, max_width: int = FUSED_MAX_WIDTH) -> str | None:
    """Why the fused mode does not apply to ``split`` (``weighed``), or None if it does.

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
    custom = split.custom_vjp_in_body
    if custom is not None:
        return (
            f"the region calls the custom VJP `{custom}`, whose backward rule need not be "
            "linear in the cotangent (gradient clipping is not): Jacobian rows taken with unit "
            "cotangents would change it"
        )
    width = weighed.width
    if width == 0:
        return "the region has no floating-point sum that carries a gradient"
    if any(
        jnp.issubdtype(_compat.dtype_of(v), jnp.complexfloating)
        for v, f in zip(split.sums, weighed.flags, strict=True)
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


def choose(
    candidate: Candidate, requested: Mode, layout: Layout, diff: list[int] | None = None
) -> Decision:
    """The gradient mode for ``requested`` (see the module docstring). Auto's pick of fused
    is settled here where no measurement is needed (``diff``: the indices of the program
    inputs the caller differentiates; ``_settled``), else left ``unconfirmed``."""

    def decided(mode: Mode, reason: str) -> Decision:
        return Decision(candidate, mode, reason, layout)

    if requested is REMAT:
        return decided(REMAT, (
            "remat, as requested: each chunk's forward pass runs again in the backward pass "
            "(grad='auto' weighs it against fused, which runs it once)"
        ))  # fmt: skip
    if requested is NATIVE:
        return decided(NATIVE, (
            "native, as requested: JAX differentiates the chunked scan itself (grad='auto' "
            "weighs remat, which accumulates the gradients in the loop, against fused)"
        ))  # fmt: skip
    weighed = weigh(candidate)
    refusal = fused_refusal(candidate.split, weighed, FUSED_MAX_WIDTH)
    if refusal is not None:
        return decided(REMAT, (
            "remat, the one mode that applies here: each chunk's forward pass runs again in "
            f"the backward pass\nfused does not apply: {refusal}"
        ))  # fmt: skip
    width = weighed.width
    sums = f"{width} gradient-carrying sum entr" + ("y" if width == 1 else "ies")
    if requested is FUSED:
        return decided(FUSED, (
            f"fused, as requested: value and gradient in one pass\n{sums}"
        ))  # fmt: skip
    extra, remat_bytes = weighed.fused_extra_bytes, weighed.remat_bytes
    compared = (
        f"fused would hold {format_bytes(extra)} more than remat's estimated "
        f"{format_bytes(remat_bytes)}"
    )
    if weighed.schedule_bytes:
        compared += (
            f" (of which {format_bytes(weighed.schedule_bytes)}: one chunk's activation, which "
            "XLA's schedule of layers written per example holds under fused)"
        )
    if width > 1:
        return decided(REMAT, (
            f"remat, chosen by auto: fused would pull back {width} Jacobian rows per chunk, "
            f"slower than remat's second forward pass, and hold {format_bytes(extra)} more"
            f"\n{sums}\n{compared}"
        ))  # fmt: skip
    if extra > MEMORY_SLACK * remat_bytes:
        return decided(REMAT, (
            f"remat, chosen by auto: fused would save a forward pass per chunk but hold "
            f"{format_bytes(extra)} more, more than {MEMORY_SLACK:.0%} more than remat's "
            f"estimated {format_bytes(remat_bytes)}\n{compared}"
        ))  # fmt: skip
    fused = decided(FUSED, (
        f"fused, chosen by auto: value and gradient in one pass, one forward pass per chunk "
        f"fewer than remat, for {format_bytes(extra)} more memory (within "
        f"{MEMORY_SLACK:.0%} of remat's estimated {format_bytes(remat_bytes)})"
        f"\n{sums}\n{compared}"
    ))  # fmt: skip
    return _settled(fused, remat_bytes, diff)


def _settled(decision: Decision, remat_bytes: int, diff: list[int] | None) -> Decision:
    """Auto's estimated pick of fused (``decision``; ``remat_bytes``: remat's estimated
    peak), settled where no measurement is needed: nothing is differentiated (``diff``
    empty), or the estimate decides alone (``estimate_decides``, ``by_estimate``). Elsewhere
    it is ``unconfirmed``, as where the caller measures it itself (``diff`` None: the memory
    budget search, the passes of ``_pairwise``)."""
    if diff is not None and not diff:
        return decision
    if diff is not None and estimate_decides(decision.candidate, diff, remat_bytes):
        return by_estimate(decision)
    return dataclasses.replace(decision, unconfirmed=True)


def estimate_decides(candidate: Candidate, diff: list[int], remat_bytes: int) -> bool:
    """Whether auto's estimated pick of fused needs no measurement: the gradients of the
    region's chunked inputs that the caller differentiates (``diff``: indices of the
    program's inputs), which fused stacks from the forward pass, are within
    ``MEMORY_SLACK`` of remat's estimated peak ``remat_bytes`` (see the module docstring)."""
    return differentiated_chunk_bytes(candidate.split, diff) <= MEMORY_SLACK * remat_bytes


def differentiated_chunk_bytes(split: Split, diff: list[int]) -> int:
    """Bytes of the region's floating chunked inputs that depend on the program inputs at
    ``diff`` (through the prologue; an equation reading one such value is taken to make
    all its outputs depend on it)."""
    jaxpr = split.jaxpr
    reached = {jaxpr.invars[i] for i in diff}
    for i in split.indices(PROLOGUE):
        eqn = jaxpr.eqns[i]
        if any(v in reached for v in variables(eqn.invars)):
            reached.update(eqn.outvars)
    return float_bytes(v for v, _ in split.chunked if v in reached)


def by_estimate(decision: Decision) -> Decision:
    """Auto's estimated pick of fused (``decision``) where the estimate decides alone
    (``estimate_decides``)."""
    return decision.to(FUSED, (
        f"{decision.reason}\nthe estimate decides (no compile): fused would hold no "
        f"differentiated chunked input's gradient beyond {MEMORY_SLACK:.0%} of remat's estimate"
    ))  # fmt: skip


def confirm_fused(decision: Decision, fused_bytes: int | None, remat_bytes: int | None) -> Decision:
    """Auto's estimated pick of fused (``decision``), given XLA's temp bytes of both modes'
    ``value_and_grad``: fused while within ``MEMORY_SLACK`` of remat, else remat; the
    estimate's fused where they cannot be measured (None)."""
    why = decision.reason
    if fused_bytes is None or remat_bytes is None:
        return decision.to(
            FUSED, f"{why}\nnot measured (not compilable outside the caller's context)"
        )
    measured = f"measured: fused {format_bytes(fused_bytes)}, remat {format_bytes(remat_bytes)}"
    if fused_bytes > (1 + MEMORY_SLACK) * remat_bytes:
        estimate = why.split("\n", 1)[-1]
        return decision.to(REMAT, (
            f"remat, chosen by auto on measuring both: fused would save a forward pass per "
            f"chunk but took {format_bytes(fused_bytes)} against remat's "
            f"{format_bytes(remat_bytes)}\n{measured}, fused more than {MEMORY_SLACK:.0%} above "
            f"remat, though the estimate had it within\n{estimate}"
        ))  # fmt: skip
    return decision.to(FUSED, f"{why}\n{measured}")
