"""Which JAX versions are tested; lookups of JAX's internals that say clearly when one has
moved (the rest of ``_compat`` goes through ``internal`` and ``param``); JAX's primitives by
name."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import jax

from jaxpr_accum._errors import PlanWarning, warn

TESTED = ("0.9", "0.10")  # the series of JAX that CI tests
_TESTED_TEXT = " and ".join(f"{v}.x" for v in TESTED)


class JaxVersionWarning(PlanWarning):
    """The installed JAX is of another series than the tested ones (``TESTED``): it may work,
    or raise ``MissingInternal`` where an internal this package needs has moved."""


class MissingInternal(RuntimeError):
    """A JAX internal this package needs (a private function, a parameter of an equation) is
    not in the installed JAX."""

    def __init__(self, what: str):
        super().__init__(
            f"jaxpr_accum needs {what}, which JAX {jax.__version__} does not have; "
            f"tested with JAX {_TESTED_TEXT}"
        )


_warned = False


def check_jax_version(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed JAX's) is of a tested series; if it is not,
    a ``JaxVersionWarning``, once per process."""
    global _warned
    version = jax.__version__ if version is None else version
    tested = ".".join(version.split(".")[:2]) in TESTED
    if not tested and not _warned:
        _warned = True
        message = (
            f"jaxpr_accum is tested with JAX {_TESTED_TEXT}, not {version}; it raises "
            "MissingInternal where an internal of JAX it needs has moved"
        )
        warn(message, JaxVersionWarning)  # attributed to the user's import
    return tested


@functools.cache
def internal(path: str) -> Any:
    """JAX's ``module.attr`` named by ``path`` (``"jax._src.core.Var"``), looked up at first
    use; ``MissingInternal`` if the installed JAX has no such thing."""
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise MissingInternal(path) from None


def param(eqn: Any, key: str) -> Any:
    """``eqn.params[key]``; ``MissingInternal`` where the installed JAX's parameter layout of
    that primitive has no ``key``."""
    try:
        return eqn.params[key]
    except KeyError:
        raise MissingInternal(f"the `{key}` parameter of `{eqn.primitive.name}`") from None


@functools.cache
def _primitives_by_name() -> dict[str, Any]:
    """Every primitive of the installed JAX by name: the public ``jax.extend.core.primitives``
    first, then (the one name fallback) the ``*_p`` objects of JAX's private modules for the
    few it does not export (``tile``, ``optimization_barrier``, ``random_wrap``, ...)."""
    from jax.extend.core import Primitive, primitives

    index: dict[str, Any] = {}
    for value in vars(primitives).values():
        if isinstance(value, Primitive):
            index.setdefault(value.name, value)
    for name, module in sorted(sys.modules.items()):
        if module is None or not name.startswith("jax._src"):
            continue
        for attr, value in list(vars(module).items()):
            if attr.endswith("_p") and isinstance(value, Primitive):
                index.setdefault(value.name, value)
    return index


def primitive(name: str) -> Any:
    """JAX's primitive object named ``name``, or None if the installed JAX has none."""
    return _primitives_by_name().get(name)


# Names in the package's own tables that the installed JAX has no primitive for (newer or
# older ones than it has): such a primitive cannot appear in its programs, so it is skipped.
ABSENT: set[str] = set()


# Primitives that some tested JAX has and another lacks (0.10 only, for now): the package's
# tables name them, and skip them where the installed JAX has none.
VERSION_DEPENDENT = frozenset({"mulhi", "ormqr", "stack", "unstack", "stage"})


def table_primitive(name: str) -> Any:
    """The primitive named ``name`` in one of the package's own tables, or None (recorded in
    ``ABSENT``) if the installed JAX lacks it and it is one of ``VERSION_DEPENDENT``; any
    other unknown name is an error, as a user's is (``primitive``)."""
    found = primitive(name)
    if found is None:
        if name not in VERSION_DEPENDENT:
            raise ValueError(
                f"no primitive named {name!r} in JAX {jax.__version__}, and it is not one "
                "that a tested JAX version lacks: a misspelt name in a rule table?"
            )
        ABSENT.add(name)
    return found


def primitives(names: str) -> frozenset:
    """The primitive objects for whitespace-separated ``names``, a table of the package's own
    (see ``table_primitive``: a name the installed JAX lacks is skipped)."""
    found = (table_primitive(name) for name in names.split())
    return frozenset(p for p in found if p is not None)
