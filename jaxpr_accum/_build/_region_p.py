"""The region as one JAX primitive, ``serialized_region``, whose rules run it in chunks.

``call(region, mode, inputs)`` binds the primitive on the region's flat inputs (native
binds the chunk loop with checkpointed bodies instead, as one equation that JAX
differentiates as the loop itself: ``_compat.loop_call``). Its
parameters are the ``Region`` (``_region``), the gradient ``Mode``, the forward pass as a
jaxpr (so ``jax.make_jaxpr`` of a serialized function shows the loop) and ``used_outputs``:
which of the region's outputs the equation returns (None: all; the forward jaxpr returns
those only). Its rules:

- evaluation and lowering: the forward pass, the chunk loop without checkpoints;
- **linearization** (``jax.grad``, ``jax.vjp``, ``jax.linearize``): the mode's own rule
  (``_remat``: a linear primitive whose transpose is the chunked backward; ``_fused``: the
  Jacobian rows computed in the forward pass);
- **JVP** (``jax.jvp``, ``jax.jacfwd``, and linearization where JAX goes through the JVP, as
  inside ``jax.checkpoint``): ``jax.jvp`` of the forward pass with each chunk's body
  checkpointed, which is chunked in both the primal and the tangent, as one equation
  (``_compat.loop_call``: ``jax.vmap`` keeps it one, which ``checkify`` checks per
  element); an output no perturbed input reaches (through ``stop_gradient``, say) gets a
  symbolic zero tangent, as JAX gives it (``Region.tangent_flags``), so what reads only it
  is not differentiated. The primal
  outputs that a linearization rule binds (``linearizing=True``; an outer JVP meets them under
  ``jax.hessian``) are differentiated as computed inside ``jax.vjp``, as JAX differentiates
  the original's: a custom VJP runs its forward rule there, a custom JVP its rule's primal;
  and linearized again (reverse over reverse), a region with a custom rule takes JAX's
  linearization of that JVP;
- **batching** (``jax.vmap`` over any argument, through JAX's batching table): that same
  checkpointed forward pass as a jaxpr, batched by JAX over the vmapped axis, as one
  equation that ``checkify`` checks element by element (``_compat.batched_loop_call``); an
  output that no batched argument reaches stays unbatched, as in the original (an ordered
  callback on it runs as in the original, f12); with no argument batched, the primitive;
- **checkify** (``jax.experimental.checkify``, ``_compat.checks_through``): where a check
  of the enabled error set can fire inside the region, its checkpointed forward pass,
  checkified (the error carried through the chunks in order, one slot per check site, as
  for every pass of the region: ``Region.scope``);
- **dead-code elimination** (``jax.jit``, ``jax.vjp``, ``pe.dce_jaxpr``): the equation keeps
  the used outputs only, its forward jaxpr is pruned to them (so the unused ones are not
  computed); its inputs all stay (the region's signature has them all) and so do its effects.
  Every other rule computes the whole region and returns the used outputs.

Why this is exact by construction: the JVP, batching and dead-code rules are JAX's own
transformations of a plain JAX program (the chunk loop), which computes the original's values;
JAX then differentiates or batches further whatever it gets. Only the linearization rules are
hand-written, and they are only used where the region's inputs are linearized directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import jax

from jaxpr_accum import _compat
from jaxpr_accum._build._region import Region
from jaxpr_accum._build._signature import Inputs, Outputs
from jaxpr_accum._compat import Array, Aval, ClosedJaxpr, Eqn, Params
from jaxpr_accum._engine import _table

#: A mode's linearization rule of the primitive: ``(region, is_vjp, nonzeros, primals,
#: outputs_of) -> (outputs, output nonzeros, residuals, linearized)`` (see
#: ``_compat.define_primitive``); ``outputs_of(primals)`` binds the primitive again.
Linearize = Callable[[Region, bool, list, list, Callable[[list], list]], tuple]


class GradientMode(Protocol):
    """What the primitive needs of a gradient mode (``_modes._mode.Mode`` declares the four):
    its ``name``, its ``linearize`` rule, and whether JAX differentiates the chunk loop itself
    (``jax_differentiates``: the primitive is not bound, the loop's bodies are checkpointed)."""

    @property
    def name(self) -> str: ...

    @property
    def linearize(self) -> Linearize: ...

    @property
    def jax_differentiates(self) -> bool: ...


def call(region: Region, mode: GradientMode, inputs: Inputs) -> Outputs:
    """The region's outputs on ``inputs`` in ``mode``: through the primitive, or where JAX
    differentiates the loop (native) without it, the chunk loop with checkpointed bodies."""
    if mode.jax_differentiates:
        flat = inputs.flat()
        closed = region.forward_jaxpr([_compat.aval_of(x) for x in flat], checkpoint=True)
        if _compat.debug_checks_on():  # a value the loop makes invalid named as written
            return region.signature.outputs(_compat.checked_call(closed, flat, region.as_written))
        # one equation, differentiated as JAX differentiates the loop (``jax.vmap`` keeps it
        # one, which ``checkify`` checks per element)
        return region.signature.outputs(_compat.loop_call(closed, flat, region.scope))
    flat = inputs.flat()
    outs = _bind(region, mode, flat, linearizing=False)
    return region.signature.outputs(outs)


def _bind(region: Region, mode: GradientMode, flat: list, linearizing: bool) -> list:
    """The primitive bound on ``flat``, every output used."""
    jaxpr = region.forward_jaxpr([_compat.aval_of(x) for x in flat])
    return region_p.bind(
        *flat, region=region, mode=mode, jaxpr=jaxpr, linearizing=linearizing, used_outputs=None
    )


def _used(values: list, used_outputs: tuple | None) -> list:
    """The ``values`` (one per output of the region) of the outputs the equation returns."""
    if used_outputs is None:
        return list(values)
    return [v for v, u in zip(values, used_outputs, strict=True) if u]


def _checkpointed(region: Region) -> Callable:
    def forward(*flat: Array) -> list:
        return region.forward(region.signature.inputs(flat), checkpoint=True).flat()

    return forward


def _checkpointed_loop(region: Region) -> Callable:
    """The forward pass with checkpointed bodies as one equation (``_compat.loop_call``),
    which JAX differentiates and batches as one (``checkify`` checks it per element); where
    ``jax_debug_nans`` is on, inline, its equations run eagerly as the original's do."""
    if _compat.debug_checks_on():
        return _checkpointed(region)

    def forward(*flat: Array) -> list:
        closed = region.forward_jaxpr([_compat.aval_of(x) for x in flat], checkpoint=True)
        return _compat.loop_call(closed, flat, region.scope)

    return forward


def _abstract_eval(*avals: Aval, jaxpr: ClosedJaxpr, **_: object) -> tuple:
    return list(jaxpr.out_avals), jaxpr.effects


def _impl(*flat: Array, jaxpr: ClosedJaxpr, **_: object) -> list:
    return jax.extend.core.jaxpr_as_fun(jaxpr)(*flat)


def _deoptimized(*flat: Array, region: Region, **_: object) -> None:
    """The region's equations as written, one by one (``jax_debug_nans``): the first that
    makes an invalid value raises JAX's error naming it, as in the original's de-optimized
    run."""
    region.as_written(*flat)


def _jvp(
    primals: list,
    tangents: list,
    *,
    region: Region,
    linearizing: bool,
    used_outputs: tuple | None,
    **_: object,
) -> tuple:
    avals = [_compat.aval_of(p) for p in primals]
    perturbed = [not _compat.is_zero(t) for t in tangents]
    reached = region.tangent_flags(avals, perturbed).flat()
    # differentiated with respect to the perturbed inputs only, the others fixed: they keep
    # JAX's symbolic zeros (a custom VJP refuses any other tangent for a value it closes over)
    forward = _of_perturbed(_checkpointed_loop(region), primals, perturbed)
    if linearizing:  # forward over reverse: differentiate the primal as a VJP computes it
        forward = _primal_of_vjp(forward)
    dyn = [p for p, d in zip(primals, perturbed, strict=True) if d]
    dyn_tangents = [t for t, d in zip(tangents, perturbed, strict=True) if d]
    outs, dots = jax.jvp(forward, tuple(dyn), tuple(dyn_tangents))
    # symbolic zeros where no perturbed input reaches (``stop_gradient``), as JAX gives them
    zeros = [_compat.zero_tangent(_compat.aval_of(o)) for o in outs]
    dots = [t if r else z for t, r, z in zip(dots, reached, zeros, strict=True)]
    return _used(outs, used_outputs), _used(dots, used_outputs)


def _of_perturbed(fun: Callable, primals: list, perturbed: list[bool]) -> Callable:
    """``fun`` as a function of its ``perturbed`` arguments, the others fixed at ``primals``."""

    def partial(*dyn: Array) -> list:
        it = iter(dyn)
        return fun(*(next(it) if d else p for p, d in zip(primals, perturbed, strict=True)))

    return partial


def _primal_of_vjp(fun: Callable) -> Callable:
    """``fun``'s outputs computed inside ``jax.vjp``: a custom VJP in it then runs its forward
    rule, which an outer JVP differentiates (as JAX does for the original under
    ``jax.hessian``); ``jax.jvp`` of the custom VJP itself is an error."""
    return lambda *args: jax.vjp(fun, *args)[0]


def _checkpointed_jaxpr(params: Params) -> ClosedJaxpr:
    """The equation's forward pass (its used outputs) with each chunk's body checkpointed."""
    closed = params["region"].forward_jaxpr(params["jaxpr"].in_avals, checkpoint=True)
    used = params["used_outputs"]
    return closed if used is None else _compat.dce(closed, used)


def _batch(
    axis: object, args: list, dims: list, *, region: Region, jaxpr: ClosedJaxpr, **p: object
) -> tuple:
    # JAX batches the checkpointed loop's jaxpr: outputs no batched argument reaches stay
    # unbatched (dim None), as the original's do
    closed = _checkpointed_jaxpr({"region": region, "jaxpr": jaxpr, **p})
    if _compat.debug_checks_on():  # its equations run eagerly, as the original's do
        return _compat.run_batched(closed, axis, dims, args)
    # one equation, which ``checkify`` checks per element
    outs, out_batched = _compat.batched_loop_call(closed, args, region.scope, axis, dims)
    return outs, [0 if b else None for b in out_batched]


def _dce(used: list[bool], eqn: Eqn) -> tuple[list[bool], Eqn | None]:
    if not any(used) and not _compat.has_effects(eqn):
        return [False] * len(eqn.invars), None
    if all(used):
        return [True] * len(eqn.invars), eqn
    # keep every input (the region's signature has them all), prune the forward jaxpr
    p = eqn.params
    jaxpr = _compat.dce(p["jaxpr"], used)
    returned = iter(used)
    before = [True] * len(eqn.outvars) if p["used_outputs"] is None else p["used_outputs"]
    params = {**p, "jaxpr": jaxpr, "used_outputs": tuple(b and next(returned) for b in before)}
    outvars = [v for v, u in zip(eqn.outvars, used, strict=True) if u]
    return [True] * len(eqn.invars), eqn.replace(
        outvars=outvars, params=params, effects=jaxpr.effects
    )


def _linearize(
    is_vjp: bool,
    nonzeros: list,
    *primals: Array,
    region: Region,
    mode: GradientMode,
    linearizing: bool,
    used_outputs: tuple | None,
    **p: object,
) -> tuple:
    if linearizing and region.split.custom_rule_in_body is not None:
        # reverse over reverse: the outer derivative of a custom rule's primal is that of the
        # primal its rule computes (a custom VJP's forward rule, a custom JVP's primal output),
        # as for the original; the mode's rule would pull back through the custom derivative
        params = {"region": region, "mode": mode, **p}  # in the equation's order:
        params.update(linearizing=linearizing, used_outputs=used_outputs)  # after ``jaxpr``
        return _compat.linearize_from_jvp(region_p, is_vjp, nonzeros, primals, params)

    def outputs_of(flat: list) -> list:
        return _bind(region, mode, flat, linearizing=True)

    outs, nz, res, linearized = mode.linearize(
        region, is_vjp, list(nonzeros), list(primals), outputs_of
    )
    if used_outputs is None:
        return outs, nz, res, linearized

    def linearized_used(residuals: list, *tangents: object) -> list:
        return _used(linearized(residuals, *tangents), used_outputs)

    return _used(outs, used_outputs), _used(nz, used_outputs), res, linearized_used


_compat.held_weakly_in_caches(Region)  # the region owns its plan: freed with its function
region_p = _compat.define_primitive(
    "serialized_region",
    abstract_eval=_abstract_eval,
    impl=_impl,
    jvp=_jvp,
    batch=_batch,
    linearize=_linearize,
    dce=_dce,
    deoptimized=_deoptimized,
)
_compat.checks_through(region_p, _checkpointed_jaxpr)

# An outer ``serialize_axis`` does not enter an inner one's region: its loop is already chunked.
_table.register(
    region_p,
    _table.Barrier(
        "this is the region of an inner `serialize_axis` (primitive `{name}`), already "
        "chunked: serialize the inner function's `.original` instead, or drop one of the two"
    ),
)
