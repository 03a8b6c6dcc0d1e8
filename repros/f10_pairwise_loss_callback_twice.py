"""f10: a user's ``jax.debug.callback`` on the loss of a pairwise (two-pass) plan runs twice
per call where the original runs it once -- in every grad mode, with no gradient taken. The
values are right; a logging or checkpoint-writing callback has its effect duplicated. A loss
with no pairwise term (``mse`` below) runs it once.
Exits 1 while the defect is there, 0 when fixed. Found by the fuzzer (issue 30's callbacks)."""

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

SEEN = []


def f(w, x):
    h = jnp.tanh(x @ w)
    sim = h @ h.T
    loss = jnp.mean(jax.nn.logsumexp(sim, axis=1))
    jax.debug.callback(lambda v: SEEN.append(1), loss)
    return loss


def calls():
    jax.effects_barrier()
    n = len(SEEN)
    SEEN.clear()
    return n


warnings.simplefilter("ignore")  # the PlanWarning: a tiny two-pass plan saves nothing
rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)) * 0.5, jnp.float32)
x = jnp.asarray(rng.normal(size=(7, 3)), jnp.float32)
ref = jax.jit(f)(w, x)
n_ref = calls()
bad = []
for mode in ("auto", "remat", "fused", "native"):
    got = jax.jit(ja.serialize_axis(f, chunk=3, argnums=1, grad=mode))(w, x)
    n_got = calls()
    assert_tree_close(got, ref)
    print(f"grad={mode!r}: the callback ran {n_got} time(s), the original {n_ref}")
    bad += [mode] if n_got != n_ref else []
sys.exit(1 if bad else 0)
