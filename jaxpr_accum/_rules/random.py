"""Random primitives: draws along the axis are generated per chunk, bit for bit.

Keys carry the axis like any array (``split(key, N)`` then ``vmap`` over keys): ``random_bits``
and ``random_split`` map key dimensions to the leading dimensions of their outputs, and
``fold_in`` / ``wrap`` / ``unwrap`` are positionwise.

A draw that *creates* the axis (its ``shape`` holds it) is generated inside the loop for the
chunk only. Under the partitionable threefry (JAX's default), element ``i`` of a draw of
shape ``S`` is ``threefry2x32(key, counter)`` with ``counter`` the 64-bit row-major index of
``i`` in ``S``, split into two 32-bit words (that layout is JAX's, so it lives in ``_compat``
and a test pins it against ``jax.random.bits``). The chunk's counters are computed from the
*full* shape's strides with the chunk's offset along the axis, in exact 2x32-bit integer
arithmetic, so the chunked bits equal the original's whatever the widths, merged dimensions
or sizes. The bits are then recomputed in the backward pass like any chunk activation.

The chunk's counters, and its threefry, are one flat run in row-major order, reshaped to the
chunk's shape only once drawn. Threefry is elementwise, and XLA:CPU compiles its kernel about
five times faster at rank 1 than at rank 4 (``jax.random.bits`` of 16,384 elements: 0.17 s as
``(16384,)``, 0.85 s as ``(4, 4, 32, 32)``); on the 12-layer transformer with dropout of
``benchmarks/planning_cost.py`` that is the difference between compiling in 1.35x the
original's time and in 1.0x.

Where that formula is not the one JAX uses (legacy non-partitionable threefry, ``rbg`` /
``unsafe_rbg`` keys, a batch of keys), the draw is hoisted: computed before the loop on the
full axis, still exact, and the plan says so.
"""

from __future__ import annotations

import math
from typing import TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array, JaxprEqn
from jaxpr_accum._engine._table import Rule, register
from jaxpr_accum._engine._view import EqnResize, View
from jaxpr_accum._rules.elementwise import Elementwise

_MASK16 = np.uint32(0xFFFF)

Words: TypeAlias = tuple[Array, Array]  # a 64-bit unsigned integer as (hi, lo) uint32 words


def _mul_wide(a: Array, c: int) -> Words:
    """``a * c`` as ``(hi, lo)`` 32-bit words, for uint32 ``a`` and ``0 <= c < 2**64``."""
    c_lo, c_hi = c & 0xFFFFFFFF, c >> 32
    lo = a * np.uint32(c_lo)
    a_lo, a_hi = a & _MASK16, a >> np.uint32(16)
    cl, ch = np.uint32(c_lo & 0xFFFF), np.uint32(c_lo >> 16)
    ll, lh, hl, hh = a_lo * cl, a_lo * ch, a_hi * cl, a_hi * ch
    mid = (ll >> np.uint32(16)) + (lh & _MASK16) + (hl & _MASK16)
    hi = hh + (lh >> np.uint32(16)) + (hl >> np.uint32(16)) + (mid >> np.uint32(16))
    return hi + a * np.uint32(c_hi), lo


def _add_wide(x: Words, y: Words) -> Words:
    lo = x[1] + y[1]
    carry = (lo < x[1]).astype(np.uint32)
    return x[0] + y[0] + carry, lo


def chunk_shape(full_shape: tuple[int, ...], loc: AxisLoc, k: int) -> tuple[int, ...]:
    """The shape of a chunk of ``k`` along ``loc`` of ``full_shape``."""
    shape = list(full_shape)
    shape[loc.dim] = k * loc.inner
    return tuple(shape)


def chunk_counters(full_shape: tuple[int, ...], loc: AxisLoc, k: int, start: Array | int) -> Words:
    """The 2x32-bit row-major counters of the chunk ``[start, start+k)`` of ``full_shape``,
    flat: in the row-major order of the chunk's shape (``chunk_shape``).

    Where every counter of the full shape fits one 32-bit word (at most ``2**32`` elements)
    the high word is zero and the low word is plain uint32 arithmetic, which never wraps: the
    chunk is ``outer`` runs (the dimensions before the axis) of ``span`` consecutive counters,
    so the low word is two iotas over ``(outer, span)``, flattened. That keeps the counters
    one fused expression of the loop index, as JAX's own full-shape iota is, with no
    per-dimension term for the compiler to hoist out of the loop. A larger draw takes the
    exact two-word arithmetic."""
    shape = list(chunk_shape(full_shape, loc, k))
    strides = [math.prod(full_shape[d + 1 :]) for d in range(len(full_shape))]
    if math.prod(full_shape) <= 2**32:
        outer, stride = math.prod(full_shape[: loc.dim]), strides[loc.dim]
        runs = (outer, k * loc.inner * stride)
        offset = lax.convert_element_type(start * loc.inner, np.uint32) * np.uint32(stride)
        low = lax.broadcasted_iota(np.uint32, runs, 1) + offset
        if outer > 1:
            run_stride = np.uint32(full_shape[loc.dim] * stride)
            low = low + lax.broadcasted_iota(np.uint32, runs, 0) * run_stride
        return jnp.zeros(math.prod(shape), np.uint32), low.reshape(-1)
    indices = [lax.broadcasted_iota(np.uint32, shape, d) for d in range(len(shape))]
    indices[loc.dim] = indices[loc.dim] + lax.convert_element_type(start * loc.inner, np.uint32)
    hi, lo = wide_counters(shape, indices, strides)
    return hi.reshape(-1), lo.reshape(-1)


def wide_counters(shape: list[int], indices: list[Array], strides: list[int]) -> Words:
    """``sum(index * stride)`` over the dimensions, exact in two 32-bit words."""
    total = (jnp.zeros(shape, np.uint32), jnp.zeros(shape, np.uint32))
    for index, stride in zip(indices, strides, strict=True):
        total = _add_wide(total, _mul_wide(index, stride))
    return total


def in_loop_draw_refusal(eqn: JaxprEqn) -> str | None:
    """Why a draw born along the axis cannot be generated per chunk, or None if it can."""
    key = eqn.invars[0]
    if _compat.shape_of(key):
        return "a batch of keys draws along the axis"
    return _compat.counter_draw_refusal(_compat.aval_dtype(key))


class KeyPrefix(Rule):
    """Output dims ``< keys.ndim`` are the keys' dims; the rest are drawn here (for a
    row-mapped axis, the rows of the chunk's window)."""

    row_map_ok = True

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        key_rank = len(_compat.shape_of(eqn.invars[0]))
        loc = view.in_loc(0)
        if loc is not None:
            view.set_out(0, loc)
        loc = view.out_loc(0)
        if loc is None:
            return
        if loc.dim < key_rank:
            view.set_in(0, loc)
            return
        refusal = in_loop_draw_refusal(eqn)
        if refusal is not None:
            view.hoist(
                f"`{eqn.primitive.name}` draws along the axis; computed before the loop on the "
                f"full axis (exact): {refusal}"
            )

    def resize(self, eqn: JaxprEqn, r: EqnResize, invals: list[Array]) -> list[Array]:
        loc = r.out_locs[0]
        if r.in_locs[0] is not None:
            return super().resize(eqn, r, invals)
        full_shape = tuple(eqn.params["shape"])
        assert loc is not None  # a draw along the axis: its result carries it
        with _compat.user_context(eqn):
            first, rows = r.window(loc)
            counters = chunk_counters(full_shape, loc, rows, first)
            bits = _compat.threefry_counter_bits(invals[0], counters)
            return [self.finish(eqn, invals[0], bits, chunk_shape(full_shape, loc, rows))]

    def finish(self, eqn: JaxprEqn, key: Array, bits: Words, shape: tuple[int, ...]) -> Array:
        """The draw of ``shape`` from its flat threefry words ``bits``."""
        raise NotImplementedError


class RandomBits(KeyPrefix):
    def finish(self, eqn: JaxprEqn, key: Array, bits: Words, shape: tuple[int, ...]) -> Array:
        return _compat.threefry_finish_bits(*bits, eqn.params["bit_width"]).reshape(shape)


class RandomSplit(KeyPrefix):
    def finish(self, eqn: JaxprEqn, key: Array, bits: Words, shape: tuple[int, ...]) -> Array:
        data = jnp.stack(bits, axis=1).reshape((*shape, 2))
        return jax.random.wrap_key_data(data, impl=_compat.key_impl(key.dtype))


class SameLeadingDims(Rule):
    """``random_wrap`` / ``random_unwrap``: the key data's trailing dimension comes or goes."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        view.set_out(0, view.in_loc(0))
        view.set_in(0, view.out_loc(0))


register("random_bits", RandomBits())
register("random_split", RandomSplit())
register(["random_wrap", "random_unwrap"], SameLeadingDims())


class RandomGamma(Elementwise):
    """``random_gamma(keys, a)``: with one key per position, positionwise; with one key for
    all of them, the primitive splits it over every position, so a draw along the axis is
    hoisted (computed before the loop on the full axis, exact)."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        keys, a = (_compat.shape_of(v) for v in eqn.invars)
        if keys == a:
            super().propagate(eqn, view)
        elif view.in_loc(1) is not None or view.out_loc(0) is not None:
            view.hoist("`random_gamma` splits one key over every position along the axis")


register(["random_fold_in", "random_seed", "random_clone", "threefry2x32"], Elementwise())
register("random_gamma", RandomGamma())
