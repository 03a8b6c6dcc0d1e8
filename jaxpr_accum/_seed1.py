"""The seed-1 model: a Monte-Carlo encoder-decoder whose decoder is ``vmap``ped over samples
(``docs/faq.md``, question 1), sized by ``Seed1Config``; the demo's problem, and the benchmarks'.

An encoder produces ``mu, sigma`` of a latent image, 16 Monte-Carlo samples
``z = mu + sigma * normal(key, (16, ...))`` are drawn inside the module, and the decoder is
``jax.vmap``-ed over them inside ``@nn.compact``, exactly as the user wrote it. The loss is the
negative Gaussian log-likelihood of the unmasked image, averaged over samples and batch.
Sizes are chosen so that the decoder's activations over the 16 samples dominate the backward
pass's memory, which is the situation ``serialize_axis`` is for. Flax is needed (``pip install
-e '.[flax]'``), imported when a model is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Seed1Config:
    """Sizes of the seed-1 problem. The defaults run the demo in well under a minute on CPU."""

    batch: int = 4
    height: int = 32
    width: int = 32
    channels: int = 1
    latent: int = 4
    n_samples: int = 16
    encoder_width: int = 8
    decoder_widths: tuple[int, ...] = (32, 32, 32)
    sigma_floor: float = 1e-3
    seed: int = 42


QUICK_SEED1 = Seed1Config(height=16, width=16, decoder_widths=(16, 16))


def _flax_linen():
    try:
        import flax.linen as nn
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "the demo needs Flax: pip install -e '.[flax]' (or pip install flax optax)"
        ) from e
    return nn


def _build_modules(cfg: Seed1Config):
    """Define the linen modules of the seed (lazily, so that importing this file needs no Flax)."""
    nn = _flax_linen()

    def to_sigma(h):
        return cfg.sigma_floor + (1.0 - cfg.sigma_floor) * nn.softplus(h)

    class Encoder(nn.Module):  # type: ignore[name-defined]
        """Small on purpose: the encoder runs once, outside the sample axis."""

        @nn.compact
        def __call__(self, x):
            h = nn.Conv(features=cfg.encoder_width, kernel_size=(3, 3))(x)
            h = nn.relu(h)
            h = nn.Conv(features=2 * cfg.latent, kernel_size=(3, 3))(h)
            return h[..., : cfg.latent], to_sigma(h[..., cfg.latent :])

    class Decoder(nn.Module):  # type: ignore[name-defined]
        """The heavy part: its activations exist once per Monte-Carlo sample."""

        @nn.compact
        def __call__(self, z):
            h = z
            for w in cfg.decoder_widths:
                h = nn.relu(nn.Conv(features=w, kernel_size=(3, 3))(h))
            h = nn.Conv(features=2 * cfg.channels, kernel_size=(3, 3))(h)
            return h[..., : cfg.channels], to_sigma(h[..., cfg.channels :])

    class Model(nn.Module):  # type: ignore[name-defined]
        @nn.compact
        def __call__(self, masked_x, rng, n_samples: int):
            mu, sigma = Encoder()(masked_x)
            # Monte-Carlo samples of the latent, stacked on a new leading axis.
            z = jax.random.normal(key=rng, shape=(n_samples, *mu.shape))
            # Re-parametrisation trick.
            z = z * jnp.expand_dims(sigma, 0) + jnp.expand_dims(mu, 0)
            decoder = Decoder()
            # The line the user asked about: every sample's decoder activations at once.
            mu_x_hat, sigma_x_hat = jax.vmap(decoder, in_axes=0)(z)
            return mu_x_hat, sigma_x_hat

    return Model, Encoder, Decoder


def seed1_modules(cfg: Seed1Config | None = None):
    """``(Model, Encoder, Decoder)`` linen classes of the seed-1 problem (for hand-written peers).

    ``Model().init(...)["params"]`` holds the two submodules under ``"Encoder_0"`` and
    ``"Decoder_0"``.
    """
    return _build_modules(cfg or Seed1Config())


def log_likelihood(x, mu, sigma):
    """Per-pixel Gaussian log-likelihood, as in the seed."""
    return -0.5 * ((x - mu) ** 2) / (sigma**2) - jnp.log(sigma)


def seed1_problem(cfg: Seed1Config | None = None) -> tuple[Callable[..., Any], tuple]:
    """Return ``(loss, args)``: ``loss(params, x, mask, rng) -> scalar`` and concrete args.

    Differentiate with respect to argument 0 (the Flax params), as the seed's train step does.
    """
    cfg = cfg or Seed1Config()
    Model, _, _ = _build_modules(cfg)
    model = Model()
    root = jax.random.PRNGKey(cfg.seed)
    data_key, mask_key, init_key, rng = jax.random.split(root, 4)
    x = jax.random.normal(data_key, (cfg.batch, cfg.height, cfg.width, cfg.channels), jnp.float32)
    mask = jax.random.bernoulli(mask_key, p=0.5, shape=(*x.shape[:-1], 1)).astype(x.dtype)
    params = model.init(init_key, mask * x, rng, cfg.n_samples)["params"]

    def loss(params, x, mask, rng):
        masked_x = mask * x
        mu_x_hat, sigma_x_hat = model.apply({"params": params}, masked_x, rng, cfg.n_samples)
        ll = jax.vmap(log_likelihood, in_axes=(0, 0, 0))  # over batch elements
        ll = jax.vmap(ll, in_axes=(None, 0, 0))(x, mu_x_hat, sigma_x_hat)  # over samples
        ll = ll.sum((2, 3, 4))  # spatial dims and channel
        return -ll.mean()  # samples and batch

    return loss, (params, x, mask, rng)
