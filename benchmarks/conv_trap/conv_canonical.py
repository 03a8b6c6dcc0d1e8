"""Convolutions whose gradients stay fast on XLA:CPU inside loops (``lax.scan`` / ``while``).

The trap
--------
XLA:CPU runs a convolution through its fast Eigen kernel only if the convolution is
*canonical*: dimension labels ``b01f_01io->b01f`` (input N,spatial...,C; kernel
spatial...,I,O; output N,spatial...,C), row-major layouts, no window reversal
(``PotentiallyImplementedAsEigenConvolution`` in ``xla/service/cpu/ir_emission_utils.cc``).
Every other convolution falls back to a naive loop nest emitted as LLVM IR, which is one
to two orders of magnitude slower.

JAX's transpose rules emit non-canonical convolutions for the gradients of an NHWC/HWIO
conv:

* weight gradient: ``conv(x, g)`` with labels ``f01b_i01o->01bf`` (the batch dim plays the
  contracted "feature" role, channels play "batch"/"output feature");
* input gradient: ``conv(g, rev(w))`` with labels ``b01f_01oi->b01f`` (kernel I/O swapped).

XLA:CPU has a pass to repair this, ``ConvCanonicalization``, which wraps a non-canonical
conv in transposes so the conv itself is canonical. But the pass only walks
``module->entry_computation()``; convolutions in a nested computation -- a ``while`` body
(``lax.scan``, ``fori_loop``), a ``conditional`` branch, a non-inlined call -- are left as
they are and hit the slow emitter. Hence: the same gradient is fast at top level and
~25x (weight grad) / ~9x (input grad) slower inside ``lax.scan``.

The fix
-------
Do by hand what ``ConvCanonicalization`` would have done: ``canonical_conv`` transposes
the operands to ``(N, spatial..., C)`` / ``(spatial..., I, O)``, runs the convolution with
canonical dimension numbers ``lhs_spec=(0, n+1, 1..n)``, ``rhs_spec=(n+1, n, 0..n-1)``,
``out_spec=(0, n+1, 1..n)`` -- i.e. ``('NHWC', 'HWIO', 'NHWC')`` for 2-D -- and transposes
the result back. Transposes are pure relabelings, so this is exact for any dimension
numbers, strides, dilations, padding and group counts (the groups live on the feature
dimensions, which keep their role). The transposes are cheap copies (often fused);
XLA:CPU does not fold transposes back into convolutions.

Two later XLA passes would turn some canonical convs non-canonical again, so
``canonical_conv`` pre-empts them:

* ``ConvOperandSwapper`` swaps input and kernel when the kernel's spatial extent exceeds the
  input's (the weight gradient of an lhs-dilated / transposed conv), adding window reversal.
  Then padding and lhs dilation are materialized with ``lax.pad`` behind an
  ``optimization_barrier`` (otherwise the simplifier folds the pad back into the conv).
* ``ConvolutionGroupConverter`` rewrites ``1 < batch_group_count < out_features`` (the weight
  gradient of a grouped, non-depthwise conv) into a conv with an extra spatial dim. Such a
  conv is split into ``batch_group_count`` canonical convs plus a concatenate.

``conv_canonical`` is a ``jax.custom_vjp`` drop-in for ``conv_general_dilated`` whose
forward and backward convolutions are all canonical: the backward traces JAX's own
transpose rules (so padding / dilation / group bookkeeping is JAX's) and re-emits every
convolution in them through ``canonical_conv``. ``canonicalize_convs`` applies the same
rewrite to any function (e.g. a chunk body's pullback) without a custom_vjp.

Measured (benchmarks/conv_trap/measure.py, 2 busy CPU cores, value_and_grad of
conv3x3-relu-conv3x3 on [64,32,32,16], 4 chunks): unchunked 23-58 ms, lax.scan +
checkpoint 0.8-1.6 s (25-55x), same scan with conv_canonical 28-77 ms (~1.2x; the rest is
remat's forward recompute).

Limitations: ``conv_canonical`` is a custom_vjp, so it supports reverse mode (and vmap,
checkpoint, scan) but not forward mode (``jax.jvp`` / ``jax.hessian``). Only f32 / f16 reach
Eigen at all; other dtypes are slow with or without this.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.extend.core import Literal

conv_p = lax.conv_general_dilated_p
ConvDimensionNumbers = lax.ConvDimensionNumbers

# The equation params of conv_general_dilated in this JAX version (e.g. out_sharding).
_PARAM_DEFAULTS = {
    k: v for k, v in jax.make_jaxpr(lambda a, b: lax.conv_general_dilated(a, b, (1,), "VALID"))(
        np.zeros((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.float32)).eqns[0].params.items()
    if k == "out_sharding"}

__all__ = ["canonical_conv", "conv_canonical", "canonicalize_convs", "is_canonical"]


def _canonical_dn(nspatial: int) -> ConvDimensionNumbers:
    sp = tuple(range(1, nspatial + 1))
    return ConvDimensionNumbers(
        lhs_spec=(0, nspatial + 1, *sp),
        rhs_spec=(nspatial + 1, nspatial, *range(nspatial)),
        out_spec=(0, nspatial + 1, *sp),
    )


def is_canonical(dimension_numbers: ConvDimensionNumbers) -> bool:
    return tuple(map(tuple, dimension_numbers)) == tuple(
        map(tuple, _canonical_dn(len(dimension_numbers.lhs_spec) - 2)))


def _transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    return x if perm == tuple(range(len(perm))) else lax.transpose(x, perm)


def canonical_conv(lhs, rhs, *, dimension_numbers, **params):
    """``conv_general_dilated_p.bind`` with the conv itself in canonical (NHWC/HWIO/NHWC) form.

    ``params`` are the remaining equation params of ``conv_general_dilated`` (window_strides,
    padding (explicit pairs), lhs_dilation, rhs_dilation, feature_group_count,
    batch_group_count, precision, preferred_element_type[, out_sharding]).
    """
    if not isinstance(dimension_numbers, ConvDimensionNumbers):
        dimension_numbers = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    n = len(lhs_spec) - 2
    lhs_perm = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])  # -> N, spatial..., C
    rhs_perm = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])  # -> spatial..., I, O
    out_perm = (out_spec[0], *out_spec[2:], out_spec[1])  # canonical out -> N, spatial..., C
    lhs, rhs = _transpose(lhs, lhs_perm), _transpose(rhs, rhs_perm)
    if (params["feature_group_count"] == 1 and params["batch_group_count"] == 1
            and np.prod(rhs.shape[:n]) > np.prod(lhs.shape[1:n + 1])):
        # XLA's ConvOperandSwapper would swap a conv whose kernel is larger than its input
        # (e.g. the weight gradient of a transposed / lhs-dilated conv) into a
        # non-canonical conv with window reversal. Materialize padding and lhs dilation
        # (zeros, exactly what the conv does) so the input is never smaller than the kernel.
        cfg = [(0, 0, 0)] + [(lo, hi, d - 1) for (lo, hi), d in
                             zip(params["padding"], params["lhs_dilation"])] + [(0, 0, 0)]
        # The barrier stops the algebraic simplifier folding the pad back into the conv.
        lhs = lax.optimization_barrier(lax.pad(lhs, np.zeros((), lhs.dtype), cfg))
        params = dict(params, padding=((0, 0),) * n, lhs_dilation=(1,) * n)
    groups = params["batch_group_count"]
    if 1 < groups < rhs.shape[-1]:
        # XLA:CPU rewrites batch-grouped convs (the weight gradient of a grouped conv) into
        # a conv with an extra spatial dim and non-canonical labels; only the depthwise case
        # (one output feature per group) stays canonical. Split the groups by hand instead:
        # batch (lhs dim 0) and output features (rhs dim -1) are group-major blocks.
        nb, ob = lhs.shape[0] // groups, rhs.shape[-1] // groups
        p1 = dict(params, batch_group_count=1)
        out = lax.concatenate(
            [conv_p.bind(lax.slice_in_dim(lhs, g * nb, (g + 1) * nb, axis=0),
                         lax.slice_in_dim(rhs, g * ob, (g + 1) * ob, axis=n + 1),
                         dimension_numbers=_canonical_dn(n), **p1) for g in range(groups)],
            dimension=n + 1)
    else:
        out = conv_p.bind(lhs, rhs, dimension_numbers=_canonical_dn(n), **params)
    return _transpose(out, np.argsort(out_perm))


# ---------------------------------------------------------------------------------------
# Rewrite every conv in a traced function into canonical form.


def _eval_canonical(jaxpr, consts, *args):
    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive is conv_p:
            outs = [canonical_conv(*invals, **eqn.params)]
        elif eqn.primitive.name in ("jit", "pjit", "closed_call") and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]  # inline: a nested jit may hold convs too
            outs = _eval_canonical(inner.jaxpr, inner.consts, *invals)
        else:
            # Other nested jaxprs (remat, scan, cond, custom_*) are re-bound as they are;
            # the convs of a gradient rule / a plain pullback are at top level or in a jit.
            bind_params = eqn.primitive.get_bind_params(eqn.params)
            subfuns, bind_params = bind_params if isinstance(bind_params, tuple) else ([], bind_params)
            outs = eqn.primitive.bind(*subfuns, *invals, **bind_params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def canonicalize_convs(fun):
    """``fun`` with every top-level ``conv_general_dilated`` rewritten by ``canonical_conv``."""

    @functools.wraps(fun)
    def wrapped(*args):
        flat, tree = jax.tree.flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *f: fun(*jax.tree.unflatten(tree, f)), return_shape=True)(*flat)
        outs = _eval_canonical(closed.jaxpr, closed.consts, *flat)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return wrapped


def _explicit_padding(lhs_shape, rhs_shape, dn, strides, padding, lhs_dilation, rhs_dilation):
    """String padding -> (lo, hi) pairs, exactly as ``lax.conv_general_dilated`` does it."""
    if any(d != 1 for d in lhs_dilation):
        raise ValueError("string padding with lhs_dilation is not supported (as in lax)")
    k = [(int(s) - 1) * int(r) + 1 if s else 0
         for s, r in zip(np.take(rhs_shape, dn.rhs_spec[2:]), rhs_dilation)]
    return lax.padtype_to_pads(np.take(lhs_shape, dn.lhs_spec[2:]), k, strides, padding)


# ---------------------------------------------------------------------------------------
# Drop-in replacement for conv_general_dilated_p with fast gradients.


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(lhs, rhs, params):
    return canonical_conv(lhs, rhs, **dict(params))


def _conv_fwd(lhs, rhs, params):
    return canonical_conv(lhs, rhs, **dict(params)), (lhs, rhs)


def _conv_bwd(params, res, g):
    lhs, rhs = res
    p = dict(params)

    def grads(lhs, rhs, g):
        # JAX's own transpose rules (no forward conv is traced: linear_transpose only).
        dlhs, = jax.linear_transpose(lambda l: conv_p.bind(l, rhs, **p), lhs)(g)
        drhs, = jax.linear_transpose(lambda r: conv_p.bind(lhs, r, **p), rhs)(g)
        return dlhs, drhs

    return tuple(canonicalize_convs(grads)(lhs, rhs, g))


_conv.defvjp(_conv_fwd, _conv_bwd)


class _Hashable(tuple):
    """Params as a hashable, order-stable tuple of (name, value) for nondiff_argnums."""


def conv_canonical(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation,
                   dimension_numbers, feature_group_count, batch_group_count, precision,
                   preferred_element_type, **extra):
    """Drop-in for ``conv_general_dilated_p.bind(lhs, rhs, **eqn.params)``.

    Same params as the jaxpr equation of ``conv_general_dilated`` (``padding`` given as
    explicit ``(lo, hi)`` pairs, ``dimension_numbers`` a ``ConvDimensionNumbers``); extra
    params of newer JAX versions (``out_sharding``) pass through. Values are identical and
    gradients equal JAX's up to float reassociation, but every convolution it emits --
    forward, input gradient, weight gradient -- is canonical for XLA:CPU, so it stays fast
    inside ``lax.scan``. Non-float inputs fall back to the plain primitive.
    """
    if not isinstance(dimension_numbers, ConvDimensionNumbers):
        dimension_numbers = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    if isinstance(padding, str):
        padding = _explicit_padding(lhs.shape, rhs.shape, dimension_numbers, window_strides,
                                    padding, lhs_dilation, rhs_dilation)
    params = dict(window_strides=tuple(window_strides),
                  padding=tuple(tuple(int(a) for a in p) for p in padding),
                  lhs_dilation=tuple(lhs_dilation), rhs_dilation=tuple(rhs_dilation),
                  dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
                  batch_group_count=batch_group_count, precision=precision,
                  preferred_element_type=preferred_element_type)
    params.update({**_PARAM_DEFAULTS, **extra})
    if not (jax.numpy.issubdtype(lhs.dtype, jax.numpy.floating)
            and jax.numpy.issubdtype(rhs.dtype, jax.numpy.floating)):
        return conv_p.bind(lhs, rhs, **params)
    return _conv(lhs, rhs, _Hashable(sorted(params.items(), key=lambda kv: kv[0])))


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         batch_group_count=1, precision=None, preferred_element_type=None):
    """User-level ``lax.conv_general_dilated`` signature on top of ``conv_canonical``."""
    n = lhs.ndim - 2
    lhs_dilation = lhs_dilation or (1,) * n
    rhs_dilation = rhs_dilation or (1,) * n
    dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    return conv_canonical(lhs, rhs, window_strides=tuple(window_strides), padding=padding,
                          lhs_dilation=tuple(lhs_dilation), rhs_dilation=tuple(rhs_dilation),
                          dimension_numbers=dn, feature_group_count=feature_group_count,
                          batch_group_count=batch_group_count, precision=precision,
                          preferred_element_type=preferred_element_type)
