"""f12: an ordered ``io_callback`` on a per-example value (through ``stop_gradient``), under
``jax.vmap`` over an argument that is not chunked (the temperature ``t``) inside ``jax.vjp``:
``grad="fused"`` raises "Cannot `vmap` ordered IO callback" where the original runs (found by
the fuzzer's io_per_example idiom): the region's batching rule batched every output, the
callback's operand included, although it does not depend on the vmapped argument. Fixed: the
rule batches the forward pass's jaxpr with JAX, which leaves such outputs unbatched. Exits 1
(an uncaught error) while the defect is there, 0 once fixed. The fuzzer's script, as it
printed it:
"""

import os

os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import warnings

# ---- layer helpers (from tests/fuzz/runtime.py) ----
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close


def is_float(v):
    return jnp.issubdtype(jnp.result_type(v), jnp.inexact)


def weights(v):
    return 1.0 + 0.5 * jnp.sin(jnp.arange(v.size, dtype=v.dtype) + 1.0).reshape(v.shape)


def scal(out):
    """A scalar of every floating leaf of ``out``, weighted so that no leaf cancels another."""
    total = jnp.zeros((), jnp.float32)
    for v in jax.tree.leaves(out):
        if is_float(v):
            total = total + jnp.sum(v * weights(v)).astype(jnp.float32)
    return total


def tan(tree):
    """A fixed tangent (or cotangent) with the structure of ``tree``."""
    return jax.tree.map(
        lambda v: (0.5 * jnp.cos(jnp.arange(v.size, dtype=v.dtype))).reshape(v.shape), tree
    )


def floats(out):
    return [v for v in jax.tree.leaves(out) if is_float(v)]


def replace(args, idx, vals):
    full = list(args)
    for i, v in zip(idx, vals, strict=True):
        full[i] = v
    return full


def L_vjp(F, argnums):
    """``jax.vjp`` with respect to ``argnums``; returns the output and the pulled-back ``tan``."""
    idx = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def G(*a):
        def inner(*d):
            o = F(*replace(a, idx, d))
            return floats(o), o

        fl, pull, o = jax.vjp(inner, *[a[i] for i in idx], has_aux=True)
        return o, pull(tan(fl))

    return G


def stack(make, ops):
    """``make()`` stacked for the ``vmap`` layers: ``ops`` lists ``(axis, size)`` from the
    innermost layer out; each is ``np.stack`` of ``size`` fresh draws at ``axis``."""
    if not ops:
        return make()
    axis, size = ops[-1]
    draws = [stack(make, ops[:-1]) for _ in range(size)]
    return jax.tree.map(lambda *vs: np.stack(vs, axis), *draws)


def sample_x(rng, n, d):
    return rng.normal(size=(n, d)).astype(np.float32)


def sample_y(rng, n, c):
    return rng.integers(0, c, size=(n,)).astype(np.int32)


def sample_m(rng, n):
    return rng.random(size=(n,)) < 0.6


def sample_t(rng):
    return np.asarray(rng.uniform(0.5, 2.0), np.float32)


def to_jax(tree):
    return jax.tree.map(jnp.asarray, tree)


# ---- the program ----
from jax.experimental import io_callback  # noqa: E402

SEEN = [0]


def count(v):  # the user's callback: counts the values it sees
    SEEN[0] += int(np.size(v))


def calls():  # the values the callbacks saw since the last call (and reset)
    jax.effects_barrier()
    n, SEEN[0] = SEEN[0], 0
    return n


def f(p, x, y, t):
    h = jnp.tanh(x @ p["w1"] + p["b1"])

    @jax.checkpoint
    def layer(c, w):
        return c + 0.5 * jnp.tanh(c @ w), None

    h, _ = lax.scan(layer, h, p["ws"])
    h = h + p["emb"][y]
    s = h @ p["w2"]
    io_callback(count, None, lax.stop_gradient(s[:, 0]), ordered=True)
    st = s / t
    term0 = jnp.mean((st - 0.5) ** 2)
    logp1 = jax.nn.log_softmax(st)
    term1 = -jnp.mean(logp1[jnp.arange(x.shape[0]), y])
    loss = 2.0 * term0 + term1
    loss = loss / 32
    return loss, {"metric": jnp.sum(s[:, 0] > 0)}


def init_params(rng):
    p = {}
    p["w2"] = (rng.normal(size=(4, 3)) * 0.5).astype(np.float32)
    p["w1"] = (rng.normal(size=(2, 4)) * 0.5).astype(np.float32)
    p["b1"] = (rng.normal(size=(4,)) * 0.1).astype(np.float32)
    p["ws"] = (rng.normal(size=(2, 4, 4)) * 0.3).astype(np.float32)
    p["emb"] = (rng.normal(size=(3, 4)) * 0.3).astype(np.float32)
    return p


def make_args(seed):
    rng = np.random.default_rng(seed)
    p = stack(lambda: init_params(rng), [])
    x = stack(lambda: sample_x(rng, 10, 2), [])
    y = stack(lambda: sample_y(rng, 10, 3), [])
    t = stack(lambda: sample_t(rng), [(0, 3)])
    return to_jax(
        (
            p,
            x,
            y,
            t,
        )
    )


def run(g, args):
    F = g
    F = jax.jit(F)
    F = jax.vmap(F, in_axes=(None, None, None, 0))
    F = L_vjp(F, argnums=(1, 3, 0))  # w.r.t. x, t, p
    F = jax.jit(F)
    return F(*args)


def serialized():
    return ja.serialize_axis(f, chunk=5, grad="fused")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    jax.config.update("jax_disable_most_optimizations", True)
    args = make_args(412)
    ref = run(f, args)
    seen_ref = calls()  # the values the user's callback saw
    got = run(serialized(), args)
    seen_got = calls()
    assert_tree_close(got, ref)
    assert seen_got == seen_ref, (seen_got, seen_ref)
    print("serialized matches the original")
