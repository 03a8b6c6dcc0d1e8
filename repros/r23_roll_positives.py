"""r23: SimCLR's NT-Xent with positives ``jnp.roll(jnp.arange(n), n // 2)`` grew 3.6x per
doubling of N: pass 2 stopped at the ``concatenate`` of ``jnp.roll`` (a constant) and stacked
the N x N log-probabilities (the same positives as ``(arange + n // 2) % n`` were linear). And
``z @ z[::-1].T`` (reversed columns) got no two-pass plan at all (0.99 of the original). Both
are now linear in N. Exits 1 while the defect is there, 0 when fixed (about a minute)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys

import jax
import jax.numpy as jnp

import jaxpr_accum as ja

k = jax.random.split(jax.random.key(12), 3)
w = (jax.random.normal(k[0], (16, 32)) / 4, jax.random.normal(k[1], (32, 8)) / 4)


def simclr(w, x, t):
    z = jnp.tanh(x @ w[0]) @ w[1]
    z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
    n = z.shape[0]
    s = jnp.where(jnp.eye(n, dtype=bool), -jnp.inf, z @ z.T / t)
    pos = jnp.roll(jnp.arange(n), n // 2)
    return -jnp.mean(jax.nn.log_softmax(s, 1)[jnp.arange(n), pos])


def reversed_columns(w, x, t):
    z = jnp.tanh(x @ w[0]) @ w[1]
    return jnp.mean(jax.nn.logsumexp(z @ z[::-1].T / t, 1))


def temp(f, *a):
    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    return step.lower(*a).compile().memory_analysis().temp_size_in_bytes


bad = False
for f in (simclr, reversed_columns):
    mem = {}
    for n in (1024, 2048):
        x = jax.random.normal(k[2], (n, 16))
        mem[n] = (temp(f, w, x, 0.5), temp(ja.serialize_axis(f, chunk=256, argnums=1), w, x, 0.5))
    growth, ratio = mem[2048][1] / mem[1024][1], mem[2048][1] / mem[2048][0]
    print(f"{f.__name__}: x{growth:.2f} per doubling, {ratio:.3f} of the original at N=2048")
    bad |= growth > 2.3 or ratio > 0.2
sys.exit(1 if bad else 0)
