"""The zoo's cases, by name."""

from __future__ import annotations

import importlib

from .case import Case
from .eqx_nnx import (
    make_eqx_cnn,
    make_eqx_gru,
    make_eqx_mlp,
    make_eqx_vit_block,
    make_nnx_mnist_cnn,
)
from .flax_linen import (
    make_flax_lm1b_block,
    make_flax_mnist_cnn,
    make_flax_ppo,
    make_flax_seq2seq_lstm,
    make_flax_sst2_rnn,
    make_flax_vae,
)
from .hk_numpyro import make_hk_lenet, make_hk_lstm, make_hk_vae, make_numpyro_svi_mvn
from .losses import _optax, make_per_row_indexing

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
