"""Re-emitting an equation of a traced program on new operands (``bind``), as the rewriter
builds its programs: with the user's source line and name stack (``user_context``), sharding
annotations recorded on another mesh dropped, the operands of an equation with jaxprs of its
own laid out as they were traced (``_as_traced``), a ``pvary`` reduced to the axes its operand
does not already vary over, a custom VJP's closed-over constants kept its constants, and a
primitive that JAX binds only inside a jitted call of its own bound inside one again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.extend.core import JaxprEqn

from jaxpr_accum._compat._custom import is_custom_vjp_call, rebind_keeping_constants
from jaxpr_accum._compat._lookup import internal as _jax
from jaxpr_accum._compat._random import called_only
from jaxpr_accum._compat._sharding import explicit_spec, laid_out_as, varying_axes
from jaxpr_accum._compat._types import Array, Params
from jaxpr_accum._compat._walk import sub_jaxprs


@contextlib.contextmanager
def user_context(eqn: JaxprEqn) -> Iterator[None]:
    """Make equations emitted inside carry ``eqn``'s user source line and name stack."""
    name_stack = _jax("jax._src.source_info_util.current_name_stack")()
    name_stack = name_stack + eqn.source_info.name_stack
    with _jax("jax._src.source_info_util.user_context")(
        eqn.source_info.traceback, name_stack=name_stack
    ):
        yield


def _fit_shardings(params: dict[str, Any]) -> dict[str, Any]:
    """Drop sharding params recorded on another mesh than the current one.

    Inside ``shard_map`` the context mesh has manual axes; an output sharding recorded when
    the program was traced (on the caller's mesh) no longer applies there. Dropping it only
    forgets a layout annotation, never changes a value.
    """
    fitted = None
    for key, value in params.items():
        if isinstance(value, jax.sharding.NamedSharding):
            context = jax.sharding.get_abstract_mesh()
            if value.mesh.abstract_mesh != context:
                fitted = fitted or dict(params)
                fitted[key] = None
    return params if fitted is None else fitted


def _fit_pvary(invals: Sequence[object], params: Params) -> Params | None:
    """A recorded ``pvary``'s axes less those its operand already varies over (the fused
    mode differentiates replicated inputs as varying, ``_jacobians``); None: nothing left to
    cast, the operand passes through."""
    missing = tuple(a for a in params["axes"] if a not in varying_axes(invals[0]))
    return None if not missing else {**params, "axes": missing}


def _as_traced(eqn: JaxprEqn, invals: Sequence[object]) -> list:
    """The operands of an equation with jaxprs of its own (a ``scan``, ``cond``, ``jit``,
    custom rule), laid out as the program was traced: its jaxprs are typed with the layouts
    of the trace, which leaves out explicit meshes' (``trace_aval``), so an operand sharded
    over ``Explicit`` axes is resharded to the layout its variable was traced at (whole,
    where the trace had none). Bound on the sharded value instead, the equation's types
    would disagree with its jaxprs', and JAX's derivative of it would fail. Elsewhere each
    equation infers its layout from its operands, as the original's does, and a
    ``shard_map``'s jaxpr is typed per device, its operands laid out as its specs say."""
    if eqn.primitive.name == "shard_map" or next(sub_jaxprs(eqn.params), None) is None:
        return list(invals)
    return [
        laid_out_as(x, explicit_spec(v.aval) or jax.sharding.PartitionSpec())
        for v, x in zip(eqn.invars, invals, strict=True)
    ]


def bind(
    eqn: JaxprEqn,
    invals: Sequence[object],
    params: dict[str, Any] | None = None,
    *,
    in_own_call: bool = True,
) -> list:
    """Re-emit ``eqn`` on ``invals`` (optionally with new params), keeping its source info.

    A primitive that JAX binds only inside a jitted function of its own (``called_only``)
    is bound inside a ``jit`` again, unless ``in_own_call`` is false (tracing for planning,
    which reads the primitive itself)."""
    params = _fit_shardings(eqn.params if params is None else params)
    if eqn.primitive.name == "pvary":
        params = _fit_pvary(invals, params)
        if params is None:
            return list(invals)
    bind_params = eqn.primitive.get_bind_params(params)
    invals = _as_traced(eqn, invals)
    kept = rebind_keeping_constants(eqn, invals, bind_params) if is_custom_vjp_call(eqn) else None
    if kept is not None:  # a custom VJP's closed-over constants stay its constants
        bind_params, invals = kept

    def emit(*xs: object) -> Array | Sequence[Array]:
        with user_context(eqn):
            return eqn.primitive.bind(*xs, **bind_params)

    run = jax.jit(emit) if in_own_call and called_only(eqn.primitive) else emit
    out = run(*invals)
    return list(out) if eqn.primitive.multiple_results else [out]
