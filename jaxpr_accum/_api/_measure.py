"""Measuring a function's compiled ``value_and_grad`` at some arguments: compiling it, its
value and gradients against a reference's (the largest per-leaf relative difference, by
``jaxpr_accum.testing.tree_difference``'s rule) and its wall time. What ``sweep`` and the
demo measure. ``temp_bytes`` (public) is the measure that ``memory=`` bounds, of any function
at any arguments."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxpr_accum._base._compare import tree_difference
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._planning import _budget
from jaxpr_accum._planning._budget import scalar_of


@dataclasses.dataclass(frozen=True)
class FirstCall:
    """A function's program compiled and called once (``Program.compile_and_check``): the
    ``compiled`` program (None: it failed), the ``out`` of its first call (value and
    gradients), and that call's ``seconds``."""

    compiled: jax.stages.Compiled | None
    out: Any
    seconds: float


def temp_bytes(f: Callable[..., object], *args: object, **kwargs: object) -> int:
    """XLA's temp bytes of ``f``'s gradient program at these arguments: what ``memory=`` bounds.

    The program is ``jax.jit(jax.value_and_grad(g))``, compiled (not run) at the arguments,
    where ``g`` reduces ``f``'s floating outputs to one scalar (the one real scalar output
    itself, else the float32 sum of every floating output) and is differentiated with respect
    to every floating array leaf of the arguments; other leaves are held fixed.

    Args:
        f: Any function: a ``SerializedFunction`` or its original.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        ``memory_analysis().temp_size_in_bytes`` of that compiled program.

    Raises:
        SerializeError: The backend does not report compiled memory.

    Examples:
        >>> ja.temp_bytes(sf, w, x) / ja.temp_bytes(sf.original, w, x)
    """
    leaves, tree = jax.tree.flatten((args, kwargs))
    arrays = [i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, np.ndarray))]

    def run(*xs: object) -> list:
        full = list(leaves)
        for i, x in zip(arrays, xs, strict=True):
            full[i] = x
        a, k = jax.tree.unflatten(tree, full)
        return jax.tree.leaves(f(*a, **k))

    inputs = [leaves[i] for i in arrays]
    return _budget.temp_bytes(run, inputs, [j for j, x in enumerate(inputs) if has_float_dtype(x)])


def compile_value_and_grad(
    f: Callable[..., object], args: Sequence[object], argnums: int | Sequence[int] = 0
) -> jax.stages.Compiled:
    """AOT-compile ``jax.jit(jax.value_and_grad(f, argnums))`` at ``args`` (call with ``*args``)."""
    return jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()


def difference(got: object, ref: object) -> float:
    """The largest per-leaf relative difference of ``got`` from ``ref`` (``inf`` where the trees
    differ in structure, shapes or dtypes)."""
    try:
        return float(tree_difference(got, ref).max_rel)
    except AssertionError:  # the trees differ in structure, shapes or dtypes
        return float("inf")


class Program:
    """``jax.jit(jax.value_and_grad(g, argnums))`` of a function at a sweep's arguments, where
    ``g`` reduces the function's floating outputs to a scalar as the memory budget does
    (``_budget.scalar_of``); the arguments without array leaves are closed over."""

    def __init__(self, args: tuple, dynamic: list[int], argnums: int | tuple[int, ...]):
        self.args, self.dynamic, self.argnums = args, dynamic, argnums
        self.dyn_args = [args[i] for i in dynamic]

    def scalar(self, f: Callable) -> Callable:
        def g(*dyn: object) -> jax.Array:
            full = list(self.args)
            for i, x in zip(self.dynamic, dyn, strict=True):
                full[i] = x
            return scalar_of(jax.tree.leaves(f(*full)))

        return g

    def compile(self, f: Callable) -> jax.stages.Compiled:
        return compile_value_and_grad(self.scalar(f), self.dyn_args, self.argnums)

    def time(self, exe: jax.stages.Compiled) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(exe(*self.dyn_args))
        return time.perf_counter() - t0

    def compile_and_check(self, f: Callable, precision: str | None) -> FirstCall:
        """``f`` compiled and called once; off CPU with a ``precision``, the value and
        gradients are those of the program compiled again at that matmul precision."""
        exe = self.compile(f)
        t0 = time.perf_counter()
        out = jax.block_until_ready(exe(*self.dyn_args))
        seconds = time.perf_counter() - t0
        if precision is not None and jax.default_backend() != "cpu":
            with jax.default_matmul_precision(precision):
                out = self.compile(f)(*self.dyn_args)
        return FirstCall(compiled=exe, out=out, seconds=seconds)
