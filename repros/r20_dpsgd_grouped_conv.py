"""r20: DP-SGD's per-example gradients of a conv net (jax's ``differentially_private_sgd.py``
pattern: ``vmap(grad(loss))`` over single-example batches, each gradient clipped by its norm,
then summed). Under ``vmap`` JAX batches each example's conv *weight* gradient as a grouped
convolution: the examples move into the feature groups, with reshapes (one with
``dimensions``) around it. The region stopped there ("the convolution slides or mixes along
the axis", "``reshape`` with ``dimensions`` transposes along the way"), the rest ran after the
loop and memory was 0.60 of the original. A grouped conv whose groups are the examples mixes
no examples. Exits 1 while the region stops, the result is not exact, or memory at chunk
N/8 is above 0.25 of the original; 0 when fixed."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys

import jax
import jax.numpy as jnp

import jaxpr_accum as ja


def loss(w, x):  # one example: x [1, 12, 12, 2]
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn)
    return jnp.sum(jnp.tanh(y) ** 2)


def clipped_grad_sum(w, xs):  # private_grad without the noise
    g = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, xs)  # per-example grads [N, 3, 3, 2, 8]
    norms = jnp.sqrt(jnp.sum(g**2, axis=(1, 2, 3, 4)))
    g = g / jnp.maximum(norms / 1.0, 1.0)[:, None, None, None, None]
    return jnp.sum(g, 0)


def temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


w = jax.random.normal(jax.random.key(0), (3, 3, 2, 8)) / 4
xs = jax.random.normal(jax.random.key(1), (64, 1, 12, 12, 2))
sf = ja.serialize_axis(clipped_grad_sum, chunk=8, argnums=1)
stops = [str(s) for s in sf.explain(w, xs).stops]
print("\n".join(stops) or "no stops")
ok = bool(jnp.allclose(jax.jit(sf)(w, xs), jax.jit(clipped_grad_sum)(w, xs), rtol=1e-4, atol=1e-5))
ratio = temp(sf, w, xs) / temp(clipped_grad_sum, w, xs)
print(f"exact: {ok}; temp memory at chunk N/8: {ratio:.3f} of the original")
sys.exit(1 if stops or not ok or ratio > 0.25 else 0)
