"""The library's own exception and warning, in a leaf module that every other module may import.

Every warning ``jaxpr_accum`` issues is a ``PlanWarning`` issued through ``warn``, which
attributes it to the user's code: the first frame of the call stack outside this package and
outside the frameworks it runs under (JAX, jaxlib, Flax, Equinox, Haiku, and the standard
library's ``contextlib``, through which they enter contexts). So the warning's ``filename``
and ``lineno`` are the line of the user's program that called into the library, also when
that call is traced under ``jax.jit`` or ``jax.grad``, and Python's "once per location"
filtering uses the user's module registry, as ``warnings.warn(..., stacklevel=n)`` would for
a direct call.
"""

from __future__ import annotations

import sys
import warnings

#: Modules whose frames are never the user's (the package itself and what it runs under).
_INTERNAL = ("jaxpr_accum", "jax", "jaxlib", "flax", "equinox", "haiku", "contextlib")


class SerializeError(ValueError):
    """The program cannot be serialized along the requested axis; the message says why.

    Raised at the first call (or ``explain``) when there is no candidate axis, when two
    different axes have the requested ``size``, or when no equation can run per chunk. The
    message names the primitives and your source lines, and what to pass instead. Where only
    part of a program cannot be chunked, nothing is raised: that part runs unchunked and
    ``explain`` says why. A ``ValueError``; it is not the error for bad arguments (those raise
    ``TypeError`` or ``ValueError`` naming the argument).

    Examples:
        >>> import jax.numpy as jnp
        >>> import jaxpr_accum as ja
        >>> sf = ja.serialize_axis(lambda x: jnp.sum(x**2), chunk=4, size=7)
        >>> try:
        ...     sf(jnp.ones((10, 3)))
        ... except ja.SerializeError as e:
        ...     print(str(e).split(";")[0])
        found no axis of size 7 born at position 0
    """


class ArgumentError(ValueError):
    """A bad argument of the user's, found once the call's arguments are known.

    A ``ValueError`` naming the argument and what was expected (``argnums`` or ``axis`` out of
    range, leaves of unequal length along the axis, a chunk that the shards do not divide).
    It is reported as it is, never a reason to fall back to a narrower plan. It is not a
    ``SerializeError``: that one says the program, not the call, has nothing to chunk.

    Examples:
        >>> import jax.numpy as jnp
        >>> import jaxpr_accum as ja
        >>> sf = ja.serialize_axis(lambda w, x: jnp.sum(x @ w), chunk=4, argnums=(0, 1))
        >>> try:
        ...     sf(jnp.ones((8, 3)), jnp.ones((10, 8)))
        ... except ValueError as e:
        ...     print(type(e).__name__)
        ArgumentError
    """


class PlanWarning(UserWarning):
    """A warning from ``jaxpr_accum`` about a plan: one not expected to save memory, a fallback.

    The category of every warning the library issues: a plan not expected to save memory (on
    its first call), and a fallback to a narrower plan after an internal error (naming the
    error). It is attributed to the line of your code that called into the library, also
    through ``jax.jit`` and ``jax.grad``, so the usual filters apply.

    Examples:
        >>> import warnings
        >>> import jaxpr_accum as ja
        >>> with warnings.catch_warnings():
        ...     warnings.filterwarnings("ignore", category=ja.PlanWarning)  # silenced here
        ...     # or "error": every PlanWarning raised, as in a strict test suite
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
