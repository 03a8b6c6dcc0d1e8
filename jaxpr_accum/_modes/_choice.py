"""Choosing the gradient mode: ``choose(candidate, requested, layout, diff) -> Decision``.

The ``Decision`` (``_decision``) is one pass's plan, made by the estimate alone: nothing is
compiled to choose a mode, in one pass or in two (``_pairwise``), so planning costs what the
analysis costs. The call and ``explain`` reach the same decision for the same
differentiation (``diff``: the program inputs the caller differentiates, which
``explain(..., grad_argnums=...)`` gives).

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
  per-example form written on the transposed batch (``W.T @ x.T``) measures fused one below;
  on a TPU v5e the 219M-parameter language model of ``benchmarks/accelerator.py`` at 2 rows a
  chunk measures fused 1.14x remat (and 0.69x its step); a SimCLR loss's pass 2 at 96 rows in
  chunks of 32 measures fused one chunk's block of pairs (12 KiB) above remat, 1.25x.

  The chunked inputs' gradients: where the caller differentiates the region's chunked inputs
  (the data, not only the parameters; in two passes, pass 2's rows, the stacked
  embeddings), fused stacks their gradients from the forward pass and holds them while the
  rest of the program runs its backward; remat writes them in its backward loop. On the
  cases of ``benchmarks/auto_choice.py`` an estimate without them missed fused's memory (up
  to 1.5x remat's, measured, where it estimated no extra), so fused's extra bytes count them
  (``differentiated_chunk_bytes``): where they exceed ``MEMORY_SLACK`` of remat's estimate,
  auto takes remat and says so. This is conservative: XLA's buffer assignment sometimes
  reuses that memory (SimCLR's pass 2 at 512 views in chunks of 64 measures both modes
  alike), and remat there costs a forward pass per chunk that fused would save. Earlier
  versions settled such a pick by compiling both modes' ``value_and_grad`` on the first call
  (two more compiles, tens of seconds for a large model on a TPU); none is compiled now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import float_bytes, format_bytes
from jaxpr_accum._analysis._estimate import Candidate
from jaxpr_accum._analysis._split import PROLOGUE, Split
from jaxpr_accum._analysis._stages import variables
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._compat import Jaxpr, JaxprEqn, Var
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._modes._mode import FUSED, NATIVE, REMAT, Mode

FUSED_MAX_WIDTH = 8
MEMORY_SLACK = 0.1  # auto takes fused while it is estimated within this much of remat


@dataclasses.dataclass(frozen=True)
class Weighed:
    """What auto weighs of a candidate, read off its split once (``weigh``): which sums carry
    gradients (``flags``) and their entries (``width``), and the byte sizes of the estimate
    (see the module docstring): one chunk's materialised activations, the largest of them
    where XLA's schedule holds one more under fused (per-example layers; else 0), the
    floating invariant inputs (their gradients' accumulators), every floating input of the
    region, the chunked ones the caller differentiates (their gradients, which fused stacks
    from the forward pass), the materialised results of the program after the loop, the
    outputs stacked back."""

    flags: tuple[bool, ...]
    width: int
    chunk_bytes: int
    schedule_bytes: int
    invariant_bytes: int
    input_bytes: int
    chunk_grad_bytes: int
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
        holds from the forward pass while that part runs its backward; the gradients of the
        differentiated chunked inputs, which it stacks from the forward pass
        (``chunk_grad_bytes``); and the activation XLA's schedule holds beyond remat's
        (``schedule_bytes``)."""
        held_over = self.invariant_bytes if self.epilogue_bytes > self.chunk_bytes else 0
        rows = (self.width - 1) * self.input_bytes
        return rows + held_over + self.chunk_grad_bytes + self.schedule_bytes


def weigh(candidate: Candidate, diff: Sequence[int]) -> Weighed:
    """``candidate``'s ``Weighed`` where the caller differentiates the program inputs at
    ``diff``."""
    split = candidate.split
    rows, size = min(candidate.chunk, split.size), max(split.size, 1)
    return Weighed(
        flags=split.gradient_sums,
        width=split.gradient_width,
        chunk_bytes=split.held_bytes * rows // size,
        schedule_bytes=split.largest_held_bytes * rows // size if split.per_example_layers else 0,
        invariant_bytes=split.invariant_bytes,
        input_bytes=split.input_bytes,
        chunk_grad_bytes=differentiated_chunk_bytes(split, diff),
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


def choose(candidate: Candidate, requested: Mode, layout: Layout, diff: Sequence[int]) -> Decision:
    """The gradient mode for ``requested`` (see the module docstring), by the estimate alone
    (``diff``: the indices of the program inputs the caller differentiates)."""

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
    weighed = weigh(candidate, diff)
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
    parts = [
        (weighed.chunk_grad_bytes, "the differentiated chunked inputs' gradients, which fused "
         "stacks from the forward pass"),
        (weighed.schedule_bytes, "one chunk's activation, which XLA's schedule of layers "
         "written per example holds under fused"),
    ]  # fmt: skip
    of = "; ".join(f"{format_bytes(b)}: {what}" for b, what in parts if b)
    compared += f" (of which {of})" if of else ""
    if width > 1:
        return decided(REMAT, (
            f"remat, chosen by auto: fused would pull back {width} Jacobian rows per chunk, "
            f"slower than remat's second forward pass, and hold {format_bytes(extra)} more"
            f"\n{sums}\n{compared}"
        ))  # fmt: skip
    if extra > MEMORY_SLACK * remat_bytes:
        stacked = weighed.chunk_grad_bytes > MEMORY_SLACK * remat_bytes
        held = " (the differentiated chunked inputs' gradients, from the forward pass)"
        return decided(REMAT, (
            f"remat, chosen by auto: fused would save a forward pass per chunk but hold "
            f"{format_bytes(extra)} more{held if stacked else ''}, more than "
            f"{MEMORY_SLACK:.0%} more than remat's estimated {format_bytes(remat_bytes)}"
            f"\n{sums}\n{compared}"
        ))  # fmt: skip
    return decided(FUSED, (
        f"fused, chosen by auto: value and gradient in one pass, one forward pass per chunk "
        f"fewer than remat, for {format_bytes(extra)} more memory (within "
        f"{MEMORY_SLACK:.0%} of remat's estimated {format_bytes(remat_bytes)})"
        f"\n{sums}\n{compared}"
    ))  # fmt: skip


def differentiated_chunk_bytes(split: Split, diff: Sequence[int]) -> int:
    """Bytes of the region's floating chunked inputs that depend on the program inputs at
    ``diff`` (through the prologue, ``differentiated``)."""
    prologue = [split.jaxpr.eqns[i] for i in split.indices(PROLOGUE)]
    reached = differentiated(split.jaxpr, diff, prologue)
    return float_bytes(v for v, _ in split.chunked if v in reached)


def differentiated(jaxpr: Jaxpr, diff: Sequence[int], eqns: Iterable[JaxprEqn]) -> set[Var]:
    """The inputs of ``jaxpr`` at ``diff`` and the variables that depend on them through
    ``eqns`` (in program order; an equation reading one such value is taken to make all its
    outputs depend on it)."""
    reached = {jaxpr.invars[i] for i in diff}
    for eqn in eqns:
        if any(v in reached for v in variables(eqn.invars)):
            reached.update(eqn.outvars)
    return reached
