"""Applying the streaming rules (``_stream.rules``) to one equation: its operands as the
algebra sees them, at plan time (coefficients unknown) and in the loop, at chunk size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, JaxprEqn, Literal, Params, Var
from jaxpr_accum._engine._table import rule_for
from jaxpr_accum._engine._view import EqnResize
from jaxpr_accum._stream.rules import STREAM_RULES
from jaxpr_accum._stream.terms import (
    Deferred,
    Emitter,
    NotStreamable,
    Operand,
    Plain,
    Streamed,
)

# in the loop's environment: a chunk's array, or a streamed value
Value: TypeAlias = Array | Streamed
# how the algebra sees a variable's value
KindOf: TypeAlias = Callable[[Var, Value | None], Operand]
Emit: TypeAlias = Callable[[JaxprEqn, EqnResize, list[Value]], list[Streamed]]


def operands(
    eqn: JaxprEqn, kind_of: KindOf, values: Sequence[Value] | None = None
) -> list[Operand]:
    """The equation's operands: a literal is a float coefficient (a scalar) or a plain array,
    a variable is what ``kind_of(var, value)`` says (``values``: the operands' values in the
    loop, None at plan time)."""
    ops: list[Operand] = []
    for i, v in enumerate(eqn.invars):
        if isinstance(v, Literal):  # in the loop, its value is ``v.val`` (``_interpret.read``)
            if np.iscomplexobj(v.val):
                raise NotStreamable("a complex constant")
            scalar = np.ndim(v.val) == 0
            ops.append(Plain(float(v.val) if scalar else None if values is None else v.val))
        else:
            ops.append(kind_of(v, None if values is None else values[i]))
    return ops


def apply(em: Emitter, ops: list[Operand], axis_dim: int | None) -> Streamed:
    """The streamed result of ``em.eqn`` (``NotStreamable`` if it is outside the algebra)."""
    eqn = em.eqn
    rule = STREAM_RULES.get(eqn.primitive)
    if rule is None:
        raise NotStreamable(f"`{eqn.primitive.name}` of a streamed value")
    if len(eqn.outvars) != 1 or not jnp.issubdtype(
        _compat.aval_dtype(eqn.outvars[0]), jnp.floating
    ):
        raise NotStreamable("a result that is not one real floating-point array")
    return rule(em, ops, axis_dim)


DEFERRED = object()  # in the loop's environment: a value that is only known after the loop


def emitter(deferred: frozenset[Var]) -> Emit:
    """``emit(eqn, r, invals)`` for the streamed equations of a loop body whose values
    reduced over the whole axis are ``deferred``: they are read as ``Deferred`` whatever the
    environment holds (the body may compute their per-chunk partial for another output)."""

    def kind_of(v: Var, x: Value | None) -> Operand:
        if v in deferred:
            return Deferred(v)
        return x if isinstance(x, Streamed) else Plain(x)

    def emit(eqn: JaxprEqn, r: EqnResize, invals: list[Value]) -> list[Streamed]:
        rule = rule_for(eqn.primitive)

        def bind(ops: list[Array | float], params: Params | None) -> Array:
            if params is not None:
                return _compat.bind(eqn, ops, params)[0]
            # a scalar literal is passed as its constant, as to every ``resize``
            return rule.resize(eqn, r, ops)[0]  # type: ignore[arg-type]

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
