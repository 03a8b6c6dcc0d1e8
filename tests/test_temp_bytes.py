"""``ja.temp_bytes``: the measure ``memory=`` bounds, of any function at any arguments."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jaxpr_accum as ja


def test_temp_bytes_is_xlas_temp_memory_of_the_gradient_program():
    """Equal to XLA's temp bytes of ``jit(value_and_grad)`` with respect to the floating
    arguments (the integer one held fixed), and smaller for the serialized loss."""

    def loss(w, x, labels):
        h = jnp.tanh(jnp.tanh(x @ w) @ w.T)
        return jnp.mean((h - labels[:, None]) ** 2)

    w = jnp.ones((32, 64)) / 8
    x = jax.random.normal(jax.random.key(0), (512, 32))
    labels = jnp.arange(512) % 3
    direct = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(w, x, labels).compile()
    original = ja.temp_bytes(loss, w, x, labels)
    assert original == direct.memory_analysis().temp_size_in_bytes
    sf = ja.serialize_axis(loss, chunk=32, argnums=(1, 2), grad="remat")
    assert ja.temp_bytes(sf, w, x, labels) < original / 2
