"""Python's cyclic garbage collector, paused while a call signature is planned.

Planning (the analysis, building the chunked program, tracing its forward and backward passes
to validate them, and the ``memory=`` search's compiles) allocates a few hundred thousand
short-lived objects: tracers, equations, jaxprs. Nearly all of them die by reference count,
but their allocation alone triggers the collector's full collections, each of which walks the
process's whole heap (the model, JAX's caches): about three per plan of a 12-layer
transformer, a quarter of a second of its lowering (``benchmarks/planning_cost.py``). Paused,
the collector runs once afterwards, on what planning left.

The collector is process-wide, so the pause is taken only where it affects nothing but the
plan: in a process with no other Python thread (a data loader's thread would pile up its
garbage for the plan's duration, and its own use of ``gc.disable`` would be overridden), and
not around the user's function, whose trace may make cyclic garbage of its own.

Invariant: the collector's state is restored as it was found, however planning ends; a
collector that is already paused (by the caller, or by an enclosing plan) is left alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The body run with the cyclic garbage collector paused, where that affects only the
    body (module docstring)."""
    if not gc.isenabled() or threading.active_count() > 1:
        yield
        return
    try:
        gc.disable()
        yield
    finally:
        gc.enable()
