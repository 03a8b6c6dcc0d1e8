"""Contrastive losses over a large batch, in two passes: SimCLR and CLIP.

SimCLR's NT-Xent compares each of ``2n`` augmented views with every other one
(``z @ z.T``: ``[2n, 2n]`` similarities, their log-softmax over each row, their cotangent);
CLIP compares each image with every text of the batch and normalises both ways (over the
texts for each image, over the images for each text). With a small encoder, those ``N x N``
matrices are the largest buffers of the train step, and they grow quadratically with the
batch.

The value ``z @ z.T`` pairs the batch with itself, so ``serialize_axis`` runs the loss in two
passes, derived from the plain code below:

1. the encoder, chunked; its embeddings (``N x d``) are stacked;
2. the pairs, by blocks of rows: each block's ``[chunk, N]`` similarities against the whole
   stacked embeddings. SimCLR's log-softmax is over each row, inside the block; CLIP's
   cross-entropy over the columns (over the chunked images) is streamed: an online
   logsumexp per column.

The backward pass is GradCache's, derived: the embeddings' gradient from the pairs (rows per
block, columns accumulated), then the encoder's backward chunk by chunk. The augmentations
are drawn inside the loss, in pass 1, with the original's random bits.

The script prints both plans, XLA's temp memory of ``jax.value_and_grad`` against the
original's (and checks that it is at most ``MAX_RATIO`` of it), and checks value and
gradients against the undecorated loss with ``jaxpr_accum.testing.assert_matches_original``.

Run: ``python examples/contrastive.py`` (``--quick``: smaller sizes).
"""

import sys

import jax
import jax.numpy as jnp
import optax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_matches_original

QUICK = "--quick" in sys.argv[1:]
BATCH, CHUNK = (256, 64) if QUICK else (2048, 256)
MAX_RATIO = 0.5 if QUICK else 0.25  # serialized / original temp memory, checked below
FEATURES, HIDDEN, EMBED = 32, 64, 32


def encode(w, x):
    return jnp.tanh(x @ w[0]) @ w[1]


def normalise(z):
    return z / jnp.linalg.norm(z, axis=1, keepdims=True)


def simclr_loss(w, images, key, temperature):
    """NT-Xent over two augmented views of each image; view i's positive is i + n."""
    k1, k2 = jax.random.split(key)
    view_a = images + 0.1 * jax.random.normal(k1, images.shape)  # augmentations
    view_b = images * jax.random.uniform(k2, images.shape, minval=0.8, maxval=1.2)
    z = normalise(jnp.concatenate([encode(w, view_a), encode(w, view_b)]))
    sim = z @ z.T / temperature
    n = sim.shape[0]
    sim = jnp.where(jnp.eye(n, dtype=bool), -jnp.inf, sim)  # not oneself
    positive = (jnp.arange(n) + n // 2) % n
    logp = jax.nn.log_softmax(sim, axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, positive[:, None], axis=1))


def clip_loss(w, images, texts, log_scale):
    """Symmetric InfoNCE: cross-entropy over the texts and over the images, averaged."""
    za, zb = normalise(encode(w[0], images)), normalise(encode(w[1], texts))
    logits = za @ zb.T * jnp.exp(log_scale)
    labels = jnp.arange(logits.shape[0])
    per_image = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    per_text = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()
    return (per_image + per_text) / 2


def temp_bytes(f, *args, argnums):
    """XLA's temp memory for `jax.value_and_grad(f)`, jitted."""
    compiled = jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def mlp(key, features):
    k1, k2 = jax.random.split(key)
    return (
        jax.random.normal(k1, (features, HIDDEN)) / features**0.5,
        jax.random.normal(k2, (HIDDEN, EMBED)) / HIDDEN**0.5,
    )


def main():
    keys = jax.random.split(jax.random.key(0), 6)
    images = jax.random.normal(keys[0], (BATCH // 2, FEATURES))  # 2 views each: BATCH rows
    texts = jax.random.normal(keys[1], (BATCH, 16))
    cases = [
        (
            f"SimCLR, {BATCH} views in chunks of {CHUNK}",
            simclr_loss,
            (mlp(keys[2], FEATURES), images, keys[3], jnp.float32(0.5)),
            1,
            (0, 1, 3),
        ),
        (
            f"CLIP, a batch of {BATCH} pairs in chunks of {CHUNK}",
            clip_loss,
            (
                (mlp(keys[4], FEATURES), mlp(keys[5], 16)),
                jax.random.normal(keys[0], (BATCH, FEATURES)),
                texts,
                jnp.float32(2.0),
            ),
            (1, 2),
            (0, 1, 2, 3),
        ),
    ]
    for what, loss, args, batch, diff in cases:
        print(f"\n== {what}")
        sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=batch)
        print(sf.explain(*args))
        m_orig = temp_bytes(loss, *args, argnums=diff)
        m = temp_bytes(sf, *args, argnums=diff)
        print(
            f"XLA temp memory of value_and_grad: original {m_orig / 2**20:.2f} MiB, serialized "
            f"{m / 2**20:.2f} MiB ({m / m_orig:.2f}x)"
        )
        assert m < MAX_RATIO * m_orig, f"memory ratio {m / m_orig:.2f} above {MAX_RATIO}"
        assert sf.explain(*args).second is not None, "expected the two-pass plan"
        assert_matches_original(sf, *args, vmap=False)
        value = jax.jit(sf)(*args)
        print(f"loss {float(value):.6f}; value and gradients match the original")


if __name__ == "__main__":
    main()
