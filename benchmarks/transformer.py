"""A pre-norm Flax linen transformer language-model loss with dropout, for microbatching its
token batch with ``argnums=1`` (``TransformerConfig.dropout=0``: the same model without random
draws), and its hand-written peers."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A pre-norm decoder-only transformer; ``dropout=0`` builds it without any random draws."""

    batch: int = 32
    seq: int = 64
    embed: int = 128
    heads: int = 4
    layers: int = 2
    vocab: int = 256
    dropout: float = 0.1
    #: Attention dropout drawn per example and head (``u32[batch, heads, seq, seq]``, as in
    #: the dropout transformer of docs/faq.md), not Flax's default mask broadcast over batch
    #: and heads.
    attention_dropout_per_example: bool = True
    seed: int = 0


def transformer_modules(cfg: TransformerConfig):
    """The linen ``Transformer`` class of ``cfg`` (defined lazily: importing needs no Flax)."""
    import flax.linen as nn

    det = cfg.dropout == 0.0

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            h = nn.MultiHeadDotProductAttention(
                num_heads=cfg.heads,
                dropout_rate=cfg.dropout,
                deterministic=det,
                broadcast_dropout=not cfg.attention_dropout_per_example,
            )(h, h, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
            x = x + nn.Dropout(cfg.dropout, deterministic=det)(h)
            h = nn.LayerNorm()(x)
            h = nn.gelu(nn.Dense(4 * cfg.embed)(h))
            h = nn.Dropout(cfg.dropout, deterministic=det)(h)
            h = nn.Dense(cfg.embed)(h)
            return x + nn.Dropout(cfg.dropout, deterministic=det)(h)

    class Transformer(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(cfg.vocab, cfg.embed)(tokens)
            x = x + self.param("pos", nn.initializers.normal(0.02), (cfg.seq, cfg.embed))
            for _ in range(cfg.layers):
                x = Block()(x)
            return nn.Dense(cfg.vocab)(nn.LayerNorm()(x))

    return Transformer


def _transformer_ce_sum(model, cfg: TransformerConfig, params, tokens, dropout_key):
    """Sum over sequences and positions of the next-token cross-entropy."""
    rngs = None if cfg.dropout == 0.0 else {"dropout": dropout_key}
    logits = model.apply({"params": params}, tokens[:, :-1], rngs=rngs)
    logp = jax.nn.log_softmax(logits)
    return -jnp.sum(logp * jax.nn.one_hot(tokens[:, 1:], cfg.vocab, dtype=logp.dtype))


def make_transformer_loss(cfg: TransformerConfig) -> Callable[..., Any]:
    """A fresh ``loss(params, tokens, dropout_key)`` function object (no tracing caches hit)."""
    model = transformer_modules(cfg)()

    def loss(params, tokens, dropout_key):
        """Mean next-token cross-entropy over the batch and the sequence."""
        ce = _transformer_ce_sum(model, cfg, params, tokens, dropout_key)
        return ce / (tokens.shape[0] * (tokens.shape[1] - 1))

    return loss


def transformer_problem(
    cfg: TransformerConfig | None = None,
) -> tuple[Callable[..., Any], tuple]:
    """Return ``(loss, (params, tokens, dropout_key))``; serialize with ``argnums=1``.

    ``tokens`` is ``int32[batch, seq + 1]`` (inputs and shifted targets).
    """
    cfg = cfg or TransformerConfig()
    data_key, init_key, dropout_key = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    tokens = jax.random.randint(data_key, (cfg.batch, cfg.seq + 1), 0, cfg.vocab)
    params = transformer_modules(cfg)().init(init_key, tokens[:, :-1])["params"]
    return make_transformer_loss(cfg), (params, tokens, dropout_key)


def transformer_peers(cfg: TransformerConfig | None, chunk: int) -> dict[str, Callable[..., Any]]:
    """Hand-written chunked versions of ``transformer_problem(cfg)``'s loss, same signature.

    A user writing these by hand derives one dropout key per chunk (per example for
    ``lax.map``) with ``fold_in``: the masks differ from the unchunked run's (same
    distribution), which does not matter for memory and time.
    """
    cfg = cfg or TransformerConfig()
    model = transformer_modules(cfg)()

    def ce_sum(params, tokens, key):
        return _transformer_ce_sum(model, cfg, params, tokens, key)

    def scan_checkpoint(params, tokens, dropout_key):
        b = tokens.shape[0]
        assert b % chunk == 0, "the hand-written peer needs chunk | batch"
        ts = tokens.reshape(b // chunk, chunk, *tokens.shape[1:])

        @jax.checkpoint
        def body(total, it):
            i, t = it
            return total + ce_sum(params, t, jax.random.fold_in(dropout_key, i)), None

        total, _ = lax.scan(body, jnp.zeros((), jnp.float32), (jnp.arange(b // chunk), ts))
        return total / (b * (tokens.shape[1] - 1))

    def lax_map(remat: bool):
        def f(params, tokens, dropout_key):
            def per_example(it):
                i, t = it
                return ce_sum(params, t[None], jax.random.fold_in(dropout_key, i))

            per_example = jax.checkpoint(per_example) if remat else per_example
            b = tokens.shape[0]
            ces = lax.map(per_example, (jnp.arange(b), tokens), batch_size=chunk)
            return jnp.sum(ces) / (b * (tokens.shape[1] - 1))

        return f

    return {
        "scan+checkpoint": scan_checkpoint,
        "lax.map": lax_map(False),
        "lax.map+checkpoint": lax_map(True),
    }
