"""Copies of the axis side by side (``_rules/blocks``) and row maps of a chunked input itself
(``_analysis/_input_slices``).

A concatenation of parts that each carry the whole axis (DPO's ``concatenate([chosen,
rejected])`` of two inputs chunked along the pairs, two encodings of one batch) holds the
axis once per part: each chunk computes its rows of every part, and slices or splits that take
whole parts again (``s[:B] - s[B:]``, ``jnp.split(s, 2)``) pair rows in the same chunk. With
``size=`` naming the concatenated rows, the parts' own axis is a candidate too. A slice of a
chunked input that takes part of the axis (halves rejoined, a roll by hand) reads the whole
input through a root of its own. Every program is compared with the original (values, and
gradients with respect to every floating input, ``tests.oracle``) at chunk sizes that divide
the axis and that do not, 1, the axis and more, and checked to chunk without a stop, or, where
a slice cuts a part, to stop there exactly.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import jaxpr_accum as ja

from .oracle import NOT_WORTH_IT, assert_matches_original

D = 4


def _w(seed: int, *shape: int):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape) / 2, jnp.float32)


def dpo_pairs(w, chosen, rejected):
    """r24: one forward pass over the concatenated pairs, the halves paired again."""
    x = jnp.concatenate([chosen, rejected], 0)
    s = jnp.tanh(jnp.tanh(x @ w) @ w).sum(1)
    n = s.shape[0] // 2
    return -jnp.mean(jax.nn.log_sigmoid(s[:n] - s[n:]))


def dpo_split(w, chosen, rejected):
    """The same, split with ``jnp.split`` and a per-token gather (``take_along_axis``)."""
    x = jnp.concatenate([chosen, rejected])
    logp = jax.nn.log_softmax(jnp.tanh(x @ w) @ w, -1)
    picked = jnp.take_along_axis(logp, jnp.argmax(x, -1, keepdims=True), -1)[:, 0]
    a, b = jnp.split(picked, 2)
    return -jnp.sum(jax.nn.log_sigmoid(a - b))


def _plan(sf, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        return sf.explain(*args)


@pytest.mark.parametrize(
    "loss, how",
    [
        (dpo_pairs, "argnums"),
        (dpo_split, "size"),
        pytest.param(dpo_pairs, "size", marks=pytest.mark.slow),
        pytest.param(dpo_split, "argnums", marks=pytest.mark.slow),
    ],
)
def test_concatenated_pairs_are_chunked_together(loss, how):
    """With the pairs named (``argnums``) or the concatenated rows (``size=2B``), the whole
    loss is chunked: no stop, the pairs' sum the only reduction after the loop."""
    b = 12
    w, a, r = _w(0, D, D), _w(1, b, D), _w(2, b, D)
    kw = dict(argnums=(1, 2), chunk=5) if how == "argnums" else dict(size=2 * b, chunk=10)
    sf = ja.serialize_axis(loss, grad="remat", **kw)
    plan = _plan(sf, w, a, r)
    assert not plan.stops and plan.axis_size == b, str(plan)
    assert plan.chunk == 5, str(plan)  # size=2B: 10 rows of the concatenation, 5 pairs
    assert_matches_original(sf, w, a, r, vmap=False)


@pytest.mark.slow
@pytest.mark.filterwarnings(NOT_WORTH_IT)
def test_a_slice_that_cuts_a_part_stops():
    """``s[: B + 1]`` takes a row of the second part: the region stops there, exactly (the
    parts' encodings are chunked and stacked)."""

    def loss(w, a, r):
        s = jnp.concatenate([jnp.tanh(a @ w), jnp.tanh(r @ w)]).sum(1)
        return jnp.sum(s[: a.shape[0] + 1] ** 2)

    w, a, r = _w(3, D, D), _w(4, 6, D), _w(5, 6, D)
    sf = ja.serialize_axis(loss, grad="remat", argnums=(1, 2), chunk=4)
    plan = _plan(sf, w, a, r)
    assert any("cuts a copy" in str(s) for s in plan.stops), str(plan)
    assert_matches_original(sf, w, a, r, vmap=False)


N = 24
ROW_MAPS = {
    "halves rejoined": (
        lambda w, x: jnp.sum(jnp.tanh(jnp.concatenate([x[: N // 2], x[N // 2 :] * 2.0]) @ w) ** 2)
    ),
    "roll by hand, read whole too": (
        lambda w, x: jnp.sum(jnp.tanh(jnp.concatenate([x[5:], x[:5]]) @ w) * x)
    ),
    "jnp.roll, read whole too": lambda w, x: jnp.sum(jnp.tanh(jnp.roll(x, 5, axis=0) @ w) * x),
}


FAST_ROW_MAPS = {("halves rejoined", "argnums"), ("jnp.roll, read whole too", "size")}


@pytest.mark.parametrize(
    "name, how",
    [
        pytest.param(name, how, marks=() if (name, how) in FAST_ROW_MAPS else pytest.mark.slow)
        for name in ROW_MAPS
        for how in ("argnums", "size")
    ],
)
def test_row_maps_of_the_chunked_input(name, how):
    """r31: slices of the chunked input itself, rejoined or beside a whole read of it, are
    chunked (no stop) and exact."""
    w, x = _w(6, D, D), _w(7, N, D)
    kw = dict(argnums=1) if how == "argnums" else dict(size=N)
    sf = ja.serialize_axis(ROW_MAPS[name], grad="remat", chunk=4, **kw)
    plan = _plan(sf, w, x)
    assert not plan.stops, str(plan)
    assert_matches_original(sf, w, x, vmap=False)


def test_rows_paired_at_two_row_maps_are_refused():
    """Rows ``i`` and ``16 + i`` of the input in one product: no chunk holds both, so nothing
    is chunked, and the error names the two row maps."""
    w, x = _w(8, D, D), _w(9, N, D)
    loss = lambda w, x: jnp.sum(jnp.tanh(x[:8] @ w) * jnp.tanh(x[-8:] @ w))  # noqa: E731
    sf = ja.serialize_axis(loss, grad="remat", chunk=4, argnums=1)
    with pytest.raises(ja.SerializeError, match=r"two places.*positions 0 \.\. 7"):
        sf.explain(w, x)


PART_OPS = {
    "x": lambda w, x, y: x,
    "sin": lambda w, x, y: jnp.sin(x),
    "encoded": lambda w, x, y: jnp.tanh(x @ w),
    "other input": lambda w, x, y: y,
}
PAIRINGS = {
    "difference of halves": lambda s, p: (
        s[: s.shape[0] // p] - s[s.shape[0] // p : 2 * s.shape[0] // p]
    ),
    "split product": lambda s, p: jnp.prod(jnp.stack(jnp.split(s, p)), 0),
    "whole": lambda s, p: s,
    "last part": lambda s, p: s[(p - 1) * s.shape[0] // p :],
}


@pytest.mark.slow
@given(
    parts=st.lists(st.sampled_from(sorted(PART_OPS)), min_size=2, max_size=3),
    pairing=st.sampled_from(sorted(PAIRINGS)),
    n=st.integers(1, 9),
    chunk=st.integers(1, 12),
    by_size=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_copies_property(parts, pairing, n, chunk, by_size, seed):
    """Parts drawn from the chunked input (itself, a function of it, an encoding, a second
    chunked input), concatenated, encoded, paired by a drawn slicing, at a drawn chunk."""
    p = len(parts)

    def loss(w, x, y):
        z = jnp.concatenate([PART_OPS[op](w, x, y) for op in parts])
        s = jnp.tanh(z @ w).sum(1)
        return jnp.sum(jnp.sin(PAIRINGS[pairing](s, p)))

    note(f"parts={parts} pairing={pairing} n={n} chunk={chunk} by_size={by_size}")
    args = (_w(seed, D, D), _w(seed + 1, n, D), _w(seed + 2, n, D))
    kw = dict(size=p * n, chunk=p * chunk) if by_size else dict(argnums=(1, 2), chunk=chunk)
    sf = ja.serialize_axis(loss, grad="remat", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        try:
            plan = sf.explain(*args)
        except ja.SerializeError:  # size=: another axis of that size may leave nothing
            assert by_size
            return
        if not by_size:
            assert not plan.stops, str(plan)
        assert_matches_original(sf, *args, vmap=False)
