"""DPO on a small decoder-only language model, chunked over the pairs.

Direct preference optimisation compares, for each pair, the policy's log-likelihood of the
chosen and the rejected answer with a frozen reference model's. As MaxText and TRL write it,
the loss runs the policy and the reference *once* on the concatenated batch
(``concatenate([chosen, rejected])``: ``2B`` sequences), gathers the per-token
log-probabilities of the targets, masks the padding, sums per sequence, and splits the
sums into halves again: row ``i`` is pair ``i``'s chosen answer, row ``B + i`` its rejected
one. The logits (``2B x T x vocabulary``) and the model's activations are the largest
buffers of the train step.

``serialize_axis(argnums=...)`` names the pairs: the concatenation then holds the pair axis
twice, one copy after the other, so each chunk takes its pairs' rows from both halves, runs
both models on them and keeps the pairs together. ``size=2B`` (the concatenated rows) finds
the same plan. The script prints the plan, XLA's temp memory of ``jax.value_and_grad``
against the original's for several batches of pairs (checking it is at most ``MAX_RATIO`` of
it at the largest), and checks the loss and gradients against the undecorated loss.

Run: ``python examples/dpo.py`` (``--quick``: smaller sizes).
"""

import sys

import jax
import jax.numpy as jnp
import optax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_matches_original

QUICK = "--quick" in sys.argv[1:]
VOCAB, SEQ, WIDTH, HEADS, LAYERS = (128, 16, 32, 2, 1) if QUICK else (1024, 64, 128, 4, 2)
PAIRS, CHUNK = ((4, 8), 2) if QUICK else ((16, 32, 64), 4)
MAX_RATIO = 0.5 if QUICK else 0.25  # serialized / original temp memory at the largest batch
BETA = 0.1


def init(key):
    """A decoder-only transformer's parameters (pre-norm, learned positions)."""
    keys = iter(jax.random.split(key, 4 + 4 * LAYERS))

    def dense(n_in, n_out):
        return jax.random.normal(next(keys), (n_in, n_out)) / n_in**0.5

    layers = [
        {
            "qkv": dense(WIDTH, 3 * WIDTH),
            "proj": dense(WIDTH, WIDTH),
            "up": dense(WIDTH, 4 * WIDTH),
            "down": dense(4 * WIDTH, WIDTH),
        }
        for _ in range(LAYERS)
    ]
    return {
        "embed": jax.random.normal(next(keys), (VOCAB, WIDTH)) * 0.02,
        "position": jax.random.normal(next(keys), (SEQ, WIDTH)) * 0.02,
        "layers": layers,
        "unembed": dense(WIDTH, VOCAB),
    }


def layer_norm(h):
    mean = h.mean(-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def attention(layer, h):
    n, t, _ = h.shape
    q, k, v = jnp.split(h @ layer["qkv"], 3, axis=-1)
    heads = lambda a: a.reshape(n, t, HEADS, WIDTH // HEADS)  # noqa: E731
    scores = jnp.einsum("nqhd,nkhd->nhqk", heads(q), heads(k)) / (WIDTH // HEADS) ** 0.5
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    out = jnp.einsum("nhqk,nkhd->nqhd", weights, heads(v)).reshape(n, t, WIDTH)
    return out @ layer["proj"]


def logits(params, tokens):
    """``[n, T]`` tokens -> ``[n, T, VOCAB]`` next-token logits."""
    h = params["embed"][tokens] + params["position"]
    for layer in params["layers"]:
        h = h + attention(layer, layer_norm(h))
        h = h + jax.nn.gelu(layer_norm(h) @ layer["up"]) @ layer["down"]
    return layer_norm(h) @ params["unembed"]


def sequence_log_probs(params, tokens, targets, mask):
    """The log-likelihood of each sequence's targets, padding masked out."""
    per_token = -optax.softmax_cross_entropy_with_integer_labels(logits(params, tokens), targets)
    return (per_token * mask).sum(-1)


def dpo_loss(params, reference, chosen, rejected, chosen_mask, rejected_mask):
    """MaxText's DPO: one forward pass of each model over the concatenated pairs."""
    tokens = jnp.concatenate([chosen, rejected])  # [2B, T + 1]: pair i is rows i and B + i
    mask = jnp.concatenate([chosen_mask, rejected_mask])
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    policy = sequence_log_probs(params, inputs, targets, mask)
    frozen = jax.lax.stop_gradient(sequence_log_probs(reference, inputs, targets, mask))
    policy_chosen, policy_rejected = jnp.split(policy, 2)
    reference_chosen, reference_rejected = jnp.split(frozen, 2)
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    return -jnp.mean(jax.nn.log_sigmoid(BETA * margin))


def batch(key, pairs):
    """Token pairs with answers padded at random lengths (masks by pair)."""
    k_chosen, k_rejected, k_len = jax.random.split(key, 3)
    tokens = lambda k: jax.random.randint(k, (pairs, SEQ + 1), 0, VOCAB)  # noqa: E731
    lengths = jax.random.randint(k_len, (2, pairs, 1), SEQ // 2, SEQ + 1)
    masks = (jnp.arange(SEQ) < lengths).astype(jnp.float32)
    return tokens(k_chosen), tokens(k_rejected), masks[0], masks[1]


def temp_bytes(f, *args):
    """XLA's temp memory for ``jax.value_and_grad(f)`` (with respect to the policy), jitted."""
    compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main():
    params, reference = init(jax.random.key(0)), init(jax.random.key(1))
    sf = ja.serialize_axis(dpo_loss, chunk=CHUNK, argnums=(2, 3, 4, 5))
    print(f"DPO, {LAYERS}-layer decoder (width {WIDTH}, vocabulary {VOCAB}, {SEQ} tokens)")
    print("XLA temp memory of value_and_grad, original and serialized, by batch of pairs:")
    print(f"{'pairs':>6} {'original':>12} {'serialized':>12} {'ratio':>6}")
    ratio = 1.0
    for pairs in PAIRS:
        args = (params, reference, *batch(jax.random.key(pairs), pairs))
        m_orig, m = temp_bytes(dpo_loss, *args), temp_bytes(sf, *args)
        ratio = m / m_orig
        print(f"{pairs:>6} {m_orig / 2**20:>9.2f} MiB {m / 2**20:>9.2f} MiB {ratio:>6.3f}")
    assert ratio <= MAX_RATIO, f"memory ratio {ratio:.3f} above {MAX_RATIO}"
    plan = sf.explain(*args)
    print(plan)
    assert not plan.stops, "expected the whole loss chunked over the pairs"
    assert_matches_original(sf, *args, vmap=False)
    by_rows = ja.serialize_axis(dpo_loss, chunk=2 * CHUNK, size=2 * PAIRS[-1])
    assert not by_rows.explain(*args).stops, "size=2B: expected the same plan"
    assert_matches_original(by_rows, *args, vmap=False)
    print(f"loss {float(jax.jit(sf)(*args)):.6f}; value and gradients match the original")


if __name__ == "__main__":
    main()
