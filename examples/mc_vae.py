"""Monte-Carlo gradients of a stochastic encoder-decoder, decoded a few samples at a time.

This is the model and training loop of the first motivating report ("Accumulation of
Monte-Carlo gradients within a flax module to avoid OOM error", ``docs/faq.md`` question 1), as its
author wrote it, with one change: the loss is decorated with ``ja.serialize_axis(chunk=4)``.
``jax.vmap(decoder)(z)`` stays inside the Flax module. The rewriter finds the 16-sample axis
born at ``jax.random.normal(key, (n_samples, ...))``, decodes 4 samples per step of a
``lax.scan``, recomputes each chunk's decoder activations in the backward pass, and adds up
the gradients of the decoder's parameters and, through ``z``, of the encoder's.

To keep one definition of the loss for the comparison, the seed's inner ``loss`` closure is
built by ``make_loss`` (the same code, its closure made explicit). The check at the end
compares the serialized loss with the undecorated one (``loss.original``) at the first step:
value and gradients, and XLA's temp memory for ``jax.value_and_grad``.

Run: ``python examples/mc_vae.py`` (``--quick``: fewer train steps).
"""

import sys
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

import jaxpr_accum as ja
from jaxpr_accum.testing import tree_difference

QUICK = "--quick" in sys.argv[1:]
CHUNK = 4  # Monte-Carlo samples decoded per step of the loop

n_in_channels = 1


# ---- the seed, unchanged but for the decorator in `make_loss` ---------------------------------

# much simplified and lightweight version of encoder


class Encoder(nn.Module):
    sigma_floor: float

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(features=2 * n_in_channels, kernel_size=(2, 2))(x)
        x = nn.relu(x)
        x = nn.Conv(features=2 * n_in_channels, kernel_size=(2, 2))(x)

        def to_sigma(z):
            return self.sigma_floor + (1.0 - self.sigma_floor) * nn.softplus(z)

        mu = x[..., :n_in_channels]
        sigma = to_sigma(x[..., n_in_channels:])

        return mu, sigma


# in reality the decoder is different than the encoder, but this isn't relevant to the pending
# question, hence for simplicity:

Decoder = Encoder


class Model(nn.Module):
    @nn.compact
    def __call__(self, masked_x, rng, n_samples):
        """
        :param masked_x:        array having shape (batch, spatial dim. 1, spatial dim. 2, channels)
        :param rng:             random number generator
        :return:                array having shape
                                (MC sample, batch, spatial dim. 1, spatial dim. 2, channels)
        """

        mu, sigma = Encoder(sigma_floor=1.0e-3)(masked_x)

        # monte-carlo sampling of latent representation
        z = jax.random.normal(key=rng, shape=(n_samples, *mu.shape))

        # re-parametrisation trick
        # stack monte-carlo (MC) samples along new leading sample dimension
        z *= jnp.expand_dims(sigma, 0)
        z += jnp.expand_dims(mu, 0)

        decoder = Decoder(sigma_floor=1.0e-3)

        # how can we edit the following line to save memory?  (answer: leave it as it is)
        mu_x_hat, sigma_x_hat = jax.vmap(decoder, in_axes=0)(z)

        return mu_x_hat, sigma_x_hat


@jax.jit
def log_likelihood(x, mu, sigma):
    return -0.5 * ((x - mu) ** 2) / (sigma**2) - jnp.log(sigma)


def make_loss(state, x, mask, rng, n_samples):
    """The seed's `loss(params)` closure, decorated."""

    @ja.serialize_axis(chunk=CHUNK)  # <- the one change: the MC samples run CHUNK at a time
    def loss(params):
        masked_x = mask * x
        mu_x_hat, sigma_x_hat = state.apply_fn({"params": params}, masked_x, rng, n_samples)

        # NB:
        #   + mu_x_hat and sigma_x_hat have shape
        #     (sample, batch, spatial dim. 1, spatial dim. 2, channel)
        #   + x has shape (batch, spatial dim. 1, spatial dim. 2, channel)

        ll = jax.vmap(log_likelihood, in_axes=(0, 0, 0))  # vmap across batch elements
        # vmap across sampled realisations
        ll = jax.vmap(ll, in_axes=(None, 0, 0))(x, mu_x_hat, sigma_x_hat)

        ll = ll.sum((2, 3, 4))  # sum over spatial dims and channel
        ll = ll.mean()  # mean over samples and batch

        return -ll

    return loss


@partial(jax.jit, static_argnums=(3,))
def train_step(state, x, rng, n_samples):
    rng, key = jax.random.split(rng, 2)
    mask = jax.random.bernoulli(key, p=0.5, shape=(*x.shape[:-1], 1))

    loss = make_loss(state, x, mask, rng, n_samples)

    nll, grad = jax.value_and_grad(loss, argnums=0)(state.params)

    return nll, state.apply_gradients(grads=grad)


def train(seed, n_batches, batch_size, n_samples):
    rng = jax.random.PRNGKey(seed)
    rng, data_key, init_key = jax.random.split(rng, 3)

    # data

    # shape is (batch, spatial dim. 1, spatial dim. 2, channel)
    x = jax.random.normal(key=data_key, shape=(n_batches * batch_size, 16, 16, n_in_channels))

    # model

    init = jax.jit(Model().init, static_argnums=3)  # (jit added: start-up time only)
    state = train_state.TrainState.create(
        apply_fn=Model().apply,
        params=init(init_key, jnp.zeros_like(x), rng, n_samples)["params"],
        tx=optax.adam(1.0e-3),
    )

    check_first_step(state, x[:batch_size], rng, n_samples)  # added: see below

    # train loop

    for step in range(x.shape[0] // batch_size):
        batch = x[step * batch_size : (step + 1) * batch_size, ...]

        rng, key = jax.random.split(rng, 2)

        nll, state = train_step(state, batch, key, n_samples)

        print("step %i: %f" % (step, nll))  # noqa: UP031
        assert jnp.isfinite(nll)


# ---- the check: serialized vs original at the first step --------------------------------------


def compile_value_and_grad(f, *args):
    """`jax.value_and_grad(f)` compiled for `args`, and XLA's temp memory for it."""
    compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
    return compiled, compiled.memory_analysis().temp_size_in_bytes


def check_first_step(state, batch, rng, n_samples):
    # the same key, mask and sampling key as the first call of train_step in the loop
    _, key = jax.random.split(rng, 2)
    rng, key = jax.random.split(key, 2)
    mask = jax.random.bernoulli(key, p=0.5, shape=(*batch.shape[:-1], 1))

    def serialized(params, x, mask, rng):
        return make_loss(state, x, mask, rng, n_samples)(params)

    def original(params, x, mask, rng):
        return make_loss(state, x, mask, rng, n_samples).original(params)

    args = (state.params, batch, mask, rng)
    print(make_loss(state, batch, mask, rng, n_samples).explain(state.params))
    c0, m0 = compile_value_and_grad(original, *args)
    c1, m1 = compile_value_and_grad(serialized, *args)
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


if __name__ == "__main__":
    train(seed=42, n_batches=2 if QUICK else 4, batch_size=4, n_samples=16)
