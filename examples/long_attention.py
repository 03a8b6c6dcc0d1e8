"""Attention over a long key sequence, the keys run in chunks.

Attention's memory is its score matrix: ``[queries, keys]`` per head, held for the backward
pass, several copies of it (scores, softmax, their cotangents). Chunking the keys needs the
softmax's normaliser over *all* the keys: its max and its sum. ``serialize_axis`` streams it:
each chunk's scores are exponentiated against the running max and rescaled as chunks combine
(the online softmax of Milakov & Gimelshein, the chunked attention of Rabe & Staats), so only
one chunk's scores exist at a time, in the forward and in the backward pass. The code stays
plain attention; nothing in it is written for chunking.

Two losses:

1. ``sum(softmax(q @ k.T / sqrt(d)) @ v)`` written with ``jax.numpy``, serialized over the
   keys: ``argnums=(1, 2), axis=0`` (the leading axis of ``k`` and ``v``);
2. a Flax linen cross-attention block (``LayerNorm``, ``nn.MultiHeadDotProductAttention``,
   residual, ``Dense``) whose queries attend to a long memory sequence: its ``apply`` is the
   loss, and ``in_axes=(None, None, 1)`` chunks the memory's sequence axis. In the module's
   jaxpr the keys and values are per-position projections of that input, the scores contract
   over the head dimension with the keys on their last axis, ``jax.nn.softmax`` normalises
   over that axis and the weighted sum contracts it with the values: the axis is born at the
   input and ends in that contraction.

For each, the script prints the plan, XLA's temp memory of ``jax.value_and_grad`` against the
original's (and, for the first, against ``jax.nn.dot_product_attention(implementation="xla")``)
and checks value and gradients (queries, keys, values, parameters) against the undecorated
original with ``jaxpr_accum.testing.assert_matches_original``. Where the library cannot stream
the normaliser, the plan stops at it and says so; the results are the original's either way.

Run: ``python examples/long_attention.py`` (``--quick``: smaller sizes).
"""

import math
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_matches_original

QUICK = "--quick" in sys.argv[1:]
QUERIES, KEYS, HEAD_DIM, CHUNK = (256, 1024, 32, 128) if QUICK else (1024, 4096, 64, 512)
BATCH, HEADS, FEATURES = (1, 2, 32) if QUICK else (2, 4, 64)


def temp_bytes(f, *args, argnums):
    """XLA's temp memory for `jax.value_and_grad(f, argnums)`, jitted."""
    compiled = jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def mib(n):
    return f"{n / 2**20:.2f} MiB"


# ---- 1. attention written with jax.numpy -------------------------------------------------------


def attention_loss(q, k, v):
    """``q``: [queries, d]; ``k``, ``v``: [keys, d]."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    return jnp.sum(jax.nn.softmax(scores, axis=-1) @ v)


def dpa_loss(q, k, v):
    """The same loss with ``jax.nn.dot_product_attention`` ([batch, seq, heads, dim])."""
    out = jax.nn.dot_product_attention(
        q[None, :, None], k[None, :, None], v[None, :, None], implementation="xla"
    )
    return jnp.sum(out)


def plain_attention():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (QUERIES, HEAD_DIM))
    k = jax.random.normal(kk, (KEYS, HEAD_DIM))
    v = jax.random.normal(kv, (KEYS, HEAD_DIM))

    sf = ja.serialize_axis(attention_loss, chunk=CHUNK, argnums=(1, 2), axis=0)
    print(sf.explain(q, k, v))
    m_orig = temp_bytes(attention_loss, q, k, v, argnums=(0, 1, 2))
    m_ser = temp_bytes(sf, q, k, v, argnums=(0, 1, 2))
    m_dpa = temp_bytes(dpa_loss, q, k, v, argnums=(0, 1, 2))
    print(
        f"XLA temp memory of value_and_grad: original {mib(m_orig)}, serialized {mib(m_ser)} "
        f"({m_ser / m_orig:.2f}x), jax.nn.dot_product_attention (xla) {mib(m_dpa)} "
        f"({m_dpa / m_orig:.2f}x)"
    )
    assert_matches_original(sf, q, k, v)
    print("value and gradients (q, k, v) match the original")


# ---- 2. a Flax linen cross-attention block ------------------------------------------------------


class CrossAttentionBlock(nn.Module):
    heads: int

    @nn.compact
    def __call__(self, x, memory):
        """``x``: [batch, queries, features] attends to ``memory``: [batch, keys, features]."""
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads)(
            nn.LayerNorm()(x), nn.LayerNorm()(memory)
        )
        x = x + h
        return x + nn.Dense(x.shape[-1])(nn.gelu(nn.LayerNorm()(x)))


def flax_block():
    block = CrossAttentionBlock(heads=HEADS)
    kx, km, kp = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (BATCH, QUERIES, FEATURES))
    memory = jax.random.normal(km, (BATCH, KEYS, FEATURES))
    params = block.init(kp, x, memory)

    def loss(params, x, memory):
        return jnp.mean(block.apply(params, x, memory) ** 2)

    sf = ja.serialize_axis(loss, chunk=CHUNK, in_axes=(None, None, 1))  # memory's keys
    print(sf.explain(params, x, memory))
    m_orig = temp_bytes(loss, params, x, memory, argnums=(0, 1, 2))
    m_ser = temp_bytes(sf, params, x, memory, argnums=(0, 1, 2))
    print(
        f"XLA temp memory of value_and_grad: original {mib(m_orig)}, serialized {mib(m_ser)} "
        f"({m_ser / m_orig:.2f}x)"
    )
    assert_matches_original(sf, params, x, memory)
    print("value and gradients (parameters, queries, memory) match the original")


def main():
    print(f"== attention in jax.numpy: {QUERIES} queries, {KEYS} keys in chunks of {CHUNK}")
    plain_attention()
    print(
        f"\n== Flax cross-attention block: batch {BATCH}, {QUERIES} queries, {KEYS} keys in "
        f"chunks of {CHUNK}, {HEADS} heads, {FEATURES} features"
    )
    flax_block()


if __name__ == "__main__":
    main()
