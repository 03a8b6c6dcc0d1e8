"""Assembly: the whole program, the equations before the loop, the chunked region, the rest.

``build(decision, accum_dtype)`` returns ``run(*flat_inputs) -> flat_outputs`` for a
``_decision.Decision``, evaluated under the caller's trace: the equations before the loop
(``Split.around_the_loop``: the prologue, and what precedes the region in the program) run
once on the full inputs, the region runs in chunks (``NATIVE``: the chunk loop with
checkpointed bodies, differentiated by JAX; otherwise the region primitive with the mode's
linearization, ``_region_p``), its per-chunk monoid partials are combined (so JAX
differentiates the combination), streamed sums are combined once the deferred values they
need are known, and the equations after the loop run on what the region returned. A split
without a body (an empty axis) runs the program as written.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import numpy as np
from jax import lax

from jaxpr_accum import _stream
from jaxpr_accum._build._region import Region
from jaxpr_accum._build._region_p import call
from jaxpr_accum._build._signature import Inputs, Outputs
from jaxpr_accum._compat import Array, Jaxpr, between_scope
from jaxpr_accum._engine import _interpret
from jaxpr_accum._modes._decision import Decision

COMBINE: dict[str, Callable] = {
    "sum": lambda x: lax.reduce_sum(x, (0,)),
    "max": lambda x: lax.reduce_max(x, (0,)),
    "min": lambda x: lax.reduce_min(x, (0,)),
    "prod": lambda x: lax.reduce_prod(x, (0,)),
    "and": lambda x: lax.reduce_and(x, (0,)),
    "or": lambda x: lax.reduce_or(x, (0,)),
    "xor": lambda x: lax.reduce_xor(x, (0,)),
}


def _streamed_sums(region: Region, out: Outputs) -> list[tuple[int, Callable]]:
    """``(equation index, combine(env))`` of each streamed sum, in program order."""
    pending = []
    for sink, accs, shifts in region.signature.streams.by_sink(out.streams, out.finals):

        def combine(
            env: dict, sink: _stream.Sink = sink, accs: list = accs, shifts: list = shifts
        ) -> None:
            env[sink.var] = _stream.combine(sink, accs, shifts, env.__getitem__)

        pending.append((sink.index, combine))
    return sorted(pending, key=lambda pair: pair[0])


def build(decision: Decision, accum_dtype: np.dtype | None) -> Callable:
    """``run(*flat_inputs) -> flat outputs`` for the whole program."""
    split, mode = decision.candidate.split, decision.mode
    jaxpr = split.jaxpr
    if not split.has_body:  # an empty axis: the program as written
        return functools.partial(run_as_written, jaxpr)
    region = Region(split, decision.candidate.chunk, decision.layout, accum_dtype)
    sig = region.signature
    before, after = split.around_the_loop

    def run(*flat_inputs: Array) -> list:
        env: dict = dict(zip(jaxpr.invars, flat_inputs, strict=True))
        _interpret.eval_eqns(jaxpr.eqns, env, indices=before)
        inputs = Inputs([env[v] for v in sig.invariants], [env[v] for v, _ in sig.chunked])
        out = call(region, mode, inputs)
        env.update(zip(sig.sums, out.sums, strict=True))
        for (v, kind), per_chunk in zip(sig.partials, out.partials, strict=True):
            env[v] = COMBINE[kind](per_chunk)
        env.update(zip((v for v, _ in sig.stacked), out.stacked, strict=True))
        pending = _streamed_sums(region, out)
        for idx in after:
            # a streamed sum is combined once the deferred values it needs are known: they
            # are computed by equations before its own (in program order)
            while pending and pending[0][0] < idx:
                pending.pop(0)[1](env)
            with _between(region, split.between_the_body.get(idx)):
                _interpret.eval_eqns(jaxpr.eqns, env, indices=[idx])
        for _, combine in pending:
            combine(env)
        return [_interpret.read(env, v) for v in jaxpr.outvars]

    return run


def _between(region: Region, ordinal: int | None) -> contextlib.AbstractContextManager:
    """The scope of an equation after the loop that the program has before the body's last
    (its ``ordinal``: ``Split.between_the_body``), for ``checkify`` to order its checks."""
    return contextlib.nullcontext() if ordinal is None else between_scope(region.scope, ordinal)


def run_as_written(jaxpr: Jaxpr, *flat: Array) -> list:
    """The traced program evaluated as written (no region)."""
    return _interpret.eval_jaxpr(jaxpr, flat)
