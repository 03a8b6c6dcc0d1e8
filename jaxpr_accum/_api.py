"""``serialize_axis`` and ``SerializedFunction``: the plan cache and dispatch.

Settings are validated once, at decoration (``_settings``); what depends on the call
(``argnums`` / ``axis`` / ``in_axes`` against the actual arguments, equal sizes, concrete
shapes) is checked at the first call with those shapes, before anything is traced
(``_arguments``). Each distinct call signature (avals, placements and static leaves) is traced,
planned (``_candidates``, ``_choice``, ``_layout``; with ``memory=``, the chunk search of
``_budget``, whose choice is cached per signature even where the trace is not), built
(``_assemble``) and validated once, like ``jax.jit``, in attempts from the widest plan to the
original unchunked (``_fallback``); a function that closes over tracers of an enclosing
transformation is re-traced on each call. The plan cache is LRU-bounded (``CACHE_SIZE``
signatures per function). Flax NNX graph nodes among the arguments are handled by one
dispatch helper (``_nnx``). The public methods are JAX API boundaries: an error raised
through them shows the user's frames only (``JAX_TRACEBACK_FILTERING=off`` shows all).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxpr_accum import (
    _arguments,
    _budget,
    _candidates,
    _choice,
    _compat,
    _fallback,
    _interpret,
    _layout,
    _nnx,
    _trace,
    _worth,
)
from jaxpr_accum._assemble import build
from jaxpr_accum._compat import ClosedJaxpr
from jaxpr_accum._cost import Candidate
from jaxpr_accum._errors import warn
from jaxpr_accum._plan import Split
from jaxpr_accum._report import Plan
from jaxpr_accum._settings import SETTING_NAMES, Settings
from jaxpr_accum._sweep import Sweep, measure_sweep

CACHE_SIZE = 64  # call signatures whose plans a SerializedFunction keeps (least recent out)


class _LRU(collections.OrderedDict):
    """A dict that keeps the ``size`` most recently used entries."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class _Prepared:
    """One call signature's trace, plan and runnable program: the chunked one, or the
    function as written (``as_written``: not expected to save memory, ``_worth``; or no plan
    at all, ``split`` None, after internal errors, ``_fallback``, which has warned)."""

    def __init__(
        self,
        traced: _trace.Traced,
        split: Split | None,
        plan: Plan,
        as_written: bool = False,
        run: Callable | None = None,
    ):
        self.traced, self.split, self.plan, self.as_written = traced, split, plan, as_written
        self.run = run if run is not None else functools.partial(_as_written, traced.jaxpr)
        self.jitted = jax.jit(self.run)
        self.warned = split is None

    @classmethod
    def unchunked(cls, traced: _trace.Traced, why: str) -> _Prepared:
        return cls(traced, None, Plan.unchunked(why), as_written=True)


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"The `{name}` setting.")


class SerializedFunction:
    """``fun`` with one axis run in chunks. See ``serialize_axis``.

    The settings (``chunk``, ``axis``, ...) are read-only; ``serialize_axis(sf.original,
    ...)`` makes a function with other settings.
    """

    settings: Settings
    original: Callable
    _cache: _LRU
    _chunks: _LRU
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
        object.__setattr__(self, "_cache", _LRU(CACHE_SIZE))
        object.__setattr__(self, "_chunks", _LRU(CACHE_SIZE))  # memory=: the search's choice
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
        try:
            outs = prepared.jitted(*inputs)
        except Exception as error:
            if prepared.as_written or _fallback.strict():
                raise
            warn(_fallback.at_call(error))
            return self.original(*args, **kwargs)
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
                traced.jaxpr, inputs, _float_arguments(traced, inputs)
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

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[_Prepared, list]:
        call = _arguments.flatten(args, kwargs)
        key = _arguments.cache_key(call)
        # ``memory=`` budgets what the caller differentiates: a plan per perturbation pattern
        pattern = _arguments.perturbation(call) if self.memory is not None else None
        if key is not None and self.memory is not None:
            key = (key, pattern)
        prepared = self._cache.get(key) if key is not None else None
        if prepared is None:
            _arguments.check_concrete_shapes(call)
            seeds = _arguments.seed_axes(self.settings, call)
            traced = _trace.trace(self.original, call, seeds)
            prepared = self._plan(traced, [*traced.consts, *call.dyn], key, pattern)
            if key is not None and not traced.has_tracer_consts:
                self._cache.put(key, prepared)
        return prepared, [*prepared.traced.consts, *call.dyn]

    def _plan(
        self, traced: _trace.Traced, inputs: list, key: Any, pattern: tuple | None = None
    ) -> _Prepared:
        """The widest plan that plans, builds and validates (``_fallback``)."""

        def attempt(stream: bool, grad: str) -> Callable[[], _Prepared]:
            return lambda: self._attempt(traced, inputs, key, stream, grad, pattern)

        attempts = [("the plan as chosen", attempt(True, self.grad))]
        attempts.append(("the plan without streamed normalisers", attempt(False, self.grad)))
        if self.grad != "native":
            attempts.append(("the plan with native gradients", attempt(False, "native")))
        return _fallback.first_that_works(attempts, lambda why: _Prepared.unchunked(traced, why))

    def _attempt(
        self,
        traced: _trace.Traced,
        inputs: list,
        key: Any,
        stream: bool,
        requested: str,
        pattern: tuple | None,
    ) -> _Prepared:
        stage = _fallback.stage
        with stage("planning"):
            chosen, usable = _candidates.choose_split(traced, self.settings, stream)
        budget = None
        if self.chunk is not None:
            with stage("choosing the gradient mode"):
                grad, reason = _choice.choose(chosen, requested)
            layout = _layout.detect(traced, chosen.split, inputs, self.mesh_axis, self.chunk)
        else:
            with stage("the memory budget search"):
                fitted, grad, reason, layout, budget = self._fit_budget(
                    traced, chosen, inputs, key, requested, pattern
                )
            usable = [fitted if c is chosen else c for c in usable]
            chosen = fitted
        with stage("building"):
            run = build(chosen.split, chosen.chunk, grad, self.accum_dtype, layout)
        original = functools.partial(_as_written, traced.jaxpr)
        with stage("tracing the forward and backward passes"):
            _fallback.validate(run, inputs, original)
        plan = Plan.from_candidate(chosen, usable, grad, reason, layout, budget)
        with stage("weighing the plan against the function as written"):
            diff = _float_arguments(traced, inputs)
            why = _worth.as_written_instead(
                chosen, requested, run, original, lambda f: _budget.temp_bytes(f, inputs, diff)
            )
        if why is not None:
            plan = dataclasses.replace(plan, grad="none", grad_reason=why, warning=why)
            return _Prepared(traced, chosen.split, plan, as_written=True)
        if chosen.warning() is not None and requested == "auto":
            plan = dataclasses.replace(plan, warning=None)  # measured to save after all
        return _Prepared(traced, chosen.split, plan, run=run)

    def _fit_budget(
        self,
        traced: _trace.Traced,
        candidate: Candidate,
        inputs: list,
        key: Any,
        requested: str,
        pattern: tuple | None,
    ) -> tuple:
        """``(the candidate at the chosen chunk, grad, why, layout, Budget)`` for
        ``memory=``: the search of ``_budget``, once per call signature (later calls, and
        calls under ``jit`` or ``grad`` with the same avals, reuse its choice)."""

        def layout_for(k: int) -> _layout.Layout:
            return _layout.detect(traced, candidate.split, inputs, self.mesh_axis, k)

        cached = self._chunks.get(key) if key is not None else None
        if cached is not None:
            grad, reason, budget = cached
            k = budget.chunk
            return candidate.at(k), grad, reason, layout_for(k), budget
        grad, reason = _choice.choose(candidate, requested)
        modes = [(grad, reason)]
        if requested == "auto" and grad == "fused":
            modes.append(
                ("remat", "auto: fused applies, but its parameter-sized Jacobian accumulator "
                 "does not fit the memory budget at any chunk")
            )  # fmt: skip
        assert self.memory is not None
        limit = _budget.resolve(self.memory)
        diff = _differentiated_inputs(traced, inputs, pattern)
        names = _candidates.input_names(traced)
        wrt = ", ".join(names[traced.jaxpr.invars[i]] for i in diff) or "nothing (the forward)"
        chosen, grad, reason, layout, budget = _budget.choose_chunk(
            candidate, modes, self.accum_dtype, layout_for, inputs, diff, limit, self.memory, wrt
        )
        if key is not None:
            self._chunks.put(key, (grad, reason, budget))
        return chosen, grad, reason, layout, budget


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
    largest chunk whose compiled ``value_and_grad`` fits it, per call signature. See
    DESIGN.md for the full contract.
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


def _as_written(jaxpr: Any, *flat: Any) -> list:
    return _interpret.eval_jaxpr(jaxpr, flat)


def _differentiated_inputs(traced: _trace.Traced, inputs: list, pattern: tuple | None) -> list:
    """Indices in ``inputs`` of what the caller differentiates: the floating arguments the
    ``pattern`` marks and the closed-over values an outer ``jax.grad`` traces; every floating
    argument when the pattern is not known (a plain call, or one under ``jax.jit``)."""
    if pattern is None:
        return _float_arguments(traced, inputs)
    nc = traced.n_consts
    consts = [i for i in range(nc) if _budget.is_float(inputs[i])]
    consts = [i for i in consts if _compat.differentiated(inputs[i])]
    args = [nc + j for j, p in enumerate(pattern) if p and _budget.is_float(inputs[nc + j])]
    return consts + args


def _float_arguments(traced: _trace.Traced, inputs: list) -> list[int]:
    """Indices in ``inputs`` of the floating arguments (closed-over constants excluded)."""
    nc = traced.n_consts
    return [i for i, x in enumerate(inputs) if i >= nc and _budget.is_float(x)]
