"""``serialize_axis`` and ``SerializedFunction``: the plan cache and dispatch.

Settings are validated once, at decoration (``_settings``); what depends on the call
(``argnums`` / ``axis`` / ``in_axes`` against the actual arguments, equal sizes, concrete
shapes) is checked at the first call with those shapes, before anything is traced
(``_arguments``). Each distinct call signature (avals, placements and static leaves) is traced,
planned, built and validated once (``_prepare``), like ``jax.jit``; a function that closes
over tracers of an enclosing transformation is re-traced on each call. The plan cache is
LRU-bounded (``CACHE_SIZE`` signatures per function). A call first traces and compiles the
built program (``_fallback.ready``: an internal error there runs the original instead), then
runs it uncaught: an error raised while it runs (a callback's, ``checkify``'s,
``jax_debug_nans``') is the user's, raised as it is, and nothing is run twice. Flax NNX graph
nodes among the
arguments are handled by one dispatch helper (``_nnx``). The public methods are JAX API
boundaries: an error raised through them shows the user's frames only
(``JAX_TRACEBACK_FILTERING=off`` shows all).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxpr_accum import _arguments, _budget, _compat, _fallback, _nnx, _trace
from jaxpr_accum._compat import ClosedJaxpr
from jaxpr_accum._errors import warn
from jaxpr_accum._prepare import (
    CACHE_SIZE,
    LRU,
    Planner,
    Prepared,
    float_arguments,
    run_as_written,
)
from jaxpr_accum._report import Plan
from jaxpr_accum._settings import SETTING_NAMES, Settings
from jaxpr_accum._sweep import Sweep, measure_sweep


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"The `{name}` setting.")


class SerializedFunction:
    """``fun`` with one axis run in chunks. See ``serialize_axis``.

    The settings (``chunk``, ``axis``, ...) are read-only; ``serialize_axis(sf.original,
    ...)`` makes a function with other settings.
    """

    settings: Settings
    original: Callable
    _cache: LRU
    _planner: Planner
    _pure: SerializedFunction | None

    chunk = _setting("chunk")
    memory = _setting("memory")
    axis = _setting("axis")
    argnums = _setting("argnums")
    size = _setting("size")
    grad = _setting("grad")
    accum_dtype = _setting("accum_dtype")
    mesh_axis = _setting("mesh_axis")
    in_axes = _setting("in_axes")

    def __init__(self, fun: Callable, settings: Settings):
        if not callable(fun):
            raise TypeError(f"`fun` must be callable, got {fun!r}")
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "original", fun)
        object.__setattr__(self, "_cache", LRU(CACHE_SIZE))
        object.__setattr__(self, "_planner", Planner(settings))
        object.__setattr__(self, "_pure", None)
        functools.update_wrapper(self, fun)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in SETTING_NAMES or name in ("settings", "original"):
            raise AttributeError(
                f"`{name}` of a SerializedFunction is read-only (its plans are cached); make "
                f"a new one instead: `serialize_axis(sf.original, {name}=...)`"
            )
        object.__setattr__(self, name, value)

    # -- public --------------------------------------------------------------------------
    @_compat.api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            out, new_states, new_kw = nnx[0](*nnx[1], **nnx[2])
            _nnx.write_back(args, kwargs, new_states, new_kw)
            return out
        prepared, inputs = self._prepare(args, kwargs)
        split = prepared.split
        if prepared.plan.warning and not prepared.warned and split is not None and split.size:
            prepared.warned = True
            warn(f"{self!r}: {prepared.plan.warning}")
        original = functools.partial(run_as_written, prepared.traced.jaxpr)
        try:  # the library's stages of the call, before anything of the user's runs
            compiles = _fallback.ready(prepared.jitted, inputs, prepared.ready, original)
        except Exception as error:
            if prepared.as_written or _fallback.strict():
                raise
            warn(_fallback.at_call(error))
            return self.original(*args, **kwargs)
        if not compiles:  # nor does the function as written: it runs as written
            return self.original(*args, **kwargs)
        outs = prepared.jitted(*inputs)  # runs the user's code: what it raises is the user's
        return jax.tree_util.tree_unflatten(prepared.traced.out_tree, outs)

    @_compat.api_boundary
    def explain(self, *args: Any, **kwargs: Any) -> Plan:
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            return nnx[0].explain(*nnx[1], **nnx[2])
        prepared, inputs = self._prepare(args, kwargs)
        budget = prepared.plan.budget
        if budget is not None and budget.original is None:  # compiled once, when asked
            traced = prepared.traced
            original = _budget.original_memory(
                traced.jaxpr, inputs, float_arguments(traced, inputs)
            )
            budget = dataclasses.replace(budget, original=original)
            prepared.plan = dataclasses.replace(prepared.plan, budget=budget)
        return prepared.plan

    @_compat.api_boundary
    def jaxpr(self, *args: Any, **kwargs: Any) -> ClosedJaxpr:
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            return nnx[0].jaxpr(*nnx[1], **nnx[2])
        prepared, inputs = self._prepare(args, kwargs)
        return jax.make_jaxpr(prepared.run)(*inputs)

    @_compat.api_boundary
    def sweep(
        self,
        *args: Any,
        chunks: int | Sequence[int] | None = None,
        grads: str | Sequence[str] = ("auto",),
        argnums: int | Sequence[int] = 0,
        repeats: int = 3,
        progress: bool | None = None,
    ) -> Sweep:
        """Measure the original and each ``(chunk, grad)`` pair side by side: XLA temp bytes
        of ``jax.jit(jax.value_and_grad(g, argnums))``, the median time of ``repeats``
        interleaved calls, the largest relative gradient error (see ``_sweep``).
        ``chunks=None``: powers of two up to the axis size, and the axis size. ``progress``:
        a line per step on stderr (None: when stderr is a terminal)."""
        return measure_sweep(
            self, args, chunks=chunks, grads=grads, argnums=argnums, repeats=repeats,
            progress=progress,
        )  # fmt: skip

    def __repr__(self) -> str:
        name = getattr(self.original, "__name__", self.original)
        if self.chunk is None:
            return f"serialize_axis({name!r}, memory={self.memory!r})"
        return f"serialize_axis({name!r}, chunk={self.chunk})"

    # -- internals -----------------------------------------------------------------------
    def _on_nnx_state(self, args: tuple, kwargs: dict) -> tuple | None:
        """For a call with Flax NNX graph nodes: ``(the same serialization of fun as a pure
        function of NNX state, state args, state kwargs)`` (see ``_nnx``); else None."""
        if self._pure is self or not _nnx.has_graph_nodes(args, kwargs):
            return None
        pure = self._pure
        if pure is None:
            pure = SerializedFunction(_nnx.purify(self.original), self.settings)
            object.__setattr__(pure, "_pure", pure)  # its arguments are already pure state
            object.__setattr__(self, "_pure", pure)
        states, kw_states = _nnx.pure_arguments(args, kwargs)
        return pure, states, kw_states

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[Prepared, list]:
        call = _arguments.flatten(args, kwargs)
        key = _arguments.cache_key(call)
        # ``memory=`` budgets, and auto measures, what the caller differentiates: a plan per
        # perturbation pattern
        weighs = self.memory is not None or self.settings.grad == "auto"
        pattern = _arguments.perturbation(call) if weighs else None
        if key is not None and weighs:
            key = (key, pattern)
        prepared = self._cache.get(key) if key is not None else None
        if prepared is None:
            _arguments.check_concrete_shapes(call)
            seeds = _arguments.seed_axes(self.settings, call)
            traced = _trace.trace(self.original, call, seeds)
            prepared = self._planner.plan(traced, [*traced.consts, *call.dyn], key, pattern)
            if key is not None and not traced.has_tracer_consts:
                self._cache.put(key, prepared)
        return prepared, [*prepared.traced.consts, *call.dyn]


def serialize_axis(
    fun: Callable | None = None,
    *,
    chunk: int | None = None,
    memory: int | str | float | None = None,
    axis: int | None = 0,
    argnums: int | tuple[int, ...] | None = None,
    in_axes: Any = None,
    size: int | None = None,
    grad: str = "auto",
    accum_dtype: Any = None,
    mesh_axis: Any = None,
) -> Any:
    """Run one axis of ``fun`` in chunks of ``chunk``, with the same values and gradients.

    Use as ``@serialize_axis(chunk=4)`` or ``serialize_axis(f, chunk=4)``. The axis is the
    one named by ``argnums`` (position ``axis`` of those arguments' array leaves), by
    ``in_axes`` (as ``jax.vmap``'s: an int or None per leaf of the positional arguments), the
    one of size ``size``, or else found automatically. Instead of ``chunk``, ``memory`` (bytes, a
    string such as ``"2 GiB"``, or a fraction of the device's memory limit) chooses the
    largest chunk whose compiled ``value_and_grad`` fits it, per call signature. The full
    contract: docs/api.md and docs/semantics.md.
    """
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
    )
    if fun is None:
        return lambda f: SerializedFunction(f, settings)
    return SerializedFunction(fun, settings)
