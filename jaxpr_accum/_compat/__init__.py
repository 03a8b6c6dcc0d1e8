"""Every touch of JAX internals, in one place.

The rest of the package reads jaxprs through the public ``jax.extend.core`` types and calls
the helpers below for anything that is private to JAX or whose layout changes between JAX
versions (the parameters of ``custom_jvp_call`` / ``custom_vjp_call``, source information,
dead-code elimination). Tested with JAX 0.9.x and 0.10.x (``TESTED``); where the two differ,
the helpers detect what is present. Every private lookup goes through ``_lookup``: on a JAX
where one has moved it raises ``MissingInternal``, naming the JAX version and the missing
piece, at first use; a JAX outside the tested series warns once at import.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var  # noqa: F401 (re-exported)

from jaxpr_accum._compat._lookup import (  # noqa: F401 (re-exported)
    ABSENT,
    TESTED,
    JaxVersionWarning,
    MissingInternal,
    check_jax_version,
    primitive,
    primitives,
    table_primitive,
)
from jaxpr_accum._compat._lookup import internal as _jax
from jaxpr_accum._compat._lookup import param as _param
from jaxpr_accum._compat._region import (  # noqa: F401 (re-exported)
    abstract_like,
    aval_of,
    define_primitive,
    differentiated,
    instantiate,
    is_undefined_primal,
    is_zero,
    trace_aval,
    undefined_aval,
    union_varying,
    vary,
    varying_axes,
    zero_tangent,
)

check_jax_version()
# Public in jax.extend.core since JAX 0.10; private (jax._src.core) in 0.9.
DropVar = getattr(jax.extend.core, "DropVar", None) or _jax("jax._src.core.DropVar")

# Frames of this package are not the user's: tracebacks raised through it show at most one of
# them, and equations it emits point at the user's line that led there; the demonstration's
# model (``python -m jaxpr_accum demo``) plays the user's code. Cosmetic, so skipped where
# this JAX has moved the registries.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with contextlib.suppress(MissingInternal):
    _jax("jax._src.source_info_util.register_exclusion")(_PACKAGE_DIR)
    _jax("jax._src.traceback_util.register_exclusion")(_PACKAGE_DIR)
    _jax("jax._src.source_info_util.register_inclusion")(os.path.join(_PACKAGE_DIR, "_demo.py"))


def api_boundary(fun: Callable) -> Callable:
    """Mark a public entry point: errors raised through it show the user's frames only (as
    JAX's own entry points do; ``JAX_TRACEBACK_FILTERING=off`` shows everything)."""
    try:
        return _jax("jax._src.traceback_util.api_boundary")(fun)
    except MissingInternal:  # cosmetic: full tracebacks
        return fun


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
    if outer is None or _user_frame(eqn) is not None:
        return eqn
    source_info = eqn.source_info.replace(traceback=outer.source_info.traceback)
    return eqn.replace(source_info=source_info)


def source_line(eqn: JaxprEqn) -> str:
    """The user's source line of ``eqn`` as ``file:line (function)``, or ``<unknown>``."""
    frame = _user_frame(eqn)
    if frame is None:
        return "<unknown>"
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"


def _user_frame(eqn: JaxprEqn) -> Any:
    return _jax("jax._src.source_info_util.user_frame")(eqn.source_info.traceback)


def open_jaxpr(j: Jaxpr | ClosedJaxpr) -> Jaxpr:
    """The ``Jaxpr`` of a jaxpr, closed or not (the one place that knows the two classes)."""
    return j.jaxpr if isinstance(j, ClosedJaxpr) else j


def open_closed(j: Jaxpr | ClosedJaxpr) -> tuple[Jaxpr, list]:
    """``(jaxpr, consts)`` of a jaxpr, closed (its constants) or not (none)."""
    return (j.jaxpr, list(j.consts)) if isinstance(j, ClosedJaxpr) else (j, [])


def is_inlined_call(eqn: JaxprEqn) -> bool:
    """A nested ``jit`` or ``closed_call``: evaluated inline by the rewriter."""
    return eqn.primitive in _inlined_calls()


@functools.cache
def _inlined_calls() -> frozenset:
    return frozenset(p for p in (primitive("jit"), primitive("closed_call")) if p is not None)


def is_checkpoint(eqn: JaxprEqn) -> bool:
    """A ``jax.checkpoint`` / ``jax.remat`` call (``remat2`` in jax 0.10)."""
    return eqn.primitive is primitive("remat2") or eqn.primitive is primitive("checkpoint")


def called_jaxpr(eqn: JaxprEqn) -> Jaxpr | ClosedJaxpr:
    """The body of a call equation (``jit``'s ``jaxpr``, ``closed_call``'s ``call_jaxpr``)."""
    return eqn.params["jaxpr"] if "jaxpr" in eqn.params else _param(eqn, "call_jaxpr")


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
    dce_jaxpr = _jax("jax._src.interpreters.partial_eval.dce_jaxpr")
    jaxpr, _ = dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars), instantiate=True)
    return ClosedJaxpr(jaxpr, closed.consts)


def is_custom_vjp_call(eqn: JaxprEqn) -> bool:
    """A call of a ``jax.custom_vjp`` function."""
    return eqn.primitive is primitive("custom_vjp_call")


def custom_call_body(eqn: JaxprEqn) -> tuple[ClosedJaxpr, int]:
    """``(primal jaxpr, number of leading constant operands)`` of a custom JVP/VJP call."""
    return _param(eqn, "call_jaxpr"), _param(eqn, "num_consts")


def custom_call_identity(eqn: JaxprEqn) -> tuple[str, str]:
    """``(function name, where it is defined)`` of a custom JVP/VJP call's user function."""
    info = _param(eqn, "call_jaxpr").jaxpr.debug_info
    name = getattr(info, "func_name", None) or "<unknown>"
    return name, getattr(info, "func_src_info", None) or name


def custom_jvp_rule_jaxpr(eqn: JaxprEqn, zeros: Sequence[bool]) -> tuple[ClosedJaxpr, list]:
    """The JVP rule of a ``custom_jvp_call`` as a jaxpr at the equation's own shapes.

    Returns ``(jvp, out_zeros)``: ``jvp`` takes the non-const primals followed by the tangents
    of the inputs whose ``zeros`` flag is False, and returns the primal outputs followed by the
    tangents of the outputs whose ``out_zeros`` flag is False.
    """
    jvp_jaxpr, consts, out_zeros = _param(eqn, "jvp_jaxpr_fun").call_wrapped(*zeros)
    return ClosedJaxpr(jvp_jaxpr, consts), list(out_zeros)


def custom_vjp_parts(eqn: JaxprEqn) -> tuple[Callable, Callable]:
    """``(fwd_jaxpr_of(nonzeros) -> (ClosedJaxpr, [n_res, input_fwds]), bwd(*res, *cts))``.

    ``fwd`` jaxprs take the non-const primals and output the residuals then the primal
    outputs; residuals that the rule forwards straight from an operand are left out, and
    ``input_fwds[i]`` is then that operand's index among the equation's operands.
    """
    fwd, out_trees, bwd_fun = (_param(eqn, k) for k in ("fwd_jaxpr_thunk", "out_trees", "bwd"))

    def fwd_jaxpr_of(nonzeros: Sequence[bool]) -> tuple[ClosedJaxpr, list]:
        jaxpr, consts = fwd.call_wrapped(*nonzeros)
        _, res_tree, input_fwds = out_trees()
        return ClosedJaxpr(jaxpr, consts), [res_tree.num_leaves, list(input_fwds)]

    def bwd(*args: Any) -> list:
        return list(bwd_fun.call_wrapped(*args))

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
    return isinstance(x, (jax.Array, np.ndarray, _jax("jax.core.Tracer")))


def constvars_to_invars(closed: ClosedJaxpr) -> tuple[Jaxpr, list]:
    """``(jaxpr, consts)`` with the constants turned into leading inputs."""
    convert = _jax("jax._src.interpreters.partial_eval.convert_constvars_jaxpr")
    return convert(closed.jaxpr), list(closed.consts)


def counter_draw_refusal(key_dtype: Any) -> str | None:
    """Why draws with this key type do not follow the partitionable-threefry counter layout
    (``threefry_counter_bits``), or None if they do."""
    name = key_impl_name(key_dtype)
    if name != "threefry2x32":
        return f"`{name}` keys have no per-chunk counter formula"
    # a JAX without the flag has only the partitionable layout
    if not getattr(jax.config, "jax_threefry_partitionable", True):
        return "the legacy (non-partitionable) threefry has no per-chunk counter formula"
    return None


def threefry_counter_bits(key: Any, counters: tuple[Any, Any]) -> tuple[Any, Any]:
    """The two 32-bit threefry words JAX's partitionable ``random_bits`` computes for the
    elements whose 64-bit row-major counters are ``(hi, lo)``."""
    k1, k2 = (x for x in jax.random.key_data(key))
    return tuple(_jax("jax.extend.random.threefry2x32_p").bind(k1, k2, *counters))


def threefry_finish_bits(bits1: Any, bits2: Any, bit_width: int) -> Any:
    """The draw from the two words, as ``_threefry_random_bits_partitionable`` finishes it."""
    dtype = np.dtype(f"uint{bit_width}")
    if bit_width == 64:
        hi = jax.lax.convert_element_type(bits1, dtype)
        lo = jax.lax.convert_element_type(bits2, dtype)
        return jax.lax.shift_left(hi, np.asarray(32, dtype=dtype)) | lo
    if bit_width == 32:
        return bits1 ^ bits2
    return jax.lax.convert_element_type(bits1 ^ bits2, dtype)


def key_impl(dtype: Any) -> Any:
    """The PRNG implementation behind a key dtype."""
    try:
        return dtype._impl
    except AttributeError:
        raise MissingInternal("the `_impl` attribute of PRNG key dtypes") from None


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
    """The context mesh (``jax.set_mesh``), abstract and concrete, and whether ``shard_map``
    checks varying manual axes there, as part of a cache key."""
    return (
        str(jax.sharding.get_abstract_mesh()),
        _device_ids(_jax("jax._src.mesh.get_concrete_mesh")()),
        bool(_jax("jax._src.config._check_vma").value),
    )


def named_sharding(x: Any) -> Any:
    """The ``NamedSharding`` of a value (concrete, or traced in explicit-sharding mode), or None."""
    traced = isinstance(x, _jax("jax.core.Tracer"))
    sharding = jax.typeof(x).sharding if traced else getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.axis_names:
        return sharding
    return None


def explicit_axes(mesh: Any, names: Sequence[str]) -> bool:
    """Whether all of ``names`` are ``Explicit`` axes of ``mesh`` (shardings in the avals)."""
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return all(types.get(n) == jax.sharding.AxisType.Explicit for n in names)


def flatten_in_axes(in_axes: Any, args: tuple) -> list:
    """``in_axes`` (``jax.vmap``'s prefix semantics) broadcast to one entry per leaf of
    ``args``; a ``ValueError`` that shows both trees when it is not a prefix."""
    flatten_axes = _jax("jax._src.api_util.flatten_axes")
    if isinstance(in_axes, list):  # as jax.vmap: a list is a tuple prefix
        in_axes = tuple(in_axes)
    return flatten_axes("serialize_axis in_axes", jax.tree_util.tree_structure(args), in_axes)


def jax_version() -> str:
    return jax.__version__


def shape_of(v: Var) -> tuple[int, ...]:
    """The shape of a jaxpr variable (its aval is a ``ShapedArray``)."""
    return tuple(v.aval.shape)  # type: ignore[attr-defined]


def gather_fill_value(eqn: JaxprEqn) -> Any:
    """The value a ``fill``-mode gather returns for an out-of-range index (JAX's defaults
    where the parameter is None)."""
    fill = eqn.params.get("fill_value")
    if fill is not None:
        return fill
    dtype = np.dtype(eqn.outvars[0].aval.dtype)
    if np.issubdtype(dtype, np.inexact):
        return np.nan
    if np.issubdtype(dtype, np.signedinteger):
        return np.iinfo(dtype).min
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.iinfo(dtype).max
    return True


def is_pure(eqn: JaxprEqn) -> bool:
    """No effects and no sub-jaxprs: recomputing the equation gives the same values."""
    return not eqn.effects and not any(True for _ in sub_jaxprs(eqn.params))


def new_var(aval: Any) -> Var:
    return Var(aval)
