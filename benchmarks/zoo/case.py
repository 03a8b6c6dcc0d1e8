"""A case of the zoo: a loss in the style of a public project's example, how a user would
serialize it, and the size of its axis; random inputs (no weights, no datasets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # the pytest id
    library: str  # the project whose example it follows (also the module to import)
    model: str  # what it is, for the table
    make: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
    n: int  # the size of the serialized axis
    argnums: int | tuple[int, ...] | None = None
    axis: int | None = 0  # with argnums: the position; else where candidates are born
    size: int | None = None
    expected_stops: frozenset[str] = frozenset()
    xfail: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def chunk(self) -> int:
        return max(1, self.n // 8)

    @property
    def how(self) -> str:
        """The serialization, as the keyword arguments a user writes."""
        if self.argnums is not None:
            return f"argnums={self.argnums}" + (f", axis={self.axis}" if self.axis else "")
        if self.size is not None:
            return f"size={self.size}"
        return "automatic" + (f", axis={self.axis}" if self.axis != 0 else "")

    @property
    def module(self) -> str:
        return {"flax.linen": "flax", "flax.nnx": "flax", "dm-haiku": "haiku"}.get(
            self.library, self.library
        )

    def serialize_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"chunk": self.chunk}
        if self.argnums is not None:
            kw.update(argnums=self.argnums, axis=self.axis)
        if self.size is not None:
            kw["size"] = self.size
        elif self.argnums is None and self.axis != 0:
            kw["axis"] = self.axis
        return kw


def _rng(seed: int) -> np.random.RandomState:
    return np.random.RandomState(seed)


def _normal(rng: np.random.RandomState, *shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _labels(rng: np.random.RandomState, n: int, classes: int, *shape: int) -> jax.Array:
    return jnp.asarray(rng.randint(0, classes, size=(n, *shape)), jnp.int32)
