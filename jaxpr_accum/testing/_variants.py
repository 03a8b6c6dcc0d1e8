"""Copies of a ``SerializedFunction`` in other gradient modes and at other chunk sizes, kept
as long as the function itself, so that repeated checks reuse their traces and compiled
runners."""

from __future__ import annotations

import weakref
from typing import Any, TypeAlias

from jaxpr_accum import SerializedFunction

Serialized: TypeAlias = "SerializedFunction[..., Any]"  # what the test kit checks: any function

# Copies of a SerializedFunction in other modes and at other chunk sizes, kept as long as
# the function itself, so that repeated checks reuse their traces and compiled runners.
_VARIANTS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def is_variant_copy(sf: object) -> bool:
    """Whether ``sf`` is one of the copies ``variant_of`` made."""
    return any(sf is v for cache in list(_VARIANTS.values()) for v in cache.values())


def variant_of(sf: Serialized, grad: str, chunk: int, axis_size: int) -> Serialized:
    """``sf`` in gradient mode ``grad`` at ``chunk`` (``sf`` itself if it is that)."""
    if sf.grad == grad and sf.chunk == chunk:
        return sf
    try:
        cache = _VARIANTS.setdefault(sf, {})
    except TypeError:
        cache = {}
    key = (grad, chunk, axis_size)
    if key not in cache:
        # an automatic axis is pinned by its size (``Settings.at``), as ``sweep`` copies it
        cache[key] = SerializedFunction(sf.original, sf.settings.at(chunk, grad, axis_size))
    return cache[key]
