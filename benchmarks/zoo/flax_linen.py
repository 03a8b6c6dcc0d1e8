"""The zoo's Flax linen models: Flax's own examples (VAE, MNIST CNN, lm1b block, seq2seq
LSTM, PPO, sst2 RNN), each importing Flax when built."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .case import _labels, _normal, _rng


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
