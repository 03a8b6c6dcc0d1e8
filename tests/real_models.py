"""The real-model zoo: small configurations of public example models, serialized as a user would.

Each :class:`Case` is a loss written in the style of a public project's example (the same
layers and calls: Flax linen and NNX, Equinox, Haiku, NumPyro, optax), with random inputs
(no weights, no datasets), sized so that activations over the batch or sample axis dominate
the parameters and so that the three checks of ``tests/test_real_models.py`` run in seconds
on a CPU:

- ``make() -> (loss, args)``: the loss, a plain function of array pytrees, and its arguments;
- how to serialize it: ``argnums=`` / ``axis=`` (microbatching), ``size=`` (an axis born
  inside: Monte-Carlo samples, particles) or neither (automatic);
- ``n``: the size of that axis; every check runs at ``chunk = n // 8``;
- ``expected_stops``: the primitives at which the chunked region may stop (empty by default:
  any stop is a failure of check (a));
- ``xfail``: per check (``"chunked"``, ``"exact"``, ``"memory"``), the known shortfall of the
  library that makes it fail, with the primitive and the measured figure. These are strict,
  so they fail (XPASS) once the library is fixed: then delete the entry.

The models import their library lazily (``make`` imports it), so that this module imports
without the optional ``models`` extra; ``tests/test_real_models.py`` skips a case whose
library is missing.

``python benchmarks/real_models.py`` prints the table of ``docs/real-models.md``.
"""

from __future__ import annotations

import dataclasses
import importlib
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum._budget import temp_bytes_of
from jaxpr_accum._measure import compile_value_and_grad
from tests.oracle import find_eqns

CHECKS = ("chunked", "exact", "memory")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # the pytest id
    library: str  # the project whose example it follows (also the module to import)
    model: str  # what it is, for the table
    make: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]]
    n: int  # the size of the serialized axis
    argnums: int | tuple[int, ...] | None = None
    axis: int | None = 0  # with argnums: the position; else where candidates are born
    size: int | None = None
    expected_stops: frozenset[str] = frozenset()
    xfail: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def chunk(self) -> int:
        return max(1, self.n // 8)

    @property
    def how(self) -> str:
        """The serialization, as the keyword arguments a user writes."""
        if self.argnums is not None:
            return f"argnums={self.argnums}" + (f", axis={self.axis}" if self.axis else "")
        if self.size is not None:
            return f"size={self.size}"
        return "automatic" + (f", axis={self.axis}" if self.axis != 0 else "")

    @property
    def module(self) -> str:
        return {"flax.linen": "flax", "flax.nnx": "flax", "dm-haiku": "haiku"}.get(
            self.library, self.library
        )

    def serialize_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"chunk": self.chunk}
        if self.argnums is not None:
            kw.update(argnums=self.argnums, axis=self.axis)
        if self.size is not None:
            kw["size"] = self.size
        elif self.argnums is None and self.axis != 0:
            kw["axis"] = self.axis
        return kw


def _rng(seed: int) -> np.random.RandomState:
    return np.random.RandomState(seed)


def _normal(rng: np.random.RandomState, *shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def _labels(rng: np.random.RandomState, n: int, classes: int, *shape: int) -> jax.Array:
    return jnp.asarray(rng.randint(0, classes, size=(n, *shape)), jnp.int32)


# ============================================================================================
# Flax linen
# ============================================================================================


def make_flax_vae(n: int = 512):
    """flax/examples/vae: Dense encoder to (mean, logvar), reparameterize with a key, Dense
    decoder to logits, ``binary_cross_entropy_with_logits(...).mean() + kl_divergence.mean()``."""
    import flax.linen as nn

    latents, hidden, features = 20, 256, 784

    class Encoder(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(hidden, name="fc1")(x)
            x = nn.relu(x)
            return nn.Dense(latents, name="fc2_mean")(x), nn.Dense(latents, name="fc2_logvar")(x)

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, z):
            z = nn.Dense(hidden, name="fc1")(z)
            z = nn.relu(z)
            return nn.Dense(features, name="fc2")(z)

    class VAE(nn.Module):
        def setup(self):
            self.encoder = Encoder()
            self.decoder = Decoder()

        def __call__(self, x, z_rng):
            mean, logvar = self.encoder(x)
            std = jnp.exp(0.5 * logvar)
            eps = jax.random.normal(z_rng, logvar.shape)
            z = mean + eps * std
            return self.decoder(z), mean, logvar

    def binary_cross_entropy_with_logits(logits, labels):
        logits = nn.log_sigmoid(logits)
        return -jnp.sum(labels * logits + (1.0 - labels) * jnp.log(-jnp.expm1(logits)), axis=-1)

    def kl_divergence(mean, logvar):
        return -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar), axis=-1)

    model = VAE()
    rng = _rng(0)
    x = jnp.asarray(rng.uniform(size=(n, features)) > 0.5, jnp.float32)
    params = model.init(jax.random.PRNGKey(0), x[:1], jax.random.PRNGKey(1))["params"]

    def loss(params, batch, z_rng):
        recon_x, mean, logvar = model.apply({"params": params}, batch, z_rng)
        bce = binary_cross_entropy_with_logits(recon_x, batch).mean()
        kld = kl_divergence(mean, logvar).mean()
        return bce + kld

    return loss, (params, x, jax.random.PRNGKey(2))


def make_flax_mnist_cnn(n: int = 64):
    """flax/examples/mnist (linen): Conv(32) relu avg_pool Conv(64) relu avg_pool Dense(256)
    relu Dense(10), ``optax.softmax_cross_entropy`` on one-hot labels."""
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(features=32, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.Conv(features=64, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.Dense(features=256)(x)
            x = nn.relu(x)
            return nn.Dense(features=10)(x)

    cnn = CNN()
    rng = _rng(1)
    images = _normal(rng, n, 28, 28, 1)
    labels = _labels(rng, n, 10)
    params = cnn.init(jax.random.PRNGKey(0), images[:1])["params"]

    def loss(params, images, labels):
        logits = cnn.apply({"params": params}, images)
        one_hot = jax.nn.one_hot(labels, 10)
        return jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot))

    return loss, (params, images, labels)


def make_flax_lm1b_block(n: int = 64):
    """flax/examples/lm1b: token + learned position embeddings, a pre-norm decoder block
    (causal ``MultiHeadDotProductAttention``, dropout, MLP), logits via ``embed.attend``, and
    the weighted cross-entropy normalised by the token count ``weights.sum()``."""
    import flax.linen as nn
    import optax

    vocab, length, emb, heads, mlp, rate = 128, 32, 64, 4, 128, 0.1

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask, deterministic):
            y = nn.LayerNorm()(x)
            y = nn.MultiHeadDotProductAttention(
                num_heads=heads, qkv_features=emb, dropout_rate=rate, deterministic=deterministic
            )(y, y, mask=mask)
            x = x + nn.Dropout(rate=rate)(y, deterministic=deterministic)
            z = nn.LayerNorm()(x)
            z = nn.Dense(mlp)(z)
            z = nn.relu(z)
            z = nn.Dropout(rate=rate)(z, deterministic=deterministic)
            z = nn.Dense(emb)(z)
            z = nn.Dropout(rate=rate)(z, deterministic=deterministic)
            return x + z

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, inputs, deterministic=False):
            embed = nn.Embed(vocab, emb, embedding_init=nn.initializers.normal(1.0))
            pos = self.param("pos_embedding", nn.initializers.normal(0.02), (1, length, emb))
            # shift right, as lm1b's decoder does
            shifted = jnp.pad(inputs, ((0, 0), (1, 0)))[:, :-1]
            x = embed(shifted) + pos
            x = nn.Dropout(rate=rate)(x, deterministic=deterministic)
            mask = nn.combine_masks(
                nn.make_attention_mask(inputs > 0, inputs > 0), nn.make_causal_mask(inputs)
            )
            x = Block()(x, mask, deterministic)
            x = nn.LayerNorm()(x)
            return embed.attend(x) / jnp.sqrt(emb)

    model = Decoder()
    rng = _rng(2)
    tokens = jnp.asarray(rng.randint(1, vocab, size=(n, length)), jnp.int32)
    tokens = tokens.at[:, -4:].set(0)  # padding at the end, as in packed lm1b batches
    params = model.init(jax.random.PRNGKey(0), tokens[:1], deterministic=True)["params"]

    def loss(params, inputs, dropout_rng):
        logits = model.apply({"params": params}, inputs, rngs={"dropout": dropout_rng})
        weights = jnp.where(inputs > 0, 1.0, 0.0)
        onehot = jax.nn.one_hot(inputs, vocab)
        per_token = optax.softmax_cross_entropy(logits, onehot) * weights
        return per_token.sum() / weights.sum()

    return loss, (params, tokens, jax.random.PRNGKey(3))


def make_flax_seq2seq_lstm(n: int = 64):
    """flax/examples/seq2seq: an ``nn.RNN(nn.OptimizedLSTMCell)`` encoder whose final carry
    starts an ``nn.RNN(nn.OptimizedLSTMCell)`` decoder (teacher forcing), ``nn.Dense`` to the
    vocabulary, cross-entropy on one-hot targets."""
    import flax.linen as nn
    import optax

    vocab, in_len, out_len, hidden = 16, 8, 6, 64

    class Seq2seq(nn.Module):
        @nn.compact
        def __call__(self, encoder_inputs, decoder_inputs):
            encoder = nn.RNN(nn.OptimizedLSTMCell(hidden), return_carry=True, name="encoder")
            carry, _ = encoder(encoder_inputs)
            decoder = nn.RNN(nn.OptimizedLSTMCell(hidden), name="decoder")
            outputs = decoder(decoder_inputs, initial_carry=carry)
            return nn.Dense(vocab, name="logits")(outputs)

    model = Seq2seq()
    rng = _rng(3)
    enc = jax.nn.one_hot(_labels(rng, n, vocab, in_len), vocab)
    tgt = jax.nn.one_hot(_labels(rng, n, vocab, out_len), vocab)
    params = model.init(jax.random.PRNGKey(0), enc[:1], tgt[:1])["params"]

    def loss(params, encoder_inputs, decoder_inputs):
        logits = model.apply({"params": params}, encoder_inputs, decoder_inputs[:, :-1])
        return optax.softmax_cross_entropy(logits, decoder_inputs[:, 1:]).sum(-1).mean()

    return loss, (params, enc, tgt)


def make_flax_ppo(n: int = 128):
    """flax/examples/ppo: the Atari ``ActorCritic`` (Conv 8x8/4, 4x4/2, 3x3/1, Dense 512,
    policy and value heads) on smaller frames, and the clipped PPO loss: ``log_softmax``,
    the taken action's log-probability by ``jax.vmap(lambda lp, a: lp[a])``, value loss,
    entropy bonus."""
    import flax.linen as nn

    actions = 6

    class ActorCritic(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x.astype(jnp.float32) / 255.0
            x = nn.Conv(features=16, kernel_size=(8, 8), strides=(4, 4), name="conv1")(x)
            x = nn.relu(x)
            x = nn.Conv(features=32, kernel_size=(4, 4), strides=(2, 2), name="conv2")(x)
            x = nn.relu(x)
            x = nn.Conv(features=32, kernel_size=(3, 3), strides=(1, 1), name="conv3")(x)
            x = nn.relu(x)
            x = x.reshape((x.shape[0], -1))
            x = nn.Dense(features=256, name="hidden")(x)
            x = nn.relu(x)
            logits = nn.Dense(features=actions, name="logits")(x)
            policy_log_probabilities = nn.log_softmax(logits)
            value = nn.Dense(features=1, name="value")(x)
            return policy_log_probabilities, value

    model = ActorCritic()
    rng = _rng(4)
    states = jnp.asarray(rng.uniform(0, 255, size=(n, 44, 44, 4)), jnp.float32)
    acts = _labels(rng, n, actions)
    old_log_probs = _normal(rng, n, scale=0.1) - 1.8
    returns = _normal(rng, n)
    advantages = _normal(rng, n)
    params = model.init(jax.random.PRNGKey(0), states[:1])["params"]
    clip_param, vf_coeff, entropy_coeff = 0.1, 0.5, 0.01

    def loss(params, states, acts, old_log_probs, returns, advantages):
        log_probs, values = model.apply({"params": params}, states)
        values = values[:, 0]
        probs = jnp.exp(log_probs)
        value_loss = jnp.mean(jnp.square(returns - values), axis=0)
        entropy = jnp.sum(-probs * log_probs, axis=1).mean()
        log_probs_act_taken = jax.vmap(lambda lp, a: lp[a])(log_probs, acts)
        ratios = jnp.exp(log_probs_act_taken - old_log_probs)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        pg_loss = ratios * advantages
        clipped_loss = advantages * jax.lax.clamp(1.0 - clip_param, ratios, 1.0 + clip_param)
        ppo_loss = -jnp.mean(jnp.minimum(pg_loss, clipped_loss), axis=0)
        return ppo_loss + vf_coeff * value_loss - entropy_coeff * entropy

    return loss, (params, states, acts, old_log_probs, returns, advantages)


def make_flax_sst2_rnn(n: int = 64):
    """flax/examples/sst2: an ``nn.RNN(nn.OptimizedLSTMCell)`` over padded sequences with
    ``seq_lengths=`` (the final carry is selected per row at its own length), a ``Dense``
    classifier on the final hidden state, integer-label cross-entropy."""
    import flax.linen as nn
    import optax

    length, features, hidden, classes = 10, 16, 64, 2

    class TextClassifier(nn.Module):
        @nn.compact
        def __call__(self, inputs, lengths):
            rnn = nn.RNN(nn.OptimizedLSTMCell(hidden), return_carry=True)
            (_, h), _ = rnn(inputs, seq_lengths=lengths)
            return nn.Dense(classes)(nn.tanh(nn.Dense(hidden)(h)))

    model = TextClassifier()
    rng = _rng(14)
    inputs = _normal(rng, n, length, features)
    lengths = jnp.asarray(rng.randint(3, length + 1, size=(n,)), jnp.int32)
    labels = _labels(rng, n, classes)
    params = model.init(jax.random.PRNGKey(0), inputs[:1], lengths[:1])["params"]

    def loss(params, inputs, lengths, labels):
        logits = model.apply({"params": params}, inputs, lengths)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss, (params, inputs, lengths, labels)


# ============================================================================================
# Flax NNX
# ============================================================================================


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


# ============================================================================================
# Haiku
# ============================================================================================


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


# ============================================================================================
# optax losses on a small MLP head (per-example losses, averaged)
# ============================================================================================


def _optax_case(which: str, n: int = 128):
    """A two-layer MLP to ``[n, classes]`` outputs and the optax loss ``which`` on them."""
    import optax

    classes, hidden, features = 64, 256, 64
    rng = _rng(zlib.crc32(which.encode()) % 1000)
    params = {
        "w1": _normal(rng, features, hidden, scale=features**-0.5),
        "b1": jnp.zeros(hidden),
        "w2": _normal(rng, hidden, classes, scale=hidden**-0.5),
        "b2": jnp.zeros(classes),
    }
    x = _normal(rng, n, features)

    def head(params, x):
        h = jax.nn.gelu(x @ params["w1"] + params["b1"])
        return h @ params["w2"] + params["b2"]

    if which == "ctc_loss":
        frames, labels_len = 16, 5
        x = _normal(rng, n, frames, features)
        labels = _labels(rng, n, classes - 1, labels_len) + 1
        logit_paddings = jnp.zeros((n, frames), jnp.float32)
        label_paddings = jnp.zeros((n, labels_len), jnp.float32)

        def loss(params, x, labels, logit_paddings, label_paddings):
            logits = head(params, x)
            return optax.ctc_loss(logits, logit_paddings, labels, label_paddings).mean()

        return loss, (params, x, labels, logit_paddings, label_paddings)

    if which in ("softmax_cross_entropy_with_integer_labels", "hinge_loss"):
        if which == "hinge_loss":
            targets = jnp.asarray(rng.choice([-1.0, 1.0], size=(n, classes)), jnp.float32)
        else:
            targets = _labels(rng, n, classes)
    elif which in ("softmax_cross_entropy", "kl_divergence"):
        targets = jax.nn.softmax(_normal(rng, n, classes))
    elif which == "sigmoid_binary_cross_entropy":
        targets = jnp.asarray(rng.uniform(size=(n, classes)) > 0.5, jnp.float32)
    else:
        targets = _normal(rng, n, classes)

    fn = getattr(optax, which)

    def loss(params, x, targets):
        out = head(params, x)
        if which == "kl_divergence":
            out = jax.nn.log_softmax(out)
        return jnp.mean(fn(out, targets))

    return loss, (params, x, targets)


def make_per_row_indexing(n: int = 128):
    """The per-row lookup ``-log_softmax(logits)[jnp.arange(n), labels].mean()`` (a gather
    whose indices pair an iota along the batch with the labels) after the MLP head."""
    _, (params, x, _) = _optax_case("l2_loss", n)
    labels = _labels(_rng(15), n, 64)

    def loss(params, x, labels):
        h = jax.nn.gelu(x @ params["w1"] + params["b1"])
        log_probs = jax.nn.log_softmax(h @ params["w2"] + params["b2"])
        return -log_probs[jnp.arange(x.shape[0]), labels].mean()

    return loss, (params, x, labels)


def _optax(which: str, n: int = 128, **kw: Any) -> Case:
    argnums = (1, 2, 3, 4) if which == "ctc_loss" else (1, 2)
    return Case(
        name=f"optax-{which}",
        library="optax",
        model=f"MLP head + `optax.{which}`",
        make=lambda: _optax_case(which, n),
        n=n,
        argnums=argnums,
        **kw,
    )


# ============================================================================================
# The cases
# ============================================================================================

CASES: list[Case] = [
    Case("flax-vae", "flax.linen", "VAE (Flax's own VAE example)", make_flax_vae, 512, argnums=1),
    Case("flax-mnist-cnn", "flax.linen", "MNIST CNN", make_flax_mnist_cnn, 64, argnums=(1, 2)),
    Case("flax-lm1b-block", "flax.linen", "lm1b decoder block", make_flax_lm1b_block, 64, 1),
    Case(
        "flax-seq2seq-lstm",
        "flax.linen",
        "seq2seq, `nn.RNN(OptimizedLSTMCell)`",
        make_flax_seq2seq_lstm,
        64,
        argnums=(1, 2),
    ),
    Case(
        "flax-ppo",
        "flax.linen",
        "PPO actor-critic",
        make_flax_ppo,
        128,
        argnums=(1, 2, 3, 4, 5),
        # the advantages are normalised by their mean and std over the minibatch: a statistic
        # of the whole axis, so that subtraction runs after the loop (docs/how-it-works.md, Plan)
        expected_stops=frozenset({"sub"}),
    ),
    Case(
        "flax-sst2-rnn",
        "flax.linen",
        "sst2, `nn.RNN(..., seq_lengths=)`",
        make_flax_sst2_rnn,
        64,
        argnums=(1, 2, 3),
    ),
    Case("nnx-mnist-cnn", "flax.nnx", "MNIST CNN (NNX)", make_nnx_mnist_cnn, 64, argnums=(1, 2)),
    Case("eqx-cnn", "equinox", "MNIST CNN", make_eqx_cnn, 512, argnums=(1, 2)),
    Case("eqx-mlp", "equinox", "`eqx.nn.MLP`", make_eqx_mlp, 1024, argnums=(1, 2)),
    Case("eqx-gru", "equinox", "`eqx.nn.GRUCell` RNN", make_eqx_gru, 64, argnums=(1, 2)),
    Case("eqx-vit", "equinox", "ViT block", make_eqx_vit_block, 64, argnums=(1, 2)),
    Case("hk-lenet", "dm-haiku", "LeNet", make_hk_lenet, 64, argnums=(1, 2)),
    Case(
        "hk-vae",
        "dm-haiku",
        "VAE (Haiku's own VAE example)",
        make_hk_vae,
        512,
        argnums=2,
    ),
    Case(
        "hk-lstm",
        "dm-haiku",
        "`hk.LSTM` + `hk.dynamic_unroll` (time-major)",
        make_hk_lstm,
        64,
        argnums=(1, 2),
        axis=1,
    ),
    Case(
        "hk-lstm-auto",
        "dm-haiku",
        "`hk.LSTM` + `hk.dynamic_unroll` (time-major)",
        make_hk_lstm,
        64,
        axis=None,  # the batch is dimension 1; at the default 0, the plan says to pass this
    ),
    Case(
        "numpyro-svi-gp",
        "numpyro",
        "SVI, GP with `MultivariateNormal`, vectorised particles",
        make_numpyro_svi_mvn,
        64,
        size=64,
    ),
    _optax("softmax_cross_entropy"),
    _optax("softmax_cross_entropy_with_integer_labels"),
    _optax("sigmoid_binary_cross_entropy"),
    _optax("huber_loss"),
    _optax("l2_loss"),
    _optax("cosine_distance"),
    _optax("kl_divergence"),
    _optax("hinge_loss"),
    _optax("ctc_loss", n=64),
    Case(
        "per-row-indexing",
        "jax",
        "MLP head + `log_probs[jnp.arange(n), labels]`",
        make_per_row_indexing,
        128,
        argnums=(1, 2),
    ),
]


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def available(c: Case) -> bool:
    try:
        importlib.import_module(c.module)
    except ImportError:
        return False
    return True


# ============================================================================================
# The three checks' measurements (shared by the test and ``benchmarks/real_models.py``)
# ============================================================================================

LOOPS = ("scan", "while")
MEMORY_LIMIT = 0.6  # check (c): serialized temp bytes at most this times the original's


def count_loops(jaxpr: Any) -> int:
    """The scan and while equations of ``jaxpr``, recursively into every sub-jaxpr."""
    return len(find_eqns(jaxpr, *LOOPS))


def stop_primitive(stop: str) -> str:
    """The primitive of one of ``Plan.stops`` (printed as ```prim` at file:line: why``)."""
    return stop.split("`")[1] if stop.startswith("`") else stop


def float_argnums(args: tuple[Any, ...]) -> tuple[int, ...]:
    """The arguments that are (pytrees of) floating arrays only: what a user differentiates."""

    def is_float(leaf: Any) -> bool:
        return isinstance(leaf, (jax.Array, np.ndarray)) and jnp.issubdtype(
            leaf.dtype, jnp.floating
        )

    out = []
    for i, a in enumerate(args):
        leaves = jax.tree.leaves(_nnx_state(a))
        if leaves and all(is_float(x) for x in leaves):
            out.append(i)
    return tuple(out)


def _nnx_state(a: Any) -> Any:
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        return a
    return nnx.state(a) if isinstance(a, nnx.Module) else a


def temp_bytes(f: Callable[..., Any], args: tuple[Any, ...], argnums: tuple[int, ...]) -> int:
    """XLA's temp bytes of ``jit(value_and_grad(f, argnums))`` at ``args``."""
    measured = temp_bytes_of(compile_value_and_grad(f, args, argnums))
    assert measured is not None, "this backend does not report compiled memory"
    return measured


@dataclasses.dataclass
class Measured:
    """Everything the three checks look at, for one case at ``chunk = n // 8``."""

    loops_original: int
    loops_serialized: int
    body: int
    stops: list[str]
    temp_original: int
    temp_serialized: int
    seconds: float = 0.0  # of the measurement (trace, plan, compile both)

    @property
    def ratio(self) -> float:
        return self.temp_serialized / max(1, self.temp_original)

    def unexpected_stops(self, expected: frozenset[str]) -> list[str]:
        return [s for s in self.stops if stop_primitive(s) not in expected]


def serialized(c: Case, loss: Callable[..., Any]) -> Any:
    import jaxpr_accum as ja

    return ja.serialize_axis(loss, **c.serialize_kwargs())


def measure(c: Case, loss: Callable[..., Any], args: tuple[Any, ...]) -> Measured:
    """The structure (loops, body, stops) and the memory of ``c`` serialized at its chunk."""
    import time

    start = time.perf_counter()
    sf = serialized(c, loss)
    plan = sf.explain(*args)
    diff = float_argnums(args)
    m = Measured(
        loops_original=count_loops(jax.make_jaxpr(loss)(*args)),
        loops_serialized=count_loops(sf.jaxpr(*args)),
        body=plan.counts["body"],
        stops=list(plan.stops),
        temp_original=temp_bytes(loss, args, diff),
        temp_serialized=temp_bytes(sf, args, diff),
    )
    m.seconds = time.perf_counter() - start
    return m
