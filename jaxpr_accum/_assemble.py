"""Assembly: the whole program, the prologue, then the chunked region, then the epilogue.

``build(split, grad, accum_dtype, layout)`` returns ``run(*flat_inputs) -> flat_outputs``,
evaluated under the caller's trace: prologue equations run once on the full inputs, the region
runs in chunks (``_gradients``), its stacked monoid partials are combined (so JAX
differentiates the combination), and the epilogue runs on what the region returned. A split
without a body (an empty axis) runs the program as written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax import lax

from jaxpr_accum import _interpret, _stream
from jaxpr_accum._gradients import make_region
from jaxpr_accum._layout import Layout
from jaxpr_accum._loop import unpack_streams
from jaxpr_accum._plan import EPILOGUE, PROLOGUE, Split

COMBINE: dict[str, Callable] = {
    "sum": lambda x: lax.reduce_sum(x, (0,)),
    "max": lambda x: lax.reduce_max(x, (0,)),
    "min": lambda x: lax.reduce_min(x, (0,)),
    "prod": lambda x: lax.reduce_prod(x, (0,)),
    "and": lambda x: lax.reduce_and(x, (0,)),
    "or": lambda x: lax.reduce_or(x, (0,)),
    "xor": lambda x: lax.reduce_xor(x, (0,)),
}


def _streamed_sums(split: Split, streams: list) -> list[tuple[int, Callable]]:
    """``(equation index, combine(env))`` of each streamed sum, in program order."""
    accs, stabilisers = (iter(x) for x in unpack_streams(split, streams))
    out = []
    for sink in split.sinks:
        terms = sink.terms
        mine = [next(accs) for _ in terms]
        shifts = [s for s in (next(stabilisers) for _ in terms) if s is not None]

        def combine(env: dict, sink: Any = sink, mine: list = mine, shifts: list = shifts) -> None:
            env[sink.var] = _stream.combine(sink, mine, shifts, env.__getitem__)

        out.append((sink.index, combine))
    return sorted(out, key=lambda pair: pair[0])


def build(split: Split, grad: str, accum_dtype: Any, layout: Layout) -> Callable:
    """``run(*flat_inputs) -> flat outputs`` for the whole program."""
    jaxpr = split.jaxpr
    if not split.has_body:  # an empty axis: the program as written

        def as_written(*flat_inputs: Any) -> list:
            return _interpret.eval_jaxpr(jaxpr, flat_inputs)

        return as_written
    region = make_region(split, grad, accum_dtype, layout)
    prologue, epilogue = split.indices(PROLOGUE), split.indices(EPILOGUE)

    def run(*flat_inputs: Any) -> list:
        env: dict = dict(zip(jaxpr.invars, flat_inputs, strict=True))
        _interpret.eval_eqns(jaxpr.eqns, env, indices=prologue)
        inv = [env[v] for v in split.invariants]
        ch = [env[v] for v, _ in split.chunked]
        sums, partials, stacked, streams = region(inv, ch)
        env.update(zip(split.sums, sums, strict=True))
        for (v, kind), stacked_partials in zip(split.partials, partials, strict=True):
            env[v] = COMBINE[kind](stacked_partials)
        env.update(zip((v for v, _ in split.stacked), stacked, strict=True))
        pending = _streamed_sums(split, streams)
        for idx in epilogue:
            # a streamed sum is combined once the deferred values it needs are known: they
            # are computed by epilogue equations before its own (in program order)
            while pending and pending[0][0] < idx:
                pending.pop(0)[1](env)
            _interpret.eval_eqns(jaxpr.eqns, env, indices=[idx])
        for _, combine in pending:
            combine(env)
        return [_interpret.read(env, v) for v in jaxpr.outvars]

    return run
