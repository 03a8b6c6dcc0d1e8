"""Every touch of JAX internals, in one place.

The rest of the package reads jaxprs through the public ``jax.extend.core`` types and calls
the helpers below for anything that is private to JAX or whose layout changes between JAX
versions (the parameters of ``custom_jvp_call`` / ``custom_vjp_call``, source information,
dead-code elimination). Tested with JAX 0.9.x and 0.10.x (``TESTED``); where the two differ,
the helpers detect what is present. Every private lookup goes through ``_lookup``: on a JAX
where one has moved it raises ``MissingInternal``, naming the JAX version and the missing
piece, at first use; a JAX outside the tested series warns once at import
(``check_jax_version``, called by the package once its rule tables are built, so that the
warning lists the table entries this JAX has no primitive for).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import jax
import jax.extend.core
import numpy as np
from jax.extend.core import JaxprEqn, Literal  # noqa: F401 (re-exported)

from jaxpr_accum._compat._checks._between import between_scope, segment_scope  # noqa: F401
from jaxpr_accum._compat._checks._loops import chunk_scope, loop_scope  # noqa: F401
from jaxpr_accum._compat._checks._places import accumulated, recomputed, traced_in  # noqa: F401
from jaxpr_accum._compat._checks._rules import checks_through  # noqa: F401 (re-exported)
from jaxpr_accum._compat._custom import (  # noqa: F401 (re-exported)
    cotangent_aval,
    custom_call_body,
    custom_call_identity,
    custom_jvp_rule_jaxpr,
    custom_vjp_backward,
    custom_vjp_parts,
    is_custom_rule_call,
    is_custom_vjp_call,
    rebind_keeping_constants,
    rules_close_over_tracers,
    trace_custom_vjp_bwd,
    zeros_float0,
)
from jaxpr_accum._compat._emit import bind, user_context  # noqa: F401 (re-exported)
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
from jaxpr_accum._compat._loop_call import batched_loop_call, loop_call, loop_p  # noqa: F401
from jaxpr_accum._compat._random import (  # noqa: F401 (re-exported)
    called_only,
    counter_draw_refusal,
    key_impl,
    key_impl_name,
    threefry_counter_bits,
    threefry_finish_bits,
)
from jaxpr_accum._compat._region import (  # noqa: F401 (re-exported)
    abstract_like,
    aval_of,
    batch_jaxpr,
    checked_call,
    dce,
    debug_checks_on,
    define_primitive,
    differentiated,
    has_effects,
    held_weakly_in_caches,
    instantiate,
    is_undefined_primal,
    is_zero,
    linearize_from_jvp,
    nonzero_tangents,
    run_batched,
    runs_now,
    trace_aval,
    zero_tangent,
)
from jaxpr_accum._compat._sharding import (  # noqa: F401 (re-exported)
    context_mesh_key,
    explicit_axes,
    explicit_sharding,
    explicit_spec,
    laid_out_as,
    laid_out_as_specs,
    laid_out_like,
    named_sharding,
    placement_key,
    typed,
    typed_carry,
    union_varying,
    vary,
    varying_axes,
)
from jaxpr_accum._compat._types import (  # noqa: F401
    Array,
    Atom,
    Aval,
    ClosedJaxpr,
    Eqn,
    Float0Array,
    Jaxpr,
    Params,
    Primitive,
    ShapedArray,
    Tracer,
    Var,
    shaped,
)
from jaxpr_accum._compat._walk import (  # noqa: F401
    first_eqn,
    open_jaxpr,
    ordinary_branch,
    sub_jaxprs,
)

# Public in jax.extend.core since JAX 0.10; private (jax._src.core) in 0.9.
DropVar = getattr(jax.extend.core, "DropVar", None) or _jax("jax._src.core.DropVar")

# Frames of this package are not the user's: tracebacks raised through it show at most one of
# them, and equations it emits point at the user's line that led there; the examples, installed
# as ``jaxpr_accum.examples`` (the demo runs one), are the user's code. Cosmetic, so skipped
# where this JAX has moved the registries.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with contextlib.suppress(MissingInternal):
    _jax("jax._src.source_info_util.register_exclusion")(_PACKAGE_DIR)
    _jax("jax._src.traceback_util.register_exclusion")(_PACKAGE_DIR)
    _jax("jax._src.source_info_util.register_inclusion")(os.path.join(_PACKAGE_DIR, "examples", ""))


_F = TypeVar("_F", bound=Callable[..., Any])


def api_boundary(fun: _F) -> _F:
    """Mark a public entry point: errors raised through it show the user's frames only (as
    JAX's own entry points do; ``JAX_TRACEBACK_FILTERING=off`` shows everything). Typed as
    the identity, so a decorated method keeps its signature for type checkers."""
    try:
        return cast(_F, _jax("jax._src.traceback_util.api_boundary")(fun))
    except MissingInternal:  # cosmetic: full tracebacks
        return fun


def trace_config_key() -> tuple:
    """The configuration that tracing bakes into a jaxpr (the default matmul precision, x64,
    rank promotion, ...), as ``jax.jit`` keys its own trace cache by it: a plan traced under
    one such setting is not reused under another."""
    return tuple(_jax("jax._src.config.trace_context")())


def inherit_source(eqn: JaxprEqn, outer: JaxprEqn | None) -> JaxprEqn:
    """``eqn`` from inside ``outer``'s sub-jaxpr, pointing at the user's line.

    Equations traced inside a ``jit`` only know JAX-internal frames; the user's line is the
    one of the enclosing call, so that is used where the equation has no user frame.
    """
    if outer is None or _user_line(eqn) is not None:
        return eqn
    source_info = eqn.source_info.replace(traceback=outer.source_info.traceback)
    return eqn.replace(source_info=source_info)


def inherit_sources(jaxpr: Jaxpr | ClosedJaxpr, outer: JaxprEqn) -> Jaxpr | ClosedJaxpr:
    """``jaxpr`` (``outer``'s sub-jaxpr) with each equation pointing at the user's line
    (``inherit_source``): a call inlined keeps its caller's frames on what it inlines."""
    inner, _ = open_closed(jaxpr)
    eqns = [inherit_source(e, outer) for e in inner.eqns]
    if all(a is b for a, b in zip(eqns, inner.eqns, strict=True)):
        return jaxpr
    replaced = inner.replace(eqns=eqns)
    return jaxpr.replace(jaxpr=replaced) if isinstance(jaxpr, ClosedJaxpr) else replaced


def nested_eqns(eqns: Sequence[JaxprEqn], outer: JaxprEqn | None = None) -> Iterator[JaxprEqn]:
    """``eqns`` and, after each, those of the jaxprs nested in it, at any depth, each pointing
    at the user's line of the equation that holds it where it has none (``inherit_source``)."""
    for eqn in eqns:
        eqn = inherit_source(eqn, outer)
        yield eqn
        for _, sub in sub_jaxprs(eqn.params):
            yield from nested_eqns(open_jaxpr(sub).eqns, eqn)


def source_line(eqn: JaxprEqn) -> str:
    """The user's source line of ``eqn`` as ``file:line (function)``, or ``<unknown>``."""
    line = _user_line(eqn)
    return "<unknown>" if line is None else line


def _user_line(eqn: JaxprEqn) -> str | None:
    """``file:line (function)`` of the user's frame of ``eqn``, or None if it has none."""
    frame = _jax("jax._src.source_info_util.user_frame")(eqn.source_info.traceback)
    if frame is None:
        return None
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"


def open_closed(j: Jaxpr | ClosedJaxpr) -> tuple[Jaxpr, list]:
    """``(jaxpr, consts)`` of a jaxpr, closed (its constants) or not (none)."""
    return (j.jaxpr, list(j.consts)) if isinstance(j, ClosedJaxpr) else (j, [])


def is_inlined_call(eqn: JaxprEqn) -> bool:
    """A nested ``jit`` or ``closed_call``, or an inner serialized function's chunk loop
    (``loop_call``, native's or a vmapped region's): evaluated inline by the rewriter."""
    return eqn.primitive in _inlined_calls()


@functools.cache
def _inlined_calls() -> frozenset:
    calls = (primitive("jit"), primitive("closed_call"), loop_p())
    return frozenset(p for p in calls if p is not None)


def is_checkpoint(eqn: JaxprEqn) -> bool:
    """A ``jax.checkpoint`` / ``jax.remat`` call (``remat2`` in jax 0.10)."""
    return eqn.primitive is primitive("remat2") or eqn.primitive is primitive("checkpoint")


def called_jaxpr(eqn: JaxprEqn) -> Jaxpr | ClosedJaxpr:
    """The body of a call equation (``jit``'s and a loop call's ``jaxpr``, ``closed_call``'s
    ``call_jaxpr``)."""
    return eqn.params["jaxpr"] if "jaxpr" in eqn.params else _param(eqn, "call_jaxpr")


def constvars_to_invars(closed: ClosedJaxpr) -> tuple[Jaxpr, list]:
    """``(jaxpr, consts)`` with the constants turned into leading inputs."""
    convert = _jax("jax._src.interpreters.partial_eval.convert_constvars_jaxpr")
    return convert(closed.jaxpr), list(closed.consts)


def flatten_in_axes(in_axes: object, args: tuple) -> list:
    """``in_axes`` (``jax.vmap``'s prefix semantics) broadcast to one entry per leaf of
    ``args``; a ``ValueError`` that shows both trees when it is not a prefix."""
    flatten_axes = _jax("jax._src.api_util.flatten_axes")
    if isinstance(in_axes, list):  # as jax.vmap: a list is a tuple prefix
        in_axes = tuple(in_axes)
    return flatten_axes("serialize_axis in_axes", jax.tree_util.tree_structure(args), in_axes)


def jax_version() -> str:
    return jax.__version__


def _shaped(v: Atom) -> ShapedArray:
    """A jaxpr variable's aval, which is a ``ShapedArray`` (an array's: the rewriter handles
    no other values)."""
    return cast(ShapedArray, v.aval)


def shape_of(v: Atom) -> tuple[int, ...]:
    """The shape of a jaxpr variable (its aval is a ``ShapedArray``)."""
    return tuple(_shaped(v).shape)


def dtype_of(v: Atom) -> np.dtype:
    """The dtype of a jaxpr variable (its aval is a ``ShapedArray``)."""
    return np.dtype(_shaped(v).dtype)


def aval_dtype(v: Atom) -> jax.typing.DTypeLike:
    """The dtype of a jaxpr variable as JAX records it (for a key, an extended dtype, which
    ``np.dtype`` cannot hold)."""
    return _shaped(v).dtype


def gather_fill_value(eqn: JaxprEqn) -> jax.typing.ArrayLike:
    """The value a ``fill``-mode gather returns for an out-of-range index (JAX's defaults
    where the parameter is None)."""
    fill = eqn.params.get("fill_value")
    if fill is not None:
        return fill
    dtype = dtype_of(eqn.outvars[0])
    if jax.dtypes.issubdtype(dtype, np.inexact):  # bfloat16 too (NumPy's says no)
        return np.nan
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype.type)  # type: ignore[type-var]
        return info.min if np.issubdtype(dtype, np.signedinteger) else info.max
    return True


def is_pure(eqn: JaxprEqn) -> bool:
    """No effects and no sub-jaxprs: recomputing the equation gives the same values."""
    return not eqn.effects and not any(True for _ in sub_jaxprs(eqn.params))


def new_var(aval: Aval) -> Var:
    return Var(aval)
