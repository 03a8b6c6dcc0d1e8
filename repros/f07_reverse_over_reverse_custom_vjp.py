"""f07: reverse over reverse (``jax.grad`` with respect to the parameters of a weighted
``jax.grad`` with respect to the data) of a loss with a per-example ``jax.custom_vjp`` whose
backward rule is not the true derivative (0.9 x tanh's), under a streamed logsumexp: gradients
off by about 13% in auto/remat/fused (silently: no error, no warning). JAX differentiates the
custom rule's *forward* function for the outer derivative of the primal; the region pulled it
back through the backward rule. Exits 1 while the defect is there, 0 when fixed. Found by the
fuzzer's ``mixed`` family (seed 707: ``grad>value_and_grad>vmap[p]``)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

warnings.simplefilter("ignore")  # a tiny problem: "not expected to save memory"


@jax.custom_vjp
def tanh_cv(z):
    return jnp.tanh(z)


tanh_cv.defvjp(lambda z: (jnp.tanh(z), jnp.tanh(z)), lambda y, g: (g * (1.0 - y * y) * 0.9,))


def f(w, x):
    s = tanh_cv(x @ w) @ jnp.ones((3,))
    m = jax.lax.stop_gradient(jnp.max(s))
    return jnp.log(jnp.sum(jnp.exp(s - m))) + m


def second(g):
    weights = jnp.cos(jnp.arange(13 * 4.0)).reshape(13, 4)
    return jax.grad(lambda w, x: jnp.sum(jax.grad(g, argnums=1)(w, x) * weights))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(4, 3)) * 0.5, jnp.float32)
x = jnp.asarray(rng.normal(size=(13, 4)), jnp.float32)
ref = second(f)(w, x)
failed = False
for mode in ("auto", "remat", "fused"):
    try:
        got = second(ja.serialize_axis(f, chunk=2, argnums=1, grad=mode))(w, x)
        assert_tree_close(got, ref)
    except Exception as e:
        print(f"DEFECT ({mode}): {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        failed = True
sys.exit(1 if failed else print("ok"))
