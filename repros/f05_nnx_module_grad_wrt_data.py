"""f05: an ``nnx.Linear`` passed as an ordinary (undifferentiated) argument, and
``jax.grad`` (or ``jax.jvp``) taken with respect to the serialized data argument only:
``flax.errors.TraceContextError: Cannot mutate Param from a different trace level``, in every
mode, with or without ``JAXPR_ACCUM_STRICT``. The original runs; so does the gradient with
respect to the module. Exits 1 while the defect is there, 0 when fixed. Found by the fuzzer's
``forward`` family (``grad>jvp`` over ``nnx_linear_module``)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close


def f(lin, x):
    return jnp.mean(jnp.tanh(lin(x)) ** 2)


lin = nnx.Linear(3, 5, rngs=nnx.Rngs(0))
x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
ref = jax.grad(f, argnums=1)(lin, x)
try:
    got = jax.grad(ja.serialize_axis(f, chunk=2, argnums=1, grad="remat"), argnums=1)(lin, x)
    assert_tree_close(got, ref)
except Exception as e:
    print(f"DEFECT: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print("ok")
