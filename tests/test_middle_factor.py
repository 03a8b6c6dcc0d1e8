"""The axis as a middle factor of a merged dimension (``AxisLoc.outer``): a time-major
``[T, B, H]`` merged to ``[T * B, H]`` (``hk.BatchApply``, a time-distributed head) chunks
through the rules that never index along that dimension, and stops, exactly, everywhere else.

Each program is checked against the original in every gradient mode (values and gradients
with respect to every input, ``tests.oracle``), and for where its region stops.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja

from .oracle import GRAD_MODES, assert_matches_original, covering, modes

T, B, H, V = 5, 12, 6, 7


def _args(seed: int = 0):
    rs = np.random.RandomState(seed)
    w = jnp.asarray(rs.normal(size=(H, V)) / 2, jnp.float32)
    b = jnp.asarray(rs.normal(size=(V,)), jnp.float32)
    xs = jnp.asarray(rs.normal(size=(T, B, H)), jnp.float32)
    return w, b, xs


def head(w, b, xs):  # hk.BatchApply(hk.Linear): merge, apply, split back
    flat = xs.reshape(T * B, H)
    logits = jnp.tanh(flat) @ w + b
    return logits.reshape(T, B, V)


def batch_apply_loss(w, b, xs):
    return jnp.mean(jax.nn.log_softmax(head(w, b, xs)) ** 2)


def jitted_head_loss(w, b, xs):  # the merge inside a jit and a checkpoint: inlined
    logits = jax.jit(head)(w, b, xs) + jax.checkpoint(head)(w, b, jnp.cos(xs))
    return jnp.mean(logits**2)


def merged_sum(w, b, xs):  # reduced over the merged dimension itself, and a max of it
    flat = jnp.tanh(xs.reshape(T * B, H) @ w + b)
    return flat.sum() + jnp.max(flat, axis=0).sum()


def merged_dot(w, b, xs):  # contracted over the merged dimension: a sum over T and B
    flat = jnp.sin(xs.reshape(T * B, H))
    return jnp.sum((flat.T @ flat) * w[:, :H].T) + b.sum()


def merged_output(w, b, xs):  # the merged value is an output: stacking it would interleave
    flat = jnp.tanh(jnp.sin(xs).reshape(T * B, H) @ w)
    return flat, flat.sum()


def merged_cumsum(w, b, xs):  # accumulates along the merged dimension: mixes positions
    flat = jnp.tanh(jnp.sin(xs).reshape(T * B, H) @ w)
    return jnp.sum(jnp.cumsum(flat, axis=0) ** 2) + b.sum()


def merged_relu(w, b, xs):  # a custom_jvp (jax.nn.relu) meets the middle factor: it stops
    flat = jax.nn.relu(jnp.sin(xs).reshape(T * B, H) @ w + b)
    return jnp.sum(flat**2)


def merged_input(w, b, xs, extra):  # a merged input: it cannot be sliced per chunk
    flat = jnp.tanh(jnp.sin(xs).reshape(T * B, H) @ w) + extra
    return jnp.sum(flat**2) + b.sum()


CHUNKED = {
    "batch_apply": batch_apply_loss,
    "jitted_head": jitted_head_loss,
    "merged_sum": merged_sum,
    "merged_dot": merged_dot,
}
STOPPED = {
    "merged_output": (merged_output, "cannot be stacked per chunk"),
    "merged_cumsum": (merged_cumsum, "middle factor"),
    "merged_relu": (merged_relu, "middle factor"),
}


@pytest.mark.parametrize(
    "name, mode, chunk",
    [  # one mode each, in rotation; the default tier's: all but the first program's
        p if i else pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
        for i, p in enumerate(covering(sorted(CHUNKED), GRAD_MODES, [5], per=1))
    ]
    + [
        pytest.param(*p.values, id=p.id, marks=pytest.mark.slow)
        for p in covering(sorted(CHUNKED), GRAD_MODES, [1, 12])
    ],
)
def test_merged_axis_chunks_through_to_the_loss(name, mode, chunk):
    fn = CHUNKED[name]
    args = _args()
    sf = ja.serialize_axis(fn, chunk=chunk, argnums=2, axis=1, grad=mode)
    plan = sf.explain(*args)
    assert not plan.stops and plan.counts["body"] > 0, str(plan)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize("mode", modes("remat", "native"))
@pytest.mark.parametrize("name", sorted(STOPPED))
def test_merged_axis_stops_where_positions_would_mix(name, mode):
    fn, reason = STOPPED[name]
    args = _args(1)
    sf = ja.serialize_axis(fn, chunk=5, argnums=2, axis=1, grad=mode)
    with warnings.catch_warnings():  # a region that stops early may not save memory: incidental
        warnings.simplefilter("ignore", ja.PlanWarning)
        plan = sf.explain(*args)
        assert any(reason in s for s in plan.stops), str(plan)
        assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize("mode", modes("remat", "native"))
def test_a_merged_input_is_not_sliced(mode):
    args = (*_args(2), jnp.asarray(np.random.RandomState(3).normal(size=(T * B, V)), jnp.float32))
    sf = ja.serialize_axis(merged_input, chunk=5, argnums=2, axis=1, grad=mode)
    with warnings.catch_warnings():  # a region that stops early may not save memory: incidental
        warnings.simplefilter("ignore", ja.PlanWarning)
        plan = sf.explain(*args)
        assert any("middle factor" in s for s in plan.stops), str(plan)
        assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
def test_automatic_mode_finds_the_merged_batch_and_the_report_names_it():
    args = _args(4)
    sf = ja.serialize_axis(batch_apply_loss, chunk=4, axis=None)
    plan = sf.explain(*args)
    assert plan.born == "dimension 1 of xs", str(plan)
    assert not plan.stops, str(plan)
    assert_matches_original(sf, *args, vmap=False)
