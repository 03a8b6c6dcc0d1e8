"""The terms of a streamed value (``coef * factors``), the operands rules see, and the
arithmetic of stabilisers and aligned factors (see ``jaxpr_accum._stream``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeAlias

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, JaxprEqn, Params, Var

MAX_TERMS = 8  # terms of one streamed value (a product multiplies the counts)

# A coefficient: a float (the same everywhere), an array, or None (an array, at plan time).
Coef: TypeAlias = float | Array | None


@dataclasses.dataclass(frozen=True)
class Power:
    """``D ** power``; ``where[i]``: the value dimension of D's ``i``-th non-unit dimension."""

    var: Var
    power: int
    where: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Exp:
    """``exp(s + sum c * D)`` over ``lin = ((D, c, where), ...)``; ``where``: the value
    dimensions of the stabiliser ``s`` (compact, one dimension per entry)."""

    lin: tuple[tuple[Var, float, tuple[int, ...]], ...]
    where: tuple[int, ...]


Factor = Power | Exp


@dataclasses.dataclass(frozen=True)
class Term:
    """``coef * prod(factors)``. ``coef``: a float (everywhere that constant), an array of the
    value's chunk shape, or None (an array, at plan time). ``stab``: the ``Exp`` factor's
    stabiliser in the loop (compact, raw: may be ``-inf``)."""

    coef: Coef
    factors: tuple[Factor, ...] = ()
    stab: Array | None = None

    @property
    def exp(self) -> Exp | None:
        return next((f for f in self.factors if isinstance(f, Exp)), None)


@dataclasses.dataclass(frozen=True)
class Streamed:
    """A streamed value. A sum over the axis may keep dimensions that a factor varies along
    (``later``: summed after the loop, once the factors are known; ``shape``: its full
    shape before that)."""

    terms: tuple[Term, ...]
    later: tuple[int, ...] = ()
    shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Deferred:
    var: Var


@dataclasses.dataclass(frozen=True)
class Plain:
    """A value the chunk computes itself: ``value`` an array, a float for a scalar literal,
    or None (an array, at plan time)."""

    value: Coef


Operand = Streamed | Deferred | Plain


class NotStreamable(Exception):
    """The equation is outside the algebra (the message says why)."""


# ``bind(operands, params)``: the equation at chunk size (with ``params`` instead, if given);
# an operand is an array, or a float for a scalar literal
Bind: TypeAlias = Callable[[list[Array | float], Params | None], Array]


class Emitter:
    """How rules compute coefficients for one equation: ``bind`` it at chunk size, with the
    chunk shapes of its operands (``in_shapes``) and result (``shape``). At plan time
    (``concrete`` False) array coefficients are None and nothing is bound."""

    def __init__(
        self,
        eqn: JaxprEqn,
        sink: bool,
        bind: Bind | None = None,
        in_shapes: Sequence[tuple[int, ...]] = (),
        shape: tuple[int, ...] = (),
    ):
        self.eqn, self.sink, self._bind = eqn, sink, bind
        self.in_shapes, self.shape = list(in_shapes), shape
        self.dtype = _compat.aval_dtype(eqn.outvars[0])

    @property
    def concrete(self) -> bool:
        return self._bind is not None

    def bind(self, operands: Sequence[Array | float], params: Params | None = None) -> Array:
        """The equation at chunk size on ``operands`` (with ``params`` instead, if given)."""
        assert self._bind is not None
        return self._bind(list(operands), params)

    def full(self, c: Coef, shape: tuple[int, ...] | None = None) -> Array:
        """Coefficient ``c`` as an array of the result's chunk shape (or of ``shape``)."""
        assert c is not None, "coefficients are known at chunk size"
        shape = self.shape if shape is None else shape
        if isinstance(c, float):
            return jnp.full(shape, c, self.dtype)
        return c if tuple(c.shape) == tuple(shape) else jnp.broadcast_to(c, shape)


def arith(a: Coef, b: Coef, op: Callable[[float | Array, float | Array], float | Array]) -> Coef:
    """An elementwise coefficient op: floats stay floats, arrays at plan time stay None."""
    if isinstance(a, float) and isinstance(b, float):
        return float(op(a, b))
    return None if a is None or b is None else op(a, b)


def negated(c: Coef) -> Coef:
    return None if c is None else -c


def where_of(d: Var, out: Var, axis_dim: int | None) -> tuple[int, ...]:
    """The dimensions of ``out`` that deferred ``d`` (same rank, or a scalar) varies along."""
    dshape, oshape = _compat.shape_of(d), _compat.shape_of(out)
    if not dshape:
        return ()
    if len(dshape) != len(oshape):
        raise NotStreamable("a deferred value of another rank")
    where = tuple(i for i, n in enumerate(dshape) if n != 1)
    if any(dshape[i] != oshape[i] or i == axis_dim for i in where):
        raise NotStreamable("a deferred value varies along the axis")
    return where


def terms_of(op: Operand, out: Var, axis_dim: int | None) -> list[Term]:
    if isinstance(op, Streamed):
        return list(op.terms)
    if isinstance(op, Deferred):
        return [Term(1.0, (Power(op.var, 1, where_of(op.var, out, axis_dim)),))]
    return [Term(op.value)]


def times(factors: tuple[Factor, ...], extra: Factor) -> tuple[Factor, ...]:
    """``factors * extra``: powers of one deferred value (same alignment) add up."""
    if isinstance(extra, Power):
        for i, f in enumerate(factors):
            if isinstance(f, Power) and (f.var, f.where) == (extra.var, extra.where):
                p = f.power + extra.power
                rest = factors[:i] + factors[i + 1 :]
                return rest if p == 0 else (*rest, Power(f.var, p, f.where))
    elif any(isinstance(f, Exp) for f in factors):
        raise NotStreamable("a product of two exponentials")
    return (*factors, extra)


def remap(term: Term, mapping: Callable[[int], int | None]) -> tuple[Factor, ...]:
    """``term``'s factors with every aligned dimension ``d`` moved to ``mapping(d)``."""

    def move(where: tuple[int, ...]) -> tuple[int, ...]:
        moved = [mapping(d) for d in where]
        if any(d is None for d in moved):
            raise NotStreamable(
                "a factor constant along the axis varies along a dimension that is summed or merged"
            )
        return tuple(d for d in moved if d is not None)

    out: list[Factor] = []
    for f in term.factors:
        if isinstance(f, Power):
            out.append(Power(f.var, f.power, move(f.where)))
        else:
            lin = tuple((v, c, move(w)) for v, c, w in f.lin)
            out.append(Exp(lin, move(f.where)))
    return tuple(out)


def result(em: Emitter, terms: list[Term]) -> Streamed:
    """The streamed result; array coefficients at the result's chunk shape."""
    if len(terms) > MAX_TERMS:
        raise NotStreamable(f"more than {MAX_TERMS} terms")
    if em.concrete:
        terms = [
            t
            if t.coef is None or isinstance(t.coef, float)
            else dataclasses.replace(t, coef=em.full(t.coef))
            for t in terms
        ]
    return Streamed(tuple(terms))


def finite(s: Array) -> Array:
    return jnp.where(jnp.isfinite(s), s, jnp.zeros_like(s))


def rescale(s_from: Array, s_to: Array) -> Array:
    """``exp(s_from - s_to)`` for stabilisers; exactly 0 where ``s_from`` is ``-inf``."""
    diff = finite(s_from) - finite(s_to)
    return jnp.exp(jnp.where(s_from == -jnp.inf, -jnp.inf, diff))


def place(compact: Array, where: Sequence[int], shape: Sequence[int]) -> Array:
    """``compact`` (one dim per entry of ``where``) broadcastable against ``shape``."""
    order = sorted(range(len(where)), key=lambda i: where[i])
    if order != list(range(len(where))):
        compact = jnp.transpose(compact, order)
    target = tuple(n if d in where else 1 for d, n in enumerate(shape))
    return lax.broadcast_in_dim(compact, target, tuple(sorted(where)))


def compact(x: Array) -> Array:
    """A deferred value without its unit dimensions (its ``where`` lists the others)."""
    return jnp.reshape(x, [n for n in np.shape(x) if n != 1])
