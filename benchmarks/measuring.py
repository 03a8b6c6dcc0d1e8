"""What the benchmarks measure of a compiled program, by public JAX and the public API only.

- ``compile_value_and_grad``: ``jax.jit(jax.value_and_grad(f, argnums))`` compiled at the
  arguments (at a matmul precision, if asked);
- ``temp_bytes_of``: XLA's temp bytes of a compiled program
  (``memory_analysis().temp_size_in_bytes``; None where the backend reports none);
- ``compare_exact``: value and gradients of a serialized function against the original's,
  each the largest per-leaf relative difference of ``jaxpr_accum.testing.tree_difference``;
- ``EXACT_RTOL``: the tolerance those are graded at (float32's of ``jaxpr_accum.testing``);
- ``float_argnums``: the arguments whose leaves are all floating arrays;
- ``relative_l2``: ``||got - ref|| / ||ref||`` over every leaf of two pytrees;
- ``out_of_memory``: whether a compile or run failed for lack of device memory;
- ``concurrently``: calls on threads of their own (XLA compiles without Python's lock);
- ``step_time``: a compiled program's seconds per step, the median after a warm-up.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum.testing import tree_difference

#: The relative tolerance on value and gradients (float32's default of ``jaxpr_accum.testing``).
EXACT_RTOL = 2e-4


def compile_value_and_grad(
    f: Callable[..., Any],
    args: Sequence[Any],
    argnums: int | Sequence[int] = 0,
    precision: str | None = None,
) -> Any:
    """AOT-compile ``jax.jit(jax.value_and_grad(f, argnums))`` at ``args`` (call with ``*args``);
    ``precision``: the default matmul precision to compile at (None: as configured)."""
    at = contextlib.nullcontext() if precision is None else jax.default_matmul_precision(precision)
    with at:
        return jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()


def temp_bytes_of(compiled: Any) -> int | None:
    """XLA's temp bytes of a compiled program (None: the backend does not report them)."""
    stats = compiled.memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


def difference(got: Any, ref: Any) -> float:
    """The largest per-leaf relative difference of ``got`` from ``ref`` (``inf`` where the trees
    differ in structure, shapes or dtypes)."""
    try:
        return float(tree_difference(got, ref).max_rel)
    except AssertionError:
        return float("inf")


def compare_exact(
    original: Callable[..., Any],
    serialized: Callable[..., Any],
    args: tuple,
    argnums: int | Sequence[int] = 0,
    *,
    compiled: tuple[Any, Any] | None = None,
) -> tuple[float, float]:
    """(relative value difference, largest per-leaf relative gradient difference).

    On accelerators both are recompiled with matmuls and convolutions at "highest" precision,
    so that TF32 rounding does not drown the reassociation differences being checked; on CPU,
    ``compiled=(original_compiled, serialized_compiled)`` are reused."""
    if compiled is not None and jax.default_backend() == "cpu":
        c0, c1 = compiled
    else:
        precision = None if jax.default_backend() == "cpu" else "highest"
        c0 = compile_value_and_grad(original, args, argnums, precision)
        c1 = compile_value_and_grad(serialized, args, argnums, precision)
    v0, g0 = c0(*args)
    v1, g1 = c1(*args)
    return difference(v1, v0), difference(g1, g0)


def float_argnums(args: tuple) -> tuple[int, ...]:
    """The arguments that are (pytrees of) floating arrays only: what a user differentiates."""
    return tuple(
        i
        for i, a in enumerate(args)
        if jax.tree.leaves(a)
        and all(
            jnp.issubdtype(getattr(x, "dtype", type(x)), jnp.inexact) for x in jax.tree.leaves(a)
        )
    )


def out_of_memory(err: BaseException) -> bool:
    """Whether a compile or run failed for lack of device memory."""
    text = str(err)
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory"))


def relative_l2(got: Any, ref: Any) -> float:
    """``||got - ref|| / ||ref||`` over every leaf of two gradient pytrees, in float64."""
    num = sum(
        float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True)
    )
    den = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in jax.tree.leaves(ref))
    return float(np.sqrt(num / den)) if den else float(np.sqrt(num))


def concurrently(work: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each of ``work``'s calls on a thread of its own (XLA compiles without holding Python's
    lock, so a TPU's compiles of several programs overlap on the host's cores), by name; a
    call's exception is its result."""

    def attempt(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - reported by the caller
            return err

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(work))) as pool:
        futures = {name: pool.submit(attempt, call) for name, call in work.items()}
        return {name: future.result() for name, future in futures.items()}


def step_time(compiled: Any, args: tuple, repeats: int = 3) -> float:
    """Seconds per step of ``compiled`` at ``args``: the median of ``repeats`` after one."""
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
