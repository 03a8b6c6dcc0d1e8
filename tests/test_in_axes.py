"""``in_axes=``, as ``jax.vmap`` has it: the serialized axis of a batch inside a NamedTuple, a
dict or a graph, named per leaf of the positional arguments."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja

from .oracle import assert_matches_original

RS = np.random.RandomState(0)
W = jnp.asarray(RS.normal(size=(3, 2)) / 3, jnp.float32)


class Batch(NamedTuple):
    x: jax.Array
    y: jax.Array


def loss(w, batch, scale):
    return jnp.mean((jnp.tanh(batch.x @ w) - batch.y) ** 2) * scale


BATCH = Batch(jnp.asarray(RS.normal(size=(10, 3)), jnp.float32), jnp.zeros((10, 2)))
SCALE = jnp.float32(2.0)


@pytest.mark.parametrize(
    "in_axes",
    [(None, Batch(0, 0), None)]
    + [pytest.param(a, marks=pytest.mark.slow) for a in [(None, 0, None), [None, 0, None]]],
)
def test_in_axes_names_a_batch_inside_a_namedtuple(in_axes):
    sf = ja.serialize_axis(loss, chunk=4, in_axes=in_axes)
    plan = sf.explain(W, BATCH, SCALE)
    assert plan.born == "batch.x at axis 0, batch.y at axis 0" and plan.counts["body"] > 0
    assert_matches_original(sf, W, BATCH, SCALE, vmap=False)


@pytest.mark.slow
def test_in_axes_per_leaf_axes_in_a_dict():
    def f(w, data):
        return jnp.sum(jnp.tanh(data["x"] @ w) * data["xt"].T)

    data = {"x": BATCH.x, "xt": jnp.asarray(RS.normal(size=(2, 10)), jnp.float32)}
    sf = ja.serialize_axis(f, chunk=3, in_axes=(None, {"x": 0, "xt": 1}))
    assert sf.explain(W, data).born == "data['x'] at axis 0, data['xt'] at axis 1"
    assert_matches_original(sf, W, data, vmap=False)


def test_in_axes_errors_name_the_argument():
    with pytest.raises(TypeError, match="`in_axes` leaves must be ints or None"):
        ja.serialize_axis(loss, chunk=4, in_axes=(None, 1.5, None))
    with pytest.raises(ValueError, match="without `argnums` or `size`"):
        ja.serialize_axis(loss, chunk=4, in_axes=0, argnums=1)
    with pytest.raises(ValueError, match="at least one axis"):
        ja.serialize_axis(loss, chunk=4, in_axes=(None, None, None))
    with pytest.raises(ValueError, match="tree prefix"):
        ja.serialize_axis(loss, chunk=4, in_axes=(None, (0,), None))(W, BATCH, SCALE)
    with pytest.raises(ValueError, match=r"out of range for args\[1\]\.x"):
        ja.serialize_axis(loss, chunk=4, in_axes=(None, Batch(2, 0), None))(W, BATCH, SCALE)
    bad = Batch(BATCH.x, jnp.zeros((9, 2)))
    with pytest.raises(ValueError, match="differ in size"):
        ja.serialize_axis(loss, chunk=4, in_axes=(None, 0, None))(W, bad, SCALE)


def test_argnums_naming_a_single_key_says_how_to_serialize_its_draws():
    def mc(w, key):
        return jnp.mean(jnp.tanh(jax.random.normal(key, (8, 3)) @ w))

    key, w = jax.random.key(0), jnp.ones((3, 2))
    with pytest.raises(ValueError, match=r"argument 1 is a single PRNG key .* drop `argnums`"):
        ja.serialize_axis(mc, chunk=2, argnums=1)(w, key)
    assert_matches_original(ja.serialize_axis(mc, chunk=2), w, key, vmap=False)  # as advised
