"""Jaxprs nested in an equation's parameters, found generically (by type, not by parameter
name, whose layouts change between JAX versions), a search through them, the branch that
every ordinary lowering takes of a platform-dependent ``cond``, and a fingerprint of
equations (equal for one program traced twice)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn


def open_jaxpr(j: Jaxpr | ClosedJaxpr) -> Jaxpr:
    """The ``Jaxpr`` of a jaxpr, closed or not (the one place that knows the two classes)."""
    return j.jaxpr if isinstance(j, ClosedJaxpr) else j


def sub_jaxprs(params: dict[str, Any]) -> Iterator[tuple[tuple, ClosedJaxpr | Jaxpr]]:
    """Every sub-jaxpr in ``params`` with its path: ``(key,)`` or ``(key, index)``."""
    for key, value in params.items():
        if isinstance(value, (Jaxpr, ClosedJaxpr)):
            yield (key,), value
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, (Jaxpr, ClosedJaxpr)):
                    yield (key, i), item


def first_eqn(eqns: Iterable[JaxprEqn], is_match: Callable[[JaxprEqn], bool]) -> JaxprEqn | None:
    """The first equation of ``eqns`` or of a jaxpr nested in one, at any depth, that
    ``is_match``; None when there is none."""
    for eqn in eqns:
        if is_match(eqn):
            return eqn
        for _, sub in sub_jaxprs(eqn.params):
            found = first_eqn(open_jaxpr(sub).eqns, is_match)
            if found is not None:
                return found
    return None


# Platforms a program is lowered for outside a kernel; a ``lax.platform_dependent`` branch
# named only for others (``mosaic``: inside a Pallas kernel) is never taken by such a lowering.
ORDINARY_PLATFORMS = frozenset({"cpu", "cuda", "rocm", "gpu", "tpu"})


def ordinary_branch(eqn: JaxprEqn) -> ClosedJaxpr | None:
    """The branch of a platform-dependent ``cond`` (``branches_platforms``, whose index is a
    ``platform_index``) that every ordinary lowering takes: its default branch, where no
    other branch names an ordinary platform (``jnp.diagonal``'s ``mosaic`` branch). None for
    any other equation."""
    platforms = eqn.params.get("branches_platforms") if eqn.primitive.name == "cond" else None
    if not platforms or platforms[-1] is not None:
        return None
    if any(ORDINARY_PLATFORMS.intersection(names) for names in platforms[:-1] if names):
        return None
    return eqn.params["branches"][-1]


def fingerprint(eqns: Iterable[JaxprEqn]) -> str:
    """A digest of ``eqns``: each printed, with the source lines it was traced at."""
    digest = hashlib.sha256()
    for eqn in eqns:
        tb = eqn.source_info.traceback
        lines: list = [] if tb is None else [(f.file_name, f.line_num) for f in tb.frames]
        digest.update(f"{eqn}\n{lines}\n".encode())
    return digest.hexdigest()
