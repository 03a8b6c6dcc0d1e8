"""The streaming rules, keyed by primitive objects: how one equation maps the terms of its
streamed operand(s) to the terms of its result (see ``jaxpr_accum._stream``). A rule raises
``NotStreamable`` where the equation is outside the algebra; the planner then keeps it after
the loop. ``_stream.emit`` applies them, at plan time and in the loop."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TypeAlias

from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._compat import Primitive, Var
from jaxpr_accum._stream.terms import (
    Deferred,
    Emitter,
    Exp,
    NotStreamable,
    Operand,
    Plain,
    Power,
    Streamed,
    Term,
    arith,
    finite,
    negated,
    place,
    remap,
    result,
    terms_of,
    times,
    where_of,
)

# (emitter, operands, axis dim of the result or None) -> the result
StreamRule: TypeAlias = Callable[[Emitter, list[Operand], int | None], Streamed]
STREAM_RULES: dict[Primitive, StreamRule] = {}  # keyed by primitive objects, as ``_table.RULES``


def _rule(*names: str) -> Callable[[StreamRule], StreamRule]:
    """Register a streaming rule for the primitives ``names`` (a name the installed JAX lacks
    is skipped and recorded, ``_compat.table_primitive``)."""

    def register(fn: StreamRule) -> StreamRule:
        for name in names:
            prim = _compat.table_primitive(name)
            if prim is not None:
                STREAM_RULES[prim] = fn
        return fn

    return register


def _one_streamed(ops: list[Operand]) -> Streamed:
    if len(ops) != 1 or not isinstance(ops[0], Streamed):
        raise NotStreamable("not linear in one streamed operand")
    return ops[0]


@_rule("neg")
def _neg(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    op = _one_streamed(ops)
    return result(em, [dataclasses.replace(t, coef=negated(t.coef)) for t in op.terms])


@_rule("convert_element_type", "copy")
def _cast(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    return _structural(em, _one_streamed(ops), lambda d: d)  # to a float: ``apply`` checks


@_rule("add", "add_any", "sub")
def _add(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    out = em.eqn.outvars[0]
    a, b = (terms_of(op, out, axis) for op in ops)
    if em.eqn.primitive.name == "sub":
        b = [dataclasses.replace(t, coef=negated(t.coef)) for t in b]
    return result(em, a + b)


@_rule("mul")
def _mul(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    out = em.eqn.outvars[0]
    terms = []
    for ta in terms_of(ops[0], out, axis):
        for tb in terms_of(ops[1], out, axis):
            factors = ta.factors
            for f in tb.factors:
                factors = times(factors, f)
            stab = ta.stab if ta.exp is not None else tb.stab
            terms.append(Term(arith(ta.coef, tb.coef, lambda x, y: x * y), factors, stab))
    return result(em, terms)


@_rule("square")
def _square(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    op = _one_streamed(ops)
    return _mul(em, [op, op], axis)


@_rule("integer_pow")
def _integer_pow(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    """A small positive power, as repeated products (each multiplies the term count)."""
    y = em.eqn.params["y"]
    if not 1 <= y <= 3:
        raise NotStreamable(f"a power {y} of a streamed value")
    op = out = _one_streamed(ops)
    for _ in range(y - 1):
        out = _mul(em, [out, op], axis)
    return out


@_rule("div")
def _div(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    out = em.eqn.outvars[0]
    a, b = ops
    if isinstance(b, Streamed):
        raise NotStreamable("a division by a streamed value")
    if isinstance(b, Deferred):
        extra = Power(b.var, -1, where_of(b.var, out, axis))
        return result(
            em,
            [
                dataclasses.replace(t, factors=times(t.factors, extra))
                for t in terms_of(a, out, axis)
            ],
        )
    return result(
        em,
        [
            dataclasses.replace(t, coef=arith(t.coef, b.value, lambda x, y: x / y))
            for t in terms_of(a, out, axis)
        ],
    )


@_rule("exp")
def _exp(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    op = _one_streamed(ops)
    units = [t for t in op.terms if not t.factors]
    lin: dict[tuple[Var, tuple[int, ...]], float] = {}
    for t in op.terms:
        if not t.factors:
            continue
        f = t.factors[0]
        if not (
            len(t.factors) == 1
            and isinstance(f, Power)
            and f.power == 1
            and isinstance(t.coef, float)
        ):
            raise NotStreamable(
                "an exponent that is not a chunk value plus constant multiples of values "
                "reduced over the axis"
            )
        lin[(f.var, f.where)] = lin.get((f.var, f.where), 0.0) + t.coef
    if not units or not lin:
        raise NotStreamable("an exponent without both a chunk part and a deferred part")
    where = tuple(sorted({d for _, w in lin for d in w}))
    factor = Exp(tuple((v, c, w) for (v, w), c in lin.items()), where)
    if not em.concrete:
        return Streamed((Term(None, (factor,)),))
    exponent = em.full(units[0].coef)
    for t in units[1:]:
        exponent = exponent + em.full(t.coef)
    others = tuple(d for d in range(len(em.shape)) if d not in where)
    stab = lax.stop_gradient(lax.reduce_max(exponent, others))
    shift = place(finite(stab), where, em.shape)
    # XLA:CPU may contract ``x * c - s`` into one FMA in one fusion and not in another (the
    # sum's and the pullback's), which at large logits changes ``exp`` by ``c * x``'s rounding
    # error. Adding a zero known only at run time rounds ``x * c`` first, everywhere.
    exponent = exponent + lax.stop_gradient(shift * 0)
    coef = em.bind([exponent - shift])
    return Streamed((Term(coef, (factor,), stab),))


@_rule("broadcast_in_dim")
def _broadcast(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    dims = em.eqn.params["broadcast_dimensions"]
    op = ops[0]
    if isinstance(op, Deferred):
        shape = _compat.shape_of(op.var)
        where = tuple(dims[i] for i, n in enumerate(shape) if n != 1)
        if axis in where:
            raise NotStreamable("a deferred value broadcast along the axis")
        return result(em, [Term(1.0, (Power(op.var, 1, where),))])
    return _structural(em, _one_streamed(ops[:1]), lambda d: dims[d])


@_rule("transpose")
def _transpose(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    perm = list(em.eqn.params["permutation"])
    return _structural(em, _one_streamed(ops), perm.index)


@_rule("reshape", "squeeze")
def _reshape(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    if em.eqn.primitive.name == "reshape" and em.eqn.params.get("dimensions") is not None:
        raise NotStreamable("a reshape that transposes")
    before, after = _compat.shape_of(em.eqn.invars[0]), _compat.shape_of(em.eqn.outvars[0])
    return _structural(em, _one_streamed(ops[:1]), _kept_dims(before, after).get)


@_rule("reduce_sum")
def _reduce_sum(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    """A sum. A sink (over the axis) keeps the other summed dimensions that a factor varies
    along, to sum them after the loop; any other sum must not sum such a dimension."""
    op = _one_streamed(ops)
    axes = set(em.eqn.params["axes"])
    if em.sink:
        axes -= {d for t in op.terms for d in _aligned(t)}
    shape = _compat.shape_of(em.eqn.invars[0])
    kept = [d for d in range(len(shape)) if d not in axes]
    params = {**em.eqn.params, "axes": tuple(sorted(axes))}
    terms = []
    for t in op.terms:
        coef = None
        if em.concrete:
            coef = em.bind([em.full(t.coef, em.in_shapes[0])], params)
        terms.append(Term(coef, remap(t, lambda d: kept.index(d) if d in kept else None), t.stab))
    later = tuple(i for i, d in enumerate(kept) if d in em.eqn.params["axes"])
    return Streamed(tuple(terms), later, tuple(shape[d] for d in kept))


def _aligned(t: Term) -> set[int]:
    """The dimensions that ``t``'s factors vary along."""
    dims: set[int] = set()
    for f in t.factors:
        dims.update(f.where)
        if isinstance(f, Exp):
            dims.update(d for _, _, w in f.lin for d in w)
    return dims


@_rule("dot_general")
def _dot_general(em: Emitter, ops: list[Operand], axis: int | None) -> Streamed:
    (lc, rc), (lb, rb) = em.eqn.params["dimension_numbers"]
    kinds = [isinstance(op, Streamed) for op in ops]
    if sum(kinds) != 1 or any(isinstance(op, Deferred) for op in ops):
        raise NotStreamable("not linear in one streamed operand")
    side = kinds.index(True)
    ranks = [len(_compat.shape_of(v)) for v in em.eqn.invars]
    free = [
        [d for d in range(r) if d not in c and d not in b]
        for r, c, b in zip(ranks, (lc, rc), (lb, rb), strict=True)
    ]
    batch = list((lb, rb)[side])
    base = len(lb) + (0 if side == 0 else len(free[0]))

    def mapping(d: int) -> int | None:
        if d in batch:
            return batch.index(d)
        return base + free[side].index(d) if d in free[side] else None

    streamed, other = ops[side], ops[1 - side]
    assert isinstance(streamed, Streamed) and isinstance(other, Plain)
    terms = []
    for t in streamed.terms:
        coef = None
        if em.concrete:
            assert other.value is not None, "known at chunk size"
            pair = [em.full(t.coef, em.in_shapes[side]), other.value]
            coef = em.bind(pair if side == 0 else pair[::-1])
        terms.append(Term(coef, remap(t, mapping), t.stab))
    return result(em, terms)


def _structural(em: Emitter, op: Streamed, mapping: Callable[[int], int | None]) -> Streamed:
    """A linear structural equation: array coefficients re-bound (a float stays a float),
    factors moved with their dimensions."""
    terms = []
    for t in op.terms:
        coef = t.coef
        if coef is not None and not isinstance(coef, float):
            coef = em.bind([coef])
        terms.append(Term(coef, remap(t, mapping), t.stab))
    return result(em, terms)


def _kept_dims(before: tuple[int, ...], after: tuple[int, ...]) -> dict[int, int]:
    """Dimensions a reshape keeps whole: same size, same number of elements before them."""
    prefix_after = {(math.prod(after[:d]), after[d]): d for d in range(len(after))}
    found = {}
    for d, n in enumerate(before):
        key = (math.prod(before[:d]), n)
        if key in prefix_after:
            found[d] = prefix_after[key]
    return found
