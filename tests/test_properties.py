"""Hypothesis generates programs, shapes and chunk sizes; the original is the oracle.

A program is a chain of per-example operations on a value ``h`` of shape ``[N, *features]``:
dense layers (``h @ W + b``), convolutions (a per-sample NHWC ``lax.conv_general_dilated``
under ``jax.vmap``, so that the batch shows up as a merged ``[N * 1, ...]`` conv batch),
elementwise functions, broadcasting (a per-feature bias, a scalar scale), reshapes merging two
feature axes, time-major dense layers (``hk.BatchApply``: the first feature axis moved in front
of the batch and merged with it, ``[T * N, ...]``, so the batch is a middle factor), reductions
over feature axes, custom_jvp / custom_vjp functions (shape-polymorphic ones, directly or per
example under ``jax.vmap``, and ones whose rule mixes the batch, which must run unchunked and
exactly), per-example ``vmap``s, and nested ``jit``s closing over a constant along the batch
(also inside a ``scan`` body), followed by a reduction of every feature axis and a sum over the
batch axis (optionally also returning the per-example values, which the rewriter must stack).

Two families:

* microbatching: the batch is the input ``x``, serialized with ``argnums=0``;
* Monte-Carlo: the axis is born inside from ``jax.random.normal(key, (S, *mu.shape))`` and
  serialized with ``size=S`` (S is 7 or 11, which no feature dimension can equal: features
  are products of numbers in 1..6).

Chunk sizes are drawn from {1, N, N + 3, a divisor of N, a non-divisor of N}. Values and
gradients with respect to every float input are compared
(``jaxpr_accum.testing.assert_matches_original``).

The number of examples comes from the Hypothesis profile (see ``conftest.py``).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from jax import lax

import jaxpr_accum as ja

from .oracle import GRAD_MODES, assert_matches_original, find_eqns

PROPERTY_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

UNARY = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "sin": jnp.sin,
}
BINARY = {
    "x*tanh(x)": lambda h: h * jnp.tanh(h),
    "x+sin(x)": lambda h: h + jnp.sin(h),
    "x*x": lambda h: h * h,
}


# Custom derivative rules, as users write them. Shape-polymorphic ones are chunked; those
# whose rule mixes positions along the batch must run unchunked, and exactly.
@jax.custom_vjp
def clip_grad(v: jax.Array) -> jax.Array:
    return v


clip_grad.defvjp(lambda v: (v, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@jax.custom_vjp
def center_grad(v: jax.Array) -> jax.Array:
    return v


center_grad.defvjp(lambda v: (v, None), lambda _, g: (g - g.mean(0),))  # a batch statistic


@jax.custom_jvp
def soft(v: jax.Array) -> jax.Array:
    return jnp.logaddexp(v, 0.0)


soft.defjvp(lambda p, t: (soft(p[0]), jax.nn.sigmoid(p[0]) * t[0]))


@jax.custom_jvp
def batch_scaled(v: jax.Array) -> jax.Array:
    return v * 1.0


batch_scaled.defjvp(lambda p, t: (p[0] * 1.0, t[0] * (1 + jnp.mean(p[0] ** 2, axis=0))))

CUSTOM = {  # name -> (function, applied per example under vmap, mixes the batch)
    "clip_grad": (clip_grad, False, False),
    "vmap(clip_grad)": (clip_grad, True, False),
    "soft": (soft, False, False),
    "vmap(soft)": (soft, True, False),
    "center_grad": (center_grad, False, True),
    "batch_scaled": (batch_scaled, False, True),
}


# --------------------------------------------------------------------------------------
# Program generation: a list of op specs (pure data, printed by Hypothesis on failure)
# --------------------------------------------------------------------------------------


@st.composite
def op_chains(draw: st.DrawFn) -> tuple[tuple[int, ...], list[tuple[Any, ...]], str]:
    """Per-example feature shape, a chain of ops, and the final feature reduction."""
    rank = draw(st.sampled_from([1, 2, 3]))  # number of feature axes
    if rank == 3:  # an image: H, W, C (kept small: convs are the slowest to compile)
        feat = (
            draw(st.integers(1, 4)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 3)),
        )
    else:
        feat = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    shape = feat
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 5))):
        choices = ["dense", "unary", "binary", "bias", "scale", "custom", "vmap", "jit_const"]
        if len(shape) == 3:
            choices.append("conv")
        if len(shape) >= 2:
            choices += ["merge", "reduce", "time_major"]
        op = draw(st.sampled_from(choices))
        if op in ("dense", "time_major"):
            g = draw(st.integers(1, 6))
            ops.append((op, shape[-1], g))
            shape = (*shape[:-1], g)
        elif op == "conv":
            k = draw(st.sampled_from([1, 2, 3]))
            c = draw(st.integers(1, 3))
            ops.append(("conv", k, shape[-1], c))
            shape = (*shape[:-1], c)
        elif op == "unary":
            ops.append(("unary", draw(st.sampled_from(sorted(UNARY)))))
        elif op == "binary":
            ops.append(("binary", draw(st.sampled_from(sorted(BINARY)))))
        elif op == "bias":
            ops.append(("bias", shape[-1]))
        elif op == "custom":
            names = sorted(n for n in CUSTOM if ops or not CUSTOM[n][2])  # chunk something first
            ops.append(("custom", draw(st.sampled_from(names))))
        elif op == "vmap":
            ops.append(("vmap",))
        elif op == "jit_const":
            ops.append(("jit_const", draw(st.booleans())))
        elif op == "scale":
            ops.append(("scale",))
        elif op == "merge":
            ops.append(("merge",))
            shape = (*shape[:-2], shape[-2] * shape[-1])
        elif op == "reduce":
            kind = draw(st.sampled_from(["sum", "max"]))
            ax = draw(st.integers(0, len(shape) - 1))
            ops.append(("reduce", kind, ax))
            shape = shape[:ax] + shape[ax + 1 :]
    final = draw(st.sampled_from(["sum", "max"]))
    return feat, ops, final


@st.composite
def chunks_for(draw: st.DrawFn, n: int) -> int:
    """1, N, N + 3, a random divisor, or a random non-divisor of N."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    non_divisors = [d for d in range(2, n) if n % d != 0]
    options = [st.just(1), st.just(n), st.just(n + 3), st.sampled_from(divisors)]
    if non_divisors:
        options.append(st.sampled_from(non_divisors))
    return draw(st.one_of(options))


def make_params(ops: list[tuple[Any, ...]], seed: int) -> list[Any]:
    rs = np.random.RandomState(seed)

    def normal(*shape: int, scale: float = 1.0) -> jax.Array:
        return jnp.asarray(rs.normal(size=shape) * scale, jnp.float32)

    params: list[Any] = []
    for op in ops:
        if op[0] in ("dense", "time_major"):
            _, a, g = op
            params.append({"w": normal(a, g, scale=1 / math.sqrt(a)), "b": normal(g, scale=0.1)})
        elif op[0] == "conv":
            _, k, cin, cout = op
            params.append(normal(k, k, cin, cout, scale=1 / math.sqrt(k * k * cin)))
        elif op[0] == "bias":
            params.append(normal(op[1]))
        elif op[0] == "scale":
            params.append(jnp.float32(rs.uniform(0.5, 1.5)))
        else:
            params.append(None)
    return params


def _conv_one(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """One sample [H, W, C] -> [H, W, C']: NHWC conv with a conv batch of 1."""
    y = lax.conv_general_dilated(
        x[None],
        kernel,
        window_strides=(1, 1),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
    return y[0]


def _jit_scale(const: np.ndarray) -> Any:
    return jax.jit(lambda a: a * const)


def apply_chain(ops: list[tuple[Any, ...]], params: list[Any], h: jax.Array) -> jax.Array:
    """Apply the ops to ``h`` of shape [N, *features] (axis 0 is the batch)."""
    for op, p in zip(ops, params, strict=True):
        kind = op[0]
        if kind == "dense":
            h = h @ p["w"] + p["b"]
        elif kind == "time_major":  # [N, T, ...] -> [T * N, ...] -> dense -> [N, T, ...]
            n, t = h.shape[:2]
            flat = jnp.swapaxes(h, 0, 1).reshape(t * n, *h.shape[2:])
            flat = jnp.tanh(flat @ p["w"] + p["b"])
            h = jnp.swapaxes(flat.reshape(t, n, *flat.shape[1:]), 0, 1)
        elif kind == "custom":
            fun, per_example, _ = CUSTOM[op[1]]
            h = jax.vmap(fun)(h) if per_example else fun(h)
        elif kind == "vmap":  # a per-example function that reduces within the example
            h = jax.vmap(lambda e: e * jnp.tanh(jnp.sum(e)))(h)
        elif kind == "jit_const":  # a nested jit closing over a constant along the batch
            scale = _jit_scale(np.linspace(0.5, 1.5, h.size, dtype=np.float32).reshape(h.shape))
            if op[1]:  # ... inside a scan body
                h = lax.scan(lambda c, t, s=scale: (c + 0.5 * t * s(c), None), h, jnp.arange(2.0))[
                    0
                ]
            else:
                h = scale(h)
        elif kind == "conv":
            h = jax.vmap(_conv_one, in_axes=(0, None))(h, p)
        elif kind == "unary":
            h = UNARY[op[1]](h)
        elif kind == "binary":
            h = BINARY[op[1]](h)
        elif kind == "bias":
            h = h + p
        elif kind == "scale":
            h = h * p
        elif kind == "merge":
            h = h.reshape(*h.shape[:-2], h.shape[-2] * h.shape[-1])
        elif kind == "reduce":
            _, how, ax = op
            h = h.sum(axis=ax + 1) if how == "sum" else h.max(axis=ax + 1)
        else:  # pragma: no cover - generator and interpreter out of sync
            raise AssertionError(op)
    return h


def assert_chunked(sf: Any, n: int, chunk: int, *args: Any) -> None:
    """Every op in these programs is chunkable, so the rewritten program must scan over
    ``n // chunk`` chunks (checked when there are at least two, and unless auto measured the
    loop to save nothing and runs the function as written), and the plan's axis is n."""
    plan = sf.explain(*args)
    if n // chunk >= 2 and not plan.runs_as_written:  # auto runs a tiny program as written
        jaxpr = sf.jaxpr(*args)
        lengths = [e.params["length"] for e in find_eqns(jaxpr, "scan")]
        assert n // chunk in lengths, f"no scan of length {n // chunk} in:\n{jaxpr}"
    assert plan.axis_size == n, str(plan)


def finish(h: jax.Array, final: str, per_example: bool) -> Any:
    axes = tuple(range(1, h.ndim))
    per = h.sum(axis=axes) if final == "sum" else h.max(axis=axes)
    total = per.sum()
    return (total, per) if per_example else total


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------


# 8 examples, not the profile's 12 (each runs the whole composition check, about 25 s of CPU;
# the fuzzer's 300 pairs in the slow tier draw such programs too); more with
# HYPOTHESIS_PROFILE=dev or thorough
@settings(PROPERTY_SETTINGS, max_examples=max(8, settings.default.max_examples - 4))
@given(
    data=st.data(),
    chain=op_chains(),
    n=st.integers(1, 12),
    per_example=st.booleans(),
    grad=st.sampled_from(GRAD_MODES),
    seed=st.integers(0, 2**16),
)
@pytest.mark.slow
def test_microbatched_program(data, chain, n, per_example, grad, seed):
    feat, ops, final = chain
    chunk = data.draw(chunks_for(n), label="chunk")
    params = make_params(ops, seed)
    x = jnp.asarray(np.random.RandomState(seed + 1).normal(size=(n, *feat)), jnp.float32)

    def f(x, params):
        return finish(apply_chain(ops, params, x), final, per_example)

    note(f"N={n} feat={feat} chunk={chunk} grad={grad} ops={ops} final={final}")
    sf = ja.serialize_axis(f, chunk=chunk, argnums=0, grad=grad)
    assert_matches_original(sf, x, params, vmap=False)
    assert_chunked(sf, n, chunk, x, params)


@pytest.mark.slow  # the default tier has the microbatched property run
@PROPERTY_SETTINGS
@given(
    data=st.data(),
    chain=op_chains(),
    s=st.sampled_from([7, 11]),
    per_example=st.booleans(),
    grad=st.sampled_from(GRAD_MODES),
    seed=st.integers(0, 2**16),
)
def test_monte_carlo_program(data, chain, s, per_example, grad, seed):
    """The axis is born inside, from a random draw; gradients flow to mu and log_sigma."""
    feat, ops, final = chain
    chunk = data.draw(chunks_for(s), label="chunk")
    params = make_params(ops, seed)
    rs = np.random.RandomState(seed + 1)
    mu = jnp.asarray(rs.normal(size=feat), jnp.float32)
    log_sigma = jnp.asarray(rs.normal(size=feat) * 0.3, jnp.float32)
    key = jax.random.key(seed)

    def f(mu, log_sigma, params, key):
        z = mu + jnp.exp(log_sigma) * jax.random.normal(key, (s, *mu.shape))
        return finish(apply_chain(ops, params, z), final, per_example)

    note(f"S={s} feat={feat} chunk={chunk} grad={grad} ops={ops} final={final}")
    sf = ja.serialize_axis(f, chunk=chunk, size=s, grad=grad)
    assert_matches_original(sf, mu, log_sigma, params, key, vmap=False)
    assert_chunked(sf, s, chunk, mu, log_sigma, params, key)
