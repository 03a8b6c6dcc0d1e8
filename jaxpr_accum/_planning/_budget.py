"""Choosing the chunk from a memory budget: ``serialize_axis(f, memory="2 GiB")``.

The measure, ``m(k)``: XLA's temp bytes (``compiled.memory_analysis().temp_size_in_bytes``)
of ``jax.jit(jax.value_and_grad(run_k, argnums=<floating arguments>))`` for the *built*
program at chunk ``k`` (prologue, chunked region, epilogue), lowered at the call's avals on
the call's backend (per device under a sharded layout: the compiled SPMD program is one
device's). Several floating outputs are summed into the scalar that is differentiated; the
original function is never compiled here (``original_memory`` compiles it once, lazily,
when ``explain`` is asked).

The search (``_chunk_search.ChunkSearch``, one per gradient mode, in units of the per-device
chunk ``c``: chunk ``= c * devices``) measures ``m(n)`` (one chunk) first, then ``m(1)``. Over
the budget at chunk 1: under ``grad="auto"`` with fused chosen, the search is redone in remat
(fused keeps one parameter-sized Jacobian accumulator, which a tight budget may not afford);
otherwise the budget is impossible and ``SerializeError`` names the smallest measured memory,
its chunk, and what dominates it.
The mode searched is ``_choice``'s, chosen by the estimate for what the caller
differentiates: the search compiles to fit the budget, never to choose between modes (remat
is searched only where fused fits at no chunk).

Invariants: the chosen chunk was itself compiled and measured within the budget (never only
predicted); every chunk measured over the budget is larger than the chosen one; the axis
analysis and the stages are computed once (``Candidate.at`` only rescales the estimate).
Fused is kept whenever it fits at some chunk: it saves one forward pass per chunk, which a
larger remat chunk does not buy back. The choice is cached per call signature by ``_api``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._assembly._assemble import build
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._base._errors import ArgumentError, SerializeError
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._compat import Array, Jaxpr
from jaxpr_accum._engine import _interpret
from jaxpr_accum._modes._decision import Budget, Decision, Trial
from jaxpr_accum._modes._mode import FUSED, REMAT
from jaxpr_accum._pairwise import detect
from jaxpr_accum._planning._chunk_search import ChunkSearch


def resolve(memory: int | float, device: jax.Device | None = None) -> int:
    """The budget in bytes: ``memory`` itself, or a fraction of the device's memory limit."""
    if isinstance(memory, int):
        return memory
    device = device or jax.devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    limit = (stats or {}).get("bytes_limit")
    if not limit:
        raise ArgumentError(
            f"`memory={memory!r}` is a fraction of the device's memory limit, but "
            f"{device.platform} device {device.id} reports none (`device.memory_stats()` has "
            "no 'bytes_limit'); pass the budget in bytes instead, e.g. memory='2 GiB'"
        )
    return max(1, int(memory * limit))


def abstract(x: Array) -> Array | jax.ShapeDtypeStruct:
    """What to lower at for the input ``x``: a concrete array itself (its sharding included),
    a tracer's shape, dtype, weak type and named sharding."""
    if not isinstance(x, jax.core.Tracer):
        return x
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(
        np.shape(x), aval.dtype, weak_type=aval.weak_type, sharding=_compat.named_sharding(x)
    )


def scalar_of(outputs: Sequence[Array]) -> Array:
    """The scalar whose ``value_and_grad`` is measured: the one real scalar floating output
    itself, else the float32 sum of every floating output's (real part's) entries."""
    outs = [o for o in outputs if has_float_dtype(o)]
    if len(outs) == 1 and jnp.ndim(outs[0]) == 0 and not jnp.iscomplexobj(outs[0]):
        return outs[0]
    return sum((jnp.sum(jnp.real(o)).astype(jnp.float32) for o in outs), jnp.float32(0))


def temp_bytes(run: Callable, inputs: list, diff: list[int]) -> int:
    """XLA temp bytes of ``value_and_grad`` of ``run``'s floating outputs (summed) with
    respect to the inputs at ``diff`` (the forward alone when there are none)."""

    def scalar(*xs: Array) -> Array:
        return scalar_of(run(*xs))

    fn = jax.value_and_grad(scalar, argnums=tuple(diff)) if diff else scalar
    measured = temp_bytes_of(jax.jit(fn).lower(*[abstract(x) for x in inputs]).compile())
    if measured is None:
        raise SerializeError(
            f"the {jax.default_backend()} backend does not report compiled memory "
            "(`memory_analysis()` is None), so `memory=` cannot choose a chunk; pass `chunk=`"
        )
    return measured


class Measure:
    """XLA's temp bytes of a program's ``value_and_grad`` with respect to ``diff`` (what the
    caller differentiates), compiled once per program: the never-worse check (``_worth``)
    may ask for one the chunk search has measured (``record``). None where it cannot be
    measured on its own: a program of a caller's context (collectives over a ``vmap`` axis
    name or a ``shard_map``'s manual axes), one that is not reverse-differentiable
    (``while_loop``), a backend that reports no memory; the estimate then decides alone."""

    def __init__(self, inputs: list, diff: list[int]):
        self.inputs, self.diff = inputs, diff
        self.measured: dict[int, tuple[Callable, int | None]] = {}

    def __call__(self, run: Callable) -> int | None:
        if id(run) not in self.measured:  # the program is kept with its figure: ids stay unique
            try:
                figure: int | None = temp_bytes(run, self.inputs, self.diff)
            except Exception:  # not measurable out of the caller's context: see the docstring
                figure = None
            self.record(run, figure)
        return self.measured[id(run)][1]

    def record(self, run: Callable, figure: int | None) -> None:
        """``run``'s figure, measured elsewhere (the chunk search's, for its chosen chunk)."""
        self.measured[id(run)] = (run, figure)


def temp_bytes_of(compiled: jax.stages.Compiled) -> int | None:
    """XLA's temp bytes of a compiled computation (None: the backend does not report them)."""
    stats = compiled.memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


def original_memory(jaxpr: Jaxpr, inputs: list, diff: list[int]) -> int:
    """The original's ``m``: the traced program as written (compiled once, for ``explain``)."""
    return temp_bytes(lambda *xs: _interpret.eval_jaxpr(jaxpr, xs), inputs, diff)


@dataclasses.dataclass(frozen=True)
class Request:
    """What a search measures: ``value_and_grad`` of the built program at ``inputs`` with
    respect to the inputs at ``diff`` (named by ``wrt``), against ``limit`` bytes (the
    budget ``requested`` as the user wrote it), accumulating in ``accum_dtype``; ``auto``:
    the mode was chosen by ``grad="auto"`` (a pick of fused may fall back to remat)."""

    limit: int
    requested: int | float | str  # the budget as the user wrote it
    inputs: list
    diff: list[int]
    wrt: str
    accum_dtype: np.dtype | None
    auto: bool = False


def choose_chunk(
    first: Decision, layout_for: Callable[[int], Layout], request: Request
) -> Decision:
    """The decision at the chosen chunk, with its ``Budget``: ``first`` (``_choice``'s, at
    the whole axis) or, where that is auto's pick of fused and it fits at no chunk, remat
    (``layout_for``: the layout at a chunk, ``_layout.detect``)."""
    t0 = time.perf_counter()
    candidate = first.candidate
    split = candidate.split
    devices = layout_for(split.size).devices
    choices = _modes_to_try(first, request.auto)
    n = max(1, split.size // devices)
    tried: list[Trial] = []
    for choice in choices:

        def at(c: int, choice: Decision = choice) -> Decision:
            k = c * devices
            return dataclasses.replace(choice, candidate=candidate.at(k), layout=layout_for(k))

        def measure(c: int, choice: Decision = choice) -> int:
            run = build(at(c), request.accum_dtype)
            m = temp_bytes(jax.jit(run), request.inputs, request.diff)  # as the call runs it
            tried.append(Trial(grad=choice.mode.name, chunk=c * devices, measured=m))
            return m

        search = ChunkSearch(measure, request.limit, n)
        c = search.run()
        if c is not None:
            budget = Budget(
                limit=request.limit,
                requested=request.requested,
                chunk=c * devices,
                grad=choice.mode.name,
                measured=search.points[c],
                tried=tuple(tried),
                model=search.fit(),
                seconds=time.perf_counter() - t0,
                wrt=request.wrt,
            )
            return dataclasses.replace(at(c), budget=budget)
    raise impossible(split, tried, devices, request)


def _modes_to_try(first: Decision, auto: bool) -> list[Decision]:
    """The gradient modes the search tries in order, each a decision at the full axis with
    its reason: ``_choice``'s, then remat where that is auto's pick of fused (see the module
    docstring)."""
    if not (auto and first.mode is FUSED):
        return [first]
    return [first, first.to(REMAT, (
        "remat, chosen by auto: fused applies, but its parameter-sized Jacobian accumulator "
        "does not fit the memory budget at any chunk"
    ))]  # fmt: skip


def impossible(split: Split, tried: list[Trial], devices: int, request: Request) -> SerializeError:
    limit, wrt = request.limit, request.wrt
    smallest = min(tried, key=lambda t: (t.measured, t.chunk))
    best = smallest.measured
    outside = split.outside_bytes
    params = split.invariant_bytes
    parts = {
        "the unchunked prologue and epilogue (values computed once on the full axis, "
        f"{format_bytes(outside)})": outside,
        f"the stacked outputs of the region ({format_bytes(split.stacked_bytes)}, plus their "
        "cotangents)": 2 * split.stacked_bytes,
        f"the parameter gradients ({format_bytes(params)} of floating loop-invariant inputs, "
        "each with an accumulator)": params,
    }
    # named only where the estimate is a large part of the measurement, not above it (XLA
    # writes the gradients into the outputs, outside its temp memory)
    fitting = [p for p in parts if best / 4 <= parts[p] <= best]
    dominant = max(fitting, key=lambda p: parts[p]) if fitting else None
    per = f" per device ({devices} devices)" if devices > 1 else ""
    remat = (
        "; `grad='remat'` holds no Jacobian rows and may need less"
        if all(t.grad == FUSED.name for t in tried)
        else ""
    )
    paired = (
        " This function pairs the axis with itself: the budget search plans one pass, with the "
        "pairs after the loop on the full axis; `chunk=` runs it in two passes, the pairs a "
        "block of rows at a time, and may need far less."
        if detect.find(split) is not None
        else ""
    )
    return SerializeError(
        f"the memory budget {format_bytes(limit)}{per} is below what this function needs at "
        f"any chunk for value_and_grad with respect to {wrt}: the smallest measured is "
        f"{format_bytes(best)}, at chunk {smallest.chunk} ({smallest.grad} gradients; tried: "
        + ", ".join(f"{t.chunk} -> {format_bytes(t.measured)} [{t.grad}]" for t in tried)
        + ")."
        + ("" if dominant is None else f" What dominates it (estimated): {dominant}.")
        + f" Raise `memory` to at least {format_bytes(best)} ({best} bytes){remat}; `explain` "
        "of the function with `chunk=1` shows what runs outside the region and what it stacks."
        + paired
    )
