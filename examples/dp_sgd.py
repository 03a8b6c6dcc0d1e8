"""DP-SGD on a Flax conv net: per-example clipped, noised gradients, serialized over examples.

DP-SGD (Abadi et al., 2016) clips each example's gradient to norm ``C``, sums the clipped
gradients, adds Gaussian noise of scale ``sigma * C`` and averages. Written in JAX as in jax's
``examples/differentially_private_sgd.py``: ``vmap(grad(loss))`` over single-example
batches. That holds every example's gradient at once: ``N`` copies of the parameters, on top
of ``N`` examples' activations. The batch a device can hold is bounded by it, and DP-SGD
wants large batches (the noise is divided by the batch size).

``ja.serialize_axis(private_grad, memory=BUDGET, argnums=(1, 2))`` runs the same code over
chunks of examples in a ``lax.scan``, accumulating the clipped sum: the per-example gradients
of one chunk at a time. Under ``vmap`` each example's *weight* gradient of a convolution is a
grouped convolution whose feature groups are the examples; the rewriter chunks it (a chunk
of ``k`` examples is the convolution with ``k`` groups). The noise is drawn once, after the
loop, with the original's random bits.

The script prints XLA's temp memory of the private gradient against the batch size (the
original and the serialized one at a fixed chunk), then takes the smallest batch of the table
that the original cannot hold within ``BUDGET``, serializes it with ``memory=BUDGET`` (the
chunk is chosen by measuring ``value_and_grad``, as ``memory=`` always does; ``grad="remat"``
keeps that search to one mode), checks that it fits and that its value equals the original's,
and trains the net for a few steps with optax, both ways, checking that the parameters agree.

Run: ``python examples/dp_sgd.py`` (``--quick``: smaller sizes).
"""

import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

QUICK = "--quick" in sys.argv[1:]
BATCHES = (16, 32, 64, 128) if QUICK else (64, 128, 256, 512, 1024)
TABLE_CHUNK = 8 if QUICK else 16  # the serialized column of the table
BUDGET_MIB = 16 if QUICK else 64
BUDGET = f"{BUDGET_MIB} MiB"
CLIP, NOISE, LR, STEPS = 1.0, 1.1, 0.1, 3


class ConvNet(nn.Module):
    """Two strided convolutions and a dense head on 28 x 28 x 1 images (MNIST-sized)."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(16, (3, 3), strides=(2, 2))(x))
        x = nn.relu(nn.Conv(32, (3, 3), strides=(2, 2))(x))
        x = nn.relu(nn.Dense(64)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(x)


model = ConvNet()


def loss(params, x, y):
    """One example's loss (a batch of one, as DP-SGD's per-example gradients take it)."""
    logits = model.apply(params, x[None])
    return optax.softmax_cross_entropy_with_integer_labels(logits, y[None]).mean()


def private_grad(params, xs, ys, key):
    """Clipped per-example gradients, summed, noised and averaged (DP-SGD's private gradient)."""
    grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    leaves = jax.tree_util.tree_leaves(grads)
    norms = jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, 1) for g in leaves))
    scale = 1.0 / jnp.maximum(norms / CLIP, 1.0)
    summed, unravel = ravel_pytree(
        jax.tree.map(lambda g: jnp.einsum("n,n...->...", scale, g), grads)
    )
    noise = NOISE * CLIP * jax.random.normal(key, summed.shape)  # one draw: quick to compile
    return unravel((summed + noise) / xs.shape[0])


def temp_bytes(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    xs = jnp.asarray(rng.normal(size=(n, 28, 28, 1)), jnp.float32)
    return xs, jnp.asarray(rng.integers(0, 10, size=n), jnp.int32)


def train(grad_fn, params, xs, ys):
    opt = optax.sgd(LR)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        grads = grad_fn(params, xs, ys, key)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for i in range(STEPS):
        params, state = step(params, state, jax.random.key(100 + i))
    return params


def main():
    params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    size = sum(p.size for p in jax.tree_util.tree_leaves(params))
    print(f"ConvNet: {size:,} parameters ({size * 4 / 2**20:.2f} MiB of float32 per example)")
    serialized = ja.serialize_axis(private_grad, chunk=TABLE_CHUNK, argnums=(1, 2))
    key = jax.random.key(1)
    print(f"\nXLA temp memory of the private gradient (MiB), serialized at chunk {TABLE_CHUNK}:")
    print(f"{'batch':>7} {'original':>10} {'serialized':>11} {'ratio':>7}")
    rows = []
    for n in BATCHES:
        xs, ys = data(n)
        orig = temp_bytes(private_grad, params, xs, ys, key)
        ser = temp_bytes(serialized, params, xs, ys, key)
        rows.append((n, orig))
        print(f"{n:>7} {orig / 2**20:>10.2f} {ser / 2**20:>11.2f} {ser / orig:>7.3f}")

    budget = BUDGET_MIB * 2**20
    over = [n for n, orig in rows if orig > budget]
    assert over, f"every batch of the table fits {BUDGET}: nothing to show"
    n = over[0]  # the smallest batch the original cannot hold
    xs, ys = data(n)
    in_budget = ja.serialize_axis(private_grad, memory=BUDGET, argnums=(1, 2), grad="remat")
    used = temp_bytes(in_budget, params, xs, ys, key)
    plan = in_budget.explain(params, xs, ys, key)
    print(
        f"\nmemory={BUDGET!r}, batch {n}: the original needs "
        f"{dict(rows)[n] / 2**20:.1f} MiB; serialized in chunks of {plan.chunk}: "
        f"{used / 2**20:.1f} MiB"
    )
    assert used <= budget, (used, budget)
    assert not plan.stops, str(plan)
    assert_tree_close(jax.jit(in_budget)(params, xs, ys, key), private_grad(params, xs, ys, key))

    xs, ys = data(BATCHES[1], seed=1)
    trained = train(serialized, params, xs, ys)
    assert_tree_close(trained, train(private_grad, params, xs, ys))
    print(f"{STEPS} DP-SGD steps with optax at batch {BATCHES[1]}: the same parameters both ways")


if __name__ == "__main__":
    main()
