"""f06: ``jax.hessian`` (forward over reverse) of a serialized loss that contains a
``jax.custom_vjp`` (an ordinary per-example tanh with its own backward rule) raises ``TypeError:
can't apply forward-mode autodiff (jvp) to a custom_vjp function`` in modes auto/remat/fused
(native runs). Called directly, without ``JAXPR_ACCUM_STRICT`` the call falls back to the
original, unchunked, with a ``PlanWarning``; called inside a ``lax.scan`` (the Hessian of a scan
over parameter sets) it raises with or without strict: a crash. The original's Hessian runs: JAX
differentiates the custom rule's backward pass forward, never the custom_vjp itself. Exits 1
while the defect is there, 0 when fixed. Found by the fuzzer's ``mixed`` family
(``scan>hessian`` over ``custom_vjp_per_example``)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close


@jax.custom_vjp
def tanh_cv(z):
    return jnp.tanh(z)


tanh_cv.defvjp(lambda z: (jnp.tanh(z), jnp.tanh(z)), lambda y, g: (g * (1.0 - y * y),))


def f(w, x):
    return jnp.mean(tanh_cv(x @ w) ** 2)


def in_scan(g):  # the Hessian of a sum over parameter sets, g called in a scan body
    return lambda ws, x: jax.lax.scan(lambda c, w: (c + g(w, x), None), 0.0, ws)[0]


ws = jnp.stack([jnp.ones((3, 2)) / 3, -jnp.ones((3, 2)) / 4])
x = jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)
failed = False
for name, wrap, a in (("direct", lambda g: g, (ws[0], x)), ("in_scan", in_scan, (ws, x))):
    ref = jax.hessian(wrap(f))(*a)
    try:
        got = jax.hessian(wrap(ja.serialize_axis(f, chunk=2, argnums=1, grad="remat")))(*a)
        assert_tree_close(got, ref)
    except Exception as e:
        print(f"DEFECT ({name}): {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        failed = True
sys.exit(1 if failed else print("ok"))
