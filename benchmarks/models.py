"""Models for the benchmarks, and the hand-written peers ``serialize_axis`` is measured against.

- ``seed1_problem``: the Monte-Carlo encoder-decoder of ``examples/mc_vae.py`` (``problem``).
- ``mlp_problem``: an MLP regression loss over many rows, sized so that activations (rows x
  width per layer) dominate parameters, for microbatching with ``argnums``; ``MLPConfig.dtype``
  makes parameters and data 16-bit (``benchmarks/accuracy.py``).
- ``transformer_problem``: a pre-norm Flax linen transformer language-model loss with dropout,
  for microbatching its token batch with ``argnums=1`` (``TransformerConfig.dropout=0``: the
  same model without any random draws); written in ``transformer.py``, re-exported here.
- Peers (docs/benchmarks.md, "Targets"): for each problem, the hand-written
  ``lax.scan`` + ``jax.checkpoint`` gradient accumulation that users write today, and
  ``jax.lax.map(batch_size=k)`` with and without ``jax.checkpoint``. They compute the same loss
  (up to reassociation) with the same signature, so they can be measured with the same helpers
  (``harness.py``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the checkout's examples/ (installed: jaxpr_accum.examples)
    sys.path.insert(0, ROOT)

from transformer import (  # noqa: E402
    TransformerConfig,
    make_transformer_loss,
    transformer_modules,
    transformer_peers,
    transformer_problem,
)

from examples import mc_vae as _mc_vae  # noqa: E402

Seed1Config = _mc_vae.Sizes
QUICK_SEED1 = _mc_vae.SMALL
log_likelihood = _mc_vae.log_likelihood
seed1_problem = _mc_vae.problem

__all__ = [
    "MLPConfig",
    "QUICK_SEED1",
    "Seed1Config",
    "TransformerConfig",
    "mlp_peers",
    "mlp_problem",
    "seed1_peers",
    "seed1_problem",
    "transformer_peers",
    "transformer_problem",
    "make_transformer_loss",
    "transformer_modules",
]


# --------------------------------------------------------------------------------------------
# MLP over rows (microbatching)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    rows: int = 1024
    d_in: int = 256
    width: int = 512
    depth: int = 4
    d_out: int = 16
    seed: int = 0
    dtype: str = "float32"  # of parameters and data


def _mlp_apply(params, x):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.gelu(h @ w + b)
    w, b = params[-1]
    return h @ w + b


def _mlp_row_loss_sum(params, x, y):
    """Sum over rows of the squared error; the mean is taken by the caller."""
    return jnp.sum((_mlp_apply(params, x) - y) ** 2)


def mlp_problem(cfg: MLPConfig | None = None) -> tuple[Callable[..., Any], tuple]:
    """Return ``(loss, (params, x, y))``; ``loss`` is the mean squared error over all rows.

    Serialize with ``argnums=(1, 2)`` (the rows of ``x`` and ``y``).
    """
    cfg = cfg or MLPConfig()
    key = jax.random.PRNGKey(cfg.seed)
    kx, ky, *kl = jax.random.split(key, 2 + cfg.depth + 1)
    dims = [cfg.d_in] + [cfg.width] * cfg.depth + [cfg.d_out]
    dtype = jnp.dtype(cfg.dtype)
    params = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        w = jax.random.normal(kl[i], (a, b), jnp.float32) / jnp.sqrt(a)
        params.append((w.astype(dtype), jnp.zeros((b,), dtype)))
    x = jax.random.normal(kx, (cfg.rows, cfg.d_in), jnp.float32).astype(dtype)
    y = jax.random.normal(ky, (cfg.rows, cfg.d_out), jnp.float32).astype(dtype)

    def loss(params, x, y):
        return _mlp_row_loss_sum(params, x, y) / x.shape[0]

    return loss, (params, x, y)


def mlp_peers(chunk: int) -> dict[str, Callable[..., Any]]:
    """Hand-written chunked versions of ``mlp_problem``'s loss, same signature."""

    def scan_checkpoint(params, x, y):
        n = x.shape[0]
        assert n % chunk == 0, "the hand-written peer needs chunk | rows"
        xs = x.reshape(n // chunk, chunk, *x.shape[1:])
        ys = y.reshape(n // chunk, chunk, *y.shape[1:])

        @jax.checkpoint
        def body(total, xy):
            return total + _mlp_row_loss_sum(params, *xy), None

        total, _ = lax.scan(body, jnp.zeros((), x.dtype), (xs, ys))
        return total / n

    def lax_map(remat: bool):
        def f(params, x, y):
            def per_row(xy):
                return _mlp_row_loss_sum(params, xy[0][None], xy[1][None])

            per_row = jax.checkpoint(per_row) if remat else per_row
            return jnp.sum(lax.map(per_row, (x, y), batch_size=chunk)) / x.shape[0]

        return f

    return {
        "scan+checkpoint": scan_checkpoint,
        "lax.map": lax_map(False),
        "lax.map+checkpoint": lax_map(True),
    }


# --------------------------------------------------------------------------------------------
# Monte-Carlo encoder-decoder (Monte-Carlo samples)
# --------------------------------------------------------------------------------------------


def seed1_peers(cfg: Seed1Config | None, chunk: int) -> dict[str, Callable[..., Any]]:
    """Hand-written chunked versions of ``seed1_problem(cfg)``'s loss, same signature.

    They restructure the model the way a user would by hand: apply the encoder and the decoder
    separately, draw all Monte-Carlo noise up front, and loop over chunks of samples.
    """
    cfg = cfg or Seed1Config()
    encoder = _mc_vae.Encoder(cfg.encoder_width, cfg.latent)
    decoder = _mc_vae.Decoder(cfg.decoder_widths, cfg.channels)
    n = cfg.n_samples

    def encode(params, x, mask, rng):
        mu, sigma = encoder.apply({"params": params["Encoder_0"]}, mask * x)
        eps = jax.random.normal(key=rng, shape=(n, *mu.shape))
        return eps * sigma[None] + mu[None]

    def decode(params, z):
        return decoder.apply({"params": params["Decoder_0"]}, z)

    def ll_sum(x, mu_x_hat, sigma_x_hat):
        return jnp.sum(log_likelihood(x[None], mu_x_hat, sigma_x_hat))

    def scan_checkpoint(params, x, mask, rng):
        assert n % chunk == 0, "the hand-written peer needs chunk | n_samples"
        z = encode(params, x, mask, rng)
        zs = z.reshape(n // chunk, chunk, *z.shape[1:])

        @jax.checkpoint
        def body(total, zc):
            mu_x_hat, sigma_x_hat = jax.vmap(lambda zi: decode(params, zi))(zc)
            return total + ll_sum(x, mu_x_hat, sigma_x_hat), None

        total, _ = lax.scan(body, jnp.zeros((), x.dtype), zs)
        return -total / (n * x.shape[0])

    def lax_map(remat: bool):
        def f(params, x, mask, rng):
            z = encode(params, x, mask, rng)
            dec = (
                jax.checkpoint(lambda zi: decode(params, zi))
                if remat
                else (lambda zi: decode(params, zi))
            )
            mu_x_hat, sigma_x_hat = lax.map(dec, z, batch_size=chunk)
            return -ll_sum(x, mu_x_hat, sigma_x_hat) / (n * x.shape[0])

        return f

    return {
        "scan+checkpoint": scan_checkpoint,
        "lax.map": lax_map(False),
        "lax.map+checkpoint": lax_map(True),
    }


# --------------------------------------------------------------------------------------------
# Transformer language model with dropout (microbatching the token batch)
# --------------------------------------------------------------------------------------------
