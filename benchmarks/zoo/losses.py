"""The zoo's optax losses on a small MLP head (per-example losses, averaged), and per-row
indexing of log-probabilities."""

from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp

from .case import Case, _labels, _normal, _rng


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
