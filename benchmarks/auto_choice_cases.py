"""The cases of ``auto_choice.py``: the real-model zoo, the peers' MLP, the MC encoder-decoder, the
dropout transformer, and models built to test auto's rule (an auxiliary output, three sums, a
parameter-dominated MLP, issue 20's tanh MLP and its hand-written scan)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zoo as rm
from jax import lax
from models import (
    QUICK_SEED1,
    MLPConfig,
    Seed1Config,
    TransformerConfig,
    mlp_problem,
    seed1_problem,
    transformer_problem,
)


@dataclasses.dataclass
class Case:
    key: str
    title: str
    make: Callable[[], tuple[Callable[..., Any], tuple]]
    n: int
    chunk: int
    serialize_kw: dict[str, Any]  # beside chunk and grad
    argnums: tuple[int, ...] | None = None  # differentiated; None: the floating arguments
    has_aux: bool = False
    peers: Callable[[], dict[str, Callable]] | None = None  # timed beside the modes


def _zoo_case(c: rm.Case) -> Case:
    kw = c.serialize_kwargs()
    chunk = kw.pop("chunk")
    return Case(c.name, f"{c.library}: {c.model}", c.make, c.n, chunk, kw)


def _classifier(rng: np.random.RandomState, n: int, d_in: int, width: int, depth: int, k: int):
    dims = [d_in] + [width] * depth + [k]
    params = [
        (jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32), jnp.zeros(b))
        for a, b in zip(dims[:-1], dims[1:], strict=True)
    ]
    x = jnp.asarray(rng.normal(size=(n, d_in)), jnp.float32)
    y = jnp.asarray(rng.randint(0, k, size=n), jnp.int32)
    return params, x, y


def _hidden(params, x):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.gelu(h @ w + b)
    return h


def make_metrics(n: int = 1024, width: int = 256):
    """Loss, accuracy (through argmax: no gradient) and confidence (a float metric with a
    gradient), differentiated with ``has_aux=True``."""
    params, x, y = _classifier(np.random.RandomState(1), n, 128, width, 3, 10)

    def loss(params, x, y):
        w, b = params[-1]
        logits = _hidden(params, x) @ w + b
        logp = jax.nn.log_softmax(logits)
        ce = -jnp.mean(jnp.take_along_axis(logp, y[:, None], 1))
        accuracy = jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32))
        confidence = jnp.mean(jnp.exp(jnp.max(logp, -1)))
        return ce, (accuracy, confidence)

    return loss, (params, x, y)


def make_three_sums(n: int = 1024, width: int = 256):
    """``sum(w * ce) / sum(w) + 1e-3 * mean(h ** 2)`` with ``w`` from the parameters: three
    gradient-carrying sums over the rows, combined non-linearly after the loop."""
    rng = np.random.RandomState(2)
    params, x, y = _classifier(rng, n, 128, width, 3, 10)
    v = jnp.asarray(rng.normal(size=(width,)) / np.sqrt(width), jnp.float32)

    def loss(params, v, x, y):
        h = _hidden(params, x)
        w_out, b_out = params[-1]
        logp = jax.nn.log_softmax(h @ w_out + b_out)
        ce = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
        weight = jax.nn.sigmoid(h @ v)
        return jnp.sum(weight * ce) / jnp.sum(weight) + 1e-3 * jnp.mean(h**2)

    return loss, (params, v, x, y)


def make_param_dominated(n: int = 64, width: int = 2048, depth: int = 3):
    """Large weights, a small batch: parameters and their gradients dominate memory."""
    cfg = MLPConfig(rows=n, d_in=width, width=width, depth=depth, d_out=16, seed=3)
    return mlp_problem(cfg)


def make_issue20(n: int = 2048, d: int = 384, layers: int = 6):
    """The dense 6-layer tanh MLP of issue 20: ``loss(ws, x)``, rows of ``x`` serialized."""
    rng = np.random.RandomState(20)
    ws = [jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), jnp.float32) for _ in range(layers)]
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    return issue20_loss, (ws, x)


def _issue20_sum(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(h @ w)
    return jnp.sum(h**2)


def issue20_loss(ws, x):
    return _issue20_sum(ws, x) / x.size


def issue20_scan(chunk: int) -> Callable:
    """The hand-written ``lax.scan`` + ``jax.checkpoint`` version of ``issue20_loss``."""

    def loss(ws, x):
        n = x.shape[0]
        xs = x.reshape(n // chunk, chunk, *x.shape[1:])

        @jax.checkpoint
        def body(total, xc):
            return total + _issue20_sum(ws, xc), None

        total, _ = lax.scan(body, jnp.zeros((), x.dtype), xs)
        return total / x.size

    return loss


def make_cases(quick: bool) -> list[Case]:
    """The zoo's cases (four of them when ``quick``), the benchmarks' models, the rule's."""
    zoo = [c for c in rm.CASES if rm.available(c)]
    if quick:
        zoo = [c for c in zoo if c.name in ("eqx-mlp", "flax-vae", "flax-ppo", "optax-l2_loss")]
    return [*(_zoo_case(c) for c in zoo), *_model_cases(quick), *_rule_cases(quick)]


def _model_cases(quick: bool) -> list[Case]:
    mcfg = MLPConfig(rows=512, width=128, depth=3) if quick else MLPConfig(2048, width=384, depth=6)
    scfg = QUICK_SEED1 if quick else Seed1Config()
    tcfg = (
        TransformerConfig(batch=16, seq=32, embed=64, heads=2, layers=1, vocab=128)
        if quick
        else TransformerConfig()
    )
    return [
        Case(
            "peers-mlp",
            f"peers' dense MLP ({mcfg.rows} rows, width {mcfg.width}, {mcfg.depth} layers)",
            lambda: mlp_problem(mcfg),
            mcfg.rows,
            mcfg.rows // 8,
            {"argnums": (1, 2)},
        ),
        Case(
            "mc_vae",
            f"Monte-Carlo encoder-decoder ({scfg.n_samples} samples, automatic axis)",
            lambda: seed1_problem(scfg),
            scfg.n_samples,
            4,
            {},
        ),
        Case(
            "dropout-transformer",
            f"dropout transformer (batch {tcfg.batch}, `argnums=1`)",
            lambda: transformer_problem(tcfg),
            tcfg.batch,
            4,
            {"argnums": 1},
        ),
    ]


def _rule_cases(quick: bool) -> list[Case]:
    rows = 256 if quick else 1024
    i20 = (512, 128) if quick else (2048, 384)
    i20_chunk = i20[0] // 8
    return [
        Case(
            "metrics",
            f"loss + accuracy + confidence, `has_aux=True` ({rows} rows)",
            lambda: make_metrics(rows, 128 if quick else 256),
            rows,
            rows // 8,
            {"argnums": (1, 2)},
            has_aux=True,
        ),
        Case(
            "three-sums",
            f"`sum(w*ce)/sum(w)` + activation penalty: 3 gradient-carrying sums ({rows} rows)",
            lambda: make_three_sums(rows, 128 if quick else 256),
            rows,
            rows // 8,
            {"argnums": (2, 3)},
        ),
        Case(
            "param-dominated",
            "parameter-dominated MLP (3 layers of 2048x2048, 64 rows)"
            if not quick
            else "parameter-dominated MLP (3 layers of 512x512, 32 rows)",
            (lambda: make_param_dominated(32, 512)) if quick else make_param_dominated,
            32 if quick else 64,
            4 if quick else 8,
            {"argnums": (1, 2)},
        ),
        Case(
            "issue20-mlp",
            f"issue 20: dense 6-layer tanh MLP (D {i20[1]}, N {i20[0]}), grads of the weights",
            lambda: make_issue20(*i20),
            i20[0],
            i20_chunk,
            {"argnums": 1},
            argnums=(0,),
            peers=lambda: {"scan+checkpoint": issue20_scan(i20_chunk)},
        ),
    ]
