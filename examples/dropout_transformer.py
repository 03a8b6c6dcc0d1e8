"""A data-parallel transformer train step with dropout, its batch run in chunks.

The second question of ``docs/faq.md``: a transformer with dropout, trained
data-parallel under ``jit`` with the batch sharded over devices. Every dropout draws random bits
for every dropped activation (``u32[batch, seq, embed]`` per layer in the MLP,
``u32[batch, heads, seq, seq]`` in attention), and those buffers dominate memory.

``ja.serialize_axis(loss, chunk=CHUNK, argnums=1)`` serializes the batch axis of argument 1
(the token batch): each step of the loop runs ``CHUNK`` sequences through the model, and the
dropout bits are generated *per chunk*, bit-identical to the unchunked program's (same key,
same masks), and recomputed rather than stored in the backward pass.

The batch is sharded over 8 simulated CPU devices (``NamedSharding(mesh, P("data"))``), the
parameters replicated. ``mesh_axis="data"`` tells the rewriter that the batch axis is sharded
over the mesh axis ``"data"`` (under ``jit`` on a mesh of ``Auto`` axes the traced values do
not carry that sharding themselves): each device then scans its own shard, ``CHUNK / 8`` rows
per chunk, and the gradients are summed across devices once, after the loop. Without it the
rewritten program would treat the batch as one unsharded array (see ``docs/limitations.md``).

The script compares one train step's loss and gradients with the undecorated loss (same
dropout key), prints XLA's temp memory for ``jax.value_and_grad`` of both, and runs a few
optax steps. Run: ``python examples/dropout_transformer.py`` (``--quick``: smaller sizes).
"""

import os
import sys

# 8 simulated devices on the host: must be set before jax is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpr_accum as ja  # noqa: E402
from jaxpr_accum.testing import tree_difference  # noqa: E402

QUICK = "--quick" in sys.argv[1:]
BATCH, SEQ, EMBED, HEADS, VOCAB = (32, 16, 32, 2, 64) if QUICK else (64, 64, 64, 4, 256)
LAYERS, DROPOUT, STEPS = 2, 0.1, 3
CHUNK = 8 if QUICK else 16  # rows of the global batch per chunk: CHUNK / 8 on each device


class Block(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=HEADS, dropout_rate=DROPOUT, deterministic=deterministic
        )(h, h, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
        x = x + nn.Dropout(DROPOUT, deterministic=deterministic)(h)
        h = nn.LayerNorm()(x)
        h = nn.Dense(4 * EMBED)(h)
        h = nn.gelu(h)
        h = nn.Dropout(DROPOUT, deterministic=deterministic)(h)
        h = nn.Dense(EMBED)(h)
        return x + nn.Dropout(DROPOUT, deterministic=deterministic)(h)


class Transformer(nn.Module):
    @nn.compact
    def __call__(self, tokens, deterministic=False):
        x = nn.Embed(VOCAB, EMBED)(tokens)
        x = x + self.param("pos", nn.initializers.normal(0.02), (SEQ, EMBED))
        for _ in range(LAYERS):
            x = Block()(x, deterministic)
        return nn.Dense(VOCAB)(nn.LayerNorm()(x))


model = Transformer()


def loss(params, tokens, dropout_key):
    """Next-token cross-entropy, averaged over the batch and the sequence."""
    logits = model.apply({"params": params}, tokens[:, :-1], rngs={"dropout": dropout_key})
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return ce.mean()


# The one change: the batch axis (axis 0 of argument 1, the tokens) runs CHUNK rows at a time.
serialized_loss = ja.serialize_axis(
    loss,
    chunk=CHUNK,
    argnums=1,
    mesh_axis="data",  # the batch is sharded over mesh axis "data": each device chunks its shard
)


def make_train_step(loss_fn, tx):
    @jax.jit
    def train_step(params, opt_state, tokens, key):
        key, dropout_key = jax.random.split(key)
        value, grads = jax.value_and_grad(loss_fn)(params, tokens, dropout_key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, key, value

    return train_step


def compile_value_and_grad(f, *args):
    """`jax.value_and_grad(f)` compiled for `args`, and XLA's temp memory (per device) for it."""
    compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
    return compiled, compiled.memory_analysis().temp_size_in_bytes


def main():
    mesh = Mesh(jax.devices(), ("data",))
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    n = len(jax.devices())
    print(f"{n} devices, batch {BATCH} x seq {SEQ}, chunks of {CHUNK} rows ({CHUNK // n} a device)")

    data_key, init_key, key = jax.random.split(jax.random.key(0), 3)
    tokens = jax.random.randint(data_key, (STEPS, BATCH, SEQ + 1), 0, VOCAB)
    tokens = [jax.device_put(t, batch_sharding) for t in tokens]
    params = jax.jit(model.init, static_argnames="deterministic", out_shardings=replicated)(
        init_key, tokens[0][:, :-1], deterministic=True
    )["params"]
    tx = optax.adamw(1e-3)

    # One step's loss and gradients, serialized vs original, same dropout key.
    args = (params, tokens[0], key)
    print(serialized_loss.explain(*args))
    c0, m0 = compile_value_and_grad(loss, *args)
    c1, m1 = compile_value_and_grad(serialized_loss, *args)
    (v0, g0), (v1, g1) = c0(*args), c1(*args)
    # each leaf relative to its own magnitude, floored at 1e-3 of the largest leaf's
    dv, diff = tree_difference(v1, v0).max_rel, tree_difference(g1, g0)
    ga, dg = diff.max_abs, diff.max_rel
    print(
        f"XLA temp memory of value_and_grad: original {m0:,} B, serialized {m1:,} B "
        f"({m0 / m1:.2f}x less)"
    )
    print(f"loss: original {float(v0):.6f}, serialized {float(v1):.6f} (relative diff {dv:.1e})")
    print(f"largest gradient difference: {ga:.2e} (relative {dg:.1e})")
    assert dv <= 2e-4 and dg <= 2e-4, f"serialized differs from the original: {dv=}, {dg=}"

    # A few data-parallel train steps with optax.
    step = make_train_step(serialized_loss, tx)
    opt_state, key = jax.device_put((tx.init(params), key), replicated)
    for i in range(STEPS):
        params, opt_state, key, value = step(params, opt_state, tokens[i], key)
        print(f"step {i}: loss {float(value):.4f}")
        assert jnp.isfinite(value)


if __name__ == "__main__":
    main()
