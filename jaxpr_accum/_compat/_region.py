"""JAX's rule tables for primitives of the package's own (``_region_p``, ``_remat``), tangents
and cotangents, and the batching and dead-code elimination of jaxprs their rules use: the
private JAX they need, looked up through ``internal`` (a moved piece is a
``MissingInternal``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._sharding import varying_axes
from jaxpr_accum._compat._types import Array, Aval, ClosedJaxpr, Eqn, Primitive

# -- the region primitives ---------------------------------------------------------------
# JAX's rule tables for a primitive of our own (``_region_p``, ``_remat``). The linearization
# rule (``is_vjp, nonzeros, *primals -> (out, out_nonzeros, residuals, linearized)``) is what
# ``jax.grad`` / ``jax.linearize`` use (direct linearization); every other transformation
# uses the JVP, batching and transpose rules. Batching goes through JAX's own table
# (``fancy_primitive_batchers``: the rule sees the vmapped axis, its name included), not the
# backwards-compatibility ``primitive_batchers``; dead-code elimination through
# ``partial_eval.dce_rules``.


def define_primitive(
    name: str,
    *,
    abstract_eval: Callable,
    impl: Callable,
    jvp: Callable,
    batch: Callable,
    transpose: Callable | None = None,
    linearize: Callable | None = None,
    dce: Callable | None = None,
    deoptimized: Callable | None = None,
) -> Primitive:
    """A multiple-results primitive: ``abstract_eval(*avals, **params) -> (avals, effects)``,
    ``impl(*args, **params) -> outs`` (lowered through JAX, so any traceable function),
    ``jvp(primals, tangents, **params)``, ``batch(axis, args, dims, **params) -> (outs,
    dims)`` (``axis``: JAX's description of the vmapped axis, for ``batch_jaxpr``; called
    only when some argument is batched, an output dim of None is an unbatched output),
    ``transpose(cts, *args, **params)``, ``linearize(is_vjp, nonzeros, *primals, **params)``,
    ``dce(used_outputs, eqn) -> (used_inputs, eqn or None)``; ``deoptimized(*args,
    **params)``: run where ``jax_debug_nans`` / ``jax_debug_infs`` finds an invalid value in
    an eager (compiled) application, as JAX runs a ``jit`` function's de-optimized version,
    to raise the error that names the operation."""
    p = jax.extend.core.Primitive(name)
    p.multiple_results = True
    apply_primitive = internal("jax._src.dispatch.apply_primitive")

    def eager(*args: object, **params: object) -> object:
        try:
            return apply_primitive(p, *args, **params)
        except FloatingPointError:  # raised only under jax_debug_nans / jax_debug_infs
            if deoptimized is not None:
                try:
                    deoptimized(*args, **params)
                except (FloatingPointError, ZeroDivisionError):
                    raise  # the error naming the operation
                except Exception:  # it cannot say more: the first error stands
                    pass
            raise

    p.def_impl(eager)
    p.def_effectful_abstract_eval(abstract_eval)
    lower_fun = internal("jax._src.interpreters.mlir.lower_fun")
    internal("jax._src.interpreters.mlir.register_lowering")(
        p, lower_fun(impl, multiple_results=True)
    )
    internal("jax._src.interpreters.ad.primitive_jvps")[p] = jvp
    internal("jax._src.interpreters.batching.fancy_primitive_batchers")[p] = _batcher(p, batch)
    if transpose is not None:
        internal("jax._src.interpreters.ad.primitive_transposes")[p] = transpose
    if linearize is not None:
        internal("jax._src.interpreters.ad.primitive_linearizations")[p] = linearize
    if dce is not None:
        internal("jax._src.interpreters.partial_eval.dce_rules")[p] = dce
    return p


def debug_checks_on() -> bool:
    """Whether ``jax_debug_nans`` or ``jax_debug_infs`` is set."""
    flags: Any = jax.config  # the flags' values are attributes JAX sets, not typed ones
    return bool(flags.jax_debug_nans or flags.jax_debug_infs)


def checked_call(closed: ClosedJaxpr, args: Sequence[object], as_written: Callable) -> list:
    """``closed`` applied to ``args`` as one equation whose eager run, where
    ``jax_debug_nans`` / ``jax_debug_infs`` finds an invalid value in its outputs, runs
    ``as_written(*args)`` (the program's equations one by one) so that JAX's error names the
    operation that made it. JAX does not check the results of a loop evaluated inside a
    jaxpr's eager run, so without it the error names the first checked operation after
    (a ``div`` reading the loop's sum). Differentiated and batched as ``closed`` is."""
    return _checked_p().bind(*args, jaxpr=closed, as_written=as_written)


@functools.cache
def _checked_p() -> Primitive:
    def impl(*args: object, jaxpr: ClosedJaxpr, **_: object) -> list:
        return jax.extend.core.jaxpr_as_fun(jaxpr)(*args)

    def jvp(primals: list, tangents: list, *, jaxpr: ClosedJaxpr, **params: object) -> tuple:
        # the values from the equation itself, so that they stay checked once linearized (the
        # JVP's own are partially evaluated into plain equations); tangents: JAX's JVP of it
        outs = p.bind(*primals, jaxpr=jaxpr, **params)
        tangents = [instantiate(t) for t in tangents]
        fun = jax.extend.core.jaxpr_as_fun(jaxpr)
        _, dots = jax.jvp(fun, tuple(primals), tuple(tangents))
        return list(outs), list(dots)

    def batch(axis: object, args: list, dims: list, *, jaxpr: ClosedJaxpr, **_: object) -> tuple:
        return run_batched(jaxpr, axis, dims, args)

    p = define_primitive(
        "serialized_region_pass",
        abstract_eval=lambda *_, jaxpr, **__: (list(jaxpr.out_avals), jaxpr.effects),
        impl=impl,
        jvp=jvp,
        batch=batch,
        deoptimized=lambda *args, as_written, **_: as_written(*args),
    )
    return p


def held_weakly_in_caches(cls: type) -> None:
    """JAX's caches keyed by equation parameters (abstract evaluation's, for one) hold the
    instances of ``cls`` weakly, as they hold a jaxpr: a parameter that owns a whole plan
    (the region) is freed with the function that made it, not when 2,048 later entries evict
    it. JAX holds a parameter strongly unless its exact type is registered."""
    internal("jax._src.util.weakref_cache_key_types").add(cls)


def _batcher(p: Primitive, rule: Callable) -> Callable:
    """``rule`` as JAX's batching table calls it (for every argument dims, under any
    ``jax.vmap``): where no argument is batched, the primitive itself, unbatched."""

    def batch(axis: object, args: list, dims: list, **params: object) -> tuple:
        if all(d is None for d in dims):
            outs = p.bind(*args, **params)
            return outs, [None] * len(outs)
        return rule(axis, args, dims, **params)

    return batch


def batch_jaxpr(
    closed: ClosedJaxpr, axis: object, dims: Sequence[int | None]
) -> tuple[ClosedJaxpr, list[bool]]:
    """``(the closed jaxpr batched over the vmapped axis at the input dims, which outputs are
    batched)``: an output is batched (at dimension 0) only where a batched input reaches it,
    so what does not depend on the vmapped arguments (an ordered callback's operand, say)
    stays unbatched, as in the original under ``jax.vmap``."""
    batching = "jax._src.interpreters.batching."
    outs = [internal(batching + "zero_if_mapped")] * len(closed.out_avals)
    batched, out_batched = internal(batching + "batch_jaxpr_axes")(closed, axis, dims, outs)
    return batched, list(out_batched)


def run_batched(closed: ClosedJaxpr, axis: object, dims: Sequence[int | None], args: list) -> tuple:
    """``(outputs, their dims)``: ``closed`` batched as ``batch_jaxpr`` does, applied to
    ``args`` inline (a batching rule's answer; an unbatched output's dim is None)."""
    batched, out_batched = batch_jaxpr(closed, axis, dims)
    outs = jax.extend.core.jaxpr_as_fun(batched)(*args)
    return outs, [0 if b else None for b in out_batched]


def dce(closed: ClosedJaxpr, used: Sequence[bool] | None = None) -> ClosedJaxpr:
    """Drop equations whose results are unused (keeps effects and inputs), and the outputs
    not flagged in ``used`` (default: keeps every output)."""
    dce_jaxpr = internal("jax._src.interpreters.partial_eval.dce_jaxpr")
    used = [True] * len(closed.jaxpr.outvars) if used is None else list(used)
    jaxpr, _ = dce_jaxpr(closed.jaxpr, used, instantiate=True)
    return ClosedJaxpr(jaxpr, closed.consts)


def has_effects(eqn: Eqn) -> bool:
    """Whether the equation has effects that dead-code elimination must keep."""
    return internal("jax._src.interpreters.partial_eval.has_effects")(eqn)


def linearize_from_jvp(
    p: Primitive, is_vjp: bool, nonzeros: list, primals: tuple, params: dict
) -> tuple:
    """JAX's own linearization of the primitive ``p`` (through its JVP rule), for a
    linearization rule that declines."""
    rule = internal("jax._src.interpreters.ad.fallback_linearize_rule")
    return rule(p, is_vjp, nonzeros, *primals, **params)


def is_zero(t: object) -> bool:
    """A symbolic zero tangent or cotangent (``ad.Zero``)."""
    return type(t) is internal("jax._src.interpreters.ad.Zero")


def zero_tangent(aval: Aval) -> object:
    """The symbolic zero tangent of a primal of type ``aval``."""
    return internal("jax._src.interpreters.ad.Zero")(aval.to_tangent_aval())


def nonzero_tangents(closed: ClosedJaxpr, nonzeros: Sequence[bool]) -> list[bool]:
    """Which outputs of the closed jaxpr have a nonzero tangent when the inputs flagged in
    ``nonzeros`` do, as JAX's own JVP of it finds with symbolic zeros: an output computed only
    through ``stop_gradient``, integers or unperturbed inputs has none (traced, never run)."""
    jvp_jaxpr = internal("jax._src.interpreters.ad.jvp_jaxpr")
    return list(jvp_jaxpr(closed, tuple(nonzeros), False)[1])


def instantiate(t: object) -> Array:
    """A tangent as an array (symbolic zeros made concrete, ``float0`` for integers)."""
    return internal("jax._src.interpreters.ad.instantiate_zeros")(t)


def is_undefined_primal(x: object) -> bool:
    """A linear input in a transpose rule (its cotangent is wanted)."""
    return internal("jax._src.interpreters.ad.is_undefined_primal")(x)


def trace_aval(x: jax.typing.ArrayLike) -> Aval | jax.ShapeDtypeStruct:
    """What to trace a function at for the argument ``x``: its shape, dtype and weak type;
    inside ``shard_map``, a tracer's own abstract value (with the manual axes it varies
    over). Shardings of explicit meshes are left out: the program is traced as written,
    and ``_layout`` handles where the axis lives."""
    if isinstance(x, internal("jax.core.Tracer")):
        aval = jax.typeof(x)
        if varying_axes(x):
            return aval
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x))


def abstract_like(x: jax.typing.ArrayLike) -> Aval | jax.typing.ArrayLike:
    """What to evaluate abstractly at for the input ``x``, as the real call will see it: a
    concrete array itself (its sharding included), a tracer's own abstract value (weak type,
    sharding and varying manual axes included)."""
    return jax.typeof(x) if isinstance(x, internal("jax.core.Tracer")) else x


def aval_of(x: jax.typing.ArrayLike) -> Aval:
    """The abstract value of an array or tracer (its varying manual axes in ``shard_map``)."""
    return jax.typeof(x)


def differentiated(x: object) -> bool | None:
    """Whether the innermost transformation tracing ``x`` is automatic differentiation with
    a nonzero tangent for it (``jax.grad``, ``jax.vjp``, ``jax.jvp``; looking through
    ``jax.vmap``): True or False; None when ``x`` is traced by no differentiation (a plain
    value, or a ``jax.jit`` tracer, behind which an outer ``jax.grad`` cannot be seen)."""
    ad = (internal("jax._src.interpreters.ad.JVPTracer"),
          internal("jax._src.interpreters.ad.LinearizeTracer"))  # fmt: skip
    batch = internal("jax._src.interpreters.batching.BatchTracer")
    while isinstance(x, batch):
        x = x.val
    if isinstance(x, ad):
        return not is_zero(x.tangent)
    return None


def runs_now() -> bool:
    """Whether an equation bound here runs now: no transformation traces the current call
    (JAX's current trace is its eval trace). Under ``jax.jit``, ``jax.grad``, ``jax.vmap`` or
    ``checkify`` the call is traced (whatever its arguments: ``checkify`` passes arrays)."""
    ctx = internal("jax._src.core.trace_ctx")
    return isinstance(ctx.trace, internal("jax._src.core.EvalTrace"))
