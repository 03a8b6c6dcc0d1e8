"""The library's own exceptions and warning, in a leaf module that every other module may
import; and ``stage``, which labels an internal error with the stage of planning it was raised
in (a fallback's warning names it, ``_planning._fallback``).

Every warning ``jaxpr_accum`` issues is a ``PlanWarning`` issued through ``warn``, which
attributes it to the user's code: the first frame of the call stack outside this package and
outside the frameworks it runs under (JAX, jaxlib, Flax, Equinox, Haiku, and the standard
library's ``contextlib``, through which they enter contexts, and ``importlib``, through which a
warning at import comes). So the warning's ``filename`` and ``lineno`` are the line of the
user's program that called into (or imported) the library, also when
that call is traced under ``jax.jit`` or ``jax.grad``, and Python's "once per location"
filtering uses the user's module registry, as ``warnings.warn(..., stacklevel=n)`` would for
a direct call.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

#: Modules whose frames are never the user's (the package itself and what it runs under).
_INTERNAL = (
    "jaxpr_accum", "jax", "jaxlib", "flax", "equinox", "haiku", "contextlib", "importlib"
)  # fmt: skip


class SerializeError(ValueError):
    """The program cannot be serialized along the requested axis; the message says why.

    Raised at the first call (or ``explain`` / ``jaxpr`` / ``sweep``) with given argument
    shapes, when the function itself offers nothing to chunk: no axis of the requested size or
    position is found, no equation carries it, or a custom derivative rule cannot be chunked.
    It is about the program, never about a value: the same function with other shapes may
    serialize.

    ``SerializeError`` and ``ArgumentError`` are siblings: both subclass ``ValueError``, and
    neither subclasses the other. A ``SerializeError`` says "this program has no chunkable axis
    here", an ``ArgumentError`` says "these arguments do not match the settings". Catch
    ``ValueError`` for both.

    Examples:
        >>> import jax.numpy as jnp, jaxpr_accum as ja
        >>> sf = ja.serialize_axis(lambda x: jnp.sum(x), chunk=2, size=7)
        >>> try:
        ...     sf(jnp.ones(3))
        ... except ja.SerializeError as e:
        ...     print("cannot serialize:", e)  # doctest: +ELLIPSIS
        cannot serialize: ...
    """


class ArgumentError(ValueError):
    """A call's arguments do not match the function's settings; the message names which.

    Raised at the first call with given arguments (before anything is traced) where the
    settings of ``serialize_axis`` cannot apply to them: ``argnums`` or ``in_axes`` out of
    range or naming no array, leaves named for the axis that differ in size, ``axis`` out of
    range for an argument, a ``memory`` budget that no chunk fits. It is the caller's to fix,
    so it is reported as it is, never a reason for a narrower plan or a fallback.

    ``ArgumentError`` and ``SerializeError`` are siblings: both subclass ``ValueError``. An
    ``ArgumentError`` is about the arguments against the settings, a ``SerializeError`` about
    the program. Catch ``ValueError`` for both.

    Examples:
        >>> import jax.numpy as jnp, jaxpr_accum as ja
        >>> sf = ja.serialize_axis(lambda x, y: jnp.sum(x * y), chunk=2, argnums=(0, 1))
        >>> try:
        ...     sf(jnp.ones(4), jnp.ones(6))
        ... except ja.ArgumentError as e:
        ...     print("bad arguments:", e)  # doctest: +ELLIPSIS
        bad arguments: ...
    """


class PlanWarning(UserWarning):
    """A warning from ``jaxpr_accum`` about a plan: one not expected to save memory, a fallback.

    Attributed to the user's call site. Silence it with
    ``warnings.filterwarnings("ignore", category=jaxpr_accum.PlanWarning)``.

    Examples:
        >>> import warnings, jaxpr_accum as ja
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", category=ja.PlanWarning)
    """


def _internal(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in _INTERNAL)


def warn(message: str, category: type[Warning] = PlanWarning) -> None:
    """Issue ``message`` as a warning attributed to the first frame outside the library and
    the frameworks in ``_INTERNAL`` (the outermost frame if every frame is internal)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _internal(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    globs = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=globs.get("__name__", "<string>"),
        registry=globs.setdefault("__warningregistry__", {}),
    )  # no module_globals, as warnings.warn: a loader without sources (``python -c``) raises


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Label an exception raised inside with the stage of planning it was raised in (the
    innermost), which a fallback's warning names (``stage_of``)."""
    try:
        yield
    except Exception as error:
        if not hasattr(error, "_jaxpr_accum_stage"):
            error._jaxpr_accum_stage = name  # type: ignore[attr-defined]
        raise


def stage_of(error: BaseException) -> str | None:
    """The stage ``error`` was raised in (``stage``), or None."""
    return getattr(error, "_jaxpr_accum_stage", None)
