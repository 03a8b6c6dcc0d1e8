"""Fail-safe: no internal error of this library reaches a user whose original function runs.

A plan is made in *attempts* (``_planner.Planner.attempts``), from the widest to the
narrowest: the plan as chosen (in two passes where the program pairs the axis with itself;
elsewhere that attempt answers ``DoesNotApply`` and the next takes its name), in one pass, the
same without streamed normalisers, the same with ``native`` gradients (JAX differentiates the
chunk loop itself), and finally the original function, unchunked. Each attempt plans, builds,
and *validates*: it traces the built program's forward pass and its reverse-mode backward pass
abstractly (``jax.eval_shape`` of a VJP), so that a failure that would only surface when
``jax.grad`` transposes the region is found now, not in the middle of the user's training
step. The program is traced under ``jax.jit``, as the call runs it: JAX's caches (keyed by the
function, its avals and the perturbed inputs) then hand a differentiated call the traced
program and its linearization instead of making them again. The first attempt that gets
through is used; if it is not the first, one ``PlanWarning`` names the internal error, the
stage where it happened and what runs instead.

At call time (``ready``) the built program is traced, and for a call that runs now lowered
and compiled, before it runs: a failure there is the library's and runs the original for that
call. The run itself is never caught: nothing of the user's has run before it, everything
after it is the user's (a callback's exception, ``checkify``, ``jax_debug_nans``), raised as
it is, and a fallback would run the user's callbacks twice. Planning never runs the program
either (measurements compile at abstract inputs; validation traces).

What is never caught: a ``SerializeError`` of the first attempt (the documented answer for a
program with nothing to chunk), and ``ArgumentError`` (a bad argument of the user's); errors
raised by the user's own function while it is traced run before any attempt. A backward pass
that fails for the original too (a ``while_loop`` is not reverse-differentiable) is the
program's, not ours: the plan is kept.

``JAXPR_ACCUM_STRICT=1`` turns every fallback into the error itself; the project's own tests
run strict, so a fallback never hides a defect from them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._base._errors import ArgumentError, SerializeError, stage, stage_of, warn
from jaxpr_accum._compat import Array
from jaxpr_accum._planning._attempt import Attempt

STRICT_VARIABLE = "JAXPR_ACCUM_STRICT"
T = TypeVar("T")


def strict() -> bool:
    """Whether fallbacks are errors (``JAXPR_ACCUM_STRICT`` set to anything but 0/false)."""
    return os.environ.get(STRICT_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def describe(error: BaseException) -> str:
    where = stage_of(error) or "planning"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__} while {where}" + (f": {first[:300]}" if first else "")


@dataclasses.dataclass(frozen=True)
class DoesNotApply:
    """An attempt's answer where it has nothing to try (the two-pass plan of a program that
    pairs nothing), and ``why``: the next attempt takes its place, and its name."""

    why: str


def first_that_works(
    attempts: Sequence[Attempt],
    run: Callable[[Attempt], T | DoesNotApply],
    unchunked: Callable[[str], T],
) -> T:
    """``run(attempt)`` for the first of ``attempts`` that does not raise an internal error
    and applies; ``unchunked(why)`` when none does. An attempt that does not apply
    (``DoesNotApply``) is not a failure: the next one takes its place, and its name."""
    failures: list[str] = []
    instead: str | None = None  # the name of an attempt that did not apply
    for attempt in attempts:
        what, instead = instead or attempt.what, None
        try:
            result = run(attempt)
        except ArgumentError:
            raise
        except SerializeError:
            if not failures:
                raise
            failures.append(f"{what}: nothing to chunk")
            continue
        except Exception as error:
            if strict():
                raise
            failures.append(f"{what}: {describe(error)}")
            continue
        if isinstance(result, DoesNotApply):
            instead = what
            continue
        if failures:
            warn(_message(failures, what))
        return result
    why = _message(failures, "the original function, unchunked")
    warn(why)
    return unchunked(why)


def _message(failures: list[str], instead: str) -> str:
    return (
        f"jaxpr_accum hit an internal error ({failures[0]}); running {instead} instead, with "
        "the original's values and gradients. Please report it with a program that "
        f"reproduces it; set {STRICT_VARIABLE}=1 to raise it instead."
        + ("" if len(failures) == 1 else " Narrower plans tried: " + "; ".join(failures[1:]))
    )


def at_call(error: BaseException) -> str:
    """The warning for a call whose built program failed to trace or compile although it
    validated."""
    return _message([describe(error)], "the original function, unchunked, for this call")


def ready(
    jitted: jax.stages.Wrapped, inputs: Sequence, done: set[bool], original: Callable
) -> bool:
    """The library's stages of a call, run ahead of it so that their failures are told from
    the user's: trace ``jitted`` at ``inputs`` and, for a call that runs now (no enclosing
    transformation traces it), lower and compile it; JAX's caches hand the call itself what
    was made here. Once per kind of call (``done``: the kinds already made). False where the
    ``original`` (a function of the same inputs) does not lower either (a ``checkify.check``
    outside ``checkify``): not ours, the call runs the function as written."""
    now = _compat.runs_now() and not any(isinstance(x, jax.core.Tracer) for x in inputs)
    if now in done:
        return True
    with stage("tracing the built program for this call"):
        traced = jitted.trace(*inputs)
    if now:
        try:
            with stage("compiling the built program for this call"):
                traced.lower().compile()
        except Exception:
            try:
                jax.jit(original).trace(*inputs).lower()
            except Exception:
                return False
            raise
    done.add(now)
    return True


def validate(run: Callable, inputs: Sequence, original: Callable, diff: Sequence[int]) -> None:
    """Trace ``run``'s forward pass and its VJP with respect to the floating inputs ``diff``
    (what the plan is for: the inputs its caller differentiates, every floating input where
    that is not known), abstractly; a failure is raised unless the ``original`` fails there
    too. Traced as ``jax.jit(run)``, as the call runs it (module docstring)."""
    avals = [_compat.abstract_like(x) for x in inputs]
    try:
        jax.eval_shape(_backward_of(jax.jit(run), avals, diff), *avals)
    except Exception:
        try:
            jax.eval_shape(_backward_of(original, avals, diff), *avals)
        except Exception:
            return  # not reverse-differentiable as written: not ours to fix
        raise


def _backward_of(fun: Callable, avals: Sequence, diff: Sequence[int]) -> Callable:
    def backward(*xs: Array) -> list:
        def of_floats(*d: Array) -> list:
            full = list(xs)
            for i, x in zip(diff, d, strict=True):
                full[i] = x
            return list(fun(*full))

        outs, pullback = jax.vjp(of_floats, *(xs[i] for i in diff))
        return pullback([_zero_cotangent(o) for o in outs])

    return backward


def _zero_cotangent(x: Array) -> Array | np.ndarray:
    if has_float_dtype(x):
        return jax.numpy.zeros_like(x)  # with ``x``'s varying manual axes, inside shard_map
    return np.zeros(x.shape, jax.dtypes.float0)
