"""Checked by mypy (tests/test_typing.py), never run: the public API keeps the wrapped
function's types. A line that ends in ``# mypy: error`` must be flagged, every other line
must pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr

import jaxpr_accum as ja


def loss(w: jax.Array, x: jax.Array, scale: float = 1.0) -> jax.Array:
    return scale * jnp.sum(jnp.tanh(x @ w))


w, x = jnp.ones((3, 2)), jnp.ones((8, 3))

# serialize_axis(f, ...): the function's parameters and return type
direct = ja.serialize_axis(loss, chunk=2, argnums=1)
value: jax.Array = direct(w, x)
value = direct(w, x, scale=2.0)
wrapped: ja.SerializedFunction[[jax.Array, jax.Array, float], jax.Array] = direct


# @serialize_axis(...): the same through the decorator
@ja.serialize_axis(chunk=2)
def decorated(x: jax.Array) -> int:
    return int(x.shape[0])


n: int = decorated(x)
plan: ja.Plan = direct.explain(w, x)
program: ClosedJaxpr = direct.jaxpr(w, x)
sweep: ja.Sweep = direct.sweep(w, x, grad_argnums=0)
original_result: jax.Array = direct.original(w, x)

# what a type checker must flag
wrong: str = direct(w, x)  # mypy: error
direct(w)  # mypy: error
direct(w, x, scale="big")  # mypy: error
text: str = decorated(x)  # mypy: error
size: int = direct.explain(w, x)  # mypy: error
direct.sweep(w, x, argnums=0)  # mypy: error
