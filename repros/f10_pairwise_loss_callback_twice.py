"""f10: a user's ``jax.debug.callback`` in a pairwise (two-pass) plan runs twice per call where
the original runs it once, with no gradient taken: in remat/fused/native, on the loss and on a
per-example value (each value seen twice); auto runs this tiny function as written (with the
per-example callback alone, auto runs it twice too). The values are right; a logging or
checkpoint-writing callback has its effect duplicated. A loss with no pairwise term
(``jnp.mean(h ** 2)``) runs each callback once.
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

SEEN = {"loss": 0, "rows": 0}


def f(w, x):
    h = jnp.tanh(x @ w)
    sim = h @ h.T
    loss = jnp.mean(jax.nn.logsumexp(sim, axis=1))
    jax.debug.callback(lambda v: SEEN.update(rows=SEEN["rows"] + v.size), h[:, 0])
    jax.debug.callback(lambda v: SEEN.update(loss=SEEN["loss"] + 1), loss)
    return loss


def calls():  # (loss callbacks, per-example values seen) since the last call
    jax.effects_barrier()
    n = (SEEN["loss"], SEEN["rows"])
    SEEN.update(loss=0, rows=0)
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
    print(f"grad={mode!r}: (loss calls, rows seen) {n_got}, the original {n_ref}")
    bad += [mode] if n_got != n_ref else []
sys.exit(1 if bad else 0)
