"""The streamed sums across chunks and devices: online accumulation with rescaled
stabilisers, the per-chunk cotangents, and the combination after the loop (see
``jaxpr_accum._stream``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TypeAlias

import jax.numpy as jnp
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, Atom, JaxprEqn, Literal, Var
from jaxpr_accum._stream.terms import Exp, Power, Term, compact, finite, place, rescale


@dataclasses.dataclass(frozen=True)
class Sink:
    """A sum over the axis of a streamed value: equation ``index`` of the top-level jaxpr,
    whose result ``var`` is a region output held as ``terms`` (coefficients None here)."""

    var: Var
    index: int
    terms: tuple[Term, ...]
    shape: tuple[int, ...]  # of the accumulators
    later: tuple[int, ...] = ()  # their dimensions summed after the combination

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _compat.dtype_of(self.var).itemsize


Stab: TypeAlias = Array | None  # a stabiliser: an ``Exp`` term's (compact), None for any other term
# the equation that defines a value, if any
Definition: TypeAlias = Callable[[Atom], JaxprEqn | None]


def accumulate(
    acc: Array, s_run: Stab, part: Array, s_chunk: Stab, factor: Exp | None
) -> tuple[Array, Stab]:
    """One chunk's ``part`` into the accumulator (an ``Exp`` term: online, rescaled)."""
    part = part.astype(acc.dtype)
    if factor is None:
        return acc + part, s_run
    assert s_run is not None and s_chunk is not None, "an Exp term has stabilisers"
    s_chunk = s_chunk.astype(s_run.dtype)
    s_new = jnp.maximum(s_run, s_chunk)
    shape = acc.shape
    acc = acc * place(rescale(s_run, s_new), factor.where, shape) + part * place(
        rescale(s_chunk, s_new), factor.where, shape
    )
    return acc, s_new


def chunk_cotangent(ct: Array, s_chunk: Stab, s_final: Stab, factor: Exp | None) -> Array:
    """The cotangent of one chunk's part, from its accumulator's."""
    if factor is None:
        return ct
    assert s_chunk is not None and s_final is not None, "an Exp term has stabilisers"
    scale = rescale(s_chunk.astype(s_final.dtype), s_final)
    return ct * place(scale, factor.where, ct.shape).astype(ct.dtype)


def merge_devices(
    acc: Array,
    s: Stab,
    factor: Exp | None,
    psum: Callable[[Array], Array],
    pmax: Callable[[Array], Array],
) -> tuple[Array, Stab]:
    """Accumulators of the devices' shards into one (the identity on one device)."""
    if factor is None:
        return psum(acc), s
    assert s is not None, "an Exp term has a stabiliser"
    s_all = pmax(s)
    return psum(acc * place(rescale(s, s_all), factor.where, acc.shape)), s_all


def combine(
    sink: Sink, accs: Sequence[Array], shifts: Sequence[Array], read: Callable[[Var], Array]
) -> Array:
    """``sum_j acc_j * F_j`` with the deferred values ``read(var)`` and the final
    stabilisers ``shifts`` (one per ``Exp`` term, in order), summed over ``sink.later``."""
    shape, total = sink.shape, None
    remaining = iter(shifts)
    for term, acc in zip(sink.terms, accs, strict=True):
        value = acc
        for f in term.factors:
            if isinstance(f, Power):
                d = place(compact(read(f.var)).astype(acc.dtype), f.where, shape)
                d = d if abs(f.power) == 1 else d ** abs(f.power)
                value = value * d if f.power > 0 else value / d  # divided, as the original
            else:
                exponent = place(lax.stop_gradient(finite(next(remaining))), f.where, shape)
                for v, c, w in f.lin:
                    exponent = exponent + c * place(compact(read(v)).astype(acc.dtype), w, shape)
                value = value * jnp.exp(exponent)
        total = value if total is None else total + value
    assert total is not None, "a sink without terms"
    if sink.later:
        total = jnp.sum(total, axis=sink.later)
    return total.astype(_compat.dtype_of(sink.var))


def origin(definition: Definition, v: Var) -> JaxprEqn | None:
    """The equation a deferred value comes from: back through single-operand equations to
    the reduction (or the first equation with several operands)."""
    eqn = definition(v)
    for _ in range(32):
        if eqn is None:
            return None
        ins = [x for x in eqn.invars if not isinstance(x, Literal)]
        if eqn.primitive.name.startswith("reduce_") or eqn.primitive.name == "dot_general":
            return eqn
        prev = definition(ins[-1]) if ins else None
        if prev is None:
            return eqn
        eqn = prev
    return eqn


def describe(sink: Sink, definition: Definition, where: Callable[[JaxprEqn], str]) -> str:
    """What ``sink`` streams, for ``explain``: each deferred value by the reduction it comes
    from (``where(eqn)`` names an equation)."""
    said: list[str] = []

    def add(text: str) -> None:
        if text not in said:
            said.append(text)

    for term in sink.terms:
        for f in term.factors:
            if isinstance(f, Exp):
                for v, _, _ in f.lin:
                    add(
                        f"exp(. - {_named(definition, where, v)}) taken against each chunk's own "
                        "max and rescaled as chunks combine"
                    )
            else:
                if f.power < 0:
                    add(f"divided by {_named(definition, where, f.var)} after the loop")
                else:
                    add(f"{_named(definition, where, f.var)} applied after the loop")
    return "; ".join(said) if said else "a sum of chunk values"


def _named(definition: Definition, where: Callable[[JaxprEqn], str], v: Var) -> str:
    eqn = origin(definition, v)
    return "a value reduced over the axis" if eqn is None else where(eqn)
