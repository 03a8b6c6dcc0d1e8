"""Choosing the chunk from a memory budget: ``serialize_axis(f, memory="2 GiB")``.

The measure, ``m(k)``: XLA's temp bytes (``compiled.memory_analysis().temp_size_in_bytes``)
of ``jax.jit(jax.value_and_grad(run_k, argnums=<floating arguments>))`` for the *built*
program at chunk ``k`` (prologue, chunked region, epilogue), lowered at the call's avals on
the call's backend (per device under a sharded layout: the compiled SPMD program is one
device's). Several floating outputs are summed into the scalar that is differentiated; the
original function is never compiled here (``original_memory`` compiles it once, lazily,
when ``explain`` is asked).

The search, in units of the per-device chunk ``c`` (chunk ``= c * devices``) on ``[1, n]``:

1. ``m(n)``: one chunk. Within the budget: done, one compile.
2. ``m(1)``. Over the budget: under ``grad="auto"`` with fused chosen, the search is redone in
   remat (fused keeps one parameter-sized Jacobian accumulator, which a tight budget may not
   afford); otherwise the budget is impossible and ``SerializeError`` names the smallest
   measured memory, its chunk, and what dominates it.
3. Between ``lo`` (measured to fit) and ``hi`` (measured not to), predict the boundary from
   the affine model through the two (memory is close to affine in the chunk), measure the
   prediction, and move ``lo`` or ``hi`` to it. When the previous prediction missed by more
   than ``FIT_TOLERANCE`` of the bracket's span, the next step is a bisection instead. Stop
   when the model puts the boundary at ``lo``, when ``hi - lo`` is within ``1/16`` of ``lo``
   (or 1), or after ``MAX_COMPILES``. The steps run over the divisors of ``n`` first (a
   remainder chunk costs a second body and a concatenation of the stacked values: memory jumps
   off the affine line), then, where the next divisor is more than twice the result, over the
   chunks in between, in the order an affine model in the *extent* (the chunk plus the
   remainder's own body, ``chunk + N mod chunk``) ranks them, largest first.

Invariants: the chosen chunk was itself compiled and measured within the budget (never only
predicted); every chunk measured over the budget is larger than the chosen one; the axis
analysis and the stages are computed once (``Candidate.at`` only rescales the estimate).
Fused is kept whenever it fits at some chunk: it saves one forward pass per chunk, which a
larger remat chunk does not buy back. The result would be wrong only if memory were not
monotone in the chunk between ``lo`` and ``hi`` (a larger chunk that fits could be missed;
the chosen one still fits). The choice is cached per call signature by ``_api``.
"""

from __future__ import annotations

import dataclasses
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat, _interpret
from jaxpr_accum._assemble import build
from jaxpr_accum._cost import Candidate, format_bytes, nbytes
from jaxpr_accum._dtypes import is_float
from jaxpr_accum._errors import ArgumentError, SerializeError
from jaxpr_accum._plan import EPILOGUE, PROLOGUE, Split

MAX_COMPILES = 6  # per gradient mode, over the divisors of the axis
BETWEEN_COMPILES = 4  # more, for chunks between divisors (a remainder chunk)
FIT_TOLERANCE = 0.1


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the search did, for ``explain``."""

    limit: int
    requested: Any  # as the user wrote it
    chunk: int
    grad: str
    measured: int
    tried: list[tuple[str, int, int]]  # (gradient mode, chunk, bytes), in order
    model: tuple[float, float] | None  # bytes ~ a + b * chunk, fitted to the chosen mode's
    seconds: float
    wrt: str = "every floating argument"  # what the measured value_and_grad differentiates
    original: int | None = None  # the original's memory, measured when ``explain`` asks

    def lines(self) -> list[str]:
        req = "" if isinstance(self.requested, int) else f" ({self.requested!r})"
        out = [
            f"  memory budget: {format_bytes(self.limit)}{req} of XLA temp memory for "
            f"value_and_grad with respect to {self.wrt}",
            f"    chosen: chunk {self.chunk} ({self.grad}), measured {format_bytes(self.measured)}",
        ]
        if self.original is not None:
            out.append(f"    original (unchunked): {format_bytes(self.original)}")
        if self.model is not None:
            a, b = self.model
            out.append(
                f"    fitted model: {format_bytes(a)} + {format_bytes(b)} per chunk position"
            )
        tried = ", ".join(
            f"{k} -> {format_bytes(m)}{'' if m <= self.limit else ' (over)'}"
            + (f" [{g}]" if g != self.grad else "")
            for g, k, m in self.tried
        )
        out.append(f"    chunks tried ({len(self.tried)} compiles, {self.seconds:.1f} s): {tried}")
        return out


def resolve(memory: int | float, device: Any = None) -> int:
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


def abstract(x: Any) -> Any:
    """What to lower at for the input ``x``: a concrete array itself (its sharding included),
    a tracer's shape, dtype, weak type and named sharding."""
    if not isinstance(x, jax.core.Tracer):
        return x
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(
        np.shape(x), aval.dtype, weak_type=aval.weak_type, sharding=_compat.named_sharding(x)
    )


def scalar_of(outputs: Sequence[Any]) -> Any:
    """The scalar whose ``value_and_grad`` is measured: the one real scalar floating output
    itself, else the float32 sum of every floating output's (real part's) entries."""
    outs = [o for o in outputs if is_float(o)]
    if len(outs) == 1 and jnp.ndim(outs[0]) == 0 and not jnp.iscomplexobj(outs[0]):
        return outs[0]
    return sum((jnp.sum(jnp.real(o)).astype(jnp.float32) for o in outs), jnp.float32(0))


def temp_bytes(run: Callable, inputs: list, diff: list[int]) -> int:
    """XLA temp bytes of ``value_and_grad`` of ``run``'s floating outputs (summed) with
    respect to the inputs at ``diff`` (the forward alone when there are none)."""

    def scalar(*xs: Any) -> Any:
        return scalar_of(run(*xs))

    fn = jax.value_and_grad(scalar, argnums=tuple(diff)) if diff else scalar
    stats = jax.jit(fn).lower(*[abstract(x) for x in inputs]).compile().memory_analysis()
    if stats is None:
        raise SerializeError(
            f"the {jax.default_backend()} backend does not report compiled memory "
            "(`memory_analysis()` is None), so `memory=` cannot choose a chunk; pass `chunk=`"
        )
    return int(stats.temp_size_in_bytes)


def original_memory(jaxpr: Any, inputs: list, diff: list[int]) -> int:
    """The original's ``m``: the traced program as written (compiled once, for ``explain``)."""
    return temp_bytes(lambda *xs: _interpret.eval_jaxpr(jaxpr, xs), inputs, diff)


class _Search:
    """The measurements of one gradient mode, by per-device chunk."""

    def __init__(self, measure: Callable[[int], int], limit: int, n: int):
        self.measure, self.limit, self.n = measure, limit, n
        self.points: dict[int, int] = {}

    def at(self, c: int) -> int:
        if c not in self.points:
            self.points[c] = self.measure(c)
        return self.points[c]

    def run(self) -> int | None:
        """The largest per-device chunk measured to fit, or None if chunk 1 does not.

        Divisors of ``n`` first: a remainder chunk adds a second copy of the body and a
        concatenation of the stacked values, so memory is monotone over divisors but jumps
        between them. Where the next divisor above the result is more than twice as large
        (few divisors), the chunks in between are searched too."""
        divisors = [d for d in range(1, self.n + 1) if self.n % d == 0]
        c = self.bracket(divisors)
        if c is None:
            return None
        above = min((d for d in divisors if d > c), default=c)
        if above > 2 * c:
            c = self.between(c, above)
        return c

    def extent(self, c: int) -> int:
        """Positions one pass of chunk ``c`` holds: the chunk, and the remainder's own body
        after the scan (memory goes about as ``a + b * extent``, not ``a + b * c``)."""
        return c + self.n % c

    def between(self, lo: int, hi: int) -> int:
        """The largest chunk in ``(lo, hi)`` that fits, where ``lo`` fits and ``hi`` does
        not: candidates in decreasing order of the chunk among those the affine model in
        ``extent`` (fitted to every measurement) puts within the budget, each measured, for
        ``BETWEEN_COMPILES`` more compiles at most."""
        best, failed = lo, set()
        for _ in range(BETWEEN_COMPILES):
            a, b = self.fit_extent()
            fits = [
                c
                for c in range(best + 1, hi)
                if c not in failed and a + b * self.extent(c) <= self.limit
            ]
            if not fits:
                break
            c = max(fits)
            if self.at(c) <= self.limit:
                best = c
            else:
                failed.add(c)
        return best

    def fit_extent(self) -> tuple[float, float]:
        """``(a, b)`` of ``bytes ~ a + b * extent`` over the measurements."""
        ks = sorted(self.points)
        xs = np.asarray([self.extent(k) for k in ks], float)
        ms = np.asarray([self.points[k] for k in ks], float)
        if len(set(xs)) < 2:
            return float(ms[0]), 0.0
        b, a = np.polyfit(xs, ms, 1)
        return float(a), float(b)

    def bracket(self, chunks: Sequence[int]) -> int | None:
        """Secant steps (bisection where the fit missed) between ``lo`` (fits) and ``hi``
        (does not) over the ascending ``chunks``; the largest measured to fit."""
        limit = self.limit
        if self.at(chunks[-1]) <= limit:
            return chunks[-1]
        if self.at(chunks[0]) > limit:
            return None
        lo, hi, bisect = 0, len(chunks) - 1, False
        while hi - lo > 1 and len(self.points) < MAX_COMPILES:
            k_lo, k_hi = chunks[lo], chunks[hi]
            if k_hi - k_lo <= k_lo // 16:
                break
            m_lo, m_hi = self.points[k_lo], self.points[k_hi]
            predicted = k_lo + (limit - m_lo) * (k_hi - k_lo) / max(m_hi - m_lo, 1)
            guess = (lo + hi) // 2 if bisect else bisect_right(chunks, predicted) - 1
            if guess <= lo and not bisect:
                break  # the model puts the boundary at lo
            guess = min(max(guess, lo + 1), hi - 1)
            k = chunks[guess]
            expected = m_lo + (m_hi - m_lo) * (k - k_lo) / (k_hi - k_lo)
            m = self.at(k)
            bisect = abs(m - expected) > FIT_TOLERANCE * max(m_hi - m_lo, 1)
            lo, hi = (guess, hi) if m <= limit else (lo, guess)
        return chunks[lo]

    def fit(self) -> tuple[float, float] | None:
        if len(self.points) < 2:
            return None
        ks, ms = zip(*sorted(self.points.items()), strict=True)
        b, a = np.polyfit(np.asarray(ks, float), np.asarray(ms, float), 1)
        return float(a), float(b)


def choose_chunk(
    candidate: Candidate,
    modes: list[tuple[str, str]],
    accum_dtype: Any,
    layout_for: Callable[[int], Any],
    inputs: list,
    diff: list[int],
    limit: int,
    requested: Any,
    wrt: str,
) -> tuple[Candidate, str, str, Any, Budget]:
    """``(the candidate at the chosen chunk, grad mode, why, layout, Budget)``.

    ``modes``: the gradient modes to try in order, with the reason of each; ``layout_for``:
    the layout at a chunk (``_layout.detect``); ``diff``: the inputs the measured
    ``value_and_grad`` differentiates, named by ``wrt``.
    """
    t0 = time.perf_counter()
    split = candidate.split
    devices = layout_for(split.size).devices
    n = max(1, split.size // devices)
    tried: list[tuple[str, int, int]] = []
    searches = []
    for mode, why in modes:

        def measure(c: int, mode: str = mode) -> int:
            k = c * devices
            m = temp_bytes(build(split, k, mode, accum_dtype, layout_for(k)), inputs, diff)
            tried.append((mode, k, m))
            return m

        search = _Search(measure, limit, n)
        searches.append(search)
        c = search.run()
        if c is not None:
            k = c * devices
            budget = Budget(
                limit=limit,
                requested=requested,
                chunk=k,
                grad=mode,
                measured=search.points[c],
                tried=tried,
                model=search.fit(),
                seconds=time.perf_counter() - t0,
                wrt=wrt,
            )
            return candidate.at(k), mode, why, layout_for(k), budget
    raise impossible(split, tried, limit, devices, wrt)


def impossible(split: Split, tried: list, limit: int, devices: int, wrt: str) -> SerializeError:
    mode, k, best = min(tried, key=lambda t: (t[2], t[1]))
    jaxpr = split.jaxpr
    outside = sum(
        nbytes(v)
        for i in split.indices(PROLOGUE) + split.indices(EPILOGUE)
        for v in jaxpr.eqns[i].outvars
    )
    params = sum(nbytes(v) for v in split.invariants if is_float(v))
    parts = {
        "the unchunked prologue and epilogue (values computed once on the full axis, "
        f"{format_bytes(outside)})": outside,
        f"the stacked outputs of the region ({format_bytes(split.stacked_bytes)}, plus their "
        "cotangents)": 2 * split.stacked_bytes,
        f"the parameter gradients ({format_bytes(params)} of floating loop-invariant inputs, "
        "each with an accumulator and a gradient)": 2 * params,
    }
    dominant = max(parts, key=lambda p: parts[p])
    per = f" per device ({devices} devices)" if devices > 1 else ""
    return SerializeError(
        f"the memory budget {format_bytes(limit)}{per} is below what this function needs at "
        f"any chunk for value_and_grad with respect to {wrt}: the smallest measured is "
        f"{format_bytes(best)}, at chunk {k} ({mode} gradients; tried: "
        + ", ".join(f"{kk} -> {format_bytes(m)}" for _, kk, m in tried)
        + f"). What dominates it (estimated): {dominant}. Raise `memory` to at least "
        f"{format_bytes(best)} ({best} bytes); `explain` of the function with `chunk=1` shows "
        "what runs outside the region and what it stacks."
    )
