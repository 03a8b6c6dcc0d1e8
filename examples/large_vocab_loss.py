"""A language model's cross-entropy over a large vocabulary, in chunks.

The last layer of a language model, ``logits = h @ W`` with ``W``: [d, vocab], followed by
``optax.softmax_cross_entropy_with_integer_labels``, holds ``[tokens, vocab]`` logits (and
their softmax, and their cotangent) for the backward pass: with a large vocabulary, the
largest buffers of the whole train step. Two ways to chunk it, both from the same loss:

1. over the **vocabulary** (``argnums=0, axis=1``: the columns of ``W``). The cross-entropy
   normalises over that axis (its logsumexp) and looks up the label's logit along it (a
   gather). ``serialize_axis`` streams both: an online logsumexp (each chunk's sum of
   ``exp`` against the running max, rescaled as chunks combine) and the label look-up per
   chunk (only labels that fall inside the chunk). One ``[tokens, chunk]`` slice of the
   logits exists at a time; ``W``'s gradient comes out chunk by chunk.
2. over the **tokens** (``argnums=(1, 2), axis=0``: ``h`` and the labels ``y``), the
   ordinary microbatching: the loss is a mean over tokens, each chunk holds ``[chunk,
   vocab]`` logits, and the gradient of ``W`` is accumulated.

The script prints each plan, XLA's temp memory of ``jax.value_and_grad`` (with respect to
``W`` and ``h``) against the original's, and checks value and gradients against the
undecorated loss with ``jaxpr_accum.testing.assert_matches_original``. Where the library
cannot stream the normaliser, the plan stops at it and says so; the results are the
original's either way.

Run: ``python examples/large_vocab_loss.py`` (``--quick``: smaller sizes).
"""

import math
import sys

import jax
import optax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_matches_original

QUICK = "--quick" in sys.argv[1:]
TOKENS, D_MODEL, VOCAB = (256, 64, 4096) if QUICK else (512, 256, 16384)
VOCAB_CHUNK, TOKEN_CHUNK = (512, 32) if QUICK else (2048, 64)


def lm_head_loss(W, h, y):
    """Mean cross-entropy of the logits ``h @ W`` against the integer labels ``y``."""
    return optax.softmax_cross_entropy_with_integer_labels(h @ W, y).mean()


def temp_bytes(f, *args):
    """XLA's temp memory for `jax.value_and_grad(f)` with respect to W and h, jitted."""
    compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main():
    kw, kh, ky = jax.random.split(jax.random.key(0), 3)
    W = jax.random.normal(kw, (D_MODEL, VOCAB)) / math.sqrt(D_MODEL)
    h = jax.random.normal(kh, (TOKENS, D_MODEL))  # the model's last hidden states
    y = jax.random.randint(ky, (TOKENS,), 0, VOCAB)
    print(f"{TOKENS} tokens, d {D_MODEL}, vocabulary {VOCAB}")

    m_orig = temp_bytes(lm_head_loss, W, h, y)
    print(f"XLA temp memory of value_and_grad, original: {m_orig / 2**20:.2f} MiB")
    for what, sf in (
        (
            f"over the vocabulary, chunks of {VOCAB_CHUNK}",
            ja.serialize_axis(lm_head_loss, chunk=VOCAB_CHUNK, argnums=0, axis=1),
        ),
        (
            f"over the tokens, chunks of {TOKEN_CHUNK}",
            ja.serialize_axis(lm_head_loss, chunk=TOKEN_CHUNK, argnums=(1, 2), axis=0),
        ),
    ):
        print(f"\n== {what}")
        print(sf.explain(W, h, y))
        m = temp_bytes(sf, W, h, y)
        print(
            f"XLA temp memory of value_and_grad: original {m_orig / 2**20:.2f} MiB, serialized "
            f"{m / 2**20:.2f} MiB ({m / m_orig:.2f}x)"
        )
        assert_matches_original(sf, W, h, y)
        value, _ = jax.jit(jax.value_and_grad(sf, argnums=(0, 1)))(W, h, y)
        print(f"loss {float(value):.6f}; value and gradients (W, h) match the original")


if __name__ == "__main__":
    main()
