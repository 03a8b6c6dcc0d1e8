"""A Monte-Carlo encoder-decoder whose decoder is ``jax.vmap``-ped over samples, trained with
its samples decoded a few at a time.

The model: an encoder maps a masked image to the mean and scale of a latent image; inside the
Flax module, ``n_samples`` latents ``z = mu + sigma * eps`` are drawn at once, and the decoder,
``jax.vmap``-ped over them, maps each to the mean and scale of the whole image. The loss is the
negative Gaussian log-likelihood of the image, averaged over samples and batch. As written, the
backward pass holds the decoder's activations for every sample at once: memory grows with
``n_samples``.

The one change for ``jaxpr_accum`` is in ``train``: ``ja.serialize_axis(loss, chunk=CHUNK)``.
The model stays as it is, ``jax.vmap(decoder)`` inside the module included. The rewriter finds
the sample axis born at ``jax.random.normal(rng, (n_samples, ...))``, decodes ``CHUNK``
samples per step of a ``lax.scan``, recomputes each chunk's activations in the backward pass,
and adds up the gradients of the decoder's parameters and, through ``z``, of the encoder's.

Before training, the script prints the plan (``explain``) and compares the serialized loss with
the undecorated one at the first batch: value, gradients, and XLA's temp memory for
``jax.value_and_grad``. ``python -m jaxpr_accum demo`` runs this model too (``problem``).

Run: ``python examples/mc_vae.py`` (``--quick``: smaller images and decoder, fewer steps).
"""

import dataclasses
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import jaxpr_accum as ja
from jaxpr_accum.testing import tree_difference

CHUNK = 4  # Monte-Carlo samples decoded per step of the loop


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The problem's sizes; the defaults are the demo's."""

    batch: int = 4
    height: int = 32
    width: int = 32
    channels: int = 1
    latent: int = 4  # channels of the latent image
    n_samples: int = 16  # Monte-Carlo samples of the latent per image
    encoder_width: int = 8
    decoder_widths: tuple[int, ...] = (32, 32, 32)


SMALL = Sizes(height=16, width=16, decoder_widths=(16, 16))  # --quick


def to_sigma(h, floor=1e-3):
    """A positive scale, at least ``floor``."""
    return floor + (1.0 - floor) * nn.softplus(h)


class Encoder(nn.Module):
    """Small on purpose: it runs once per image, outside the sample axis."""

    width: int
    latent: int

    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Conv(self.width, kernel_size=(3, 3))(x))
        h = nn.Conv(2 * self.latent, kernel_size=(3, 3))(h)
        return h[..., : self.latent], to_sigma(h[..., self.latent :])


class Decoder(nn.Module):
    """The heavy part: its activations exist once per Monte-Carlo sample."""

    widths: tuple[int, ...]
    channels: int

    @nn.compact
    def __call__(self, z):
        h = z
        for width in self.widths:
            h = nn.relu(nn.Conv(width, kernel_size=(3, 3))(h))
        h = nn.Conv(2 * self.channels, kernel_size=(3, 3))(h)
        return h[..., : self.channels], to_sigma(h[..., self.channels :])


class Model(nn.Module):
    sizes: Sizes

    @nn.compact
    def __call__(self, masked_x, rng):
        s = self.sizes
        mu, sigma = Encoder(s.encoder_width, s.latent)(masked_x)
        # Monte-Carlo samples of the latent, stacked on a new leading axis; the
        # re-parametrisation trick keeps them differentiable in mu and sigma.
        eps = jax.random.normal(rng, (s.n_samples, *mu.shape))
        z = mu[None] + sigma[None] * eps
        # Every sample's decoder activations at once: the memory serialize_axis saves.
        mu_x, sigma_x = jax.vmap(Decoder(s.decoder_widths, s.channels))(z)
        return mu_x, sigma_x  # (n_samples, batch, height, width, channels)


def log_likelihood(x, mu, sigma):
    """Per-pixel Gaussian log-likelihood (up to a constant)."""
    return -0.5 * ((x - mu) / sigma) ** 2 - jnp.log(sigma)


def make_loss(model):
    """``loss(params, x, mask, rng)``: the negative log-likelihood of the whole image ``x``
    given its unmasked pixels, averaged over the Monte-Carlo samples and the batch."""

    def loss(params, x, mask, rng):
        mu_x, sigma_x = model.apply({"params": params}, mask * x, rng)
        ll = log_likelihood(x, mu_x, sigma_x)  # x broadcasts over the samples
        return -ll.sum((2, 3, 4)).mean()

    return loss


def random_mask(key, x):
    """Hide about half of the pixels (the same ones in every channel)."""
    return jax.random.bernoulli(key, 0.5, (*x.shape[:-1], 1)).astype(x.dtype)


def problem(sizes=None, key=None):
    """``(loss, (params, x, mask, rng))``: the undecorated loss and one batch to call it on,
    drawn from ``key`` (``sizes``: ``Sizes()`` by default)."""
    sizes = sizes or Sizes()
    model = Model(sizes)

    @jax.jit  # one compiled program draws the batch and initialises the parameters
    def draw(key):
        data_key, mask_key, init_key, rng = jax.random.split(key, 4)
        x = jax.random.normal(data_key, (sizes.batch, sizes.height, sizes.width, sizes.channels))
        mask = random_mask(mask_key, x)
        params = model.init(init_key, mask * x, rng)["params"]
        return params, x, mask, rng

    return make_loss(model), draw(jax.random.PRNGKey(42) if key is None else key)


def compare_first_batch(loss, serialized, args):
    """The serialized loss against the undecorated one: value, gradients, XLA temp memory."""

    def compiled(f):
        exe = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
        return exe, exe.memory_analysis().temp_size_in_bytes

    (c0, m0), (c1, m1) = compiled(loss), compiled(serialized)
    (v0, g0), (v1, g1) = c0(*args), c1(*args)
    # each leaf relative to its own magnitude, floored at 1e-3 of the largest leaf's
    dv, dg = tree_difference(v1, v0).max_rel, tree_difference(g1, g0).max_rel
    print(f"XLA temp memory of value_and_grad: original {m0:,} B, serialized {m1:,} B "
          f"({m0 / m1:.2f}x less)")  # fmt: skip
    print(f"loss: original {float(v0):.6f}, serialized {float(v1):.6f} (relative diff {dv:.1e})")
    print(f"largest gradient difference, relative: {dg:.1e}")
    assert dv <= 2e-4 and dg <= 2e-4, f"serialized differs from the original: {dv=}, {dg=}"


def train(sizes, steps):
    loss, (params, x, mask, rng) = problem(sizes)
    serialized = ja.serialize_axis(loss, chunk=CHUNK)  # <- the one change
    print(serialized.explain(params, x, mask, rng))
    compare_first_batch(loss, serialized, (params, x, mask, rng))

    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, x, key):
        mask_key, rng = jax.random.split(key)
        nll, grads = jax.value_and_grad(serialized)(params, x, random_mask(mask_key, x), rng)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, nll

    key = jax.random.PRNGKey(43)
    for step in range(steps):
        key, data_key, step_key = jax.random.split(key, 3)
        batch = jax.random.normal(data_key, x.shape)
        params, opt_state, nll = train_step(params, opt_state, batch, step_key)
        print(f"step {step}: loss {float(nll):.4f}")
        assert jnp.isfinite(nll)


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    train(SMALL if quick else Sizes(), steps=2 if quick else 4)
