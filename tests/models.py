"""Flax linen models and their losses, used as programs to serialize.

Each ``make_*`` function returns ``(loss, args)``: the loss is a plain function of arrays (the
oracle) and ``args`` are concrete, small inputs for it.

(a) ``seed1``: the Monte-Carlo encoder-decoder of ``examples/mc_vae.py`` (the demo's model,
    written once there), at a tiny size: an encoder of two convolutions, a decoder of two,
    ``jax.vmap(decoder)(z)`` over 16 latent samples inside ``@nn.compact``. The loss draws
    the input mask from its key, as a train step does, and calls the example's loss.
(b) ``mlp``: a linen MLP with a per-example squared error, batch = ``(x, y)``.
(c) ``attention``: a pre-norm transformer block (linen multi-head self-attention, softmax over
    the sequence) with a per-example loss.
(d) ``batch_stats``: batch normalisation by hand (mean / var over the batch axis, then
    normalise), and ``flax_batchnorm``: ``nn.BatchNorm`` in training mode that also returns
    its updated running statistics.
(e) ``iwae``: an importance-weighted bound, logsumexp over Monte-Carlo samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.scipy.special

from jaxpr_accum._api._demo import example

# --------------------------------------------------------------------------------------
# (a) The Monte-Carlo encoder-decoder of examples/mc_vae.py
# --------------------------------------------------------------------------------------

mc_vae = example("mc_vae")
SEED1_SAMPLES = 16
SEED1_BATCH = 4
SEED1_HW = 8  # spatial size (8 keeps the tests fast and is not equal to 16)
# one channel everywhere, so that no activation of a chunk is as large as the 16 samples' input
SEED1_SIZES = mc_vae.Sizes(
    batch=SEED1_BATCH, height=SEED1_HW, width=SEED1_HW, latent=1, n_samples=SEED1_SAMPLES,
    encoder_width=2, decoder_widths=(2,),
)  # fmt: skip
_seed1_mc_loss = mc_vae.make_loss(mc_vae.Model(SEED1_SIZES))


def seed1_loss(params, x, rng):
    """The example's loss, with the mask drawn inside (as a train step draws it)."""
    rng, key = jax.random.split(rng, 2)
    return _seed1_mc_loss(params, x, mc_vae.random_mask(key, x), rng)


def make_seed1(seed: int = 42, batch: int = SEED1_BATCH, hw: int = SEED1_HW):
    sizes = dataclasses.replace(SEED1_SIZES, batch=batch, height=hw, width=hw)
    _, (params, x, _, key) = mc_vae.problem(sizes, jax.random.PRNGKey(seed))
    return seed1_loss, (params, x, key)


# --------------------------------------------------------------------------------------
# (b) MLP, per-example loss, batch = (x, y)
# --------------------------------------------------------------------------------------


class MLP(nn.Module):
    features: tuple[int, ...] = (7, 5, 3)

    @nn.compact
    def __call__(self, x):
        for i, f in enumerate(self.features):
            x = nn.Dense(f)(x)
            if i + 1 < len(self.features):
                x = nn.gelu(x)
        return x


def mlp_loss(params, batch):
    x, y = batch
    pred = MLP().apply({"params": params}, x)
    per_example = ((pred - y) ** 2).sum(-1)
    return per_example.mean()


def make_mlp(n: int = 10, d_in: int = 4, dtype=jnp.float32, seed: int = 0):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(k1, (n, d_in), dtype)
    y = jax.random.normal(k2, (n, MLP.features[-1]), dtype)
    params = MLP().init(k3, x)["params"]
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    return mlp_loss, (params, (x, y))


# --------------------------------------------------------------------------------------
# (c) Attention block, per-example loss
# --------------------------------------------------------------------------------------


class Block(nn.Module):
    heads: int = 2
    width: int = 8

    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads, qkv_features=self.width)(h)
        x = x + h
        h = nn.LayerNorm()(x)
        h = nn.Dense(2 * self.width)(h)
        h = nn.gelu(h)
        h = nn.Dense(x.shape[-1])(h)
        return x + h


def attention_loss(params, x, target):
    out = Block().apply({"params": params}, x)
    per_example = ((out - target) ** 2).mean(axis=(1, 2))
    return per_example.mean()


def make_attention(batch: int = 6, seq: int = 5, dim: int = 4, seed: int = 1):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(k1, (batch, seq, dim))
    target = jax.random.normal(k2, (batch, seq, dim))
    params = Block().init(k3, x)["params"]
    return attention_loss, (params, x, target)


# --------------------------------------------------------------------------------------
# (d) Batch statistics over the batch axis
# --------------------------------------------------------------------------------------


class BatchStatsNet(nn.Module):
    hidden: int = 6

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.hidden)(x)
        mean = h.mean(axis=0)
        var = h.var(axis=0)
        h = (h - mean) / jnp.sqrt(var + 1e-5)
        h = jnp.tanh(h)
        return nn.Dense(2)(h)


def batch_stats_loss(params, x):
    out = BatchStatsNet().apply({"params": params}, x)
    return (out**2).sum(-1).mean()


def make_batch_stats(n: int = 9, d_in: int = 3, seed: int = 2):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(k1, (n, d_in)) * 2.0 + 0.5
    params = BatchStatsNet().init(k2, x)["params"]
    return batch_stats_loss, (params, x)


class FlaxBatchNormNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(5)(x)
        h = nn.BatchNorm(use_running_average=False, momentum=0.9)(h)
        h = nn.relu(h)
        return nn.Dense(2)(h)


def flax_batchnorm_loss(variables, x):
    """Returns ``(loss, new_batch_stats)``: a dict output, reduced over the batch axis."""
    out, updates = FlaxBatchNormNet().apply(variables, x, mutable=["batch_stats"])
    return (out**2).sum(-1).mean(), updates["batch_stats"]


def make_flax_batchnorm(n: int = 7, d_in: int = 3, seed: int = 3):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(k1, (n, d_in))
    variables = FlaxBatchNormNet().init(k2, x)
    return flax_batchnorm_loss, (variables, x)


# --------------------------------------------------------------------------------------
# (e) Importance-weighted bound: logsumexp over samples
# --------------------------------------------------------------------------------------

IWAE_SAMPLES = 8  # no other dimension of the program has this size
IWAE_BATCH = 3
IWAE_X = 5
IWAE_Z = 2


class IWAEEncoder(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.tanh(nn.Dense(6)(x))
        return nn.Dense(IWAE_Z)(h), nn.Dense(IWAE_Z)(h)


class IWAEDecoder(nn.Module):
    @nn.compact
    def __call__(self, z):
        h = nn.tanh(nn.Dense(7)(z))
        return nn.Dense(IWAE_X)(h)


class IWAE(nn.Module):
    n_samples: int = IWAE_SAMPLES

    def setup(self):
        self.encoder = IWAEEncoder()
        self.decoder = IWAEDecoder()

    def __call__(self, x, key):
        mu, log_sigma = self.encoder(x)
        sigma = jnp.exp(log_sigma)
        eps = jax.random.normal(key, (self.n_samples, *mu.shape))
        z = mu + sigma * eps  # [S, B, Z]
        mean_x = jax.vmap(self.decoder)(z)  # [S, B, X]
        log_px_z = -0.5 * ((x - mean_x) ** 2).sum(-1)
        log_pz = -0.5 * (z**2).sum(-1)
        log_qz = (-0.5 * eps**2 - log_sigma).sum(-1)
        return log_px_z + log_pz - log_qz  # [S, B] log importance weights


def make_iwae(logsumexp: Callable[..., Any] = jax.nn.logsumexp, seed: int = 4):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(k1, (IWAE_BATCH, IWAE_X))
    params = IWAE().init(k2, x, k3)["params"]

    def iwae_loss(params, x, key):
        log_w = IWAE().apply({"params": params}, x, key)
        bound = logsumexp(log_w, axis=0) - jnp.log(float(IWAE_SAMPLES))
        return -bound.mean()

    return iwae_loss, (params, x, k3)


LOGSUMEXPS = {
    "jax.nn.logsumexp": jax.nn.logsumexp,
    "jax.scipy.special.logsumexp": jax.scipy.special.logsumexp,
}

__all__ = [
    "make_seed1",
    "make_mlp",
    "make_attention",
    "make_batch_stats",
    "make_flax_batchnorm",
    "make_iwae",
    "LOGSUMEXPS",
]
