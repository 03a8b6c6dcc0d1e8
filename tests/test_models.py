"""Whole models, serialized and compared with the unchunked original (values and gradients)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import jaxpr_accum as ja

from . import models
from .oracle import assert_matches_original, modes

# Whole models in every mode and chunk size are the slow tier; the default tier keeps the
# analysis of the seed (which axis, which chunk).
GRAD_MODES = modes("remat", "native")


# --------------------------------------------------------------------------------------
# (a) Seed 1: Monte-Carlo encoder-decoder, 16 samples, batch 4
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed1():
    return models.make_seed1()


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_seed1_no_hint_chunk4(seed1, grad):
    """The seed's loss with no hint at all: the 16-sample axis is found automatically."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=4, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [1, 3])
def test_seed1_no_hint_small_chunks(seed1, grad, chunk):
    """chunk=1 (one sample at a time) and chunk=3 (does not divide 16: a remainder of 1)."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=chunk, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [16, 32])
def test_seed1_chunk_at_least_size(seed1, grad, chunk):
    """chunk >= the axis size is allowed and means one chunk.

    With no hint, automatic selection only considers axes longer than ``chunk``, so none of
    the 16-sample axis would be a candidate; ``size=16`` names it explicitly.
    """
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=chunk, size=models.SEED1_SAMPLES, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_seed1_size_hint(seed1, grad):
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=5, size=models.SEED1_SAMPLES, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
def test_seed1_default_grad_mode(seed1):
    """grad="auto" (the default) on the seed."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=4)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
def test_seed1_explain_names_sample_axis(seed1):
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=4)
    plan = sf.explain(*args)
    assert plan.axis_size == models.SEED1_SAMPLES, str(plan)
    assert plan.chunk == 4, str(plan)


@pytest.mark.slow
def test_seed1_batch_axis_microbatched(seed1):
    """The other axis of the seed: the data batch, microbatched via argnums."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad="remat")
    assert_matches_original(sf, *args, vmap=False)


# --------------------------------------------------------------------------------------
# (b) MLP, microbatched over (x, y)
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 10, 13])
def test_mlp_microbatched(grad, chunk):
    """N = 10: dividing chunks (1, 2, 5, 10), non-dividing (3, 4) and larger than N (13)."""
    loss, args = models.make_mlp(n=10)
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_mlp_bfloat16(grad):
    """16-bit parameters and data; gradients accumulated in float32 (the default)."""
    loss, args = models.make_mlp(n=12, dtype=jnp.bfloat16)
    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_mlp_accum_dtype_float32(grad):
    loss, args = models.make_mlp(n=8, dtype=jnp.bfloat16)
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad, accum_dtype=jnp.float32)
    assert_matches_original(sf, *args, vmap=False)


# --------------------------------------------------------------------------------------
# (c) Attention block, batch axis serialized
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [2, 4])
def test_attention_batch_serialized(grad, chunk):
    loss, args = models.make_attention(batch=6)
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=(1, 2), grad=grad)
    assert_matches_original(sf, *args, vmap=False)


# --------------------------------------------------------------------------------------
# (d) Batch statistics over the serialized axis
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [2, 4, 9])
def test_batch_stats_loss(grad, chunk):
    """mean / var over the batch axis, then normalise: needs the whole axis, must stay exact."""
    loss, args = models.make_batch_stats(n=9)
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_flax_batchnorm_with_stats_output(grad):
    """nn.BatchNorm in training mode; the updated running statistics are outputs too."""
    loss, args = models.make_flax_batchnorm(n=7)
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


# --------------------------------------------------------------------------------------
# (e) Importance-weighted bound: logsumexp over the sample axis
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("lse", sorted(models.LOGSUMEXPS))
@pytest.mark.parametrize("chunk", [2, 3])
def test_iwae_logsumexp(grad, lse, chunk):
    loss, args = models.make_iwae(models.LOGSUMEXPS[lse])
    sf = ja.serialize_axis(loss, chunk=chunk, size=models.IWAE_SAMPLES, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
def test_iwae_no_hint():
    """Automatic choice: the 8-sample axis is the only independent axis longer than 3."""
    loss, args = models.make_iwae()
    sf = ja.serialize_axis(loss, chunk=3)
    assert_matches_original(sf, *args, vmap=False)
