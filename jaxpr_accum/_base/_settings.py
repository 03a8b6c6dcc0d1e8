"""The settings of ``serialize_axis``, validated once into an immutable dataclass.

Every argument is checked here, at decoration, with an error that names the argument and the
allowed values (``chunk``, ``memory``, ``axis``, ``argnums``, ``size``, ``grad``,
``accum_dtype``, ``mesh_axis``, ``gather``); what depends on the call's arguments
(``argnums`` in range, equal sizes, a ``memory`` fraction of the device's limit) is checked
at the first call by ``_api`` and ``_budget``.

Exactly one of ``chunk`` and ``memory`` is given. ``memory`` is parsed here into bytes (an
``int``: ``"1.5 GiB"`` -> 1610612736) or kept as a fraction of the device's memory limit (a
``float`` in (0, 1]), resolved against the device at the first call.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from typing import SupportsIndex

import jax
import jax.numpy as jnp
import numpy as np

GRAD_MODES = ("auto", "remat", "fused", "native")
GATHER_MODES = ("auto", "chunk", "once")  # where a sharded parameter is gathered (``_layout``)

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
    "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_MEMORY_HELP = (
    "bytes as a positive int, a string with a unit such as '512 MiB', '2GB' or '1.5 GiB' "
    "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; K, M, G, T as KB to TB), or a float in (0, 1] "
    "for a fraction of the device's memory limit"
)
_MEMORY_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def check_memory(memory: object) -> int | float:
    """``memory`` as bytes (``int``) or a fraction of the device's limit (``float``)."""
    if isinstance(memory, bool):
        raise TypeError(f"`memory` must be {_MEMORY_HELP}; got {memory!r}")
    if isinstance(memory, str):
        m = _MEMORY_RE.match(memory)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"`memory` must be {_MEMORY_HELP}; cannot parse {memory!r}")
        n = float(m.group(1)) * _UNITS[unit]
        if not math.isfinite(n):
            raise ValueError(f"`memory` must be {_MEMORY_HELP}; {memory!r} is out of range")
        if not n >= 1:
            raise ValueError(f"`memory` must be at least 1 byte; got {memory!r}")
        return int(n)
    nbytes = as_index(memory)
    if nbytes is not None:
        if nbytes <= 0:
            raise ValueError(f"`memory` must be {_MEMORY_HELP}; got {nbytes}")
        return nbytes
    if isinstance(memory, (float, np.floating)):
        memory = float(memory)
        if not 0.0 < memory <= 1.0:
            raise ValueError(
                f"`memory` as a float is a fraction of the device's memory limit and must be "
                f"in (0, 1]; got {memory!r} (for bytes pass an int or a string such as "
                "'2 GiB')"
            )
        return memory
    raise TypeError(f"`memory` must be {_MEMORY_HELP}; got {memory!r} ({type(memory).__name__})")


def as_index(value: object) -> int | None:
    """``operator.index(value)``, or None where ``value`` is no integer: a float, and also a
    floating or non-scalar array, whose ``__index__`` exists and raises NumPy's message."""
    if not isinstance(value, SupportsIndex):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"`{name}` must be a concrete integer, known when the function is decorated; got a "
            "traced value (decorate outside `jax.jit`, or make it a static argument)"
        )
    index = None if isinstance(value, bool) else as_index(value)
    if index is None:
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__})")
    if index < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {index}")
    return index


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated arguments of ``serialize_axis`` (immutable: a new setting is a new
    ``SerializedFunction``, never a stale plan)."""

    chunk: int | None  # None: chosen from ``memory`` per call signature (``_budget``)
    axis: int | None = 0
    argnums: tuple[int, ...] | None = None
    size: int | None = None
    grad: str = "auto"
    accum_dtype: np.dtype | None = None
    mesh_axis: tuple[str, ...] | None = None
    memory: int | float | None = None  # bytes, or a fraction of the device's memory limit
    in_axes: object = None  # as ``jax.vmap``'s: a prefix of the positional arguments
    param_specs: object = None  # ``PartitionSpec``s: a prefix of the positional arguments
    gather: str = "auto"  # sharded parameters: per chunk, once before the loop, or by memory

    @classmethod
    def validated(
        cls,
        *,
        chunk: object = None,
        memory: object = None,
        axis: object = 0,
        argnums: object = None,
        size: object = None,
        grad: object = "auto",
        accum_dtype: jax.typing.DTypeLike | None = None,
        mesh_axis: object = None,
        in_axes: object = None,
        param_specs: object = None,
        gather: object = "auto",
    ) -> Settings:
        """The arguments of ``serialize_axis`` as the user passed them, checked."""
        if (chunk is None) == (memory is None):
            raise ValueError(
                "pass exactly one of `chunk` (positions per step, an int >= 1) and `memory` "
                f"(a budget: {_MEMORY_HELP}); got "
                + ("neither" if chunk is None else f"both (chunk={chunk!r}, memory={memory!r})")
            )
        steps = None if chunk is None else _check_int("chunk", chunk, 1)
        budget = check_memory(memory) if chunk is None else None
        dim = None if axis is None else _check_int("axis", axis, -(2**31))
        nums: tuple[int, ...] | None = None
        if argnums is not None:
            given = tuple(argnums) if isinstance(argnums, (tuple, list)) else (argnums,)
            if not given:
                raise ValueError("`argnums` must name at least one argument")
            nums = tuple(_check_int("argnums", a, -(2**31)) for a in given)
            if len(set(nums)) < len(nums):
                raise ValueError(f"`argnums` {nums} names an argument twice: name each once")
            if dim is None:
                raise ValueError(
                    "`axis=None` needs automatic selection; with `argnums` pass an int"
                )
        length = None if size is None else _check_int("size", size, 1)
        if nums is not None and length is not None:
            raise ValueError("pass either `argnums` or `size`, not both")
        mode = _check_choice("grad", grad, GRAD_MODES)
        gathered = _check_choice("gather", gather, GATHER_MODES)
        accum = None if accum_dtype is None else _check_accum_dtype(accum_dtype)
        mesh_axes = None
        if mesh_axis is not None:
            axes = (mesh_axis,) if isinstance(mesh_axis, str) else mesh_axis
            if not (
                isinstance(axes, (tuple, list)) and axes and all(isinstance(a, str) for a in axes)
            ):
                raise TypeError(
                    f"`mesh_axis` must be a mesh axis name or a tuple of names, got {mesh_axis!r}"
                )
            mesh_axes = tuple(axes)
        if in_axes is not None:
            in_axes = _check_in_axes(in_axes, nums, length)
        if param_specs is not None:
            _check_param_specs(param_specs)
        fields = (steps, dim, nums, length, mode, accum, mesh_axes, budget, in_axes)
        return cls(*fields, param_specs, gathered)

    def at(self, chunk: int, grad: str, axis_size: int) -> Settings:
        """These settings at another (checked) chunk and mode, as a sweep copies them. An
        axis found automatically is pinned by its size: automatic selection considers only
        axes longer than ``chunk``, so at the axis's length it would look for another."""
        automatic = self.argnums is None and self.in_axes is None and self.size is None
        size = axis_size if automatic else self.size
        return dataclasses.replace(self, chunk=chunk, grad=grad, memory=None, size=size)


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"`{name}` must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value


def _check_accum_dtype(accum_dtype: jax.typing.DTypeLike) -> np.dtype:
    try:
        dtype = jnp.dtype(accum_dtype)
    except TypeError as e:
        raise TypeError(f"`accum_dtype` must be a dtype, got {accum_dtype!r}") from e
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"`accum_dtype` must be a floating dtype, got {dtype}")
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:  # 64-bit types without x64
        raise ValueError(
            f"`accum_dtype` {dtype} needs 64-bit floats, which are disabled: enable them "
            "with `jax.config.update('jax_enable_x64', True)` before creating the function, "
            "or pass `accum_dtype=jnp.float32`"
        )
    return dtype


def _check_in_axes(in_axes: object, argnums: tuple[int, ...] | None, size: int | None) -> object:
    """``in_axes`` as ``jax.vmap`` takes it: an int, ``None``, or a pytree prefix of the
    positional arguments with an int or ``None`` per leaf; at least one int."""
    if argnums is not None or size is not None:
        raise ValueError("`in_axes` names the axis itself: pass it without `argnums` or `size`")
    leaves = jax.tree_util.tree_leaves(in_axes, is_leaf=lambda x: x is None)
    bad = [x for x in leaves if x is not None and (isinstance(x, bool) or not isinstance(x, int))]
    if bad:
        raise TypeError(
            f"`in_axes` leaves must be ints or None (as for jax.vmap), got {bad[0]!r} in "
            f"{in_axes!r}"
        )
    if not any(x is not None for x in leaves):
        raise ValueError(f"`in_axes` must name at least one axis (an int), got {in_axes!r}")
    return in_axes


def _check_param_specs(param_specs: object) -> None:
    """``param_specs`` as ``jax.jit``'s ``in_shardings`` with specs: a ``PartitionSpec`` or
    ``None`` per leaf of a pytree prefix of the positional arguments."""
    leaves = jax.tree_util.tree_leaves(param_specs, is_leaf=lambda x: x is None)
    bad = [x for x in leaves if x is not None and not isinstance(x, jax.sharding.PartitionSpec)]
    if bad:
        raise TypeError(
            f"`param_specs` leaves must be `PartitionSpec`s or None, got {bad[0]!r} in "
            f"{param_specs!r}"
        )


SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))
