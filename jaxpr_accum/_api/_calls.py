"""The plans of one serialized function's call signatures, in an LRU cache like ``jax.jit``'s.

A call signature (avals, placements, context mesh, tracing configuration, static leaves:
``_arguments.cache_key``) is checked, traced (``_trace``) and planned once (``Planner``);
where auto or ``memory=`` weigh what the caller differentiates, the perturbation pattern is
part of the key (a plan each). A trace that closes over tracers is not cached.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from jaxpr_accum._analysis import _arguments, _trace
from jaxpr_accum._api import _messages
from jaxpr_accum._base._collector import collector_paused
from jaxpr_accum._base._lru import LRU
from jaxpr_accum._base._settings import Settings
from jaxpr_accum._modes._mode import AUTO
from jaxpr_accum._planning._attempt import Prepared
from jaxpr_accum._planning._planner import CACHE_SIZE, Planner


class CallPlans:
    """The ``Prepared`` plan of each call signature of ``original`` under ``settings``."""

    def __init__(self, original: Callable[..., Any], settings: Settings):
        self.original, self.settings = original, settings
        self.cache = LRU(CACHE_SIZE)
        self.planner = Planner(settings)
        # What the calls record of each (frozen) plan, dropped with it: the kinds of call it
        # was compiled for (``_fallback.ready``), and the original's temp bytes ``explain``
        # measured (once per signature).
        self.compiled_for: WeakKeyDictionary[Prepared, set[bool]] = WeakKeyDictionary()
        self.original_bytes: WeakKeyDictionary[Prepared, int] = WeakKeyDictionary()

    def prepare(
        self, args: tuple, kwargs: dict, grad_argnums: tuple[int, ...] | None = None
    ) -> tuple[Prepared, list]:
        """The call signature's ``Prepared`` (cached) and its flat inputs; ``grad_argnums``:
        the arguments differentiated, where ``explain`` is told them (else the call's
        perturbation pattern, ``_arguments.perturbation``)."""
        call = _arguments.flatten(args, kwargs)
        key = _arguments.cache_key(call)
        # ``memory=`` budgets, and auto measures, what the caller differentiates: a plan each
        weighs = self.settings.memory is not None or self.planner.requested is AUTO
        pattern = _arguments.perturbation(call, grad_argnums) if weighs else None
        if key is not None and weighs:
            key = (key, pattern)
        prepared = self.cache.get(key) if key is not None else None
        if prepared is None:
            _arguments.check_concrete_shapes(call)
            seeds = _arguments.seed_axes(self.settings, call, self.original)
            traced = _trace.trace(self.original, call, seeds)
            with collector_paused():
                specs = [None] * len(traced.consts) + _arguments.param_specs(self.settings, call)
                inputs = [*traced.consts, *call.dyn]
                prepared = self.planner.prepare(traced, inputs, key, pattern, specs=specs)
            plan = _messages.with_hint(prepared.plan, self.settings, call)
            prepared = dataclasses.replace(prepared, plan=plan)
            if key is not None and not traced.has_tracer_consts:
                self.cache.put(key, prepared)
        return prepared, [*prepared.traced.consts, *call.dyn]
