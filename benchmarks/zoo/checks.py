"""The three checks' measurements, shared by ``tests/test_real_models.py`` and
``benchmarks/real_models.py``: loops of the rewritten program, the plan's body and stops, and
XLA's temp bytes of ``jit(value_and_grad(f, argnums=<float arguments>))``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

from .case import Case

CHECKS = ("chunked", "exact", "memory")

LOOPS = ("scan", "while")
MEMORY_LIMIT = 0.6  # check (c): serialized temp bytes at most this times the original's


def _sub_jaxprs(value: Any) -> list[Jaxpr]:
    if isinstance(value, ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, Jaxpr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _sub_jaxprs(v)]
    return []


def count_loops(jaxpr: Jaxpr | ClosedJaxpr) -> int:
    """The scan and while equations of ``jaxpr``, recursively into every sub-jaxpr."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    return sum(
        (e.primitive.name in LOOPS)
        + sum(count_loops(j) for v in e.params.values() for j in _sub_jaxprs(v))
        for e in jaxpr.eqns
    )


def stop_primitive(stop: str) -> str:
    """The primitive of one of ``Plan.stops`` (printed as ```prim` at file:line: why``)."""
    return stop.split("`")[1] if stop.startswith("`") else stop


def float_argnums(args: tuple[Any, ...]) -> tuple[int, ...]:
    """The arguments that are (pytrees of) floating arrays only: what a user differentiates."""

    def is_float(leaf: Any) -> bool:
        return isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(
            leaf.dtype, jnp.floating
        )

    out = []
    for i, a in enumerate(args):
        leaves = jax.tree.leaves(_nnx_state(a))
        if leaves and all(is_float(x) for x in leaves):
            out.append(i)
    return tuple(out)


def _nnx_state(a: Any) -> Any:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return a
    return nnx.state(a) if isinstance(a, nnx.Module) else a


def temp_bytes(f: Callable[..., Any], args: tuple[Any, ...], argnums: tuple[int, ...]) -> int:
    """XLA's temp bytes of ``jit(value_and_grad(f, argnums))`` at ``args``."""
    compiled = jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()
    stats = compiled.memory_analysis()
    assert stats is not None, "this backend does not report compiled memory"
    return int(stats.temp_size_in_bytes)


@dataclasses.dataclass
class Measured:
    """Everything the three checks look at, for one case at ``chunk = n // 8``."""

    loops_original: int
    loops_serialized: int
    body: int
    stops: list[str]
    temp_original: int
    temp_serialized: int
    seconds: float = 0.0  # of the measurement (trace, plan, compile both)

    @property
    def ratio(self) -> float:
        return self.temp_serialized / max(1, self.temp_original)

    def unexpected_stops(self, expected: frozenset[str]) -> list[str]:
        return [s for s in self.stops if stop_primitive(s) not in expected]


def serialized(c: Case, loss: Callable[..., Any]) -> Any:
    import jaxpr_accum as ja

    return ja.serialize_axis(loss, **c.serialize_kwargs())


def measure(c: Case, loss: Callable[..., Any], args: tuple[Any, ...]) -> Measured:
    """The structure (loops, body, stops) and the memory of ``c`` serialized at its chunk."""
    import time

    start = time.perf_counter()
    sf = serialized(c, loss)
    plan = sf.explain(*args)
    diff = float_argnums(args)
    m = Measured(
        loops_original=count_loops(jax.make_jaxpr(loss)(*args)),
        loops_serialized=count_loops(sf.jaxpr(*args)),
        body=plan.counts["body"],
        stops=list(plan.stops),
        temp_original=temp_bytes(loss, args, diff),
        temp_serialized=temp_bytes(sf, args, diff),
    )
    m.seconds = time.perf_counter() - start
    return m
