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
    """The program cannot be serialized along the requested axis (reason in the message)."""


class ArgumentError(ValueError):
    """A bad argument of the user's, found once the call's arguments are known (a
    ``ValueError``): reported as it is, never a reason to fall back to a narrower plan."""


class PlanWarning(UserWarning):
    """A warning from ``jaxpr_accum`` about a plan: one not expected to save memory, a fallback.

    Attributed to the user's call site. Silence it with
    ``warnings.filterwarnings("ignore", category=jaxpr_accum.PlanWarning)``.
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
