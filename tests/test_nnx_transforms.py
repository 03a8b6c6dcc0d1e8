"""Flax NNX transforms inside a serialized function chunk as their ``lax`` equivalents do.

``nnx.scan``, ``nnx.remat``, ``nnx.vmap`` and ``nnx.cond``, alone and nested (the standard
deep-stack pattern is ``nnx.scan`` over an ``nnx.remat`` body: outside report r16, where
NNX's graph updates hand the layer parameters back through the checkpoint unchanged). Each
program is compared with the original under ``nnx.value_and_grad`` in every mode, and its
region must chunk the batch through the transform (no stop).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, covering

slow = pytest.mark.slow
N, D, LAYERS = 12, 6, 3

X = jax.random.normal(jax.random.key(0), (N, D))
Y = jax.random.normal(jax.random.key(1), (N, 2))


def make_layers():
    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return nnx.Linear(D, D, rngs=nnx.Rngs(key))

    return make(jax.random.split(jax.random.key(2), LAYERS))


def stack_loss(remat: bool, cond: bool = False):
    def loss(layers, x, y):
        def body(h, layer):
            out = jnp.tanh(layer(h))
            if cond:
                out = nnx.cond(jnp.sum(layer.bias) > 0, lambda h: h, lambda h: -h, out)
            return out

        if remat:
            body = nnx.remat(body)
        body = nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(body)
        return jnp.mean((body(x, layers)[:, :2] - y) ** 2)

    return loss


def remat_loss(model, x, y):
    h = nnx.remat(lambda m, x: jnp.tanh(m(x)))(model, x)
    return jnp.mean((h[:, :2] - y) ** 2)


def vmap_loss(model, x, y):
    per_example = nnx.vmap(lambda m, xi: jnp.tanh(m(xi)), in_axes=(None, 0))(model, x)
    return jnp.mean((per_example[:, :2] - y) ** 2)


def cond_loss(model, x, y):
    h = nnx.cond(jnp.sum(model.kernel) > 0, lambda m, x: m(x), lambda m, x: -m(x), model, x)
    return jnp.mean((jnp.tanh(h)[:, :2] - y) ** 2)


def nested_loss(layers, x, y):
    """scan over remat over vmap (per example) over a layer."""

    def body(h, layer):
        return nnx.vmap(lambda lyr, hi: jnp.tanh(lyr(hi)), in_axes=(None, 0))(layer, h)

    body = nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(nnx.remat(body))
    return jnp.mean((body(x, layers)[:, :2] - y) ** 2)


CASES = {
    "scan": (stack_loss(remat=False), make_layers),
    "scan over remat": (stack_loss(remat=True), make_layers),
    "scan over remat with cond": (stack_loss(remat=True, cond=True), make_layers),
    "remat": (remat_loss, lambda: nnx.Linear(D, D, rngs=nnx.Rngs(3))),
    "vmap": (vmap_loss, lambda: nnx.Linear(D, D, rngs=nnx.Rngs(4))),
    "cond": (cond_loss, lambda: nnx.Linear(D, D, rngs=nnx.Rngs(5))),
    "scan over remat over vmap": (nested_loss, make_layers),
}


def _check(name, grad, chunk):
    loss, make = CASES[name]
    original, serialized = make(), make()
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=(1, 2), grad=grad)
    ref = nnx.value_and_grad(loss)(original, X, Y)
    got = nnx.value_and_grad(sf)(serialized, X, Y)
    assert_tree_close(jax.tree.leaves(got), jax.tree.leaves(ref), what=f"{name} ({grad})")
    plan = sf.explain(serialized, X, Y)
    assert plan.counts["body"] > 0 and not plan.stops, plan


@pytest.mark.slow  # the default tier's NNX modules: test_flax.py
@pytest.mark.parametrize("name", list(CASES))
def test_nnx_transform_chunks_and_is_exact(name):
    _check(name, "auto", 5)


@slow
@pytest.mark.parametrize("name, grad, chunk", covering(list(CASES), GRAD_MODES, [1, 4, N], per=2))
def test_nnx_transform_every_mode(name, grad, chunk):
    _check(name, grad, chunk)
