"""How a ``SerializedFunction`` names things: its ``repr`` (the settings not at their default,
in ``serialize_axis``'s order; the defaults are ``Settings``' field defaults, so a new setting
with a default needs only a place in ``ORDER``) and the ``TypeError`` for a keyword argument a
method does not take, which names the new spelling of a renamed one."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxpr_accum._base._settings import Settings

#: The settings in ``serialize_axis``'s order, as the ``repr`` shows them.
ORDER = (
    "chunk",
    "memory",
    "axis",
    "argnums",
    "in_axes",
    "size",
    "grad",
    "accum_dtype",
    "mesh_axis",
    "param_specs",
    "gather",
)


def non_defaults(settings: Settings) -> list[tuple[str, str]]:
    """``(name, repr)`` of every setting that differs from its default, in ``ORDER``."""
    out = []
    for f in (f for name in ORDER for f in dataclasses.fields(Settings) if f.name == name):
        value = getattr(settings, f.name)
        default = None if f.default is dataclasses.MISSING else f.default
        if (value is not None) if default is None else value != default:
            out.append((f.name, repr(str(value) if f.name == "accum_dtype" else value)))
    return out


def unexpected(method: str, kwargs: dict[str, Any]) -> str:
    """The ``TypeError`` message for keyword arguments ``method`` does not take; a renamed
    one names its new spelling."""
    name = next(iter(kwargs))
    message = f"{method}() got an unexpected keyword argument {name!r}"
    if name == "argnums":
        message += (
            ": the arguments to differentiate are `grad_argnums` (renamed in 0.1.0, since "
            "`argnums` of serialize_axis names the arguments that carry the axis)"
        )
    return message
