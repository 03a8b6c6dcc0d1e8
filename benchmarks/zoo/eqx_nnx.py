"""The zoo's Flax NNX and Equinox models (MNIST CNNs, MLP, GRU, ViT block), each importing
its library when built."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .case import _labels, _normal, _rng


def make_nnx_mnist_cnn(n: int = 64):
    """The Flax NNX MNIST tutorial's CNN (``nnx.Conv``, ``avg_pool`` via ``functools.partial``,
    ``nnx.Linear``) and ``optax.softmax_cross_entropy_with_integer_labels``; the model is
    passed as an NNX module, as ``nnx.value_and_grad`` users do."""
    from functools import partial

    import optax
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
            self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
            self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
            self.linear2 = nnx.Linear(256, 10, rngs=rngs)

        def __call__(self, x):
            x = self.avg_pool(nnx.relu(self.conv1(x)))
            x = self.avg_pool(nnx.relu(self.conv2(x)))
            x = x.reshape(x.shape[0], -1)
            x = nnx.relu(self.linear1(x))
            return self.linear2(x)

    model = CNN(rngs=nnx.Rngs(0))
    rng = _rng(5)
    images = _normal(rng, n, 28, 28, 1)
    labels = _labels(rng, n, 10)

    def loss(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=labels).mean()

    return loss, (model, images, labels)


# ============================================================================================
# Equinox
# ============================================================================================


def _eqx_functional(model, loss_of_model):
    """``eqx.partition`` into (arrays, static); the loss takes the arrays, as
    ``eqx.filter_value_and_grad`` differentiates them."""
    import equinox as eqx

    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, *batch):
        return loss_of_model(eqx.combine(params, static), *batch)

    return loss, params


def make_eqx_cnn(n: int = 512):
    """Equinox's MNIST CNN tutorial: ``Conv2d(1, 3, 4)``, ``MaxPool2d(2, 2)``, relu, flatten,
    ``Linear(1728, 512)``, ``Linear(512, 64)``, ``Linear(64, 10)``, ``log_softmax``;
    ``jax.vmap(model)`` and the cross-entropy by ``take_along_axis``."""
    import equinox as eqx

    class CNN(eqx.Module):
        layers: list

        def __init__(self, key):
            k1, k2, k3, k4 = jax.random.split(key, 4)
            self.layers = [
                eqx.nn.Conv2d(1, 3, kernel_size=4, key=k1),
                eqx.nn.MaxPool2d(kernel_size=2),
                jax.nn.relu,
                jnp.ravel,
                eqx.nn.Linear(1728, 512, key=k2),
                jax.nn.sigmoid,
                eqx.nn.Linear(512, 64, key=k3),
                jax.nn.relu,
                eqx.nn.Linear(64, 10, key=k4),
                jax.nn.log_softmax,
            ]

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def cross_entropy(model, x, y):
        pred_y = jax.vmap(model)(x)
        pred_y = jnp.take_along_axis(pred_y, jnp.expand_dims(y, 1), axis=1)
        return -jnp.mean(pred_y)

    loss, params = _eqx_functional(CNN(jax.random.PRNGKey(0)), cross_entropy)
    rng = _rng(6)
    return loss, (params, _normal(rng, n, 1, 28, 28), _labels(rng, n, 10))


def make_eqx_mlp(n: int = 1024):
    """``eqx.nn.MLP`` (width 256, depth 3) regression, ``jax.vmap(model)`` and mean squared
    error, as in Equinox's getting-started example."""
    import equinox as eqx

    model = eqx.nn.MLP(in_size=64, out_size=8, width_size=256, depth=3, key=jax.random.PRNGKey(0))

    def mse(model, x, y):
        pred_y = jax.vmap(model)(x)
        return jnp.mean((y - pred_y) ** 2)

    loss, params = _eqx_functional(model, mse)
    rng = _rng(7)
    return loss, (params, _normal(rng, n, 64), _normal(rng, n, 8))


def make_eqx_gru(n: int = 64):
    """Equinox's RNN example: ``eqx.nn.GRUCell`` under ``lax.scan`` over time, a
    ``Linear`` head on the final hidden state with a learned bias, ``jax.vmap`` over the
    batch, and a binary cross-entropy."""
    import equinox as eqx

    class RNN(eqx.Module):
        hidden_size: int = eqx.field(static=True)
        cell: eqx.Module
        linear: eqx.nn.Linear
        bias: jax.Array

        def __init__(self, in_size, out_size, hidden_size, *, key):
            ckey, lkey = jax.random.split(key)
            self.hidden_size = hidden_size
            self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
            self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
            self.bias = jnp.zeros(out_size)

        def __call__(self, input):
            hidden = jnp.zeros((self.hidden_size,))

            def f(carry, inp):
                return self.cell(inp, carry), None

            out, _ = jax.lax.scan(f, hidden, input)
            return jax.nn.sigmoid(self.linear(out) + self.bias)

    def bce(model, x, y):
        pred_y = jax.vmap(model)(x)[:, 0]
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    model = RNN(in_size=2, out_size=1, hidden_size=64, key=jax.random.PRNGKey(0))
    loss, params = _eqx_functional(model, bce)
    rng = _rng(8)
    y = jnp.asarray(rng.randint(0, 2, size=(n,)), jnp.float32)
    return loss, (params, _normal(rng, n, 16, 2), y)


def make_eqx_vit_block(n: int = 64):
    """A small ViT in Equinox: patch embedding by a strided ``Conv2d``, class token and
    position embedding, a pre-norm block of ``eqx.nn.MultiheadAttention`` and an MLP with
    ``eqx.nn.LayerNorm`` (vmapped over tokens), a ``Linear`` head; cross-entropy."""
    import equinox as eqx

    patch, dim, heads, classes, side = 4, 64, 4, 10, 16
    tokens = (side // patch) ** 2 + 1

    class ViT(eqx.Module):
        patch_embed: eqx.nn.Conv2d
        cls_token: jax.Array
        pos: jax.Array
        norm1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        mlp1: eqx.nn.Linear
        mlp2: eqx.nn.Linear
        head: eqx.nn.Linear

        def __init__(self, key):
            ks = jax.random.split(key, 7)
            self.patch_embed = eqx.nn.Conv2d(3, dim, patch, stride=patch, key=ks[0])
            self.cls_token = jax.random.normal(ks[1], (1, dim))
            self.pos = 0.02 * jax.random.normal(ks[2], (tokens, dim))
            self.norm1 = eqx.nn.LayerNorm(dim)
            self.attn = eqx.nn.MultiheadAttention(heads, dim, key=ks[3])
            self.norm2 = eqx.nn.LayerNorm(dim)
            self.mlp1 = eqx.nn.Linear(dim, 2 * dim, key=ks[4])
            self.mlp2 = eqx.nn.Linear(2 * dim, dim, key=ks[5])
            self.head = eqx.nn.Linear(dim, classes, key=ks[6])

        def __call__(self, image):
            x = self.patch_embed(image)  # [dim, side/patch, side/patch]
            x = x.reshape(dim, -1).T
            x = jnp.concatenate([self.cls_token, x], axis=0) + self.pos
            y = jax.vmap(self.norm1)(x)
            x = x + self.attn(y, y, y)
            y = jax.vmap(self.norm2)(x)
            x = x + jax.vmap(lambda t: self.mlp2(jax.nn.gelu(self.mlp1(t))))(y)
            return jax.nn.log_softmax(self.head(x[0]))

    def cross_entropy(model, images, labels):
        log_probs = jax.vmap(model)(images)
        return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))

    loss, params = _eqx_functional(ViT(jax.random.PRNGKey(0)), cross_entropy)
    rng = _rng(9)
    return loss, (params, _normal(rng, n, 3, side, side), _labels(rng, n, classes))
