"""Flax linen models and their losses, used as programs to serialize.

Each ``make_*`` function returns ``(loss, args)``: the loss is a plain function of arrays (the
oracle) and ``args`` are concrete, small inputs for it.

(a) ``seed1``: the Monte-Carlo encoder-decoder of seed 1 (``seeds/000_*.txt``), built exactly
    as the seed builds it: an ``Encoder`` of two convolutions, ``Decoder = Encoder``, and
    ``jax.vmap(decoder, in_axes=0)(z)`` over 16 latent samples inside ``@nn.compact``. Plain
    ``jax.vmap`` of a linen submodule inside ``@nn.compact`` works in flax 0.12.8 (checked:
    ``init`` creates unbatched parameters and ``apply`` returns ``(16, batch, H, W, 1)``), so the
    seed's line is kept verbatim. The loss averages the log-likelihood over the samples and
    the batch, as the seed's ``train_step`` does (the input mask included).
(b) ``mlp``: a linen MLP with a per-example squared error, batch = ``(x, y)``.
(c) ``attention``: a pre-norm transformer block (linen multi-head self-attention, softmax over
    the sequence) with a per-example loss.
(d) ``batch_stats``: batch normalisation by hand (mean / var over the batch axis, then
    normalise), and ``flax_batchnorm``: ``nn.BatchNorm`` in training mode that also returns
    its updated running statistics.
(e) ``iwae``: an importance-weighted bound, logsumexp over Monte-Carlo samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jax.scipy.special

# --------------------------------------------------------------------------------------
# (a) Seed 1: Monte-Carlo encoder-decoder (verbatim from the seed, tabs → spaces)
# --------------------------------------------------------------------------------------

n_in_channels = 1


class Encoder(nn.Module):
    sigma_floor: float

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=2 * n_in_channels, kernel_size=(2, 2))(x)
        x = nn.relu(x)
        x = nn.Conv(features=2 * n_in_channels, kernel_size=(2, 2))(x)

        def to_sigma(z):
            return self.sigma_floor + (1.0 - self.sigma_floor) * nn.softplus(z)

        mu = x[..., :n_in_channels]
        sigma = to_sigma(x[..., n_in_channels:])

        return mu, sigma


Decoder = Encoder


class Model(nn.Module):
    @nn.compact
    def __call__(self, masked_x, rng, n_samples):
        mu, sigma = Encoder(sigma_floor=1.0e-3)(masked_x)

        # monte-carlo sampling of latent representation
        z = jax.random.normal(key=rng, shape=(n_samples, *mu.shape))

        # re-parametrisation trick
        z *= jnp.expand_dims(sigma, 0)
        z += jnp.expand_dims(mu, 0)

        decoder = Decoder(sigma_floor=1.0e-3)

        # plain jax.vmap of a linen submodule: works in flax 0.12.8 (see module docstring)
        mu_x_hat, sigma_x_hat = jax.vmap(decoder, in_axes=0)(z)

        return mu_x_hat, sigma_x_hat


@jax.jit
def log_likelihood(x, mu, sigma):
    return -0.5 * ((x - mu) ** 2) / (sigma**2) - jnp.log(sigma)


SEED1_SAMPLES = 16
SEED1_BATCH = 4
SEED1_HW = 8  # spatial size (the seed uses 16; 8 keeps the tests fast and not equal to 16)


def seed1_loss(params, x, rng, n_samples=SEED1_SAMPLES):
    """The seed's ``train_step`` loss, with the mask drawn inside (as in ``train_step``)."""
    rng, key = jax.random.split(rng, 2)
    mask = jax.random.bernoulli(key, p=0.5, shape=(*x.shape[:-1], 1))

    masked_x = mask * x
    mu_x_hat, sigma_x_hat = Model().apply({"params": params}, masked_x, rng, n_samples)

    ll = jax.vmap(log_likelihood, in_axes=(0, 0, 0))  # vmap across batch elements
    ll = jax.vmap(ll, in_axes=(None, 0, 0))(x, mu_x_hat, sigma_x_hat)  # across samples

    ll = ll.sum((2, 3, 4))  # sum over spatial dims and channel
    ll = ll.mean()  # mean over samples and batch

    return -ll


def make_seed1(seed: int = 42, batch: int = SEED1_BATCH, hw: int = SEED1_HW):
    rng = jax.random.PRNGKey(seed)
    rng, data_key, init_key = jax.random.split(rng, 3)
    x = jax.random.normal(key=data_key, shape=(batch, hw, hw, n_in_channels))
    params = Model().init(init_key, jnp.zeros_like(x), rng, SEED1_SAMPLES)["params"]
    _, key = jax.random.split(rng)
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
