"""Copies of a ``SerializedFunction`` in other gradient modes and at other chunk sizes, kept
as long as the function itself, so that repeated checks reuse their traces and compiled
runners."""

from __future__ import annotations

import weakref
from typing import Any

from jaxpr_accum import serialize_axis


def _settings(sf: Any, axis_size: int) -> dict:
    """The settings of ``sf`` that a copy with another mode or chunk keeps.

    An axis found automatically is pinned by its size: automatic selection only considers
    axes longer than ``chunk``, so at a chunk of the axis's length or more it would choose
    another axis (or none).
    """
    names = ("axis", "argnums", "size", "accum_dtype", "mesh_axis")
    settings = {n: getattr(sf, n) for n in names}
    in_axes = getattr(sf, "in_axes", None)
    if in_axes is not None:
        settings["in_axes"] = in_axes
    elif settings["argnums"] is None and settings["size"] is None:
        settings["size"] = axis_size
    return settings


# Copies of a SerializedFunction in other modes and at other chunk sizes, kept as long as
# the function itself, so that repeated checks reuse their traces and compiled runners.
_VARIANTS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _is_variant(sf: Any) -> bool:
    return any(sf is v for cache in list(_VARIANTS.values()) for v in cache.values())


def _variant(sf: Any, grad: str, chunk: int, axis_size: int) -> Any:
    """``sf`` in gradient mode ``grad`` at ``chunk`` (``sf`` itself if it is that)."""
    if sf.grad == grad and sf.chunk == chunk:
        return sf
    try:
        cache = _VARIANTS.setdefault(sf, {})
    except TypeError:
        cache = {}
    key = (grad, chunk, axis_size)
    if key not in cache:
        cache[key] = serialize_axis(sf.original, chunk=chunk, grad=grad, **_settings(sf, axis_size))
    return cache[key]
