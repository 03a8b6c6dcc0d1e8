"""Every touch of JAX internals, in one place.

The rest of the package reads jaxprs through the public ``jax.extend.core`` types and calls
the helpers below for anything that is private to JAX or whose layout changes between JAX
versions (the parameters of ``custom_jvp_call`` / ``custom_vjp_call``, source information,
dead-code elimination). Tested with ``jax>=0.10,<0.11``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import config as _jax_config
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
# ... except the demonstration's model (``python -m jaxpr_accum demo``), which plays the user's
# code: its report names its lines instead of ``<unknown>``.
_source_info.register_inclusion(os.path.join(_PACKAGE_DIR, "_demo.py"))


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
    return eqn.params["jaxpr"] if "jaxpr" in eqn.params else eqn.params["call_jaxpr"]


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


def is_custom_vjp_call(eqn: JaxprEqn) -> bool:
    """A call of a ``jax.custom_vjp`` function."""
    return eqn.primitive is primitive("custom_vjp_call")


def custom_call_body(eqn: JaxprEqn) -> tuple[ClosedJaxpr, int]:
    """``(primal jaxpr, number of leading constant operands)`` of a custom JVP/VJP call."""
    return eqn.params["call_jaxpr"], eqn.params["num_consts"]


def custom_call_identity(eqn: JaxprEqn) -> tuple[str, str]:
    """``(function name, where it is defined)`` of a custom JVP/VJP call's user function."""
    info = eqn.params["call_jaxpr"].jaxpr.debug_info
    name = getattr(info, "func_name", None) or "<unknown>"
    return name, getattr(info, "func_src_info", None) or name


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


def counter_draw_refusal(key_dtype: Any) -> str | None:
    """Why draws with this key type do not follow the partitionable-threefry counter layout
    (``threefry_counter_bits``), or None if they do."""
    name = key_impl_name(key_dtype)
    if name != "threefry2x32":
        return f"`{name}` keys have no per-chunk counter formula"
    if not jax.config.jax_threefry_partitionable:
        return "the legacy (non-partitionable) threefry has no per-chunk counter formula"
    return None


def threefry_counter_bits(key: Any, counters: tuple[Any, Any]) -> tuple[Any, Any]:
    """The two 32-bit threefry words JAX's partitionable ``random_bits`` computes for the
    elements whose 64-bit row-major counters are ``(hi, lo)``."""
    k1, k2 = (x for x in jax.random.key_data(key))
    return tuple(jax.extend.random.threefry2x32_p.bind(k1, k2, *counters))


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
    """The context mesh (``jax.set_mesh``), abstract and concrete, and whether ``shard_map``
    checks varying manual axes there, as part of a cache key."""
    return (
        str(jax.sharding.get_abstract_mesh()),
        _device_ids(_mesh.get_concrete_mesh()),
        bool(_jax_config._check_vma.value),
    )


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


def flatten_in_axes(in_axes: Any, args: tuple) -> list:
    """``in_axes`` (``jax.vmap``'s prefix semantics) broadcast to one entry per leaf of
    ``args``; a ``ValueError`` that shows both trees when it is not a prefix."""
    from jax._src.api_util import flatten_axes

    if isinstance(in_axes, list):  # as jax.vmap: a list is a tuple prefix
        in_axes = tuple(in_axes)
    return flatten_axes("serialize_axis in_axes", jax.tree_util.tree_structure(args), in_axes)


def jax_version() -> str:
    return jax.__version__


@functools.cache
def _primitives_by_name() -> dict[str, Any]:
    """Every primitive of the installed JAX by name: the public ``jax.extend.core.primitives``
    first, then (the one name fallback) the ``*_p`` objects of JAX's private modules for the
    few it does not export (``tile``, ``optimization_barrier``, ``random_wrap``, ...)."""
    from jax.extend.core import primitives

    index: dict[str, Any] = {}
    for value in vars(primitives).values():
        if isinstance(value, _core.Primitive):
            index.setdefault(value.name, value)
    for name, module in sorted(sys.modules.items()):
        if module is None or not name.startswith("jax._src"):
            continue
        for attr, value in list(vars(module).items()):
            if attr.endswith("_p") and isinstance(value, _core.Primitive):
                index.setdefault(value.name, value)
    return index


def primitive(name: str) -> Any:
    """JAX's primitive object named ``name``, or None if the installed JAX has none."""
    return _primitives_by_name().get(name)


def primitives(names: str) -> frozenset:
    """The primitive objects for whitespace-separated ``names`` (each must exist)."""
    found = {name: primitive(name) for name in names.split()}
    missing = [name for name, p in found.items() if p is None]
    if missing:
        raise ValueError(f"no primitives named {missing} in JAX {jax.__version__}")
    return frozenset(found.values())


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
    return _core.Var(aval)


# -- the region primitives ---------------------------------------------------------------
# JAX's rule tables for a primitive of our own (``_region_p``, ``_remat``). The linearization
# rule (``is_vjp, nonzeros, *primals -> (out, out_nonzeros, residuals, linearized)``) is what
# ``jax.grad`` / ``jax.linearize`` use (direct linearization); every other transformation
# uses the JVP, batching and transpose rules.

from jax._src import dispatch as _dispatch  # noqa: E402
from jax._src.interpreters import ad as _ad  # noqa: E402
from jax._src.interpreters import batching as _batching  # noqa: E402
from jax._src.interpreters import mlir as _mlir  # noqa: E402


def define_primitive(
    name: str,
    *,
    abstract_eval: Callable,
    impl: Callable,
    jvp: Callable,
    batch: Callable,
    transpose: Callable | None = None,
    linearize: Callable | None = None,
) -> Any:
    """A multiple-results primitive: ``abstract_eval(*avals, **params) -> (avals, effects)``,
    ``impl(*args, **params) -> outs`` (lowered through JAX, so any traceable function),
    ``jvp(primals, tangents, **params)``, ``batch(args, dims, **params) -> (outs, dims)``,
    ``transpose(cts, *args, **params)``, ``linearize(is_vjp, nonzeros, *primals, **params)``."""
    p = jax.extend.core.Primitive(name)
    p.multiple_results = True
    p.def_impl(functools.partial(_dispatch.apply_primitive, p))
    p.def_effectful_abstract_eval(abstract_eval)
    _mlir.register_lowering(p, _mlir.lower_fun(impl, multiple_results=True))
    _ad.primitive_jvps[p] = jvp
    _batching.primitive_batchers[p] = batch
    if transpose is not None:
        _ad.primitive_transposes[p] = transpose
    if linearize is not None:
        _ad.primitive_linearizations[p] = linearize
    return p


def is_zero(t: Any) -> bool:
    """A symbolic zero tangent or cotangent (``ad.Zero``)."""
    return type(t) is _ad.Zero


def zero_tangent(aval: Any) -> Any:
    """The symbolic zero tangent of a primal of type ``aval``."""
    return _ad.Zero(aval.to_tangent_aval())


def instantiate(t: Any) -> Any:
    """A tangent as an array (symbolic zeros made concrete, ``float0`` for integers)."""
    return _ad.instantiate_zeros(t)


def is_undefined_primal(x: Any) -> bool:
    """A linear input in a transpose rule (its cotangent is wanted)."""
    return _ad.is_undefined_primal(x)


def undefined_aval(x: Any) -> Any:
    return x.aval


def varying_axes(x: Any) -> frozenset:
    """The manual mesh axes ``x`` varies over inside ``shard_map`` (empty elsewhere)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)  # jax 0.10
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))  # jax 0.9


def vary(tree: Any, axes: frozenset) -> Any:
    """``tree``'s arrays made to vary over ``axes`` too (a no-op cast, ``pvary``), so that a
    loop carry initialised with constants has the type its updates will have."""

    def cast(x: Any) -> Any:
        missing = axes - varying_axes(x)
        return _core.pvary(x, tuple(sorted(missing))) if missing else x

    return jax.tree_util.tree_map(cast, tree)


def union_varying(*trees: Any) -> frozenset:
    """Every manual mesh axis that some array of ``trees`` varies over."""
    leaves = jax.tree_util.tree_leaves(trees)
    return frozenset().union(*(varying_axes(x) for x in leaves)) if leaves else frozenset()


def trace_aval(x: Any) -> Any:
    """What to trace a function at for the argument ``x``: its shape, dtype and weak type;
    inside ``shard_map``, a tracer's own abstract value (with the manual axes it varies
    over). Shardings of explicit meshes are left out: the program is traced as written,
    and ``_layout`` handles where the axis lives."""
    if isinstance(x, _core.Tracer):
        if varying_axes(x):
            return jax.typeof(x)
        aval = jax.typeof(x)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return jax.ShapeDtypeStruct(np.shape(x), jax.numpy.result_type(x))


def abstract_like(x: Any) -> Any:
    """What to evaluate abstractly at for the input ``x``, as the real call will see it: a
    concrete array itself (its sharding included), a tracer's own abstract value (weak type,
    sharding and varying manual axes included)."""
    return jax.typeof(x) if isinstance(x, _core.Tracer) else x


def aval_of(x: Any) -> Any:
    """The abstract value of an array or tracer (with its varying manual axes inside
    ``shard_map``)."""
    return jax.typeof(x)
