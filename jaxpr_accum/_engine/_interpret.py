"""The one equation interpreter: evaluate a jaxpr's equations under the current JAX trace.

``eval_eqns(eqns, env, emit, indices)`` runs ``eqns[i]`` for ``i`` in ``indices`` (all, by
default) in order, reading operands from ``env`` (literals by value) and writing results back;
``emit(idx, eqn, invals) -> outs`` decides what each equation becomes: bound unchanged
(``bind``), resized to the chunk (the resizer), or re-expressed (canonical convolutions).
``eval_jaxpr`` does the same for a whole (closed) jaxpr. ``inlining(emit)`` wraps an emitter
so that nested ``jit`` / ``closed_call`` equations are evaluated inline, recursively, each
inner equation pointing at the user's line of the call when it has none of its own.

Invariant: every equation is re-emitted through ``emit`` under its own source information,
so the program built keeps pointing at the user's lines. The program built binds a primitive
that JAX binds only inside a jitted call of its own inside a call again (``bind``); tracing
for planning does not (``retrace``), so the planner reads the primitive itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from jaxpr_accum import _compat
from jaxpr_accum._compat import Array, Atom, ClosedJaxpr, Jaxpr, JaxprEqn, Literal

Emit = Callable[[int, JaxprEqn, list], list]


def bind(idx: int, eqn: JaxprEqn, invals: list) -> list:
    """The default emitter: the equation unchanged (a primitive that JAX binds only inside a
    jitted function of its own, inside a ``jit`` again: ``_compat.called_only``). Run eagerly
    (a de-optimized run under ``jax_debug_nans`` / ``jax_debug_infs``), an equation that makes
    an invalid value raises JAX's error naming the operation, with a note of the user's line,
    which the original's de-optimized run shows as its traceback's last frame of user code."""
    try:
        return _compat.bind(eqn, invals)
    except (FloatingPointError, ZeroDivisionError) as e:
        if not any(n.startswith(_MADE_BY) for n in getattr(e, "__notes__", ())):
            e.add_note(f"{_MADE_BY} `{eqn.primitive.name}` at {_compat.source_line(eqn)}")
        raise


_MADE_BY = "made by"


def retrace(idx: int, eqn: JaxprEqn, invals: list) -> list:
    """The emitter of tracing for planning: the equation itself, with no call around it."""
    return _compat.bind(eqn, invals, in_own_call=False)


def read(env: dict, v: Atom) -> Array:
    return v.val if isinstance(v, Literal) else env[v]


def eval_eqns(
    eqns: Sequence[JaxprEqn], env: dict, emit: Emit = bind, indices: Iterable[int] | None = None
) -> None:
    for idx in range(len(eqns)) if indices is None else indices:
        eqn = eqns[idx]
        outs = emit(idx, eqn, [read(env, v) for v in eqn.invars])
        for v, x in zip(eqn.outvars, outs, strict=True):
            if not isinstance(v, _compat.DropVar):
                env[v] = x


def eval_jaxpr(jaxpr: Jaxpr | ClosedJaxpr, args: Sequence, emit: Emit = bind) -> list:
    """Evaluate a (closed) jaxpr on ``args``; constants of a closed jaxpr come with it."""
    inner, consts = _compat.open_closed(jaxpr)
    env: dict = dict(zip(inner.constvars, consts, strict=True))
    env.update(zip(inner.invars, args, strict=True))
    eval_eqns(inner.eqns, env, emit)
    return [read(env, v) for v in inner.outvars]


def inlining(emit: Emit = bind, outer: JaxprEqn | None = None) -> Emit:
    """``emit`` with nested calls (``jit``, ``closed_call``) evaluated inline, recursively,
    and a platform-dependent ``cond`` by the branch every ordinary lowering takes
    (``_compat.ordinary_branch``: ``jnp.diagonal``'s, whose other branch is a Pallas
    kernel's)."""

    def emit_inlined(idx: int, eqn: JaxprEqn, invals: list) -> list:
        eqn = _compat.inherit_source(eqn, outer)
        if _compat.is_inlined_call(eqn):
            return eval_jaxpr(_compat.called_jaxpr(eqn), invals, inlining(emit, eqn))
        if (branch := _compat.ordinary_branch(eqn)) is not None:
            return eval_jaxpr(branch, invals[1:], inlining(emit, eqn))
        return emit(idx, eqn, invals)

    return emit_inlined


def has_calls(jaxpr: Jaxpr | ClosedJaxpr) -> bool:
    """Whether ``inlining`` would change any of the jaxpr's equations."""
    return any(
        _compat.is_inlined_call(e) or _compat.ordinary_branch(e) is not None
        for e in _compat.open_jaxpr(jaxpr).eqns
    )
