"""The two passes as one program: pass 1, then pass 2 on what it stacked.

``build(two, decisions, accum_dtype)`` returns ``run(*flat_inputs) -> flat_outputs``: pass 1
(``_assemble.build`` of its split: prologue, chunk loop, epilogue) returns the stacked values;
pass 2 (the same, of its split) reads the original inputs, the stacked values as its rows
and the same arrays again as its column copies.

Differentiation needs nothing of its own: each pass is a region primitive (or, natively, a
checkpointed chunk loop) inside plain JAX, so JAX composes them. In reverse mode pass 2's
backward gives each stacked value two cotangents, its rows' (a chunked input: stacked per
chunk) and its columns' (a loop-invariant input: accumulated across chunks); JAX adds them,
and pass 1's backward runs chunked with that cotangent. This is GradCache (Gao et al., 2021),
derived: the embeddings' gradient from the loss, then the encoder's backward chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from jaxpr_accum._assembly._assemble import build as build_pass
from jaxpr_accum._compat import Array
from jaxpr_accum._modes._decision import Decision
from jaxpr_accum._pairwise.plan import TwoPass


def build(two: TwoPass, decisions: Sequence[Decision], accum_dtype: np.dtype | None) -> Callable:
    """``run(*flat_inputs)`` for the whole program; ``decisions``: each pass's."""
    first = None if two.first is None else build_pass(decisions[0], accum_dtype)
    second = build_pass(decisions[-1], accum_dtype)
    invars = two.single.split.jaxpr.invars
    reads = [two.columns.get(v, v) for v in two.second.split.jaxpr.invars]
    stacked = two.stacked

    def run(*flat_inputs: Array) -> list:
        env: dict = dict(zip(invars, flat_inputs, strict=True))
        if first is not None:
            env.update(zip(stacked, first(*flat_inputs), strict=True))
        env.update(zip(two.constants.values, two.constants.compute(), strict=True))
        return second(*(env[v] for v in reads))

    return run
