"""f11: an ordered ``io_callback`` on ``stop_gradient`` of a per-example value in the loss:
``grad="remat"`` and ``grad="fused"`` raise "IO callbacks do not support JVP" under
``JAXPR_ACCUM_STRICT=1``, with no gradient taken (without strict: a ``PlanWarning`` and a
fallback to native gradients). The original runs, and so does its ``jax.grad`` (the callback
sees a stopped value). Exits 1 while the defect is there, 0 when fixed. Found by the fuzzer
(issue 30's callbacks); the known defect noted when the callbacks were added."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

SEEN = []


def f(w, x):
    s = jnp.tanh(x @ w)
    io_callback(lambda v: SEEN.append(v.size), None, lax.stop_gradient(s[:, 0]), ordered=True)
    return jnp.mean(s**2)


def seen():
    jax.effects_barrier()
    n = sum(SEEN)
    SEEN.clear()
    return n


warnings.simplefilter("ignore")
rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)) * 0.5, jnp.float32)
x = jnp.asarray(rng.normal(size=(7, 3)), jnp.float32)
ref = jax.jit(f)(w, x)
ref_grad = jax.jit(jax.grad(f))(w, x)
n_ref = seen()
bad = []
for mode in ("auto", "remat", "fused", "native"):
    try:
        sf = ja.serialize_axis(f, chunk=3, argnums=1, grad=mode)
        assert_tree_close(jax.jit(sf)(w, x), ref)
        assert_tree_close(jax.jit(jax.grad(sf))(w, x), ref_grad)
        n = seen()
        print(f"grad={mode!r}: runs; the callback saw {n} values, the original {n_ref}")
        bad += [mode] if n != n_ref else []
    except Exception as e:
        print(f"grad={mode!r}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        bad.append(mode)
sys.exit(1 if bad else 0)
