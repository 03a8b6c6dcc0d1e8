"""The programs and cases of ``pairwise.py``: contrastive (SimCLR, CLIP), MMD, triplet and
nearest-neighbour losses on a small encoder, and GradCache's hand-written SimCLR."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax import lax


@dataclasses.dataclass(frozen=True)
class Sizes:
    batches: tuple[int, int] = (2048, 4096)
    features: int = 32
    hidden: int = 64
    embed: int = 64
    outer_embed: int = 8
    chunk: int = 256
    budget_s: float = 10.0


FULL = Sizes()
QUICK = Sizes(batches=(512, 1024), chunk=64, budget_s=2.0)


def encode(w, x):
    return jnp.tanh(x @ w[0]) @ w[1]


def normalise(z):
    return z / jnp.linalg.norm(z, axis=1, keepdims=True)


def nt_xent(z, t, outer=False, mask=-jnp.inf):
    z = normalise(z)
    sim = jnp.sum(z[:, None, :] * z[None, :, :], axis=-1) if outer else z @ z.T
    sim = sim / t
    n = sim.shape[0]
    sim = jnp.where(jnp.eye(n, dtype=bool), mask, sim)
    positive = (jnp.arange(n) + n // 2) % n
    logp = jax.nn.log_softmax(sim, axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, positive[:, None], axis=1))


def simclr(w, x, t):
    return nt_xent(encode(w, x), t)


def simclr_outer(w, x):
    return nt_xent(encode(w, x), 0.5, outer=True, mask=-9e15)


def clip(w, images, texts, scale):
    za, zb = normalise(encode(w[0], images)), normalise(encode(w[1], texts))
    logits = za @ zb.T * jnp.exp(scale)
    labels = jnp.arange(logits.shape[0])
    rows = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    columns = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()
    return (rows + columns) / 2


def rbf(a, b):
    return jnp.exp(-jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1) / a.shape[1])


def mmd(w, x, prior):
    z = encode(w, x)
    return jnp.mean(rbf(z, z)) + jnp.mean(rbf(prior, prior)) - 2 * jnp.mean(rbf(z, prior))


def distances(z):
    sq = jnp.sum(z**2, axis=1)
    return jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2 * z @ z.T, 1e-9))


def triplet(w, x, labels):
    d = distances(encode(w, x))
    same = labels[:, None] == labels[None, :]
    positive = jnp.max(jnp.where(same, d, -jnp.inf), axis=1)
    negative = jnp.min(jnp.where(same, jnp.inf, d), axis=1)
    return jnp.mean(jax.nn.relu(positive - negative + 0.2))


def nearest(w, x):
    z = encode(w, x)
    d = jnp.sqrt(jnp.sum((z[:, None, :] - z[None, :, :]) ** 2, axis=-1) + 1e-6)
    return jnp.mean(jnp.min(jnp.where(jnp.eye(x.shape[0], dtype=bool), jnp.inf, d), axis=1))


def gradcache_simclr(chunk: int) -> Callable:
    """SimCLR's ``value_and_grad`` written by hand as GradCache does it."""

    def value_and_grad(w, x, t):
        n, f = x.shape
        blocks = x.reshape(n // chunk, chunk, f)
        z = lax.map(lambda xb: encode(w, xb), blocks).reshape(n, -1)  # no activations kept
        loss, (dz, dt) = jax.value_and_grad(nt_xent, argnums=(0, 1))(z, t)

        def backward(acc, block):
            xb, dzb = block
            _, pull = jax.vjp(encode, w, xb)
            dw, dx = pull(dzb)
            return jax.tree.map(jnp.add, acc, dw), dx

        zeros = jax.tree.map(jnp.zeros_like, w)
        dw, dx = lax.scan(backward, zeros, (blocks, dz.reshape(n // chunk, chunk, -1)))
        return loss, (dw, dx.reshape(n, f), dt)

    return value_and_grad


@dataclasses.dataclass
class Case:
    name: str
    f: Callable
    make_args: Callable[[int], tuple]
    argnums: int | tuple[int, ...]  # the batch
    diff: tuple[int, ...]  # the floating arguments
    outer: bool = False


def _normal(key, shape, scale=1.0):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32) * scale


def _mlp(key: int, s: Sizes, embed: int, features: int | None = None) -> tuple:
    f = features or s.features
    return (_normal(key, (f, s.hidden), f**-0.5), _normal(key + 1, (s.hidden, embed), 0.2))


def cases(s: Sizes) -> list[Case]:
    e, eo, f = s.embed, s.outer_embed, s.features
    return [
        Case("SimCLR NT-Xent, `z @ z.T`", simclr,
             lambda n: (_mlp(1, s, e), _normal(2, (n, f)), jnp.float32(0.5)), 1, (0, 1, 2)),
        Case("SimCLR NT-Xent, outer product then sum", simclr_outer,
             lambda n: (_mlp(3, s, eo), _normal(4, (n, f))), 1, (0, 1), outer=True),
        Case("symmetric CLIP, both towers chunked", clip,
             lambda n: ((_mlp(5, s, e), _mlp(7, s, e, 16)), _normal(9, (n, f)),
                        _normal(10, (n, 16)), jnp.float32(2.0)), (1, 2), (0, 1, 2, 3)),
        Case("MMD^2 (RBF), batch and prior samples", mmd,
             lambda n: (_mlp(11, s, eo), _normal(12, (n, f)), _normal(13, (n, eo))),
             (1, 2), (0, 1, 2), outer=True),
        Case("batch-hard triplets", triplet,
             lambda n: (_mlp(14, s, e), _normal(15, (n, f)),
                        jax.random.randint(jax.random.key(16), (n,), 0, 32)), (1, 2), (0, 1)),
        Case("`cdist`, nearest other row", nearest,
             lambda n: (_mlp(17, s, eo), _normal(18, (n, f))), 1, (0, 1), outer=True),
    ]  # fmt: skip
