"""The region as one JAX primitive, ``serialized_region``, whose rules run it in chunks.

``call(region, mode, inputs)`` binds the primitive on the region's flat inputs. Its
parameters are the ``Region`` (``_region``), the gradient ``Mode`` and the forward pass as a
jaxpr (so ``jax.make_jaxpr`` of a serialized function shows the loop). Its rules:

- evaluation and lowering: the forward pass, the chunk loop without checkpoints;
- **linearization** (``jax.grad``, ``jax.vjp``, ``jax.linearize``): the mode's own rule
  (``_remat``: a linear primitive whose transpose is the chunked backward; ``_fused``: the
  Jacobian rows computed in the forward pass);
- **JVP** (``jax.jvp``, ``jax.jacfwd``, and linearization where JAX goes through the JVP, as
  inside ``jax.checkpoint``): ``jax.jvp`` of the forward pass with each chunk's body
  checkpointed, which is chunked in both the primal and the tangent; an output no perturbed
  input reaches (through ``stop_gradient``, say) gets a symbolic zero tangent, as JAX gives
  it (``Region.tangent_flags``), so what reads only it is not differentiated. The primal
  outputs that a linearization rule binds (``linearizing=True``; an outer JVP meets them under
  ``jax.hessian``) are differentiated as computed inside ``jax.vjp``, as JAX differentiates
  the original's: a custom VJP runs its forward rule there, a custom JVP its rule's primal;
  and linearized again (reverse over reverse), a region with a custom rule takes JAX's
  linearization of that JVP;
- **batching** (``jax.vmap`` over any argument): ``jax.vmap`` of that same checkpointed
  forward pass.

Why this is exact by construction: the JVP and batching rules are JAX's own transformations
of a plain JAX program (the chunk loop), which computes the original's values; JAX then
differentiates or batches further whatever it gets. Only the linearization rules are
hand-written, and they are only used where the region's inputs are linearized directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxpr_accum import _compat, _table
from jaxpr_accum._region import Region
from jaxpr_accum._signature import Inputs, Outputs


class Mode:
    """A gradient mode, as ``grad=`` names it (``name``), with its linearization rule of the
    region primitive, ``linearize(region, is_vjp, nonzeros, primals, outputs_of) -> (outputs,
    output nonzeros, residuals, linearized)`` (see ``_compat.define_primitive``);
    ``outputs_of(primals)`` binds the primitive again. ``REMAT`` (``_remat``) and ``FUSED``
    (``_fused``) have one; ``NATIVE`` (the chunk loop with checkpointed bodies, differentiated
    by JAX itself) and ``AUTO`` (a request: planning chooses one of the others, ``_choice``)
    never bind the primitive's linearization. Names are parsed once, from the settings, into
    these objects (``_choice.mode_named``); plans report ``name``."""

    def __init__(self, name: str, linearize: Callable | None = None):
        self.name = name
        self.linearize: Callable = linearize or self._not_bound

    def _not_bound(self, *_: Any) -> Any:
        raise TypeError(f"the {self.name} gradient mode has no linearization rule of its own")

    def __repr__(self) -> str:
        return self.name


AUTO = Mode("auto")
NATIVE = Mode("native")


def call(region: Region, mode: Mode, inputs: Inputs) -> Outputs:
    """The region's outputs on ``inputs``, through the primitive."""
    flat = inputs.flat()
    jaxpr = region.forward_jaxpr([_compat.aval_of(x) for x in flat])
    outs = region_p.bind(*flat, region=region, mode=mode, jaxpr=jaxpr, linearizing=False)
    return region.signature.outputs(outs)


def _checkpointed(region: Region) -> Callable:
    def forward(*flat: Any) -> list:
        return region.forward(region.signature.inputs(flat), checkpoint=True).flat()

    return forward


def _abstract_eval(*avals: Any, jaxpr: Any, **_: Any) -> tuple:
    return list(jaxpr.out_avals), jaxpr.effects


def _impl(*flat: Any, jaxpr: Any, **_: Any) -> list:
    return jax.extend.core.jaxpr_as_fun(jaxpr)(*flat)


def _jvp(primals: list, tangents: list, *, region: Region, linearizing: bool, **_: Any) -> tuple:
    avals = [_compat.aval_of(p) for p in primals]
    reached = region.tangent_flags(avals, [not _compat.is_zero(t) for t in tangents]).flat()
    tangents = [_compat.instantiate(t) for t in tangents]
    forward = _checkpointed(region)
    if linearizing:  # forward over reverse: differentiate the primal as a VJP computes it
        forward = _primal_of_vjp(forward)
    outs, dots = jax.jvp(forward, tuple(primals), tuple(tangents))
    # symbolic zeros where no perturbed input reaches (``stop_gradient``), as JAX gives them
    zeros = [_compat.zero_tangent(_compat.aval_of(o)) for o in outs]
    return outs, [t if r else z for t, r, z in zip(dots, reached, zeros, strict=True)]


def _primal_of_vjp(fun: Callable) -> Callable:
    """``fun``'s outputs computed inside ``jax.vjp``: a custom VJP in it then runs its forward
    rule, which an outer JVP differentiates (as JAX does for the original under
    ``jax.hessian``); ``jax.jvp`` of the custom VJP itself is an error."""
    return lambda *args: jax.vjp(fun, *args)[0]


def _batch(args: list, dims: list, *, region: Region, **_: Any) -> tuple:
    outs = jax.vmap(_checkpointed(region), in_axes=tuple(dims))(*args)
    return outs, [0] * len(outs)


def _linearize(
    is_vjp: bool, nonzeros: list, *primals: Any, region: Region, mode: Mode, **p: Any
) -> tuple:
    if p["linearizing"] and region.split.custom_rule_in_body() is not None:
        # reverse over reverse: the outer derivative of a custom rule's primal is that of the
        # primal its rule computes (a custom VJP's forward rule, a custom JVP's primal output),
        # as for the original; the mode's rule would pull back through the custom derivative
        params = {"region": region, "mode": mode, **p}
        return _compat.linearize_from_jvp(region_p, is_vjp, nonzeros, primals, params)

    def outputs_of(flat: list) -> list:
        return region_p.bind(*flat, region=region, mode=mode, jaxpr=p["jaxpr"], linearizing=True)

    return mode.linearize(region, is_vjp, list(nonzeros), list(primals), outputs_of)


region_p = _compat.define_primitive(
    "serialized_region",
    abstract_eval=_abstract_eval,
    impl=_impl,
    jvp=_jvp,
    batch=_batch,
    linearize=_linearize,
)

# An outer ``serialize_axis`` does not enter an inner one's region: its loop is already chunked.
_table.register(
    region_p,
    _table.Barrier(
        "this is the region of an inner `serialize_axis` (primitive `{name}`), already "
        "chunked: serialize the inner function's `.original` instead, or drop one of the two"
    ),
)
