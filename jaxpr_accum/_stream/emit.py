"""Applying the streaming rules (``_stream.rules``) to one equation: its operands as the
algebra sees them, at plan time (coefficients unknown) and in the loop, at chunk size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._compat import Literal
from jaxpr_accum._stream.rules import STREAM_RULES
from jaxpr_accum._stream.terms import (
    Deferred,
    Emitter,
    NotStreamable,
    Operand,
    Plain,
    Streamed,
)
from jaxpr_accum._table import rule_for


def operands(eqn: Any, kind_of: Callable[[Any, Any], Operand], values: Any = None) -> list[Operand]:
    """The equation's operands: a literal is a float coefficient (a scalar) or a plain array,
    a variable is what ``kind_of(var, value)`` says (``values``: the operands' values in the
    loop, None at plan time)."""
    ops: list[Operand] = []
    for i, v in enumerate(eqn.invars):
        value = None if values is None else values[i]
        if isinstance(v, Literal):
            if np.iscomplexobj(v.val):
                raise NotStreamable("a complex constant")
            scalar = np.ndim(v.val) == 0
            ops.append(Plain(float(v.val) if scalar else None if values is None else value))
        else:
            ops.append(kind_of(v, value))
    return ops


def apply(em: Emitter, ops: list[Operand], axis_dim: int | None) -> Streamed:
    """The streamed result of ``em.eqn`` (``NotStreamable`` if it is outside the algebra)."""
    eqn = em.eqn
    rule = STREAM_RULES.get(eqn.primitive)
    if rule is None:
        raise NotStreamable(f"`{eqn.primitive.name}` of a streamed value")
    if len(eqn.outvars) != 1 or not jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating):
        raise NotStreamable("a result that is not one real floating-point array")
    return rule(em, ops, axis_dim)


DEFERRED = object()  # in the loop's environment: a value that is only known after the loop


def emitter(deferred: frozenset) -> Callable:
    """``emit(eqn, r, invals)`` for the streamed equations of a loop body whose values
    reduced over the whole axis are ``deferred``: they are read as ``Deferred`` whatever the
    environment holds (the body may compute their per-chunk partial for another output)."""

    def kind_of(v: Any, x: Any) -> Operand:
        if v in deferred:
            return Deferred(v)
        return x if isinstance(x, Streamed) else Plain(x)

    def emit(eqn: Any, r: Any, invals: list) -> list:
        rule = rule_for(eqn.primitive)

        def bind(ops: list, params: dict | None) -> Any:
            if params is not None:
                return _compat.bind(eqn, ops, params)[0]
            return rule.resize(eqn, r, ops)[0]

        loc = r.out_locs[0]
        em = Emitter(
            eqn,
            loc is None,
            bind,
            [r.chunk_shape(v) for v in eqn.invars],
            r.chunk_shape(eqn.outvars[0]),
        )
        ops = operands(eqn, kind_of, invals)
        return [apply(em, ops, None if loc is None else loc.dim)]

    return emit
