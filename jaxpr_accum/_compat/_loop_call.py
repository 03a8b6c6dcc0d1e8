"""The chunk loop as one equation that ``jax.vmap`` and derivatives keep one, so that
``checkify`` checks it per element, as the original's checks of the whole batch report.

JAX batches a loop traced inline op by op: under ``checkify(jax.vmap(f))`` each check then
covers one chunk of every element at once, so of a check that fires in two elements the one
whose row comes in the earlier chunk is reported, where the original, which checks the whole
batch at once, reports the first element's. So the loop is bound as one equation of the
primitive ``serialized_region_loop`` (``loop_call``), whose parameters keep it unbatched:
``jaxpr`` (what the equation computes: the loop, or the loop batched by JAX), ``scope`` (the
name scope the loop was traced in) and ``batched`` (``Batched``: the loop unbatched and where
it was batched; None where ``jaxpr`` is the loop). Its rules:

- evaluation and lowering run ``jaxpr``;
- batching binds it again with the loop batched (``batched_loop_call``, also the region
  primitive's batching rule); batched a second time, ``jaxpr`` batched again, inline;
- the JVP is JAX's JVP of the loop as one equation, and the linearization (``jax.grad``,
  ``jax.vjp``) JAX's linearization of the loop, whose forward pass (the primal outputs and
  the residuals) is one equation and whose linear part runs inline; batched, both are taken
  of the unbatched loop and batched alike, so ``checkify`` still checks them per element
  (with a custom VJP in the loop, whose linear part JAX cannot batch apart, the batched
  loop's, inline);
- partial evaluation (``jax.linearize`` through the JVP, a loop of the user's around it)
  runs ``jaxpr`` inline; split by a policy (``jax.checkpoint``), into two equations as JAX
  splits a call, unbatched; JAX then transposes what it staged after evaluating it in part
  again, which runs it inline;
- dead-code elimination prunes ``jaxpr`` and the unbatched loop to the used outputs.

``_checks._rules`` holds its ``checkify`` rule.

Invariant: the values are ``jaxpr``'s, the loop's, under every transformation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax

from jaxpr_accum._compat._custom import is_custom_vjp_call
from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._region import (
    batch_jaxpr,
    dce,
    define_primitive,
    has_effects,
    is_zero,
    linearize_from_jvp,
    run_batched,
    zero_tangent,
)
from jaxpr_accum._compat._types import ClosedJaxpr, Eqn, Primitive
from jaxpr_accum._compat._walk import first_eqn

_AD, _PE = "jax._src.interpreters.ad.", "jax._src.interpreters.partial_eval."
#: the primitive's name
LOOP_CALL = "serialized_region_loop"


@dataclasses.dataclass(frozen=True, eq=False)
class Batched:
    """Where the equation's ``jaxpr`` is a loop batched by JAX: the ``loop`` unbatched, the
    vmapped ``axis`` (JAX's ``AxisData``), the inputs' ``in_dims`` and which outputs are
    batched (``out_batched``, at 0). A parameter that JAX's walkers of inner jaxprs and its
    printer do not open: the loop is listed once."""

    loop: ClosedJaxpr
    axis: Any
    in_dims: tuple[int | None, ...]
    out_batched: tuple[bool, ...]

    def __repr__(self) -> str:
        return f"Batched(in_dims={self.in_dims}, out_batched={self.out_batched})"


def loop_call(loop: ClosedJaxpr, args: Sequence[object], scope: str) -> list:
    """``loop`` (traced in the name scope ``scope``) applied to ``args``, as one equation
    (the module's docstring)."""
    return loop_p().bind(*args, jaxpr=loop, scope=scope, batched=None)


def batched_loop_call(
    loop: ClosedJaxpr, args: Sequence[object], scope: str, axis: Any, dims: Sequence[int | None]
) -> tuple[list, list[bool]]:
    """``(outputs, which are batched)``: ``loop`` (traced in the name scope ``scope``)
    batched by JAX over ``axis`` (JAX's ``AxisData``) at the inputs' ``dims`` and applied to
    ``args``, as one equation in ``scope`` (``checkify`` takes it for the loop's run, which
    it checks per element); an output no batched input reaches stays unbatched."""
    jaxpr, out_batched = batch_jaxpr(loop, axis, dims)
    batched = Batched(loop, axis, tuple(dims), tuple(out_batched))
    with jax.named_scope(scope):
        outs = loop_p().bind(*args, jaxpr=jaxpr, scope=scope, batched=batched)
    return outs, out_batched


@functools.cache
def loop_p() -> Primitive:
    def impl(*args: object, jaxpr: ClosedJaxpr, **_: object) -> list:
        return jax.extend.core.jaxpr_as_fun(jaxpr)(*args)

    def batch(
        axis: Any, args: list, dims: list, *, jaxpr: ClosedJaxpr, scope: str, batched: Any
    ) -> tuple:
        if batched is not None:  # batched a second time: inline
            return run_batched(jaxpr, axis, dims, args)
        outs, out_batched = batched_loop_call(jaxpr, args, scope, axis, dims)
        return outs, [0 if b else None for b in out_batched]

    p = define_primitive(
        LOOP_CALL,
        abstract_eval=lambda *_, jaxpr, **__: (list(jaxpr.out_avals), jaxpr.effects),
        impl=impl,
        jvp=_jvp,
        batch=batch,
        linearize=_linearize,
        dce=_dce,
    )
    internal(_PE + "custom_partial_eval_rules")[p] = _partial_eval
    split_call = internal(_PE + "closed_call_partial_eval_custom_rule")
    internal(_PE + "partial_eval_jaxpr_custom_rules")[p] = functools.partial(
        split_call, "jaxpr", _staged_apart
    )
    return p


def _jvp(primals: list, tangents: list, *, jaxpr: ClosedJaxpr, scope: str, batched: Any) -> tuple:
    """JAX's JVP of the loop, as one equation: symbolic zeros in, and out where no perturbed
    input reaches, as for the loop traced inline."""
    nonzeros = [not is_zero(t) for t in tangents]
    if not _batches_apart(batched):
        return _inline_jvp(jaxpr, primals, tangents, nonzeros)
    loop = jaxpr if batched is None else batched.loop
    jvp_loop, out_nonzeros = internal(_AD + "jvp_jaxpr")(loop, nonzeros, False)
    n = len(loop.out_avals)
    dims = batched and [*batched.in_dims, *_kept(batched.in_dims, nonzeros)]
    one, params, flags = _as_one(jvp_loop, batched, dims)
    if batched is not None:
        wanted = [*batched.out_batched, *_kept(batched.out_batched, out_nonzeros)]
        if flags[:n] != list(batched.out_batched) or not _fits(flags, wanted):
            return _inline_jvp(jaxpr, primals, tangents, nonzeros)
    outs = loop_p().bind(
        *primals, *_kept(tangents, nonzeros), jaxpr=one, scope=scope, batched=params
    )
    if batched is not None:
        outs = _spread(outs, flags, wanted, batched)
    return outs[:n], _with_zeros(outs[n:], out_nonzeros, jaxpr)


def _inline_jvp(jaxpr: ClosedJaxpr, primals: list, tangents: list, nonzeros: list) -> tuple:
    """JAX's JVP of ``jaxpr`` (the equation's, batched where it is), inline."""
    jvp_jaxpr, out_nonzeros = internal(_AD + "jvp_jaxpr")(jaxpr, nonzeros, False)
    outs = jax.extend.core.jaxpr_as_fun(jvp_jaxpr)(*primals, *_kept(tangents, nonzeros))
    n = len(jaxpr.out_avals)
    return outs[:n], _with_zeros(outs[n:], out_nonzeros, jaxpr)


def _linearize(
    is_vjp: bool, nonzeros: list, *primals: object, jaxpr: ClosedJaxpr, scope: str, batched: Any
) -> tuple:
    """JAX's linearization of the loop; its forward pass (the primal outputs and the
    residuals) is one equation, the linear part runs inline."""
    if not _batches_apart(batched):
        params = {"jaxpr": jaxpr, "scope": scope, "batched": batched}
        return linearize_from_jvp(loop_p(), is_vjp, nonzeros, primals, params)
    loop = jaxpr if batched is None else batched.loop
    linearize_jaxpr = internal(_AD + "linearize_jaxpr")
    forward, _, out_nonzeros, _, linear = linearize_jaxpr(
        loop, nonzeros, False, False, is_vjp=is_vjp
    )
    n = len(loop.out_avals)
    one, params, flags = _as_one(forward, batched, batched and batched.in_dims)
    if batched is not None:
        res_dims = [0 if f else None for f in flags[n:]]
        tangent_dims = _kept(batched.in_dims, nonzeros)
        linear, linear_flags = batch_jaxpr(linear, batched.axis, [*res_dims, *tangent_dims])
        wanted = _kept(batched.out_batched, out_nonzeros)
        if flags[:n] != list(batched.out_batched) or not _fits(linear_flags, wanted):
            params = {"jaxpr": jaxpr, "scope": scope, "batched": batched}
            return linearize_from_jvp(loop_p(), is_vjp, nonzeros, primals, params)
    outs = loop_p().bind(*primals, jaxpr=one, scope=scope, batched=params)

    def linearized(residuals: list, *tangents: object) -> list:
        dots = jax.extend.core.jaxpr_as_fun(linear)(*residuals, *_kept(tangents, nonzeros))
        if batched is not None:
            dots = _spread(dots, linear_flags, wanted, batched)
        return _with_zeros(dots, out_nonzeros, jaxpr)

    return outs[:n], list(out_nonzeros), outs[n:], linearized


def _partial_eval(trace: Any, *tracers: object, jaxpr: ClosedJaxpr, **_: object) -> list:
    """Partial evaluation of the equation (``jax.linearize`` through its JVP, a loop of the
    user's around it): ``jaxpr`` inline, which JAX evaluates in part."""
    with internal("jax._src.core.set_current_trace")(trace):
        return jax.extend.core.jaxpr_as_fun(jaxpr)(*tracers)


def _staged_apart(*updated: dict) -> tuple:
    """The known and the staged equations' parameters, where partial evaluation with a
    policy (``jax.checkpoint``'s) splits the equation: unbatched (they are not the loop)."""
    known, staged = updated[-2:]
    return {**known, "batched": None}, {**staged, "batched": None}


def _batches_apart(batched: Any) -> bool:
    """Whether a derivative of the equation can be batched apart from the loop it
    differentiates: not a batched loop with a custom VJP (JAX cannot batch the linear part
    that a custom VJP leaves in a derivative: it is batched with the loop, inline)."""
    return batched is None or first_eqn(batched.loop.jaxpr.eqns, is_custom_vjp_call) is None


def _as_one(closed: ClosedJaxpr, batched: Any, dims: Any) -> tuple:
    """``(jaxpr, batched, which outputs are batched)``: the parameters of one equation of
    ``closed`` (a jaxpr of the unbatched loop's): as it is where the equation is unbatched,
    else batched over its axis at ``dims``, so that ``checkify`` checks it per element."""
    if batched is None:
        return closed, None, [False] * len(closed.out_avals)
    jaxpr, out_batched = batch_jaxpr(closed, batched.axis, dims)
    return jaxpr, Batched(closed, batched.axis, tuple(dims), tuple(out_batched)), out_batched


def _fits(flags: list[bool], wanted: list[bool]) -> bool:
    """No output batched where the equation's is not."""
    return not any(f and not w for f, w in zip(flags, wanted, strict=True))


def _spread(values: list, flags: list[bool], wanted: list[bool], batched: Batched) -> list:
    """``values`` batched where ``wanted``: one left unbatched is broadcast over the axis."""
    size = batched.axis.size
    return [
        jax.numpy.broadcast_to(v, (size, *jax.numpy.shape(v))) if w and not f else v
        for v, f, w in zip(values, flags, wanted, strict=True)
    ]


def _kept(values: Sequence, flags: Sequence[bool]) -> list:
    return [v for v, f in zip(values, flags, strict=True) if f]


def _with_zeros(dots: Sequence, nonzeros: Sequence[bool], jaxpr: ClosedJaxpr) -> list:
    """The tangents of ``jaxpr``'s outputs: ``dots`` of the nonzero ones, symbolic zeros."""
    given = iter(dots)
    return [
        next(given) if nz else zero_tangent(aval)
        for aval, nz in zip(jaxpr.out_avals, nonzeros, strict=True)
    ]


def _dce(used: list[bool], eqn: Eqn) -> tuple[list[bool], Eqn | None]:
    """The equation with its used outputs only (its inputs all stay)."""
    if not any(used) and not has_effects(eqn):
        return [False] * len(eqn.invars), None
    if all(used):
        return [True] * len(eqn.invars), eqn
    batched = eqn.params["batched"]
    if batched is not None:
        out_batched = tuple(b for b, u in zip(batched.out_batched, used, strict=True) if u)
        batched = dataclasses.replace(
            batched, loop=dce(batched.loop, used), out_batched=out_batched
        )
    params = {**eqn.params, "jaxpr": dce(eqn.params["jaxpr"], used), "batched": batched}
    outvars = [v for v, u in zip(eqn.outvars, used, strict=True) if u]
    return [True] * len(eqn.invars), eqn.replace(outvars=outvars, params=params)
