"""Custom derivative calls (``custom_jvp_call``, ``custom_vjp_call``): their bodies, their
rules as jaxprs at the call's own shapes, and who defined them. Their parameter layouts are
read through ``param``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, JaxprEqn, Literal, jaxpr_as_fun

from jaxpr_accum._compat._lookup import internal as _jax
from jaxpr_accum._compat._lookup import param as _param
from jaxpr_accum._compat._lookup import primitive
from jaxpr_accum._compat._types import Atom, Aval, Jaxpr, Params, ShapedArray


def _is_cotangent(x: object) -> bool:
    """An output of a backward rule that is a cotangent it computed: a concrete or traced
    array. Not a symbolic zero, None, nor a NumPy scalar: a constant, which a rule linear in
    its cotangents can only return as a zero."""
    return isinstance(x, (jax.Array, np.ndarray, _jax("jax.core.Tracer")))


def is_custom_vjp_call(eqn: JaxprEqn) -> bool:
    """A call of a ``jax.custom_vjp`` function."""
    return eqn.primitive is primitive("custom_vjp_call")


def is_custom_rule_call(eqn: JaxprEqn) -> bool:
    """A call of a ``jax.custom_vjp`` or a ``jax.custom_jvp`` function."""
    return eqn.primitive in (primitive("custom_vjp_call"), primitive("custom_jvp_call"))


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

    def bwd(*args: object) -> list:
        return list(bwd_fun.call_wrapped(*args))

    return fwd_jaxpr_of, bwd


def cotangent_aval(aval: ShapedArray) -> Aval | jax.ShapeDtypeStruct:
    """The cotangent type of a primal: its tangent type for inexact dtypes (inside
    ``shard_map``, varying over the manual axes the primal varies over), ``float0``
    otherwise."""
    if jax.dtypes.issubdtype(aval.dtype, np.inexact):  # bfloat16 too (NumPy's says no)
        return aval.to_tangent_aval()
    return jax.ShapeDtypeStruct(aval.shape, jax.dtypes.float0)


def trace_custom_vjp_bwd(
    bwd: Callable, avals: Sequence[Aval | jax.ShapeDtypeStruct]
) -> tuple[ClosedJaxpr, list[bool]]:
    """A custom VJP's backward rule as a jaxpr at the given (full-size) argument types
    (abstract values, with their varying manual axes inside ``shard_map``: the rule's
    outputs are checked against the primal's).

    Returns ``(jaxpr, returned)``: ``returned[i]`` says whether the rule gives an array for
    primal operand ``i`` (the jaxpr outputs only those), or a zero / ``None``.
    """
    returned: list[bool] = []

    def arrays_only(*args: object) -> list:
        outs = bwd(*args)
        returned[:] = [_is_cotangent(x) for x in outs]
        return [x for x in outs if _is_cotangent(x)]

    return jax.make_jaxpr(arrays_only)(*avals), returned


def custom_vjp_backward(
    eqn: JaxprEqn, fwd: ClosedJaxpr, input_fwds: Sequence[int | None], bwd: Callable
) -> tuple[ClosedJaxpr, list[bool], list[Atom | int]]:
    """A custom VJP call's backward rule traced at the call's shapes
    (``trace_custom_vjp_bwd``, from its forward rule ``fwd`` of ``custom_vjp_parts``), and
    where each residual it takes comes from: a variable (or literal) the forward rule
    outputs, or, an ``int``, the index of the operand the rule forwards."""
    computed = iter(fwd.jaxpr.outvars)  # the residuals the rule computes come first
    sources = [next(computed) if f is None else f for f in input_fwds]
    res = [eqn.invars[s].aval if isinstance(s, int) else s.aval for s in sources]
    cts = [cotangent_aval(cast(ShapedArray, v.aval)) for v in eqn.outvars]  # arrays
    # A residual the rule returns as a constant (``M.shape``) reaches JAX's backward rule as
    # that value, not a tracer (a shape it takes must be concrete): so here too.
    constants = [s.val if isinstance(s, Literal) else None for s in sources]

    def with_constants(*args: object) -> object:
        given = [a if c is None else c for a, c in zip(args, constants, strict=False)]
        return bwd(*given, *args[len(constants) :])

    jaxpr, returned = trace_custom_vjp_bwd(with_constants, [*res, *cts])
    return _traced_at(jaxpr, eqn.source_info.traceback), returned, sources


def _traced_at(closed: ClosedJaxpr, traceback: object) -> ClosedJaxpr:
    """``closed`` with every equation, in every inner jaxpr, at ``traceback``: the rule's
    operations name the call's line, as when JAX traces the rule while it differentiates
    the call (a function it traced before, inside a ``jit``, would keep that trace's)."""

    def at(value: object) -> object:
        if isinstance(value, ClosedJaxpr):
            return ClosedJaxpr(jaxpr(value.jaxpr), value.consts)
        if isinstance(value, Jaxpr):
            return jaxpr(value)
        if isinstance(value, tuple) and any(isinstance(v, ClosedJaxpr) for v in value):
            return tuple(at(v) for v in value)
        return value

    def jaxpr(inner: Jaxpr) -> Jaxpr:
        eqns = [
            e.replace(
                source_info=e.source_info.replace(traceback=traceback),
                params={k: at(v) for k, v in e.params.items()},
            )
            for e in inner.eqns
        ]
        return inner.replace(eqns=eqns)

    return ClosedJaxpr(jaxpr(closed.jaxpr), closed.consts)


def rebind_keeping_constants(
    eqn: JaxprEqn, invals: Sequence[object], params: Params
) -> tuple[Params, list] | None:
    """``(bind params, operands)`` of a ``custom_vjp_call`` re-emitted with its concrete
    operands (constants: a traced argument is a tracer) closed over by its function, so that
    the retrace hoists them as the new call's constants (``num_consts``), which no rule
    differentiates; None where it has none (bind as usual; ``params``: those of
    ``get_bind_params``).

    Inside a ``jit``, JAX passes the arrays that a custom function closes over as plain
    operands (``jax.experimental.ode.odeint``'s ``_odeint``: the Dormand-Prince tableau),
    the jit's constants: JAX never perturbs them, and the forward rule refuses them a
    tangent (``CustomVJPException``). Tracing inlines the jit and they became operands like
    the others; closed over, they are constants again, as in the original. A traced value
    the function closes over stays an operand, which the closure check finds."""
    tracer = _jax("jax.core.Tracer")
    nc = _param(eqn, "num_consts")  # constants already: the rules take the rest
    fixed = [i < nc or not isinstance(x, tracer) for i, x in enumerate(invals)]
    if not any(fixed) or all(fixed):
        return None
    wrap_init = _jax("jax._src.linear_util.wrap_init")
    call, thunk, out_trees, bwd = (
        _param(eqn, k) for k in ("call_jaxpr", "fwd_jaxpr_thunk", "out_trees", "bwd")
    )
    consts = [x for x, f in zip(invals, fixed, strict=True) if f]
    arg_index = {i: sum(not f for f in fixed[:i]) for i, f in enumerate(fixed) if not f}

    def merged(args: Sequence[object], const: bool | None = None) -> list:
        it_c, it_a = iter(consts), iter(args)
        return [(next(it_c) if const is None else const) if f else next(it_a) for f in fixed]

    def fun(*args: object) -> list:
        return jaxpr_as_fun(call)(*merged(args))

    def fwd(*interleaved: object) -> list:  # (value, nonzero) pairs of the traced operands
        vals, nonzeros = interleaved[::2], interleaved[1::2]
        jaxpr, fwd_consts = thunk.call_wrapped(*merged(nonzeros, False)[nc:])
        operands = merged(vals)
        outs = _jax("jax._src.core.eval_jaxpr")(jaxpr, fwd_consts, *operands[nc:])
        _, res_tree, input_fwds = out_trees()
        computed = iter(outs[: res_tree.num_leaves - sum(f is not None for f in input_fwds)])
        # a residual forwarded from a constant is an output now (it is no operand)
        res = [next(computed) if f is None else operands[f] for f in input_fwds]
        kept = [r for r, f in zip(res, input_fwds, strict=True) if f is None or fixed[f]]
        return [*kept, *outs[len(outs) - len(eqn.outvars) :]]

    def trees() -> tuple:
        out_tree, res_tree, input_fwds = out_trees()
        return (
            out_tree,
            res_tree,
            [None if f is None or fixed[f] else arg_index[f] for f in input_fwds],
        )

    def bwd_args(*args: object) -> list:  # the cotangents of the traced operands
        return [ct for ct, f in zip(bwd.call_wrapped(*args), fixed[nc:], strict=True) if not f]

    subfuns = (
        wrap_init(fun, debug_info=call.jaxpr.debug_info),
        wrap_init(fwd, debug_info=thunk.debug_info),
        wrap_init(bwd_args, debug_info=bwd.debug_info),
    )
    args = [x for x, f in zip(invals, fixed, strict=True) if not f]
    return {**params, "subfuns": subfuns, "out_trees": trees}, args


def rules_close_over_tracers(eqn: JaxprEqn) -> bool:
    """Whether a custom JVP/VJP call's rules (its JVP rule; its forward or backward rule)
    close over a tracer: a value computed inside the traced function (the rule is defined
    there), or one of a transformation around it. Once staged, such a call cannot be
    differentiated: JAX traces the rules when it differentiates, and the tracer becomes a
    constant of that trace, which does not lower ("No constant handler for type";
    ``jax.grad(jax.jit(f))`` fails alike)."""
    if not is_custom_rule_call(eqn):
        return False
    nc = _param(eqn, "num_consts")
    n = len(eqn.invars) - nc
    try:
        if not is_custom_vjp_call(eqn):
            return _any_tracer(_param(eqn, "jvp_jaxpr_fun").call_wrapped(*[False] * n)[1])
        fwd_of, bwd = custom_vjp_parts(eqn)
        fwd, (_, input_fwds) = fwd_of([True] * n)
        if _any_tracer(fwd.consts):
            return True
        return _any_tracer(custom_vjp_backward(eqn, fwd, input_fwds, bwd)[0].consts)
    except Exception as error:
        # A tracer of a transformation that has ended (a ``jax.vmap`` inside the function),
        # or a primal closing over a traced value that a retrace made an operand (JAX refuses
        # its forward rule a perturbed one): JAX cannot differentiate either. Any other error
        # is a rule that does not trace (the user's): planning's fallbacks decide.
        closed_over = (jax.errors.UnexpectedTracerError, _jax(_CLOSED_OVER_DIFFERENTIATED))
        return isinstance(error, closed_over)


_CLOSED_OVER_DIFFERENTIATED = "jax._src.interpreters.ad.CustomVJPException"


def _any_tracer(values: Sequence[object]) -> bool:
    return any(isinstance(x, _jax("jax.core.Tracer")) for x in values)


def zeros_float0(shape: Sequence[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=jax.dtypes.float0)
