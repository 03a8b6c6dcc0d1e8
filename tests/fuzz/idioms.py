"""Heads and callbacks from the fields of issue 30, merged into the grammar (``programs.py``).

Each head is a scalar term ``term{i}`` written as its field writes it (``{S}``: the logits,
``s`` or ``s / t``; ``{i}``: the head's index), with the entries of ``p`` it reads
(``params``, initialised in ``programs._PARAM_INIT``), its imports and module-level
definitions (``preamble``):

* **DP-SGD** (:data:`DPSGD`): ``vmap(grad(per_example_loss))`` over the rows of ``h`` of a
  small 1-D ``lax.conv_general_dilated`` net or a 2-D Flax ``nn.Conv`` net, each example's
  gradient tree clipped by its norm, summed over the examples (JAX batches the weight
  gradient as a grouped convolution whose groups are the examples);
* **along the axis** (:data:`ALONG_AXIS`): antithetic ``concatenate([z, -z])`` with
  ``noise.T @ fitness`` (OpenAI-ES), slices of one value rejoined (a roll by hand, halves
  put back), a roll then a reversal, ``jnp.roll`` with static shifts, ``[::-1]`` against
  position weights, two halves processed differently and joined;
* **pairwise with index constants** (:data:`PAIRWISE`): labels ``arange(n) % 2`` with ``==``
  (the N x N positive mask) and an ``eye`` mask, positives ``roll(arange(n), n // 2)`` and
  ``(arange(n) + n // 2) % n``, ``optax.losses.ntxent`` with labels built inside, and
  ``z @ z[::-1].T``.

The embeddings are normalised with ``+ 0.1`` under the square root and the temperatures are
0.5 or more, so that every term stays well-conditioned at float32.

:data:`CALLBACKS`: a counting user callback placed in ``f`` (``jax.debug.callback`` or an
ordered ``io_callback``, on the loss or on a per-example value); the runner compares how many
values the callbacks saw (``calls()``) under the serialized stack with the original's. Values
rather than invocations, because a chunked loop legitimately calls a per-example callback once
per chunk; on the scalar loss the two are the same. ``io_callback`` has no JVP, so it is
placed on ``stop_gradient`` of its value.
"""

from __future__ import annotations

from typing import Any

_CONV2D = """
class Conv2(nn.Module):
    @nn.compact
    def __call__(self, z):
        return nn.Conv(2, (2, 2))(z)


CONV2 = Conv2()
"""

_CLIP_SUM = """
            nrm{i} = jnp.sqrt(
                sum(jnp.sum(v.reshape(v.shape[0], -1) ** 2, axis=1) for v in jax.tree.leaves(g{i}))
                + 1e-6
            )
            sc{i} = 1.0 / jnp.maximum(1.0, nrm{i} / 0.1)
            gs{i} = jax.tree.map(lambda v: jnp.tensordot(sc{i}, v, axes=1), g{i})
            term{i} = sum(
                jnp.sum(a * b) for a, b in zip(jax.tree.leaves(gs{i}), jax.tree.leaves(cp{i}))
            )
"""

DPSGD: dict[str, dict[str, Any]] = {
    "dpsgd_conv1d": {
        "src": """
            def pel{i}(cp, r):  # one example: a 1-D signal of H positions, one channel
                z = lax.conv_general_dilated(r[None, None, :], cp['w'], (1,), 'SAME')
                return jnp.mean(jnp.tanh(z + cp['b'][None, :, None]) ** 2)

            cp{i} = {'w': p['cw'], 'b': p['cb']}
            g{i} = jax.vmap(jax.grad(pel{i}), in_axes=(None, 0))(cp{i}, h)
            """
        + _CLIP_SUM,
        "params": ("cw", "cb"),
        "logits": False,
    },
    "dpsgd_conv2d_flax": {
        "src": """
            def pel{i}(cp, r):  # one example: the H x H image outer(r, r)
                z = CONV2.apply(cp, jnp.outer(r, r)[None, :, :, None])
                return jnp.mean(jnp.tanh(z) ** 2)

            cp{i} = p['conv']
            g{i} = jax.vmap(jax.grad(pel{i}), in_axes=(None, 0))(cp{i}, h)
            """
        + _CLIP_SUM,
        "params": ("conv",),
        "logits": False,
        "imports": ("import flax.linen as nn",),
        "preamble": _CONV2D,
    },
}

ALONG_AXIS: dict[str, dict[str, Any]] = {
    "antithetic_concat": {
        "src": """
            z{i} = jnp.concatenate([{S}, -{S}])
            fit{i} = jnp.tanh(z{i}[:, 0] + 0.3)
            term{i} = jnp.sum(z{i}.T @ fit{i}) / 8
            """
    },
    "roll_shift": {"src": "term{i} = jnp.mean(jnp.roll({S}, 1, axis=0) * {S})"},
    "roll_negative_shift": {
        "src": "term{i} = jnp.mean(jnp.tanh(jnp.roll(h, -3, axis=0)) * {S}[:, :1])"
    },
    "reverse_rows": {
        "src": "term{i} = jnp.sum(jnp.tanh({S}[::-1, 0]) * jnp.arange(x.shape[0]) / x.shape[0])"
    },
    "concat_halves": {
        "src": """
            half{i} = x.shape[0] // 2
            both{i} = jnp.concatenate([jnp.tanh({S}[:half{i}]), jnp.sin({S}[half{i}:])])
            term{i} = jnp.mean(both{i} ** 2) + jnp.sum(both{i}[:, 0] * {S}[:, -1]) / 16
            """
    },
    "rejoined_slices": {
        "src": """
            cut{i} = x.shape[0] // 3 + 1
            back{i} = jnp.concatenate([{S}[cut{i}:], {S}[:cut{i}]])
            back{i} = back{i} + jnp.concatenate([{S}[:cut{i}], -0.5 * {S}[cut{i}:]])
            term{i} = jnp.mean(jnp.tanh(back{i}) * {S})
            """
    },
    "roll_then_reverse": {
        "src": "term{i} = jnp.mean(jnp.tanh(jnp.roll({S}, 2, axis=0)[::-1]) * {S})"
    },
}

_UNIT = "zn{i} = h / jnp.sqrt(jnp.sum(h * h, axis=1, keepdims=True) + 0.1)"

PAIRWISE: dict[str, dict[str, Any]] = {
    "supcon_arange_labels": {
        "src": f"""
            {_UNIT}
            n{{i}} = x.shape[0]
            lab{{i}} = jnp.arange(n{{i}}) % 2
            eye{{i}} = jnp.eye(n{{i}}, dtype=bool)
            pos{{i}} = (lab{{i}}[:, None] == lab{{i}}[None, :]) & ~eye{{i}}
            sim{{i}} = zn{{i}} @ zn{{i}}.T / 0.5
            lse{{i}} = jax.nn.logsumexp(jnp.where(eye{{i}}, -1e9, sim{{i}}), axis=1)
            term{{i}} = -jnp.sum(jnp.where(pos{{i}}, sim{{i}} - lse{{i}}[:, None], 0.0)) / (
                jnp.maximum(pos{{i}}.sum(), 1)
            )
            """,
        "logits": False,
    },
    "simclr_roll_positives": {
        "src": f"""
            {_UNIT}
            n{{i}} = x.shape[0]
            pos{{i}} = jnp.roll(jnp.arange(n{{i}}), n{{i}} // 2)
            sim{{i}} = zn{{i}} @ zn{{i}}.T / 0.5
            term{{i}} = jnp.mean(
                jax.nn.logsumexp(sim{{i}}, axis=1) - sim{{i}}[jnp.arange(n{{i}}), pos{{i}}]
            )
            """,
        "logits": False,
    },
    "simclr_modular_positives": {
        "src": f"""
            {_UNIT}
            n{{i}} = x.shape[0]
            pos{{i}} = (jnp.arange(n{{i}}) + n{{i}} // 2) % n{{i}}
            sim{{i}} = zn{{i}} @ zn{{i}}.T / 0.5
            term{{i}} = jnp.mean(
                jax.nn.logsumexp(sim{{i}}, axis=1) - sim{{i}}[jnp.arange(n{{i}}), pos{{i}}]
            )
            """,
        "logits": False,
    },
    "ntxent_optax": {
        "src": "term{i} = optax.losses.ntxent("
        "h, jnp.arange(x.shape[0]) % max(x.shape[0] // 2, 1), 0.5)",
        "logits": False,
        "imports": ("import optax",),
    },
    "gram_reversed": {
        "src": "term{i} = jnp.mean(jax.nn.logsumexp(h @ h[::-1].T, axis=1))",
        "logits": False,
    },
}

HEADS = {**DPSGD, **ALONG_AXIS, **PAIRWISE}

PARAM_INIT = {
    "cw": "(rng.normal(size=(2, 1, 2)) * 0.5).astype(np.float32)",
    "cb": "(rng.normal(size=(2,)) * 0.1).astype(np.float32)",
    "conv": "jax.tree.map(np.asarray, CONV2.init(jax.random.key(int(rng.integers(2**30))), "
    "np.zeros((1, {H}, {H}, 1), np.float32)))",
}

_COUNTER = """
SEEN = [0]


def count(v):  # the user's callback: counts the values it sees
    SEEN[0] += int(np.size(v))


def calls():  # the values the callbacks saw since the last call (and reset)
    jax.effects_barrier()
    n, SEEN[0] = SEEN[0], 0
    return n
"""

#: name: (the line placed in ``f``, where: after the logits ``s`` or on the ``loss``)
CALLBACKS: dict[str, tuple[str, str]] = {
    "debug_on_loss": ("jax.debug.callback(count, loss)", "loss"),
    "io_on_loss": ("io_callback(count, None, lax.stop_gradient(loss), ordered=True)", "loss"),
    "debug_per_example": ("jax.debug.callback(count, s[:, 0])", "s"),
    "io_per_example": (
        "io_callback(count, None, lax.stop_gradient(s[:, 0]), ordered=True)",
        "s",
    ),
}
CALLBACK_PREAMBLE = _COUNTER
CALLBACK_IMPORTS = ("from jax.experimental import io_callback",)
