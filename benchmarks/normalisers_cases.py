"""The programs and cases of ``normalisers.py``: attention, cross-entropy, pooling and CLIP losses
with their hand-written chunked peers, at full and quick sizes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; ``FULL`` and ``QUICK`` below."""

    queries: int = 1024
    keys: int = 2048
    head_dim: int = 64
    attn_chunk: int = 256
    tokens: int = 512
    d_model: int = 256
    vocab: int = 16384
    vocab_chunk: int = 2048
    token_chunk: int = 64
    set_size: int = 4096
    set_in: int = 128
    set_hidden: int = 256
    set_chunk: int = 256
    batch: int = 2048
    clip_in: int = 128
    clip_hidden: int = 256
    clip_embed: int = 128
    clip_chunk: int = 256
    tau: float = 0.07
    budget_s: float = 30.0  # timing per program family
    max_rounds: int = 40


FULL = Sizes()
QUICK = Sizes(
    queries=256,
    keys=1024,
    attn_chunk=128,
    tokens=256,
    d_model=64,
    vocab=4096,
    vocab_chunk=512,
    token_chunk=32,
    set_size=1024,
    set_hidden=128,
    set_chunk=128,
    batch=512,
    clip_hidden=128,
    clip_embed=64,
    clip_chunk=64,
    budget_s=2.0,
    max_rounds=4,
)


def attention_loss(q, k, v):
    """Plain-jnp single-head attention; ``k``, ``v``: [keys, d]."""
    return jnp.sum(jax.nn.softmax(q @ k.T / math.sqrt(q.shape[-1]), axis=-1) @ v)


def dpa_loss(q, k, v):
    """The same loss with ``jax.nn.dot_product_attention`` ([batch, seq, heads, dim] layout)."""
    out = jax.nn.dot_product_attention(
        q[None, :, None], k[None, :, None], v[None, :, None], implementation="xla"
    )
    return jnp.sum(out)


def rabe_staats_loss(q, k, v, *, chunk):
    """Attention in key chunks (Rabe & Staats 2021): running max, sum and numerator."""
    (n_keys, d), n_q = k.shape, q.shape[0]
    assert n_keys % chunk == 0, (n_keys, chunk)
    kc = k.reshape(n_keys // chunk, chunk, d)
    vc = v.reshape(n_keys // chunk, chunk, d)
    qs = q / math.sqrt(d)

    @jax.checkpoint
    def step(carry, kv):
        m, s, num = carry
        kb, vb = kv
        logits = qs @ kb.T  # [queries, chunk]
        m_new = jnp.maximum(m, lax.stop_gradient(logits.max(-1)))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(logits - m_new[:, None])
        return (m_new, s * corr + p.sum(-1), num * corr[:, None] + p @ vb), None

    init = (jnp.full((n_q,), -jnp.inf, q.dtype), jnp.zeros((n_q,), q.dtype), jnp.zeros_like(q))
    (_, s, num), _ = lax.scan(step, init, (kc, vc))
    return jnp.sum(num / s[:, None])


def ce_loss(W, h, y):
    """An LM head's mean cross-entropy; ``W``: [d, vocab], ``h``: [tokens, d]."""
    return optax.softmax_cross_entropy_with_integer_labels(h @ W, y).mean()


def chunked_ce_loss(W, h, y, *, chunk):
    """The same loss over vocabulary chunks: online logsumexp, the label's logit per chunk."""
    d, vocab = W.shape
    assert vocab % chunk == 0, (vocab, chunk)

    @jax.checkpoint
    def step(carry, start):
        m, s, picked = carry
        logits = h @ lax.dynamic_slice_in_dim(W, start, chunk, axis=1)  # [tokens, chunk]
        m_new = jnp.maximum(m, lax.stop_gradient(logits.max(-1)))
        s = s * jnp.exp(m - m_new) + jnp.exp(logits - m_new[:, None]).sum(-1)
        idx = y - start
        inside = (idx >= 0) & (idx < chunk)
        hit = jnp.take_along_axis(logits, jnp.clip(idx, 0, chunk - 1)[:, None], axis=-1)[:, 0]
        return (m_new, s, picked + jnp.where(inside, hit, 0.0)), None

    t = h.shape[0]
    init = (jnp.full((t,), -jnp.inf, h.dtype), jnp.zeros((t,), h.dtype), jnp.zeros((t,), h.dtype))
    (m, s, picked), _ = lax.scan(step, init, jnp.arange(vocab // chunk) * chunk)
    return jnp.mean(m + jnp.log(s) - picked)


def pooling_loss(W1, w2, x):
    """Softmax-weighted pooling over the set ``x`` [set, d_in]."""
    h = jnp.tanh(x @ W1)  # [set, hidden]
    p = jax.nn.softmax(h @ w2)  # [set]
    return jnp.sum((p @ h) ** 2)


def _encode(p, x):
    z = jnp.tanh(x @ p["w1"]) @ p["w2"]
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def make_clip_loss(tau: float) -> Callable:
    def clip_loss(pa, pb, xa, xb):
        """CLIP-style loss: cross-entropy over the rows and over the columns of the logits."""
        logits = _encode(pa, xa) @ _encode(pb, xb).T / tau  # [batch a, batch b]
        labels = jnp.arange(xa.shape[0])
        ce = optax.softmax_cross_entropy_with_integer_labels
        return (ce(logits, labels).mean() + ce(logits.T, labels).mean()) / 2

    return clip_loss


def _normal(key, shape, scale=1.0):
    return scale * jax.random.normal(key, shape, jnp.float32)


def attention_args(s: Sizes, keys: int | None = None) -> tuple:
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    n = keys or s.keys
    d = s.head_dim
    return _normal(kq, (s.queries, d)), _normal(kk, (n, d)), _normal(kv, (n, d))


def ce_args(s: Sizes, vocab: int | None = None) -> tuple:
    kw, kh, ky = jax.random.split(jax.random.key(1), 3)
    v = vocab or s.vocab
    W = _normal(kw, (s.d_model, v), 1 / math.sqrt(s.d_model))
    h = _normal(kh, (s.tokens, s.d_model))
    return W, h, jax.random.randint(ky, (s.tokens,), 0, v)


def pooling_args(s: Sizes) -> tuple:
    k1, k2, kx = jax.random.split(jax.random.key(2), 3)
    W1 = _normal(k1, (s.set_in, s.set_hidden), 1 / math.sqrt(s.set_in))
    w2 = _normal(k2, (s.set_hidden,), 1 / math.sqrt(s.set_hidden))
    return W1, w2, _normal(kx, (s.set_size, s.set_in))


def clip_args(s: Sizes) -> tuple:
    ks = jax.random.split(jax.random.key(3), 6)

    def enc(k1, k2):
        return {
            "w1": _normal(k1, (s.clip_in, s.clip_hidden), 1 / math.sqrt(s.clip_in)),
            "w2": _normal(k2, (s.clip_hidden, s.clip_embed), 1 / math.sqrt(s.clip_hidden)),
        }

    xa = _normal(ks[4], (s.batch, s.clip_in))
    xb = _normal(ks[5], (s.batch, s.clip_in))
    return enc(ks[0], ks[1]), enc(ks[2], ks[3]), xa, xb


@dataclasses.dataclass
class Serialized:
    """One ``serialize_axis`` setting of a case's loss, measured with auto and remat."""

    name: str  # a short label, e.g. "over keys"
    chunk: int
    settings: dict[str, Any]
    target: float | None  # graded memory ratio (auto), None: shown for comparison only


@dataclasses.dataclass
class Case:
    key: str
    short: str  # for the acceptance table
    title: str
    loss: Callable
    args: tuple
    diff: tuple[int, ...]  # argnums of value_and_grad
    serialized: list[Serialized]
    peers: dict[str, Callable]  # name -> loss with the same signature
    # "memory as the axis grows": axis length -> (args, peer losses) at the first chunk
    growth: dict[int, tuple[tuple, dict[str, Callable]]] | None = None


def _bind(f: Callable, chunk: int) -> Callable:
    def bound(*args):
        return f(*args, chunk=chunk)

    bound.__name__ = f.__name__
    return bound


def make_cases(s: Sizes) -> list[Case]:
    rabe_staats = {"Rabe-Staats scan+checkpoint": _bind(rabe_staats_loss, s.attn_chunk)}
    chunked_ce = {"hand-written chunked CE": _bind(chunked_ce_loss, s.vocab_chunk)}
    return [
        Case(
            "attention",
            "(a) attention",
            f"(a) Attention: {s.queries} queries over {s.keys} keys, d {s.head_dim}, chunk "
            f"{s.attn_chunk} keys, `argnums=(1, 2), axis=0`",
            attention_loss,
            attention_args(s),
            (0, 1, 2),
            [Serialized("over keys", s.attn_chunk, {"argnums": (1, 2), "axis": 0}, 0.30)],
            {"jax.nn.dot_product_attention (xla)": dpa_loss, **rabe_staats},
            {n: (attention_args(s, n), rabe_staats) for n in (s.keys // 2, s.keys, 2 * s.keys)},
        ),
        Case(
            "ce",
            "(b) cross-entropy",
            f"(b) Cross-entropy: {s.tokens} tokens, d {s.d_model}, vocabulary {s.vocab}; over "
            f"the vocabulary (chunk {s.vocab_chunk}, `argnums=0, axis=1`) and over the tokens "
            f"(chunk {s.token_chunk}, `argnums=(1, 2), axis=0`)",
            ce_loss,
            ce_args(s),
            (0, 1),
            [
                Serialized("over vocab", s.vocab_chunk, {"argnums": 0, "axis": 1}, 0.30),
                Serialized("over tokens", s.token_chunk, {"argnums": (1, 2), "axis": 0}, None),
            ],
            chunked_ce,
            {n: (ce_args(s, n), chunked_ce) for n in (s.vocab // 2, s.vocab, 2 * s.vocab)},
        ),
        Case(
            "pooling",
            "(c) pooling",
            f"(c) Softmax-weighted pooling over a set of {s.set_size} (d_in {s.set_in}, hidden "
            f"{s.set_hidden}), chunk {s.set_chunk}, `argnums=2, axis=0`",
            pooling_loss,
            pooling_args(s),
            (0, 1, 2),
            [Serialized("over the set", s.set_chunk, {"argnums": 2, "axis": 0}, 0.30)],
            {},
        ),
        Case(
            "clip",
            "(d) contrastive",
            f"(d) Contrastive (CLIP-style) loss over a batch of {s.batch} (encoders {s.clip_in}"
            f" -> {s.clip_hidden} -> {s.clip_embed}), rows of `xa` in chunks of {s.clip_chunk},"
            " `argnums=2, axis=0`",
            make_clip_loss(s.tau),
            clip_args(s),
            (0, 1, 2),
            [Serialized("over batch a", s.clip_chunk, {"argnums": 2, "axis": 0}, 0.40)],
            {},
        ),
    ]
