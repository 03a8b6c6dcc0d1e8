"""The zoo's Haiku models (LeNet, VAE, LSTM) and a NumPyro SVI, each importing its library
when built."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .case import _labels, _normal, _rng


def make_hk_lenet(n: int = 64):
    """A Haiku LeNet (``hk.Conv2D``, ``hk.max_pool``, ``hk.Flatten``, ``hk.Linear``) under
    ``hk.transform``, softmax cross-entropy on one-hot labels, as in Haiku's MNIST examples."""
    import haiku as hk

    def net(x):
        x = hk.Conv2D(6, kernel_shape=5, padding="VALID")(x)
        x = jax.nn.relu(x)
        x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
        x = hk.Conv2D(16, kernel_shape=5, padding="VALID")(x)
        x = jax.nn.relu(x)
        x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
        x = hk.Flatten()(x)
        x = hk.nets.MLP([120, 84, 10])(x)
        return x

    model = hk.without_apply_rng(hk.transform(net))
    rng = _rng(10)
    images = _normal(rng, n, 28, 28, 1)
    labels = _labels(rng, n, 10)
    params = model.init(jax.random.PRNGKey(0), images[:1])

    def loss(params, images, labels):
        logits = model.apply(params, images)
        labels = jax.nn.one_hot(labels, 10)
        return -jnp.sum(labels * jax.nn.log_softmax(logits)) / labels.shape[0]

    return loss, (params, images, labels)


def make_hk_vae(n: int = 512):
    """haiku/examples/vae.py: an ``hk.Linear`` encoder to (mean, log stddev), a sample drawn
    with ``hk.next_rng_key()``, an ``hk.Linear`` decoder to Bernoulli logits, the ELBO's
    log-likelihood and the KL to a standard normal."""
    import haiku as hk

    hidden, latent, features = 256, 10, 784

    def vae(x):
        h = jax.nn.relu(hk.Linear(hidden)(x))
        mean = hk.Linear(latent)(h)
        log_stddev = hk.Linear(latent)(h)
        stddev = jnp.exp(log_stddev)
        z = mean + stddev * jax.random.normal(hk.next_rng_key(), mean.shape)
        h = jax.nn.relu(hk.Linear(hidden)(z))
        logits = hk.Linear(features)(h)
        return logits, mean, stddev

    model = hk.transform(vae)
    rng = _rng(11)
    x = jnp.asarray(rng.uniform(size=(n, features)) > 0.5, jnp.float32)
    params = model.init(jax.random.PRNGKey(0), x[:1])

    def loss(params, rng_key, batch):
        logits, mean, stddev = model.apply(params, rng_key, batch)
        log_likelihood = -jnp.sum(
            jnp.logaddexp(0.0, jnp.where(batch > 0.5, -1.0, 1.0) * logits), axis=-1
        )
        kl = 0.5 * jnp.sum(-2 * jnp.log(stddev) - 1.0 + stddev**2 + mean**2, axis=-1)
        return -jnp.mean(log_likelihood - kl)

    return loss, (params, jax.random.PRNGKey(1), x)


def make_hk_lstm(n: int = 64):
    """haiku/examples/rnn: ``hk.LSTM`` unrolled with ``hk.dynamic_unroll`` over time-major
    sequences, ``hk.BatchApply(hk.Linear)`` to the vocabulary, cross-entropy; the batch is
    axis 1 of the inputs and targets."""
    import haiku as hk

    vocab, length, hidden = 32, 12, 64

    def unroll(tokens):  # [T, B]
        batch = tokens.shape[1]
        embed = hk.Embed(vocab, 32)(tokens)
        core = hk.LSTM(hidden)
        state = core.initial_state(batch)
        outputs, _ = hk.dynamic_unroll(core, embed, state)
        return hk.BatchApply(hk.Linear(vocab))(outputs)

    model = hk.without_apply_rng(hk.transform(unroll))
    rng = _rng(12)
    inputs = jnp.asarray(rng.randint(0, vocab, size=(length, n)), jnp.int32)
    targets = jnp.asarray(rng.randint(0, vocab, size=(length, n)), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), inputs[:, :1])

    def loss(params, inputs, targets):
        logits = model.apply(params, inputs)
        log_probs = jax.nn.log_softmax(logits)
        one_hot = jax.nn.one_hot(targets, vocab)
        return -jnp.sum(one_hot * log_probs) / (length * inputs.shape[1])

    return loss, (params, inputs, targets)


# ============================================================================================
# NumPyro
# ============================================================================================


def make_numpyro_svi_mvn(n: int = 64):
    """NumPyro SVI, ``Trace_ELBO(num_particles=n, vectorize_particles=True)``: a small
    Gaussian-process regression whose length scale is a latent, so every particle builds its
    own kernel and draws ``f ~ MultivariateNormal(0, covariance_matrix=K)`` (``cholesky``,
    ``triangular_solve`` per particle); a mean-field guide for the length scale and an
    ``MultivariateNormal(loc, scale_tril=L)`` guide for ``f``."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import Trace_ELBO

    points = 24
    rng = _rng(13)
    x = jnp.asarray(np.linspace(-2, 2, points), jnp.float32)
    y = jnp.sin(2 * x) + _normal(rng, points, scale=0.1)
    tril = np.tril_indices(points)

    def model(x, y):
        ls = numpyro.sample("ls", dist.LogNormal(0.0, 0.5))
        k = jnp.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / ls**2) + 1e-2 * jnp.eye(points)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(points), covariance_matrix=k))
        numpyro.sample("y", dist.Normal(f, 0.1), obs=y)

    def guide(x, y):
        ls_loc = numpyro.param("ls_loc", 0.0)
        ls_log_scale = numpyro.param("ls_log_scale", -1.0)
        numpyro.sample("ls", dist.LogNormal(ls_loc, jnp.exp(ls_log_scale)))
        f_loc = numpyro.param("f_loc", jnp.zeros(points))
        f_tril = numpyro.param("f_tril", jnp.zeros(len(tril[0])))
        lower = jnp.zeros((points, points)).at[tril].set(f_tril)
        diag = jnp.diag(lower)
        scale_tril = lower - jnp.diag(diag) + jnp.diag(0.1 * jnp.exp(diag))
        numpyro.sample("f", dist.MultivariateNormal(f_loc, scale_tril=scale_tril))

    elbo = Trace_ELBO(num_particles=n, vectorize_particles=True)
    params = {
        "ls_loc": jnp.float32(0.0),
        "ls_log_scale": jnp.float32(-1.0),
        "f_loc": _normal(rng, points, scale=0.1),
        "f_tril": _normal(rng, len(tril[0]), scale=0.01),
    }

    def loss(params, rng_key):
        return elbo.loss(rng_key, params, model, guide, x, y)

    return loss, (params, jax.random.PRNGKey(4))
