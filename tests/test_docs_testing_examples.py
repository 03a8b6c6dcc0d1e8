"""The two tests of ``docs/testing.md`` ("Testing your model"), verbatim, and a check that
the page and this file stay the same code."""

# ruff: noqa: E402, F811, I001
import re
from pathlib import Path

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")
pytestmark = pytest.mark.slow  # whole example models, trained and checked


# --- docs/testing.md, "A Flax NNX model" ---
import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_matches_original, check


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(8, 32, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(32, 4, rngs=rngs)

    def __call__(self, x):
        return self.out(self.dropout(nnx.gelu(self.hidden(x))))


def loss_fn(model, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def test_nnx_loss_is_serialized_exactly():
    model = MLP(nnx.Rngs(0, dropout=1))
    x = jax.random.normal(jax.random.key(0), (24, 8))
    y = jax.random.randint(jax.random.key(1), (24,), 0, 4)
    sf = ja.serialize_axis(loss_fn, chunk=8, argnums=1)  # microbatches of 8 rows
    assert_matches_original(sf, model, x, y)  # this model, these inputs
    check(sf, model, x, y, max_examples=4)  # drawn inputs, chunk sizes and modes


# --- docs/testing.md, "A linen `apply`" ---
import flax.linen as nn
import jax
import jax.numpy as jnp

import jaxpr_accum as ja
from jaxpr_accum.testing import check


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, z):
        return nn.Dense(16)(nn.relu(nn.Dense(32)(z)))


def test_linen_apply_is_serialized_exactly():
    decoder = Decoder()
    params = decoder.init(jax.random.key(0), jnp.ones((4,)))["params"]

    @ja.serialize_axis(chunk=4)  # the 16 samples, 4 at a time
    def loss(params, key):
        z = jax.random.normal(key, (16, 4))  # the sample axis is born here
        return jnp.mean(jax.vmap(lambda z: decoder.apply({"params": params}, z))(z) ** 2)

    check(loss, params, jax.random.key(1), max_examples=4)


def test_the_page_shows_this_code():
    page = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
    here = Path(__file__).read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 2
    for block in blocks:
        assert block in here, block
