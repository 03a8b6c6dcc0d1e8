"""b01: ``jax.grad`` of (a scalar of) ``jax.grad`` through a ``jax.custom_jvp`` whose rule is not
the true derivative (tanh with its JVP scaled by 1.1), under a streamed ``logsumexp`` /
softmax-weighted sum over the serialized axis: the second-order gradient is silently wrong
(~0.6-0.9% off) in grad="remat" and grad="fused" (native is right; jax.hessian is right).
The custom_vjp analogue is repro f07. Found by an adversarial review of the f07 fix.
Exits 1 while the defect is present, 0 when fixed."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close


@jax.custom_jvp
def tanh_cj(z):
    return jnp.tanh(z)


tanh_cj.defjvp(lambda p, t: (jnp.tanh(p[0]), 1.1 * (1 - jnp.tanh(p[0]) ** 2) * t[0]))


def loss(w, x):
    return jax.nn.logsumexp(tanh_cj(x @ w)[:, 0])


def loss_softmax(w, x):
    h = tanh_cj(x @ w)
    return jnp.sum(jax.nn.softmax(h[:, 0]) * x[:, 0])


rng = np.random.default_rng(3)
w = jnp.asarray(rng.normal(size=(3, 4)) / 2, jnp.float32)
x = jnp.asarray(rng.normal(size=(12, 3)), jnp.float32)


def grad_of_grad(f):
    return jax.grad(lambda a: jnp.sum(jax.grad(f)(a, x) ** 2))(w)


failed = False
for f in (loss, loss_softmax):
    ref = grad_of_grad(f)
    for mode in ("remat", "fused"):
        try:
            got = grad_of_grad(ja.serialize_axis(f, chunk=5, argnums=1, grad=mode))
            assert_tree_close(got, ref)
        except Exception as e:
            print(
                f"DEFECT ({f.__name__}, {mode}): {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            )
            print("   ", " ".join(str(e).split())[:300])
            failed = True
sys.exit(1 if failed else print("ok"))
