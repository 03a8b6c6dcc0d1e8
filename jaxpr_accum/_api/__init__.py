"""``serialize_axis`` and ``SerializedFunction``: the public entry point and what it returns.

Settings are validated once, at decoration (``_settings``); what depends on the call
(``argnums`` / ``axis`` / ``in_axes`` against the actual arguments, equal sizes, concrete
shapes) is checked at the first call with those shapes, before anything is traced
(``_arguments``). The plan cache and the dispatch are ``SerializedFunction``'s
(``_function``); how it names itself is ``_naming``'s.

For type checkers, ``SerializedFunction[P, R]`` keeps the wrapped function's parameters
(``ParamSpec`` ``P``) and return type ``R``: ``__call__``, ``explain`` and ``jaxpr`` take the
original's arguments. ``serialize_axis`` is overloaded for its two uses, a direct call and a
decorator with arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, overload

from jax.typing import DTypeLike

from jaxpr_accum._api._function import P, R, SerializedFunction
from jaxpr_accum._base._settings import Settings

__all__ = ["SerializedFunction", "serialize_axis"]

T = TypeVar("T")


@overload
def serialize_axis(
    fun: Callable[P, R],
    *,
    chunk: int | None = None,
    memory: int | str | float | None = None,
    axis: int | None = 0,
    argnums: int | tuple[int, ...] | None = None,
    in_axes: object = None,
    size: int | None = None,
    grad: str = "auto",
    accum_dtype: DTypeLike | None = None,
    mesh_axis: str | tuple[str, ...] | None = None,
    param_specs: object = None,
    gather: str = "auto",
) -> SerializedFunction[P, R]: ...


@overload
def serialize_axis(
    fun: None = None,
    *,
    chunk: int | None = None,
    memory: int | str | float | None = None,
    axis: int | None = 0,
    argnums: int | tuple[int, ...] | None = None,
    in_axes: object = None,
    size: int | None = None,
    grad: str = "auto",
    accum_dtype: DTypeLike | None = None,
    mesh_axis: str | tuple[str, ...] | None = None,
    param_specs: object = None,
    gather: str = "auto",
) -> Callable[[Callable[P, R]], SerializedFunction[P, R]]: ...


def serialize_axis(
    fun: Callable[P, R] | None = None,
    *,
    chunk: int | None = None,
    memory: int | str | float | None = None,
    axis: int | None = 0,
    argnums: int | tuple[int, ...] | None = None,
    in_axes: object = None,
    size: int | None = None,
    grad: str = "auto",
    accum_dtype: DTypeLike | None = None,
    mesh_axis: str | tuple[str, ...] | None = None,
    param_specs: object = None,
    gather: str = "auto",
) -> SerializedFunction[P, R] | Callable[[Callable[P, R]], SerializedFunction[P, R]]:
    """Run one axis of ``fun`` in chunks, with the same values and gradients.

    The function is traced to a jaxpr at its first call with given shapes; the region that
    carries the axis is rewritten into a ``lax.scan`` over chunks that recomputes each chunk's
    activations in the backward pass and accumulates the gradients, so peak memory scales
    with the chunk instead of with the axis. Use it directly, ``serialize_axis(f, chunk=4)``,
    or as a decorator, ``@serialize_axis(chunk=4)``. Where a part of the program cannot be
    proven chunkable, it runs unchunked and ``explain`` says why: never a wrong number.

    Args:
        fun: The function to serialize, taking and returning pytrees of arrays; None returns a
            decorator.
        chunk: Positions of the axis per step, an int >= 1; need not divide the axis.
            Exactly one of ``chunk`` and ``memory`` is given.
        memory: A budget instead of ``chunk``: bytes (an int, or a string such as
            ``"2 GiB"``), or a float in (0, 1], a fraction of the device's memory limit. The
            largest chunk whose compiled ``value_and_grad`` fits it is chosen, per call
            signature.
        axis: With ``argnums``, the position of the axis in every array leaf of those
            arguments; without, the position at which a candidate axis must be born (None:
            any position).
        argnums: The positional arguments whose array leaves all carry the axis (an int or
            a tuple of ints): microbatching. Not ``jax.grad``'s ``argnums``.
        in_axes: The axis as ``jax.vmap``'s ``in_axes``: an int or None per leaf of the
            positional arguments (a prefix tree). Excludes ``argnums`` and ``size``.
        size: The length of an independent axis to serialize wherever it is born (a
            Monte-Carlo sample axis created inside the function). Without ``argnums``,
            ``in_axes`` and ``size``, the axis is chosen automatically, the one whose
            chunking saves the most.
        grad: How the chunked region is differentiated: ``"remat"`` (recompute each chunk
            in the backward pass), ``"fused"`` (Jacobian rows in the forward pass),
            ``"native"`` (JAX's own derivative of the loop) or ``"auto"`` (chosen per call
            signature).
        accum_dtype: A floating dtype for the gradient accumulators of loop-invariant inputs;
            None: float32 for 16-bit floats, else the input's own dtype.
        mesh_axis: A mesh axis name, or a tuple of names, that the axis is sharded over on a
            mesh of ``Auto`` axes (an ``Explicit`` one is detected): each device runs its
            shard in chunks.
        param_specs: The ``PartitionSpec`` of each argument the loop reads whole (the
            parameters), on a mesh of ``Auto`` axes (an ``Explicit`` one's are read from the
            arguments): a ``PartitionSpec`` or None (replicated) per leaf of a pytree prefix
            of the positional arguments, as ``jax.jit``'s ``in_shardings``. Under a sharded
            layout, a sharded parameter stays sharded across the loop (FSDP, tensor
            parallelism): each chunk's step gathers it and reduce-scatters its gradient.
        gather: Where a sharded parameter is gathered under a sharded layout: ``"chunk"`` (in
            each chunk's step, FSDP's memory), ``"once"`` (once before the loop: the whole
            parameter lives across the loop, and inside it only its gradient is
            reduce-scattered, per chunk) or ``"auto"`` (once where a ``memory=`` budget fits
            the whole parameters at some chunk, else per chunk; per chunk without
            ``memory=``). ``explain`` says which and why.

    Returns:
        A ``SerializedFunction`` that takes and returns what ``fun`` does (for type checkers
        too); with ``fun=None``, a decorator that makes one.

    Raises:
        TypeError: A setting of the wrong type, or ``fun`` not callable.
        ValueError: A setting out of range, or an inconsistent combination (both or neither
            of ``chunk`` and ``memory``; ``argnums`` with ``size``). At the first call,
            ``ArgumentError`` (arguments that do not match the settings) and
            ``SerializeError`` (nothing to chunk) subclass ``ValueError`` too.

    Examples:
        >>> import jax, jax.numpy as jnp, jaxpr_accum as ja
        >>> @ja.serialize_axis(chunk=4, argnums=(1, 2))
        ... def mse(w, x, y):
        ...     return jnp.mean((jnp.tanh(x @ w) - y) ** 2)
        >>> w, x, y = jnp.ones((3, 2)), jnp.ones((16, 3)), jnp.zeros((16, 2))
        >>> g = jax.grad(mse)(w, x, y)  # 4 chunks of 4 rows, the original's gradient
        >>> bool(jnp.allclose(g, jax.grad(mse.original)(w, x, y), rtol=1e-5))
        True
    """
    if fun is not None:
        _callable(fun)  # before the settings: `serialize_axis(4)` meant `chunk=4`
    settings = Settings.validated(
        chunk=chunk,
        memory=memory,
        axis=axis,
        argnums=argnums,
        size=size,
        grad=grad,
        accum_dtype=accum_dtype,
        mesh_axis=mesh_axis,
        in_axes=in_axes,
        param_specs=param_specs,
        gather=gather,
    )
    if fun is None:
        return lambda f: SerializedFunction(_callable(f), settings)
    return SerializedFunction(fun, settings)


def _callable(fun: T) -> T:
    if not callable(fun):
        raise TypeError(
            f"`fun` must be callable, got {fun!r} ({type(fun).__name__}); pass `chunk` and "
            "the other settings by keyword: `serialize_axis(f, chunk=4)`"
        )
    return fun
