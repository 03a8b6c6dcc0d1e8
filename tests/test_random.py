"""Randomness inside the chunked region (``docs/semantics.md``, "Randomness").

Draws inside the region must be bit-identical to the unchunked program's, generated per chunk
inside the loop (never the full ``u32[N, ...]`` buffer), and recomputed in the backward pass.
Every program is compared with the original (values and gradients, ``assert_matches_original``)
and, where the draw itself is an output, bit for bit (``np.testing.assert_array_equal``).
Structure tests walk the rewritten jaxpr and the optimized HLO for full-size random buffers.
Where the per-chunk formula does not apply (legacy threefry, ``rbg`` keys) the draw must be
computed before the loop, still exactly, and the plan must say so (``Plan.hoisted``).

Tiers: the default tier runs each distribution and each keying pattern once; the other
modes and chunk sizes, the Flax transformer block and the property run are ``slow``.
"""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import assert_matches_original, covering, iter_eqns, tiered

N = 10
D = 4
KEY = jax.random.key(42)
DRAW_PRIMS = ("random_bits", "threefry2x32")
slow = pytest.mark.slow


def _rand(shape, seed, scale=1.0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape) * scale, jnp.float32)


def assert_draw_equal(sf, f, *args):
    """The first output (the draw, or a value computed from it position by position) is
    bit-identical to the original's under ``jax.jit`` (eager op-by-op evaluation may round
    fused arithmetic differently, so jit is the reference); the rest (sums over the axis) are
    compared by ``assert_matches_original`` within the tolerance that reassociation needs."""
    g, r = sf(*args)[0], jax.jit(f)(*args)[0]
    assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, g.dtype, r.shape, r.dtype)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def full_size_draws(jaxpr, n: int) -> list:
    """Draw equations (anywhere, recursively) whose output has the full axis at dim 0."""
    return [
        e
        for e in iter_eqns(jaxpr)
        if e.primitive.name in DRAW_PRIMS
        and any(getattr(v.aval, "shape", ())[:1] == (n,) for v in e.outvars)
    ]


def serialize_checked(f, *args, chunk, grad="auto", expect_in_loop=True, **kw):
    """Serialize ``f``, check the plan says the region is not empty (and, by default, that
    no draw was moved before the loop); return (sf, plan)."""
    sf = ja.serialize_axis(f, chunk=chunk, grad=grad, **kw)
    plan = sf.explain(*args)
    assert plan.counts["body"] > 0, f"nothing chunked:\n{plan}"
    if expect_in_loop:
        assert not plan.hoisted, str(plan)
    return sf, plan


# --------------------------------------------------------------------------------------
# Distributions with a shape that carries the axis (size=N)
# --------------------------------------------------------------------------------------


def draw_normal(mu, key):
    z = mu + jax.random.normal(key, (N, D))
    return z, jnp.tanh(z * mu).sum()


def draw_uniform(mu, key):
    u = jax.random.uniform(key, (N, D), minval=-1.0, maxval=2.0)
    return u, (jnp.sin(u * mu) ** 2).sum()


def draw_bernoulli(mu, key):
    m = jax.random.bernoulli(key, 0.3, (N, D))
    return m, jnp.where(m, mu, -2.0 * mu).sum()


def draw_categorical(logits, key):
    c = jax.random.categorical(key, logits, shape=(N,))  # gumbel noise [N, C], argmax over C
    onehot = jax.nn.one_hot(c, logits.shape[0])
    return c, (onehot * jax.nn.log_softmax(logits)).sum()


def draw_truncated_normal(mu, key):
    t = jax.random.truncated_normal(key, -1.5, 2.0, (N, D))
    return t, (jnp.exp(t * mu) * t).sum()


DISTRIBUTIONS = {
    "normal": draw_normal,
    "uniform": draw_uniform,
    "bernoulli": draw_bernoulli,
    "categorical": draw_categorical,
    "truncated_normal": draw_truncated_normal,
}


@pytest.mark.parametrize(
    "name, grad, chunk",
    [
        ("normal", "remat", 3),
        pytest.param("normal", "native", 5, marks=slow),
        pytest.param("uniform", "native", 3, marks=slow),
        pytest.param("bernoulli", "remat", 5, marks=slow),
        pytest.param("categorical", "native", 3, marks=slow),
        pytest.param("truncated_normal", "remat", 3, marks=slow),
    ],
)
def test_distribution_along_axis(name, grad, chunk):
    f = DISTRIBUTIONS[name]
    mu = _rand((D,), 1, scale=0.5)
    sf, _ = serialize_checked(f, mu, KEY, chunk=chunk, grad=grad, size=N)
    assert_draw_equal(sf, f, mu, KEY)
    assert_matches_original(sf, mu, KEY, vmap=False)


@pytest.mark.parametrize("chunk", [4, *(pytest.param(c, marks=slow) for c in (1, N, N + 3))])
def test_uniform_draw_every_chunk_size(chunk):
    sf = ja.serialize_axis(draw_uniform, chunk=chunk, size=N)
    mu = _rand((D,), 2)
    assert_draw_equal(sf, draw_uniform, mu, KEY)


# --------------------------------------------------------------------------------------
# Raw bits of every width
# --------------------------------------------------------------------------------------


def bits_all_widths(x, key):
    k8, k16, k32 = jax.random.split(key, 3)
    b8 = jax.random.bits(k8, (N, 3, 2), dtype=jnp.uint8)
    b16 = jax.random.bits(k16, (N, 3, 2), dtype=jnp.uint16)
    b32 = jax.random.bits(k32, (N, 3, 2), dtype=jnp.uint32)
    loss = (x * (b8.astype(jnp.float32) - b16.astype(jnp.float32) / 256.0)).sum()
    return b8, b16, b32, loss + (x * (b32 >> 24).astype(jnp.float32)).sum()


@pytest.mark.parametrize("grad, chunk", [("remat", 3)])
@pytest.mark.slow
def test_bits_widths(grad, chunk):
    """``random_bits`` of widths 8, 16 and 32, chunked, equal the original's exactly."""
    x = _rand((N, 3, 2), 3)
    sf, _ = serialize_checked(bits_all_widths, x, KEY, chunk=chunk, grad=grad, argnums=0)
    got, ref = sf(x, KEY), bits_all_widths(x, KEY)
    for g, r, width in zip(got[:3], ref[:3], (8, 16, 32), strict=True):
        assert g.dtype == r.dtype == jnp.dtype(f"uint{width}")
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    assert_matches_original(sf, x, KEY, vmap=False)


# --------------------------------------------------------------------------------------
# Per-sample keys: split and fold_in
# --------------------------------------------------------------------------------------


def split_per_sample(x, key):
    keys = jax.random.split(key, N)
    noisy = jax.vmap(lambda k, xi: xi + jax.random.normal(k, xi.shape))(keys, x)
    return noisy, jnp.tanh(noisy).sum()


def fold_in_per_index(mu, key):
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(N))
    u = jax.vmap(lambda k: jax.random.uniform(k, (D,)))(keys)
    return u, (u * mu).sum() + (jnp.cos(u + mu) ** 2).sum()


@pytest.mark.parametrize("grad, chunk", [("remat", 3), pytest.param("native", 1, marks=slow)])
@pytest.mark.slow
def test_split_key_per_sample(grad, chunk):
    x = _rand((N, D), 4)
    sf, _ = serialize_checked(split_per_sample, x, KEY, chunk=chunk, grad=grad, argnums=0)
    assert_draw_equal(sf, split_per_sample, x, KEY)
    assert_matches_original(sf, x, KEY, vmap=False)


@pytest.mark.parametrize("grad, chunk", [("native", 4)])
@pytest.mark.slow
def test_split_key_per_sample_size_hint(grad, chunk):
    """The axis is born at the split itself (size=N), not at an argument."""

    def f(mu, key):
        keys = jax.random.split(key, N)
        u = jax.vmap(lambda k: jax.random.uniform(k, (D,)))(keys)
        return u, (jnp.sin(u * mu)).sum()

    mu = _rand((D,), 5)
    sf, _ = serialize_checked(f, mu, KEY, chunk=chunk, grad=grad, size=N)
    assert_draw_equal(sf, f, mu, KEY)
    assert_matches_original(sf, mu, KEY, vmap=False)


@pytest.mark.parametrize("grad, chunk", [("remat", 3), pytest.param("native", 5, marks=slow)])
@pytest.mark.slow
def test_fold_in_per_index(grad, chunk):
    mu = _rand((D,), 6)
    sf, _ = serialize_checked(fold_in_per_index, mu, KEY, chunk=chunk, grad=grad, size=N)
    assert_draw_equal(sf, fold_in_per_index, mu, KEY)
    assert_matches_original(sf, mu, KEY, vmap=False)


# --------------------------------------------------------------------------------------
# Flax linen dropout models, the batch serialized with argnums
# --------------------------------------------------------------------------------------


class DropoutMLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        h = nn.relu(nn.Dense(16)(x))
        h = nn.Dropout(0.5, deterministic=not train)(h)
        h = nn.tanh(nn.Dense(8)(h))
        h = nn.Dropout(0.25, deterministic=not train)(h)
        return nn.Dense(1)(h)


class DropoutBlock(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=2,
            qkv_features=8,
            dropout_rate=0.2,
            broadcast_dropout=False,
            deterministic=not train,
        )(h)
        x = x + nn.Dropout(0.3, deterministic=not train)(h)
        h = nn.relu(nn.Dense(16)(x))
        h = nn.Dropout(0.3, deterministic=not train)(h)
        return x + nn.Dense(8)(h)


MLP = DropoutMLP()
BLOCK = DropoutBlock()
MLP_X = _rand((N, 5), 7)
MLP_Y = _rand((N, 1), 8)
BLOCK_X = _rand((6, 5, 8), 9)  # batch 6, sequence 5, embedding 8
BLOCK_Y = _rand((6, 5, 8), 10)
MLP_PARAMS = MLP.init(jax.random.key(1), MLP_X, False)
BLOCK_PARAMS = BLOCK.init(jax.random.key(2), BLOCK_X, False)


def mlp_loss(params, x, y, key):
    out = MLP.apply(params, x, True, rngs={"dropout": key})
    return ((out - y) ** 2).mean()


def block_loss(params, x, y, key):
    out = BLOCK.apply(params, x, True, rngs={"dropout": key})
    return ((out - y) ** 2).mean()


@pytest.mark.slow
def test_dropout_is_active():
    """Sanity: the models really draw dropout masks in training mode (so comparing losses
    tests the masks), and the masks change the loss."""
    for loss, args, n_draws in [
        (mlp_loss, (MLP_PARAMS, MLP_X, MLP_Y, KEY), 2),
        (block_loss, (BLOCK_PARAMS, BLOCK_X, BLOCK_Y, KEY), 3),
    ]:
        draws = [
            e for e in iter_eqns(jax.make_jaxpr(loss)(*args)) if e.primitive.name == "random_bits"
        ]
        assert len(draws) >= n_draws, draws
    a = mlp_loss(MLP_PARAMS, MLP_X, MLP_Y, KEY)
    b = mlp_loss(MLP_PARAMS, MLP_X, MLP_Y, jax.random.key(7))
    assert not np.isclose(a, b)


@pytest.mark.parametrize("grad, chunk", [("remat", 3), pytest.param("native", 5, marks=slow)])
@pytest.mark.slow
def test_flax_dropout_mlp(grad, chunk):
    args = (MLP_PARAMS, MLP_X, MLP_Y, KEY)
    sf, _ = serialize_checked(mlp_loss, *args, chunk=chunk, grad=grad, argnums=(1, 2))
    assert_matches_original(sf, *args, vmap=False)
    assert not full_size_draws(sf.jaxpr(*args), N), sf.jaxpr(*args)


@pytest.mark.slow
@pytest.mark.parametrize("grad, chunk", [("remat", 3)])
def test_flax_dropout_transformer_block(grad, chunk):
    args = (BLOCK_PARAMS, BLOCK_X, BLOCK_Y, KEY)
    sf, _ = serialize_checked(block_loss, *args, chunk=chunk, grad=grad, argnums=(1, 2))
    assert_matches_original(sf, *args, vmap=False)
    assert not full_size_draws(sf.jaxpr(*args), 6), sf.jaxpr(*args)


# --------------------------------------------------------------------------------------
# Property: the serialized draw equals the original bit for bit
# --------------------------------------------------------------------------------------


@st.composite
def draw_cases(draw):
    n = draw(st.integers(1, 12))
    trailing = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=2)))
    chunk = draw(st.sampled_from(sorted({1, 2, 3, max(1, n // 2), n, n + 2})))
    seed = draw(st.integers(0, 2**32 - 1))
    return n, trailing, chunk, seed


def _x_plus_uniform(x, key):
    return x + jax.random.uniform(key, x.shape)


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(draw_cases())
def test_property_draw_bit_identical(case):
    n, trailing, chunk, seed = case
    x = _rand((n, *trailing), seed % 1000)
    key = jax.random.key(seed)
    sf = ja.serialize_axis(_x_plus_uniform, chunk=chunk, argnums=0)
    plan = sf.explain(x, key)
    assert plan.counts["body"] > 0 and not plan.hoisted, str(plan)
    got, ref = sf(x, key), _x_plus_uniform(x, key)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


# --------------------------------------------------------------------------------------
# Structure: no full-size draw in the rewritten program or in the compiled HLO
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["normal", "bernoulli", "truncated_normal"])
def test_rewritten_jaxpr_has_no_full_size_draw(name):
    f = DISTRIBUTIONS[name]
    mu = _rand((D,), 11)
    assert full_size_draws(jax.make_jaxpr(f)(mu, KEY), N), "the original should draw [N, ...]"
    for grad in ("remat", "native"):
        sf = ja.serialize_axis(f, chunk=3, grad=grad, size=N)
        jaxpr = sf.jaxpr(mu, KEY)
        assert not full_size_draws(jaxpr, N), jaxpr
        assert any(e.primitive.name in DRAW_PRIMS for e in iter_eqns(jaxpr)), jaxpr


def test_rewritten_jaxpr_split_and_fold_in_have_no_full_size_draw():
    x, mu = _rand((N, D), 12), _rand((D,), 13)
    sf = ja.serialize_axis(split_per_sample, chunk=3, argnums=0)
    assert not full_size_draws(sf.jaxpr(x, KEY), N), sf.jaxpr(x, KEY)
    sf = ja.serialize_axis(fold_in_per_index, chunk=3, size=N)
    assert not full_size_draws(sf.jaxpr(mu, KEY), N), sf.jaxpr(mu, KEY)


S, B, H, W, C = 16, 4, 8, 8, 1
FULL_BITS = f"u32[{S},{B},{H},{W},{C}]"


def _conv(x, k):
    return lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def mc_decoder_loss(k, mu, key):
    eps = jax.random.normal(key, (S, B, H, W, C))
    z = mu + 0.5 * eps
    y = jax.vmap(lambda zi: jnp.tanh(_conv(zi, k)))(z)
    return (y**2).mean()


@pytest.mark.slow
def test_compiled_hlo_has_no_full_random_buffer():
    k, mu = _rand((3, 3, C, 2), 14, scale=0.3), _rand((B, H, W, C), 15)
    args = (k, mu, KEY)

    def hlo(fn):
        vg = jax.value_and_grad(fn, argnums=(0, 1))
        compiled = jax.jit(vg).lower(*args).compile()
        return compiled.as_text(), compiled(*args)

    ref_text, ref = hlo(mc_decoder_loss)
    assert FULL_BITS in ref_text, "sanity: the original holds the full draw"
    sf = ja.serialize_axis(mc_decoder_loss, chunk=3, size=S)
    text, got = hlo(sf)
    assert FULL_BITS not in text, [ln for ln in text.splitlines() if FULL_BITS in ln][:5]
    # The compiled value_and_grad of both gives the same loss and gradients.
    assert_tree_close(got, ref, what="value_and_grad")


# --------------------------------------------------------------------------------------
# Where the per-chunk formula does not apply: hoisted, exact, reported
# --------------------------------------------------------------------------------------


def legacy_draws(mu, key):  # its own function: no jit cache shared with the default threefry
    k1, k2 = jax.random.split(key)
    b = jax.random.bits(k1, (N, D))
    z = mu * jax.random.normal(k2, (N, D)) + jax.random.uniform(k1, (N, D))
    return b, z, jnp.tanh(z * mu).sum()


@pytest.mark.parametrize("grad, chunk", [("remat", 3)])
@pytest.mark.slow
def test_legacy_threefry_is_exact_and_hoisted(grad, chunk):
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        mu = _rand((D,), 16)
        f = legacy_draws
        sf, plan = serialize_checked(
            f, mu, KEY, chunk=chunk, grad=grad, size=N, expect_in_loop=False
        )
        assert plan.hoisted, str(plan)
        assert_draw_equal(sf, f, mu, KEY)
        assert_matches_original(sf, mu, KEY, vmap=False)
    finally:
        jax.config.update("jax_threefry_partitionable", before)


def test_legacy_threefry_draws_differ():
    """Sanity: the legacy threefry is really a different stream, so the test above runs
    under a different formula."""
    before = jax.config.jax_threefry_partitionable
    try:
        jax.config.update("jax_threefry_partitionable", False)
        legacy = np.asarray(jax.random.bits(KEY, (N, D)))
        jax.config.update("jax_threefry_partitionable", True)
        default = np.asarray(jax.random.bits(KEY, (N, D)))
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    assert not np.array_equal(legacy, default)


RBG_KEY = jax.random.key(0, impl="rbg")


@pytest.mark.parametrize(
    "name, grad, chunk",
    [("normal", "remat", 3), pytest.param("bernoulli", "native", 5, marks=slow)],
)
@pytest.mark.slow
def test_rbg_key_is_exact_and_hoisted(name, grad, chunk):
    f = DISTRIBUTIONS[name]
    mu = _rand((D,), 17)
    sf, plan = serialize_checked(
        f, mu, RBG_KEY, chunk=chunk, grad=grad, size=N, expect_in_loop=False
    )
    assert plan.hoisted, str(plan)
    assert_draw_equal(sf, f, mu, RBG_KEY)
    assert_matches_original(sf, mu, RBG_KEY, vmap=False)


@pytest.mark.parametrize(
    "full_shape, dim, k, start",
    [
        ((2**20, 2**13), 0, 2, 2**20 - 2),
        ((2**17, 2**8, 2**8), 0, 1, 2**17 - 1),
        ((8, 2**20, 2**10), 1, 2, 2**20 - 2),
    ],
)
def test_counters_of_a_draw_beyond_two_to_the_32_are_exact_in_two_words(full_shape, dim, k, start):
    """A draw of more than 2**32 elements takes the two-word counters: checked against
    uint64 arithmetic for a chunk at the far end (the full draw is never materialised).
    Draws that fit one word are checked against ``jax.random.bits`` elsewhere."""
    from jaxpr_accum._base._lattice import AxisLoc
    from jaxpr_accum._rules.random import chunk_counters

    hi, lo = jax.jit(lambda s: chunk_counters(full_shape, AxisLoc(dim, 1), k, s))(start)
    shape = list(full_shape)
    shape[dim] = k
    hi, lo = np.asarray(hi).reshape(shape), np.asarray(lo).reshape(shape)  # flat: row-major
    strides = [int(np.prod(full_shape[d + 1 :])) for d in range(len(full_shape))]
    index = sum(
        (np.arange(n, dtype=np.uint64) + (start if d == dim else 0)).reshape(
            [-1 if e == d else 1 for e in range(len(shape))]
        )
        * np.uint64(strides[d])
        for d, n in enumerate(shape)
    )
    np.testing.assert_array_equal(np.asarray(hi), (index >> np.uint64(32)).astype(np.uint32))
    np.testing.assert_array_equal(np.asarray(lo), (index & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    assert np.asarray(hi).max() > 0  # the high word is in use


# -- the gamma family: JAX binds `random_gamma` inside its jitted `_gamma` -----------------

GAMMA_FAMILY = {
    "gamma": lambda k: jax.random.gamma(k, 2.5, (N, D)),
    "beta": lambda k: jax.random.beta(k, 2.0, 3.0, (N, D)),
    "dirichlet": lambda k: jax.random.dirichlet(k, jnp.ones(D) * 1.5, (N,)),
    "t": lambda k: jax.random.t(k, 4.0, (N, D)),
    "loggamma": lambda k: jax.random.loggamma(k, 0.5, (N, D)),
    "chisquare": lambda k: jax.random.chisquare(k, 3.0, (N, D)),
    "f": lambda k: jax.random.f(k, 3.0, 4.0, (N, D)),
    "generalized_normal": lambda k: jax.random.generalized_normal(k, 1.5, (N, D)),
    "ball": lambda k: jax.random.ball(k, D, shape=(N,)),
    "gamma per key": lambda k: jax.vmap(lambda kk: jax.random.gamma(kk, 2.5, (D,)))(
        jax.random.split(k, N)
    ),
}
#: ``ball`` divides its draw by a sum over its last dimension: that arithmetic, not the draw,
#: is fused by XLA as the program around it allows, and where the chunked program's fusion
#: differs from the original's the quotient's last bit can (1 ULP; the same expression moves
#: as much between two jitted programs that fuse it differently)
ROUNDED_AFTER_THE_DRAW = {"ball"}


@pytest.mark.parametrize(
    "name, grad, chunk",
    # every distribution meets every mode and every chunk: dividing, not dividing, one chunk
    tiered(
        covering(list(GAMMA_FAMILY), ("remat", "fused", "native"), (5, 7, N)),
        [("gamma", "remat", 7)],
    ),
)
def test_gamma_family_draws_bit_identical(name, grad, chunk):
    """A constant shape parameter is folded into the sampler as in the original (the draw
    keeps its call, its constants are computed before the loop): the draws are the
    original's bit for bit, under ``jax.jit``, in every mode and chunking."""
    draw = GAMMA_FAMILY[name]

    def f(s, key):
        return draw(key) * s

    sf = ja.serialize_axis(f, chunk=chunk, size=N, grad=grad)
    args = (jnp.float32(1.0), KEY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)  # nothing to save: a bare draw
        got = np.asarray(jax.jit(sf)(*args))
    want = np.asarray(jax.jit(f)(*args))
    if name in ROUNDED_AFTER_THE_DRAW:
        np.testing.assert_array_max_ulp(got, want, maxulp=1)
    else:
        np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.slow
def test_gamma_family_gradients_match_original():
    """The draw kept in its own call is differentiated as the original's (values and
    gradients through the shape parameter and the scale, leaf by leaf)."""

    def f(alpha, s, key):
        g = jax.random.gamma(key, alpha, (N, D))
        return (jnp.tanh(g * s) ** 2).sum()

    sf = ja.serialize_axis(f, chunk=3, size=N)
    assert_matches_original(sf, jnp.float32(2.5), _rand((D,), 3), KEY, vmap=False)
