"""Which JAX versions are tested; lookups of JAX's internals that say clearly when one has
moved (the rest of ``_compat`` goes through ``internal`` and ``param``); JAX's primitives by
name.

The package's rule tables name primitives (``table_primitive``). A name the installed JAX has
no primitive for is skipped and recorded in ``ABSENT``, never an error at import: such a
primitive cannot appear in this JAX's programs. On a tested JAX, ``ABSENT`` is exactly what
that series lacks (tests/test_compat.py checks it, so a misspelt name fails there); on an
untested one, the one version warning (``check_jax_version``, issued once the tables are
built) lists what was skipped.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import jax

from jaxpr_accum._base._errors import PlanWarning, warn
from jaxpr_accum._compat._types import Eqn, Primitive

TESTED = ("0.9", "0.10")  # the series of JAX that CI tests
_TESTED_TEXT = " and ".join(f"{v}.x" for v in TESTED)


class JaxVersionWarning(PlanWarning):
    """The installed JAX is of another series than the tested ones (0.9.x and 0.10.x).

    Issued once, at ``import jaxpr_accum``. The package may work there, or raise
    ``MissingInternal`` where an internal it needs has moved; the warning also lists the
    primitives its rule tables name that this JAX does not have (skipped: they cannot appear
    in this JAX's programs). A ``PlanWarning``, so filtering those filters this one too.

    Examples:
        >>> import warnings, jaxpr_accum as ja
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", category=ja.JaxVersionWarning)
    """


class MissingInternal(RuntimeError):
    """A JAX internal this package needs is not in the installed JAX.

    Raised at first use of the piece (a private function, a parameter of an equation) on a
    JAX whose internals have moved, typically one outside the tested series (see
    ``JaxVersionWarning``); the message names the piece and the JAX version. A
    ``RuntimeError``: no argument of the caller's can fix it, only another JAX version.

    Examples:
        >>> import jaxpr_accum as ja
        >>> issubclass(ja.MissingInternal, RuntimeError)
        True
    """

    def __init__(self, what: str):
        super().__init__(
            f"jaxpr_accum needs {what}, which JAX {jax.__version__} does not have; "
            f"tested with JAX {_TESTED_TEXT}"
        )


_warned = False


def check_jax_version(version: str | None = None) -> bool:
    """Whether ``version`` (default: the installed JAX's) is of a tested series; if it is not,
    a ``JaxVersionWarning``, once per process, that lists the rule-table entries skipped so
    far (``ABSENT``; the package calls this once its tables are built)."""
    global _warned
    version = jax.__version__ if version is None else version
    tested = ".".join(version.split(".")[:2]) in TESTED
    if not tested and not _warned:
        _warned = True
        message = (
            f"jaxpr_accum is tested with JAX {_TESTED_TEXT}, not {version}; it raises "
            "MissingInternal where an internal of JAX it needs has moved"
        )
        if ABSENT:
            message += (
                "; its rule tables name primitives this JAX does not have, skipped: "
                + ", ".join(sorted(ABSENT))
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


def param(eqn: Eqn, key: str) -> Any:
    """``eqn.params[key]``; ``MissingInternal`` where the installed JAX's parameter layout of
    that primitive has no ``key``."""
    try:
        return eqn.params[key]
    except KeyError:
        raise MissingInternal(f"the `{key}` parameter of `{eqn.primitive.name}`") from None


@functools.cache
def _primitives_by_name() -> dict[str, Primitive]:
    """Every primitive of the installed JAX by name: the public ``jax.extend.core.primitives``
    first, then (the one name fallback) the ``*_p`` objects of JAX's private modules for the
    few it does not export (``tile``, ``optimization_barrier``, ``random_wrap``, ...)."""
    from jax.extend.core import primitives

    index: dict[str, Primitive] = {}
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


def primitive(name: str) -> Primitive | None:
    """JAX's primitive object named ``name``, or None if the installed JAX has none."""
    return _primitives_by_name().get(name)


# Names in the package's own tables that the installed JAX has no primitive for (newer or
# older ones than it has): such a primitive cannot appear in its programs, so it is skipped.
ABSENT: set[str] = set()


def table_primitive(name: str) -> Primitive | None:
    """The primitive named ``name`` in one of the package's own tables, or None, recorded in
    ``ABSENT``, if the installed JAX has none (see the module docstring; a user's unknown
    name, ``register_rule``'s, is an error instead)."""
    found = primitive(name)
    if found is None:
        ABSENT.add(name)
    return found


def primitives(names: str) -> frozenset[Primitive]:
    """The primitive objects for whitespace-separated ``names``, a table of the package's own
    (see ``table_primitive``: a name the installed JAX lacks is skipped)."""
    found = (table_primitive(name) for name in names.split())
    return frozenset(p for p in found if p is not None)
