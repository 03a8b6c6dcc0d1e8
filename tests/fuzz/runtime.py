"""Helpers that the fuzzer's generated scripts call: the stack layers and the argument samplers.

This file's text is pasted verbatim into every standalone repro script (see ``runner.py``), so
it imports only JAX and NumPy and stays small. Each ``L_*`` function wraps a callable ``F`` of
the positional arguments ``(p, x, [y], [m], [t])`` into another callable of the same
arguments; the same chain of layers is applied to the original function (the oracle) and to
its serialized version.

The scalar that a reverse-mode layer differentiates is ``scal(out)``: every floating leaf of
the output summed with fixed positive weights (integer and boolean leaves are dropped), so the
gradient of every output leaf is exercised and none cancels another. Tangents and cotangents
are fixed functions of the shape (``tan``), so they need no random state under outer layers.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


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


def L_grad(F, argnums):
    """``jax.grad`` of the weighted scalar of ``F``'s float outputs."""
    return jax.grad(lambda *a: scal(F(*a)), argnums=argnums)


def L_value_and_grad(F, argnums):
    """``jax.value_and_grad`` with the full output as auxiliary data."""

    def G(*a):
        o = F(*a)
        return scal(o), o

    return jax.value_and_grad(G, argnums=argnums, has_aux=True)


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


def L_jvp(F, argnums):
    """``jax.jvp`` along ``tan`` of the arguments ``argnums``; the output and its tangent."""
    idx = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def G(*a):
        def inner(*d):
            o = F(*replace(a, idx, d))
            return floats(o), o

        primals = tuple(a[i] for i in idx)
        _, t_out, o = jax.jvp(inner, primals, tuple(tan(v) for v in primals), has_aux=True)
        return o, t_out

    return G


def L_hessian(F, argnums):
    """``jax.hessian`` (forward over reverse) of the weighted scalar."""
    return jax.hessian(lambda *a: scal(F(*a)), argnums=argnums)


def L_scan(F, i):
    """Call ``F`` in a ``lax.scan`` body over 3 steps, argument ``i`` scaled by the step."""

    def G(*a):
        def body(c, k):
            o = F(*replace(a, (i,), (jax.tree.map(lambda v: v * k, a[i]),)))
            return c + scal(o), o

        return lax.scan(body, jnp.zeros((), jnp.float32), jnp.array([1.0, 0.75, 1.25]))

    return G


def L_cond(F, i):
    """``lax.cond`` on the sign of argument ``i``'s first leaf; the false branch halves it."""

    def G(*a):
        pred = jnp.sum(jax.tree.leaves(a[i])[0]) > 0
        half = replace(a, (i,), (jax.tree.map(lambda v: v * 0.5, a[i]),))
        return lax.cond(pred, lambda: F(*a), lambda: F(*half))

    return G


def L_shard(F, data):
    """``jax.shard_map`` over 8 devices, the arguments flagged in ``data`` split on axis 0
    (``P('d')``), the others replicated (``P()``); float outputs ``pmean``, others ``psum``."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))
    in_specs = tuple(P("d") if d else P() for d in data)

    def body(*a):
        o = F(*a)
        return jax.tree.map(
            lambda v: lax.pmean(v, "d") if is_float(v) else lax.psum(v.astype(jnp.int32), "d"),
            o,
        )

    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P())


# ------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------


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
