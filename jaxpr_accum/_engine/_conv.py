"""Convolution gradients that stay fast on XLA:CPU inside the chunk loop.

XLA:CPU runs a convolution through its fast Eigen kernel only when it is *canonical*:
labels ``b01f_01io->b01f`` (input N, spatial..., C; kernel spatial..., I, O), row-major, no
window reversal; anything else goes to a naive loop nest. JAX's transpose rules emit
non-canonical convolutions for the gradients of an NHWC/HWIO conv (weight gradient
``f01b_i01o->01bf``, input gradient ``b01f_01oi->b01f``). At top level XLA's
``ConvCanonicalization`` pass wraps them in transposes, but that pass only visits the entry
computation, so inside a ``while`` body (our scan over chunks) they stay slow: measured
25-55x slower for the weight gradient (tests/conv_trap.py).

``canonicalize(fun)`` re-emits every convolution of ``fun`` (inlining nested ``jit``) as
``canonical_conv``: transpose the operands to canonical order, convolve with canonical
dimension numbers, transpose the result back. Transposes only relabel dimensions, so the
result is exact for any dimension numbers, strides, dilations, padding and groups. Two later
XLA passes that would undo it are pre-empted: the operand swapper (kernel larger than input:
padding and lhs dilation are materialised behind an ``optimization_barrier``) and the group
converter (``1 < batch_group_count < out features``: split into one conv per group).

The chunked backward passes call it on each chunk's pullback when running on CPU, where
the region's body may convolve (``Split.may_convolve``: a convolution in it, at any depth, or
a custom rule, whose derivative is not seen before it is traced).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax import lax

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, Eqn, Params
from jaxpr_accum._engine import _interpret

_conv_p = lax.conv_general_dilated_p


def _canonical_numbers(n: int) -> lax.ConvDimensionNumbers:
    spatial = tuple(range(1, n + 1))
    return lax.ConvDimensionNumbers(
        lhs_spec=(0, n + 1, *spatial),
        rhs_spec=(n + 1, n, *range(n)),
        out_spec=(0, n + 1, *spatial),
    )


def _transpose(x: Array, perm: Sequence[int]) -> Array:
    perm = tuple(int(p) for p in perm)
    return x if perm == tuple(range(len(perm))) else lax.transpose(x, perm)


def canonical_conv(
    lhs: Array, rhs: Array, *, dimension_numbers: lax.ConvDimensionNumbers, **rest: object
) -> Array:
    """``conv_general_dilated`` (equation params) with the convolution itself canonical."""
    params: Params = rest  # the equation's other params, as JAX types them
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    n = len(lhs_spec) - 2
    out_perm = (out_spec[0], *out_spec[2:], out_spec[1])
    lhs = _transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
    rhs = _transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
    single_group = params["feature_group_count"] == 1 and params["batch_group_count"] == 1
    if single_group and math.prod(rhs.shape[:n]) > math.prod(lhs.shape[1 : n + 1]):
        config = [(0, 0, 0)]
        for (lo, hi), d in zip(params["padding"], params["lhs_dilation"], strict=True):
            config.append((lo, hi, d - 1))
        config.append((0, 0, 0))
        lhs = lax.optimization_barrier(lax.pad(lhs, np.zeros((), lhs.dtype), config))
        params = {**params, "padding": ((0, 0),) * n, "lhs_dilation": (1,) * n}
    numbers = _canonical_numbers(n)
    groups = params["batch_group_count"]
    if 1 < groups < rhs.shape[-1]:
        per_batch, per_out = lhs.shape[0] // groups, rhs.shape[-1] // groups
        single = {**params, "batch_group_count": 1}
        out = lax.concatenate(
            [
                _conv_p.bind(
                    lax.slice_in_dim(lhs, g * per_batch, (g + 1) * per_batch, axis=0),
                    lax.slice_in_dim(rhs, g * per_out, (g + 1) * per_out, axis=n + 1),
                    dimension_numbers=numbers,
                    **single,
                )
                for g in range(groups)
            ],
            dimension=n + 1,
        )
    else:
        out = _conv_p.bind(lhs, rhs, dimension_numbers=numbers, **params)
    return _transpose(out, [int(i) for i in np.argsort(out_perm)])


def is_conv(eqn: Eqn) -> bool:
    return eqn.primitive is _conv_p


def is_float_conv(invals: Sequence[Array]) -> bool:
    return all(jax.numpy.issubdtype(x.dtype, jax.numpy.floating) for x in invals)


def _emit(idx: int, eqn: Eqn, invals: list[Array]) -> list[Array]:
    if is_conv(eqn) and is_float_conv(invals):
        with _compat.user_context(eqn):
            return [canonical_conv(*invals, **eqn.params)]
    return _compat.bind(eqn, invals)


def canonicalize(fun: Callable, may_convolve: bool = True) -> Callable:
    """``fun`` with its convolutions made canonical, on CPU (traced once and replayed); ``fun``
    itself elsewhere, and where its caller knows it holds none (``may_convolve`` False)."""
    if jax.default_backend() != "cpu" or not may_convolve:
        return fun

    def wrapped(*args: object) -> object:
        flat, tree = jax.tree_util.tree_flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *f: fun(*jax.tree_util.tree_unflatten(tree, f)), return_shape=True
        )(*flat)
        outs = _interpret.eval_jaxpr(closed, flat, _interpret.inlining(_emit))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    return wrapped
