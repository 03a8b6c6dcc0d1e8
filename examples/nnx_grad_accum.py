"""Gradient accumulation over microbatches of a Flax NNX model, as one decorator.

The third question of ``docs/faq.md``: its author wanted gradient accumulation
over microbatches inside an ``@nnx.jit`` train step, tried ``nnx.fori_loop`` / ``nnx.scan``
with a carry of gradients and the model, and got "nnx.fori_loop requires body function's input
and output to have the same reference and pytree structure".

Here the train step is written as if there were no microbatches at all: the loss over the
whole batch, ``nnx.value_and_grad``, ``optimizer.update``. The loss is decorated with
``ja.serialize_axis(chunk=MICROBATCH, argnums=1)``: the leading axis of argument 1 (``x``)
and of every other argument it is unified with (``y``) runs ``MICROBATCH`` rows at a time in a
``lax.scan``, each microbatch's activations are recomputed in the backward pass, and the
gradients are accumulated in the loop's carry. No carry, no loop, no reference-structure
rules to learn: the model stays an ordinary argument. Dropout draws are the ones the
undecorated step makes (bit-identical), and the model's ``nnx.Rngs`` counter advances exactly
as it would have.

The script trains two identical models for 3 steps, one with the decorated loss, one
without, and checks that losses, metrics and gradients agree at every step; it prints XLA's
temp memory for ``jax.value_and_grad`` of both losses.
Run: ``python examples/nnx_grad_accum.py`` (``--quick``: smaller sizes).
"""

import sys

import jax
import numpy as np
import optax
from flax import nnx

import jaxpr_accum as ja
from jaxpr_accum.testing import tree_difference

QUICK = "--quick" in sys.argv[1:]
BATCH, FEATURES, HIDDEN, CLASSES = (128, 32, 128, 10) if QUICK else (512, 64, 512, 10)
MICROBATCH, STEPS, LR = 32 if QUICK else 64, 3, 1e-2


class MLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs):
        self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.norm = nnx.LayerNorm(dhidden, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dhidden, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)
        self.linear3 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        x = self.dropout(nnx.gelu(self.norm(self.linear1(x))))
        x = self.dropout(nnx.gelu(self.linear2(x)))
        return self.linear3(x)


def loss_fn(model, x, y):
    """Mean cross-entropy over the whole batch, and the accuracy as an auxiliary output."""
    logits = model(x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, {"accuracy": (logits.argmax(-1) == y).mean()}


# Gradient accumulation over microbatches: the whole of it.
accumulated_loss_fn = ja.serialize_axis(loss_fn, chunk=MICROBATCH, argnums=1)


def make_train_step(loss_fn):
    @nnx.jit
    def train_step(model, optimizer, x, y):
        (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, x, y)
        optimizer.update(model, grads)
        return loss, metrics, grads

    return train_step


def temp_bytes(loss_fn, model, x, y):
    """XLA's temp memory for `nnx.value_and_grad(loss_fn)` (w.r.t. the parameters), jitted."""
    value_and_grad = nnx.jit(lambda m, x, y: nnx.value_and_grad(loss_fn, has_aux=True)(m, x, y))
    return value_and_grad.lower(model, x, y).compile().memory_analysis().temp_size_in_bytes


def main():
    kx, ky = jax.random.split(jax.random.key(0))
    xs = jax.random.normal(kx, (STEPS, BATCH, FEATURES))
    ys = jax.random.randint(ky, (STEPS, BATCH), 0, CLASSES)
    print(f"batch {BATCH} in microbatches of {MICROBATCH}")

    # Two identical models (same parameters, same dropout stream), one per train step.
    models = [MLP(FEATURES, HIDDEN, CLASSES, rngs=nnx.Rngs(0, dropout=1)) for _ in range(2)]
    optimizers = [nnx.Optimizer(m, optax.adam(LR), wrt=nnx.Param) for m in models]
    steps = [make_train_step(loss_fn), make_train_step(accumulated_loss_fn)]

    print(accumulated_loss_fn.explain(models[1], xs[0], ys[0]))
    m0 = temp_bytes(loss_fn, models[0], xs[0], ys[0])
    m1 = temp_bytes(accumulated_loss_fn, models[1], xs[0], ys[0])
    print(
        f"XLA temp memory of value_and_grad: original {m0:,} B, accumulated {m1:,} B "
        f"({m0 / m1:.2f}x less)"
    )
    worst = 0.0

    for i in range(STEPS):
        (l0, a0, g0), (l1, a1, g1) = (
            step(model, opt, xs[i], ys[i])
            for step, model, opt in zip(steps, models, optimizers, strict=True)
        )
        # each leaf relative to its own magnitude, floored at 1e-3 of the largest leaf's
        dl, da, d = tree_difference(l1, l0), tree_difference(a1, a0), tree_difference(g1, g0)
        ga, dg = d.max_abs, d.max_rel
        print(
            f"step {i}: loss {float(l0):.6f} vs {float(l1):.6f}, accuracy "
            f"{float(a0['accuracy']):.4f} vs {float(a1['accuracy']):.4f}; "
            f"largest gradient difference {ga:.2e} (relative {dg:.1e})"
        )
        worst = max(worst, dl.max_rel, da.max_rel, dg)
    # Adam divides each update by the root of its second moment, which magnifies the
    # reassociation differences of near-zero gradient entries (each moves by up to about LR
    # a step whatever its size); so the parameters are compared at the scale of the steps.
    params = [nnx.state(m, nnx.Param) for m in models]
    dp = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(params[1]), jax.tree.leaves(params[0]), strict=True)
    )
    rng_counts = [int(m.dropout.rngs.count[...]) for m in models]
    print(
        f"parameters after {STEPS} steps: largest difference {dp:.1e}; "
        f"dropout Rngs counters {rng_counts}"
    )
    assert rng_counts[0] == rng_counts[1], rng_counts
    assert worst <= 2e-4, f"accumulated differs from the original: relative {worst:.1e}"
    assert dp <= 0.05 * LR * STEPS, f"parameters differ by {dp:.1e}"


if __name__ == "__main__":
    main()
