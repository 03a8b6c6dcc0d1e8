"""Concatenation, ``jnp.roll`` and reversal along the axis (row maps, ``_rules/rows``).

Each row of a concatenation along the axis is one row of one part, so a chunk takes its rows
from the right parts, computed per chunk on their windows; a value read by two parts
(antithetic noise ``concatenate([z, -z])``, ``jnp.roll``'s two slices) gets one copy per
reader (``_fanout``), a random draw bit for bit; a slice's operand lives on the slice's rows
only, so slices of one value that meet again (two halves rejoined, a roll by hand, a roll
then a reversal: once chunked with wrong windows) are exact, each part recomputed from the
region's roots (a draw, an input read through a root of its own). Every program is compared
with the original (values, and gradients with respect to every floating input;
``tests.oracle``), at chunk sizes that divide the axis and that do not, 1, the axis and more,
and is checked to chunk (no stop) or, where a part mixes its rows, to stop there exactly.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

import jaxpr_accum as ja

from .oracle import (
    GRAD_MODES,
    NOT_WORTH_IT,
    assert_matches_original,
    find_eqns,
    primitive_names,
)

D = 3


def _w(seed: int, *shape: int):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape) / 2, jnp.float32)


def antithetic(n: int):
    """evosax OpenAI-ES: antithetic noise, fitness per member, ``noise.T @ fitness``."""

    def f(mean, w, key):
        z_plus = jax.random.normal(key, (n // 2, D))
        z = jnp.concatenate([z_plus, -1.0 * z_plus])
        fit = jax.vmap(lambda m: jnp.mean(jnp.tanh(w @ m) ** 2))(mean + 0.1 * z)
        return jnp.dot(z.T, fit)

    return f


def three_parts(n1: int, n2: int, n3: int):
    """Parts of different lengths from different ops: a draw, an input, a broadcast."""

    def f(w, a, v, key):
        p1 = jax.random.normal(key, (n1, D)) * w
        p2 = jnp.sin(a)  # a: [n2, D]
        p3 = jnp.ones((n3, 1)) * w
        z = jnp.concatenate([p1, p2, p3])
        return jnp.sum(jnp.tanh(z @ v) ** 2, axis=0)

    return f


def rolled(n: int, shift: int):
    def f(mean, v, key):
        z = jax.random.normal(key, (n, D)) + mean
        y = jnp.roll(jnp.tanh(z @ v), shift, axis=0)
        return jnp.sum(y * z)

    return f


def reversed_(n: int):
    def f(x, v, key):  # x: [n, D], at the positions themselves; the draw reversed
        z = jax.random.uniform(key, (n, D))
        return jnp.sum(jnp.tanh((z[::-1] + x) @ v) ** 2)

    return f


def halves(xa, xb, v):  # two half-batches joined
    z = jnp.concatenate([xa, xb])
    return jnp.mean(jnp.tanh(z @ v) ** 2)


def mixed_part(n: int):  # a part that mixes its rows (a cumulative sum): it must stop
    def f(mean, v, key):
        p = jnp.cumsum(jax.random.normal(key, (n // 2, D)), axis=0)
        z = jnp.concatenate([p, jax.random.normal(key, (n - n // 2, D))]) + mean
        return jnp.sum(jnp.tanh(z @ v) ** 2)

    return f


KEY = jax.random.PRNGKey(3)


def cases(n: int, shift: int = 2) -> dict:
    n1 = n // 3
    n2 = (n - n1) // 2
    return {
        "antithetic": (antithetic(n), (_w(1, D), _w(2, 5, D), KEY)),
        "three_parts": (
            three_parts(n1, n2, n - n1 - n2),
            (_w(3, D), _w(4, n2, D), _w(5, D, D), KEY),
        ),
        "roll": (rolled(n, shift), (_w(6, D), _w(7, D, D), KEY)),
        "rev": (reversed_(n), (_w(8, n, D), _w(9, D, D), KEY)),
        "halves": (halves, (_w(10, n // 2, D), _w(11, n - n // 2, D), _w(12, D, D))),
    }


def check_chunked(f, args, n, chunk, grad="remat", vmap=False):
    sf = ja.serialize_axis(f, chunk=chunk, size=n, grad=grad)
    with warnings.catch_warnings():  # chunk >= n: nothing to save, runs as written
        warnings.filterwarnings("ignore", NOT_WORTH_IT.split(":", 1)[1].rsplit(":", 1)[0])
        plan = sf.explain(*args)
        assert not plan.stops and plan.counts["body"] > 0, str(plan)
        assert_matches_original(sf, *args, vmap=vmap)


def check(name, f, args, n, chunk, **kwargs):
    check_chunked(f, args, n, chunk, **kwargs)


def rejoined(n: int):
    """Slices of one value that meet again: halves rejoined, a roll by hand (the review's
    programs that were chunked with wrong values); ``z`` a draw and a function of an input."""

    def f(mean, v, key, x):
        z = jax.random.normal(key, (n, D)) + mean + jnp.tanh(x @ v)
        y = jnp.concatenate([z[2:], z[:2]]) + jnp.concatenate([z[:2], z[2:]])
        return jnp.sum(jnp.tanh(y @ v) ** 2 * jnp.arange(1, n + 1)[:, None])

    return f, (_w(1, D), _w(2, D, D), KEY, _w(3, n, D))


def test_slices_of_one_value_rejoined_chunk_exactly():
    """The default tier's one: a chunk that straddles the halves' boundary (size 5, chunk 3);
    the region does not stop, values and gradients are the original's."""
    f, args = rejoined(5)
    check_chunked(f, args, 5, 3)


def test_antithetic_noise_concatenation_chunks():
    """The default tier's one: the OpenAI-ES generation, a chunk that straddles the halves."""
    f, args = cases(14)["antithetic"]
    check_chunked(f, args, 14, 3)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 14, 20])
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "rev", "halves"])
def test_row_maps_every_chunk_size(name, chunk):
    f, args = cases(14)[name]
    check(name, f, args, 14, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("shift", [0, 1, 5, -3, 13, 27, -30])
def test_roll_every_shift(shift):
    f, args = cases(13, shift)["roll"]
    check("roll", f, args, 13, 4)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "rev", "halves"])
def test_row_maps_every_mode_under_jit_and_vmap(name, grad):
    f, args = cases(12)[name]
    check(name, f, args, 12, 5, grad=grad, vmap=True)


@pytest.mark.slow
@settings(deadline=None, max_examples=8)
@given(
    lengths=st.lists(st.integers(2, 6), min_size=2, max_size=3),  # one row: see row_trees
    chunk=st.integers(1, 20),
    shift=st.integers(-25, 25),
    flip=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_concatenated_parts_property(lengths, chunk, shift, flip, seed):
    """Parts of drawn lengths (a draw, its negation when two are equal, a broadcast), then
    a roll by a drawn shift and perhaps a reversal, at a drawn chunk."""
    n = sum(lengths)

    def f(w, v, key):
        parts = []
        for i, m in enumerate(lengths):
            if i and m == lengths[0]:
                parts.append(-parts[0])
            elif i % 2:
                parts.append(jnp.ones((m, 1)) * jnp.sin(w))
            else:
                parts.append(jax.random.normal(jax.random.fold_in(key, i), (m, D)) * w)
        z = jnp.roll(jnp.concatenate(parts), shift, axis=0)
        z = z[::-1] if flip else z
        return jnp.sum(jnp.tanh(z @ v) * jnp.arange(n)[:, None])

    note(f"n={n} lengths={lengths} chunk={chunk} shift={shift} flip={flip}")
    check("roll", f, (_w(seed, D), _w(seed + 1, D, D), KEY), n, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_a_part_that_mixes_its_rows_stops(chunk):
    """A cumulative sum inside a part is no row map: the region stops, the values are exact."""
    f, args = mixed_part(10), (_w(13, D), _w(14, D, D), KEY)
    sf = ja.serialize_axis(f, chunk=chunk, size=10, grad="remat", axis=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        try:
            plan = sf.explain(*args)
        except ja.SerializeError as e:  # nothing else to chunk: refused, never wrong
            assert "cumsum" in str(e), str(e)
            return
        assert any("cumsum" in str(s) for s in plan.stops), str(plan)
        assert_matches_original(sf, *args, vmap=False)


def test_two_views_of_one_batch_are_chunked_side_by_side():
    """Two encodings of the same rows joined along the axis (SimCLR's two views) hold the
    axis twice, one copy after the other (``_rules/blocks``): each chunk computes its rows of
    both views, so the whole loss runs in the loop, with one encoder chain per view (no copy
    per reader), nothing stacked and no stop; values and gradients are the original's."""

    def loss(w, x, key):
        a = x + 0.1 * jax.random.normal(key, x.shape)
        z = jnp.concatenate([jnp.tanh(a @ w), jnp.tanh(x @ w)])
        z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
        return jnp.sum(jnp.tanh(z) ** 2)

    w, x, key = _w(0, D, 4), _w(1, 12, D), jax.random.key(2)
    sf = ja.serialize_axis(loss, chunk=4, argnums=1, grad="remat")
    plan = sf.explain(w, x, key)
    assert not plan.stops and not plan.stacked, plan
    assert plan.counts["body"] <= 30, plan  # one chain per view (48 with a copy per reader)
    assert_matches_original(sf, w, x, key, vmap=False)


# -- chunks aligned with the parts: each chunk computes its own part only ------------------


def switches(f, args, n, chunk) -> bool:
    """Whether the serialized program picks the chunk's part by a ``lax.switch`` (``cond``)."""
    sf = ja.serialize_axis(f, chunk=chunk, size=n, grad="remat")
    with warnings.catch_warnings():  # chunk >= n: nothing to save, runs as written
        warnings.simplefilter("ignore", ja.PlanWarning)
        return bool(find_eqns(jax.make_jaxpr(sf)(*args), "cond"))


def aligned_cases(n: int) -> dict:
    """Programs whose part boundaries are multiples of ``n // 4``."""
    q = n // 4
    return {
        "antithetic": (antithetic(n), (_w(1, D), _w(2, 5, D), KEY)),
        "three_parts": (three_parts(q, q, 2 * q), (_w(3, D), _w(4, q, D), _w(5, D, D), KEY)),
        "roll": (rolled(n, q), (_w(6, D), _w(7, D, D), KEY)),
        "halves": (halves, (_w(10, n // 2, D), _w(11, n // 2, D), _w(12, D, D))),
    }


def in_branches(f, args, n, chunk) -> set[str]:
    """The primitives inside the branches of the serialized program's switches."""
    sf = ja.serialize_axis(f, chunk=chunk, size=n, grad="remat")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        conds = find_eqns(jax.make_jaxpr(sf)(*args), "cond")
    return {name for c in conds for b in c.params["branches"] for name in primitive_names(b)}


def test_aligned_chunks_compute_their_own_part():
    """The default tier's one: the OpenAI-ES generation at a chunk that divides each half
    picks each chunk's half by a switch (and draws that half's rows only); the switch holds
    the draw and the concatenation, not the fitness that reads the noise twice (run once,
    after it); exact."""
    f, args = aligned_cases(16)["antithetic"]
    inside = in_branches(f, args, 16, 4)
    assert "concatenate" in inside and "tanh" not in inside, inside
    check_chunked(f, args, 16, 4)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 16, 20])
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "halves"])
def test_aligned_and_straddling_chunks(name, chunk):
    """A chunk dividing every boundary switches per part; one that straddles a boundary, or
    covers the axis, computes every part's window; both exact."""
    f, args = aligned_cases(16)[name]
    assert switches(f, args, 16, chunk) == (16 // 4 % chunk == 0 and chunk < 16)
    check(name, f, args, 16, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "halves"])
def test_aligned_chunks_every_mode_under_jit_and_vmap(name, grad):
    f, args = aligned_cases(16)[name]
    check(name, f, args, 16, 4, grad=grad, vmap=True)


def read_twice_cases(n: int) -> dict:
    """Programs whose joined value (a concatenation's window) has two readers, and the
    primitive that only those readers use (it must run after the switch): boundaries at
    multiples of ``n // 4``."""
    q = n // 4

    def parts(w, a, v, key):
        z = jnp.concatenate(
            [jax.random.normal(key, (q, D)) * w, jnp.sin(a), jnp.ones((2 * q, 1)) * w]
        )
        return jnp.sum(jnp.tanh(z @ v) ** 2, axis=0) + jnp.sum(jnp.cos(z) * z, axis=0)

    def roll(mean, v, key):
        y = jnp.roll(jnp.tanh((jax.random.normal(key, (n, D)) + mean) @ v), q, axis=0)
        return jnp.sum(jnp.cos(y) @ v) + jnp.sum(y * jnp.arange(n)[:, None])

    def halves(xa, xb, v):
        z = jnp.concatenate([xa, -xb])
        return jnp.mean(jnp.cos(z @ v) ** 2) + jnp.mean(z * jnp.arange(n)[:, None])

    return {
        "antithetic": (antithetic(n), (_w(1, D), _w(2, 5, D), KEY), "tanh"),
        "three_parts": (parts, (_w(3, D), _w(4, q, D), _w(5, D, D), KEY), "cos"),
        "roll": (roll, (_w(6, D), _w(7, D, D), KEY), "cos"),
        "halves": (halves, (_w(10, n // 2, D), _w(11, n // 2, D), _w(12, D, D)), "cos"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 16, 20])
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "halves"])
def test_a_joined_value_read_twice_leaves_the_switch(name, chunk):
    """A concatenation's window read twice leaves the switch (XLA materialises it once, as
    the original's concatenation): at a chunk dividing every boundary the readers run after
    the switch; at one that straddles a boundary, the axis or more there is no switch; exact
    in value and gradient at every chunk."""
    f, args, reader = read_twice_cases(16)[name]
    inside = in_branches(f, args, 16, chunk)
    if 16 // 4 % chunk == 0 and chunk < 16:
        assert "concatenate" in inside and reader not in inside, inside
    else:
        assert not inside, inside
    check(name, f, args, 16, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("name", ["antithetic", "three_parts", "roll", "halves"])
def test_a_joined_value_read_twice_every_mode_under_jit_and_vmap(name, grad):
    f, args, _ = read_twice_cases(16)[name]
    check(name, f, args, 16, 4, grad=grad, vmap=True)


@pytest.mark.slow
def test_openai_es_generation_memory_at_chunk_p_over_8():
    """The OpenAI-ES generation (P = 256 members of 64 weights, fitness on 512 samples):
    XLA's temp memory at chunk P/8 is at most 0.3 of the original's, forward and
    ``value_and_grad`` (0.32 and 0.43 while the whole body ran inside the switch)."""
    p, d = 256, 64
    data = jax.random.normal(jax.random.key(1), (512, d))

    def generation(mean, rng):
        z_plus = jax.random.normal(rng, (p // 2, d))
        z = jnp.concatenate([z_plus, -1.0 * z_plus])
        fit = jax.vmap(lambda w: jnp.mean(jnp.tanh(data @ w) ** 2))(mean + 0.1 * z)
        return jnp.dot(z.T, fit) / (p * 0.1)

    def temp(f, *a):
        return jax.jit(f).lower(*a).compile().memory_analysis().temp_size_in_bytes

    def loss(f):
        return lambda m, k: jnp.sum(f(m, k) ** 2)

    args = (jnp.full(d, 0.05), jax.random.PRNGKey(0))
    sf = ja.serialize_axis(generation, chunk=p // 8, size=p)
    assert temp(sf, *args) <= 0.3 * temp(generation, *args)
    vg, vg_sf = jax.value_and_grad(loss(generation)), jax.value_and_grad(loss(sf))
    assert temp(vg_sf, *args) <= 0.3 * temp(vg, *args)
    np.testing.assert_allclose(jax.jit(sf)(*args), generation(*args), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(vg_sf(*args)[1], vg(*args)[1], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_aligned_chunks_draw_bit_identical_noise():
    """The noise itself, returned along the axis at a chunk that switches per half: every bit
    as the original draws it."""

    def f(key):
        z = jax.random.normal(key, (8, D))
        return jnp.concatenate([z, -z]) * 1.0

    sf = ja.serialize_axis(f, chunk=4, size=16, axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        np.testing.assert_array_equal(np.asarray(jax.jit(sf)(KEY)), np.asarray(f(KEY)))


# -- random trees of row maps over row-independent parts -------------------------------------


@st.composite
def row_trees(draw, depth: int = 3):
    """``(tree, rows)``: a tree of concatenations, slices (start/stop windows), reversals,
    rolls and negations over leaves that are row-independent (``draw``: a random draw,
    ``input``: a function of an input's rows, ``const``: a broadcast), of drawn lengths. A
    leaf has two rows at least: a one-row draw's size-1 constants meet the axis and the
    region stops there (exactly; ``docs/limitations.md``)."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        m = draw(st.integers(2, 6))
        return (draw(st.sampled_from(["draw", "input", "const"])), m), m
    op = draw(st.sampled_from(["concat", "slice", "rev", "roll", "neg"]))
    if op == "concat":
        kids = [draw(row_trees(depth - 1)) for _ in range(draw(st.integers(2, 3)))]
        return ("concat", [k for k, _ in kids]), sum(m for _, m in kids)
    kid, m = draw(row_trees(depth - 1))
    if op == "slice" and m > 1:
        a = draw(st.integers(0, m - 1))
        b = draw(st.integers(a + 1, m))
        return ("slice", kid, a, b), b - a
    if op == "roll":
        return ("roll", kid, draw(st.integers(-2 * m, 2 * m))), m
    return (op if op != "slice" else "neg", kid), m


def build_tree(tree, mean, v, key, inputs):
    """The value of ``tree`` (``inputs``: one array per ``input`` leaf, in order)."""
    kind = tree[0]
    if kind in ("draw", "input", "const"):
        m = tree[1]
        if kind == "draw":
            return jax.random.normal(jax.random.fold_in(key, len(inputs)), (m, D)) + mean
        if kind == "input":
            return jnp.tanh(inputs.pop(0) @ v)
        return jnp.ones((m, 1)) * jnp.sin(mean)
    if kind == "concat":
        return jnp.concatenate([build_tree(k, mean, v, key, inputs) for k in tree[1]])
    z = build_tree(tree[1], mean, v, key, inputs)
    if kind == "slice":
        return z[tree[2] : tree[3]]
    if kind == "roll":
        return jnp.roll(z, tree[2], axis=0)
    return z[::-1] if kind == "rev" else -0.5 * z


def input_rows(tree) -> list[int]:
    if tree[0] == "input":
        return [tree[1]]
    if tree[0] in ("draw", "const"):
        return []
    kids = tree[1] if tree[0] == "concat" else [tree[1]]
    return [m for k in kids for m in input_rows(k)]


@pytest.mark.slow
@settings(deadline=None, max_examples=8)
@given(
    tree=row_trees(),
    chunk=st.sampled_from([1, 2, 3, 4, 5, 7, "axis", "more"]),
    grad=st.sampled_from(GRAD_MODES),
    seed=st.integers(0, 2**16),
)
def test_random_trees_of_row_maps(tree, chunk, grad, seed):
    """Random trees of concatenation, slices, reversal, roll and negation over parts that
    are row-independent, at a drawn chunk (dividing or not, 1, the axis, more) and gradient
    mode: chunked (no stop) and exact, values and gradients."""
    tree, n = tree
    assume(n >= 2)  # an axis of one position: nothing to chunk (any size-1 dimension is one)
    k = n if chunk == "axis" else n + 3 if chunk == "more" else chunk
    rows = input_rows(tree)

    def f(mean, v, key, *xs):
        y = build_tree(tree, mean, v, key, list(xs))
        return jnp.sum(jnp.tanh(y @ v) ** 2 * jnp.arange(1, n + 1)[:, None])

    note(f"tree={tree} n={n} chunk={k} grad={grad}")
    args = (
        _w(seed, D),
        _w(seed + 1, D, D),
        KEY,
        *[_w(seed + 2 + i, m, D) for i, m in enumerate(rows)],
    )
    if k < n:
        check_chunked(f, args, n, k, grad=grad)
        return
    sf = ja.serialize_axis(f, chunk=k, size=n, grad=grad)  # nothing to save: may stop where
    with warnings.catch_warnings():  # an input is read in part (the input's own candidate)
        warnings.simplefilter("ignore", ja.PlanWarning)
        assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
def test_a_program_with_nothing_chunkable_names_where_the_axis_is_born():
    """A candidate whose first whole value is a copy made for a reader (a roll, then a slice
    of part of it, reduced) is named by its seed in the user's program, never by a ``Var``."""
    key, mu, w = jax.random.key(0), jnp.array([0.3, -0.2, 0.5]), jnp.eye(3) / 2

    def roll_slice(mu, w):
        h = jnp.tanh((jax.random.normal(key, (9, 3)) + mu) @ w)
        return jnp.mean(jnp.roll(h, -1, 0)[2:] ** 2)

    with pytest.raises(ja.SerializeError) as info:
        ja.serialize_axis(roll_slice, chunk=2, size=9, grad="remat").explain(mu, w)
    assert "Var(id=" not in str(info.value) and "`random_bits` at" in str(info.value)
