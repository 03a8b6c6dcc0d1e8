"""The remat gradient mode: linearize the region into a linear primitive whose transpose is
the chunked backward pass.

Linearizing the region (``jax.grad``, ``jax.vjp``, ``jax.linearize``) runs the forward pass
for the primal outputs and records ``serialized_region_tangent`` with the region's inputs
(and the streamed sums' final stabilisers) as its only residuals: no activation is kept.

- Transposed (reverse mode), it is the remat backward (``Region.cotangents``): each chunk
  recomputed under ``jax.vjp``, the cotangents of loop-invariant inputs accumulated in the
  carry, those of chunked inputs stacked.
- Evaluated (``jax.linearize``'s linear function applied to tangents), it is the chunked
  forward-mode pass (``Region.tangents``).

Only the inputs the caller perturbs are differentiated (a ``while_loop`` on an input nobody
differentiates stays legal), and outputs with a zero cotangent are not pulled back at all.
An output no perturbed input reaches through differentiable equations (only through
``stop_gradient``, say) has a symbolic zero tangent (``Region.tangent_flags``), as JAX gives
it in the original: what reads only it after the region is not differentiated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._build._region import Region
from jaxpr_accum._build._signature import Inputs
from jaxpr_accum._compat import Array, Aval


def _perturbed(region: Region, flags: Sequence[bool]) -> Inputs:
    return region.signature.inputs(list(flags))


def linearize(
    region: Region, is_vjp: bool, nonzeros: list, primals: list, outputs_of: Callable
) -> tuple:
    sig = region.signature
    outs = outputs_of(primals)
    finals = sig.outputs(outs).finals
    perturbed = tuple(nz and has_float_dtype(p) for nz, p in zip(nonzeros, primals, strict=True))
    bound = sig.differentiable().flat()  # the tangent primitive's outputs
    out_flags = region.tangent_flags([_compat.aval_of(p) for p in primals], perturbed).flat()
    avals = [_compat.aval_of(x) for x in outs]

    def linearized(residuals: list, *tangents: Array) -> list:
        given = [t for t, p in zip(tangents, perturbed, strict=True) if p]
        dots = iter(tangent_p.bind(*residuals, *given, region=region, perturbed=perturbed))
        nonzero = [next(dots) if b else None for b in bound]
        return [
            t if f else _compat.zero_tangent(a)
            for t, f, a in zip(nonzero, out_flags, avals, strict=True)
        ]

    return outs, out_flags, [*primals, *finals], linearized


# -- the linear primitive ------------------------------------------------------------------
def _split_args(region: Region, args: Sequence, perturbed: Sequence[bool]) -> tuple:
    """``(inputs, finals, tangents as Inputs with None where not perturbed)``."""
    sig = region.signature
    n, m = sig.n_inputs, sig.streams.n_finals
    inputs, finals, given = sig.inputs(args[:n]), list(args[n : n + m]), iter(args[n + m :])
    tangents = sig.inputs([next(given) if p else None for p in perturbed])
    return inputs, finals, tangents


def _tangents(*args: Array, region: Region, perturbed: tuple) -> list:
    inputs, finals, tangents = _split_args(region, args, perturbed)
    return region.tangents(inputs, tangents, finals).flat()


def _abstract_eval(*avals: Aval, region: Region, perturbed: tuple) -> tuple:
    sig = region.signature
    inputs = avals[: sig.n_inputs]
    jaxpr = region.forward_jaxpr(list(inputs))
    flags = sig.differentiable().flat()
    out = [a.to_tangent_aval() for a, f in zip(jaxpr.out_avals, flags, strict=True) if f]
    return out, jaxpr.effects


def _transpose(cts: list, *args: Array, region: Region, perturbed: tuple) -> list:
    sig = region.signature
    n, m = sig.n_inputs, sig.streams.n_finals
    inputs, finals = sig.inputs(args[:n]), list(args[n : n + m])
    linear = iter(args[n + m :])
    wanted = [p and _compat.is_undefined_primal(next(linear)) for p in perturbed]
    given = iter(None if _compat.is_zero(c) else c for c in cts)
    full = [next(given) if f else None for f in sig.differentiable().flat()]
    grads = region.cotangents(inputs, sig.outputs(full), finals, _perturbed(region, wanted))
    out: list = [None] * (n + m)
    out += [g for g, p in zip(grads.flat(), perturbed, strict=True) if p]
    return out


def _jvp(primals: list, tangents: list, *, region: Region, perturbed: tuple) -> tuple:
    tangents = [_compat.instantiate(t) for t in tangents]

    def fn(*args: Array) -> list:
        return _tangents(*args, region=region, perturbed=perturbed)

    return jax.jvp(fn, tuple(primals), tuple(tangents))


def _batch(axis: object, args: list, dims: list, *, region: Region, perturbed: tuple) -> tuple:
    def fn(*a: Array) -> list:
        return _tangents(*a, region=region, perturbed=perturbed)

    outs = jax.vmap(fn, in_axes=tuple(dims))(*args)
    return outs, [0] * len(outs)


tangent_p = _compat.define_primitive(
    "serialized_region_tangent",
    abstract_eval=_abstract_eval,
    impl=_tangents,
    jvp=_jvp,
    batch=_batch,
    transpose=_transpose,
)
