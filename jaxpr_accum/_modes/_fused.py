"""The fused gradient mode: the value and the Jacobian rows of the region's gradient-carrying
sums in one forward pass (``_jacobians``: one forward and one backward per chunk), so that the
backward pass only contracts them with the incoming cotangent. ``value_and_grad`` then costs
one forward and one backward, not the extra forward of remat. Exact where the chunk's pullback
is linear in the cotangent: ``_choice`` refuses regions with a custom VJP, streamed sums or
outputs other than sums; inside ``shard_map`` it takes the remat rule where a sum is
replicated over a manual axis that an input varies over."""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._build._region import Region
from jaxpr_accum._compat import Array
from jaxpr_accum._modes._remat import linearize as remat_linearize


def linearize(
    region: Region, is_vjp: bool, nonzeros: list, primals: list, outputs_of: Callable
) -> tuple:
    """The fused mode's linearization: the sums and their Jacobian rows in one pass; the
    linear function contracts the rows with the tangents, which JAX transposes into the
    contraction with the cotangents. ``jax.linearize`` (not a VJP) takes the remat rule:
    Jacobian rows would cost more than the tangents they serve."""
    if not is_vjp or _replicated_sum(region, primals):
        return remat_linearize(region, is_vjp, nonzeros, primals, outputs_of)
    sig, split = region.signature, region.split
    inputs = sig.inputs(primals)
    perturbed = sig.inputs(
        [nz and has_float_dtype(p) for nz, p in zip(nonzeros, primals, strict=True)]
    )
    sums, jac = region.jacobians(inputs, perturbed)
    flags = split.gradient_sums  # the sums with Jacobian rows
    reached = region.tangent_flags([_compat.aval_of(p) for p in primals], perturbed.flat()).sums
    residuals = [j for j in jac.flat() if j is not None]
    avals = [_compat.aval_of(s) for s in sums]

    def linearized(res: list, *tangents: Array) -> list:
        with jax.named_scope(region.scope):  # the region's backward pass (``Region.scope``)
            return contracted(res, tangents)

    def contracted(res: list, tangents: tuple) -> list:
        held = iter(res)
        rows = None
        for j, t in zip(jac.flat(), tangents, strict=True):
            if j is None:
                continue
            jr = next(held)
            t = _compat.instantiate(t).astype(jr.dtype)
            # a product and a sum, not a dot: the contracted dimensions may be sharded
            if jr.ndim == t.ndim:  # one row, in the input's own shape (``_jacobians``)
                part = jnp.sum(jr * t)[None]
            else:
                part = jnp.sum(jr * t[None], axis=tuple(range(1, jr.ndim)))
            rows = part if rows is None else rows + part
        out, start = [], 0
        for s, f, r, a in zip(sig.sums, flags, reached, avals, strict=True):
            shaped = _compat.shaped(s)
            n = math.prod(shaped.shape) if f else 0
            if not (f and r):  # a sum only reached through ``stop_gradient``: a symbolic zero
                out.append(_compat.zero_tangent(a))
            else:
                piece = rows[start : start + n] if rows is not None else jnp.zeros((n,))
                if not jnp.issubdtype(shaped.dtype, jnp.complexfloating):  # a real sum: its part
                    piece = jnp.real(piece)
                out.append(piece.reshape(shaped.shape).astype(shaped.dtype))
            start += n
        return out

    return sums, [bool(f and r) for f, r in zip(flags, reached, strict=True)], residuals, linearized


def _replicated_sum(region: Region, primals: list) -> bool:
    """Inside ``shard_map``: some sum is replicated over a manual axis that an input varies
    over. The Jacobian rows are computed per device (``_jacobians``), which would make that
    sum vary; the remat rule keeps its type."""
    axes = _compat.union_varying(primals)
    if not axes:
        return False
    outs = region.forward_jaxpr([_compat.aval_of(p) for p in primals]).out_avals
    return any(not axes <= _compat.varying_axes(a) for a in region.signature.outputs(outs).sums)
