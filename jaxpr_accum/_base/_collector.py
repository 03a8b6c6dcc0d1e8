"""Python's cyclic garbage collector, paused while a call signature is planned.

Planning (tracing the function, the analysis, building the chunked program and tracing its
forward and backward passes) allocates a few hundred thousand short-lived objects: tracers,
equations, jaxprs. Nearly all of them die by reference count, but their allocation alone
triggers the collector's full collections, each of which walks the caller's whole heap (the
model, JAX's caches): three or four per plan of a 12-layer transformer, measured at 0.3 s of
the 1.7 s that its ``jax.jit(jax.value_and_grad(sf)).lower`` takes (``benchmarks/
planning_cost.py``). Paused, the collector runs once afterwards, on what planning left.

Invariant: the collector's state is restored as it was found, however planning ends; a
collector that is already paused (by the caller, or by an enclosing plan) is left alone.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The body run with the cyclic garbage collector paused (module docstring)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
