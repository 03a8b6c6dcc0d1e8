"""Every touch of JAX internals, in one place.

The rest of the package reads jaxprs through the public ``jax.extend.core`` types and calls
the helpers below for anything that is private to JAX or whose layout changes between JAX
versions (the parameters of ``custom_jvp_call`` / ``custom_vjp_call``, source information,
dead-code elimination). Tested with ``jax>=0.10,<0.11``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as _core
from jax._src import mesh as _mesh
from jax._src import source_info_util as _source_info
from jax._src import traceback_util as _traceback_util
from jax._src.interpreters import partial_eval as _pe
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var  # noqa: F401 (re-exported)

DropVar = _core.DropVar

# Frames of this package are not the user's: tracebacks raised through it show at most one of
# them, and equations it emits point at the user's line that led there.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_source_info.register_exclusion(_PACKAGE_DIR)
_traceback_util.register_exclusion(_PACKAGE_DIR)


def api_boundary(fun: Callable) -> Callable:
    """Mark a public entry point: errors raised through it show the user's frames only (as
    JAX's own entry points do; ``JAX_TRACEBACK_FILTERING=off`` shows everything)."""
    return _traceback_util.api_boundary(fun)


@contextlib.contextmanager
def user_context(eqn: JaxprEqn) -> Iterator[None]:
    """Make equations emitted inside carry ``eqn``'s user source line and name stack."""
    name_stack = _source_info.current_name_stack() + eqn.source_info.name_stack
    with _source_info.user_context(eqn.source_info.traceback, name_stack=name_stack):
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


def in_manual_context() -> bool:
    """Whether we are tracing inside ``shard_map`` (some context mesh axis is manual)."""
    mesh = jax.sharding.get_abstract_mesh()
    return any(t == jax.sharding.AxisType.Manual for t in getattr(mesh, "axis_types", ()))


def bind(eqn: JaxprEqn, invals: Sequence[Any], params: dict[str, Any] | None = None) -> list:
    """Re-emit ``eqn`` on ``invals`` (optionally with new params), keeping its source info."""
    params = _fit_shardings(eqn.params if params is None else params)
    bind_params = eqn.primitive.get_bind_params(params)
    with user_context(eqn):
        out = eqn.primitive.bind(*invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def inherit_source(eqn: JaxprEqn, outer: JaxprEqn | None) -> JaxprEqn:
    """``eqn`` from inside ``outer``'s sub-jaxpr, pointing at the user's line.

    Equations traced inside a ``jit`` only know JAX-internal frames; the user's line is the
    one of the enclosing call, so that is used where the equation has no user frame.
    """
    if outer is None or _source_info.user_frame(eqn.source_info.traceback) is not None:
        return eqn
    source_info = eqn.source_info.replace(traceback=outer.source_info.traceback)
    return eqn.replace(source_info=source_info)


def source_line(eqn: JaxprEqn) -> str:
    """The user's source line of ``eqn`` as ``file:line (function)``, or ``<unknown>``."""
    frame = _source_info.user_frame(eqn.source_info.traceback)
    if frame is None:
        return "<unknown>"
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"


def open_jaxpr(j: Jaxpr | ClosedJaxpr) -> Jaxpr:
    return j.jaxpr if isinstance(j, ClosedJaxpr) else j


def sub_jaxprs(params: dict[str, Any]) -> Iterator[tuple[tuple, ClosedJaxpr | Jaxpr]]:
    """Every sub-jaxpr in ``params`` with its path: ``(key,)`` or ``(key, index)``."""
    for key, value in params.items():
        if isinstance(value, (Jaxpr, ClosedJaxpr)):
            yield (key,), value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, (Jaxpr, ClosedJaxpr)):
                    yield (key, i), item


def dce(closed: ClosedJaxpr) -> ClosedJaxpr:
    """Drop equations whose results are unused (keeps effects, inputs and outputs)."""
    jaxpr, _ = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return ClosedJaxpr(jaxpr, closed.consts)


def custom_jvp_rule_jaxpr(eqn: JaxprEqn, zeros: Sequence[bool]) -> tuple[ClosedJaxpr, list]:
    """The JVP rule of a ``custom_jvp_call`` as a jaxpr at the equation's own shapes.

    Returns ``(jvp, out_zeros)``: ``jvp`` takes the non-const primals followed by the tangents
    of the inputs whose ``zeros`` flag is False, and returns the primal outputs followed by the
    tangents of the outputs whose ``out_zeros`` flag is False.
    """
    jvp_jaxpr, consts, out_zeros = eqn.params["jvp_jaxpr_fun"].call_wrapped(*zeros)
    return ClosedJaxpr(jvp_jaxpr, consts), list(out_zeros)


def custom_vjp_parts(eqn: JaxprEqn) -> tuple[Callable, Callable]:
    """``(fwd_jaxpr_of(nonzeros) -> (ClosedJaxpr, [n_res, input_fwds]), bwd(*res, *cts))``.

    ``fwd`` jaxprs take the non-const primals and output the residuals then the primal
    outputs; residuals that the rule forwards straight from an operand are left out, and
    ``input_fwds[i]`` is then that operand's index among the equation's operands.
    """
    params = eqn.params

    def fwd_jaxpr_of(nonzeros: Sequence[bool]) -> tuple[ClosedJaxpr, list]:
        jaxpr, consts = params["fwd_jaxpr_thunk"].call_wrapped(*nonzeros)
        _, res_tree, input_fwds = params["out_trees"]()
        return ClosedJaxpr(jaxpr, consts), [res_tree.num_leaves, list(input_fwds)]

    def bwd(*args: Any) -> list:
        return list(params["bwd"].call_wrapped(*args))

    return fwd_jaxpr_of, bwd


def cotangent_aval(aval: Any) -> jax.ShapeDtypeStruct:
    """The cotangent type of a primal: itself for inexact dtypes, ``float0`` otherwise."""
    if np.issubdtype(aval.dtype, np.inexact):
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype)
    return jax.ShapeDtypeStruct(aval.shape, jax.dtypes.float0)


def trace_custom_vjp_bwd(bwd: Callable, avals: Sequence[Any]) -> tuple[ClosedJaxpr, list[bool]]:
    """A custom VJP's backward rule as a jaxpr at the given (full-size) argument types.

    Returns ``(jaxpr, returned)``: ``returned[i]`` says whether the rule gives an array for
    primal operand ``i`` (the jaxpr outputs only those), or a zero / ``None``.
    """
    returned: list[bool] = []

    def arrays_only(*args: Any) -> list:
        outs = bwd(*args)
        returned[:] = [is_array(x) for x in outs]
        return [x for x in outs if is_array(x)]

    structs = [
        a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(a.shape, a.dtype)
        for a in avals
    ]
    return jax.make_jaxpr(arrays_only)(*structs), returned


def zeros_float0(shape: Sequence[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=jax.dtypes.float0)


def is_array(x: Any) -> bool:
    """A concrete or traced array (not a symbolic zero or None)."""
    return isinstance(x, (jax.Array, np.ndarray, _core.Tracer))


def constvars_to_invars(closed: ClosedJaxpr) -> tuple[Jaxpr, list]:
    """``(jaxpr, consts)`` with the constants turned into leading inputs."""
    return _pe.convert_constvars_jaxpr(closed.jaxpr), list(closed.consts)


def key_impl(dtype: Any) -> Any:
    """The PRNG implementation behind a key dtype."""
    return dtype._impl


def key_impl_name(dtype: Any) -> str:
    return key_impl(dtype).name


def _device_ids(mesh: Any) -> tuple:
    """A concrete mesh's device ids in mesh order (``()`` for an abstract mesh)."""
    if not isinstance(mesh, jax.sharding.Mesh) or mesh.empty:
        return ()
    return tuple(np.asarray(mesh.device_ids).ravel().tolist())


def placement_key(x: Any) -> tuple:
    """What of a value's placement a plan depends on: its ``NamedSharding``'s mesh, with the
    concrete device order (a plan's ``shard_map`` is bound to it), and its spec."""
    sharding = named_sharding(x)
    if sharding is None:
        return ()
    return (str(sharding.mesh.abstract_mesh), _device_ids(sharding.mesh), str(sharding.spec))


def context_mesh_key() -> tuple:
    """The context mesh (``jax.set_mesh``), abstract and concrete, as part of a cache key."""
    return (str(jax.sharding.get_abstract_mesh()), _device_ids(_mesh.get_concrete_mesh()))


def named_sharding(x: Any) -> Any:
    """The ``NamedSharding`` of a value (concrete, or traced in explicit-sharding mode), or None."""
    sharding = (
        jax.typeof(x).sharding if isinstance(x, _core.Tracer) else getattr(x, "sharding", None)
    )
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.axis_names:
        return sharding
    return None


def explicit_axes(mesh: Any, names: Sequence[str]) -> bool:
    """Whether all of ``names`` are ``Explicit`` axes of ``mesh`` (shardings in the avals)."""
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return all(types.get(n) == jax.sharding.AxisType.Explicit for n in names)


def instantiate(ct: Any) -> Any:
    """A cotangent as an array: symbolic zeros (``custom_vjp(symbolic_zeros=True)``) as zeros."""
    if isinstance(ct, jax.custom_derivatives.SymbolicZero):
        return jax.numpy.zeros(ct.aval.shape, ct.aval.dtype)
    return ct


def shape_of(v: Var) -> tuple[int, ...]:
    """The shape of a jaxpr variable (its aval is a ``ShapedArray``)."""
    return tuple(v.aval.shape)  # type: ignore[attr-defined]
