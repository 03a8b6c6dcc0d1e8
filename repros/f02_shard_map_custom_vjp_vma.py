"""f02: a loss with a ``jax.custom_vjp`` (here an identity whose backward rescales the
cotangent), serialized and called inside ``jax.shard_map`` with the default ``check_vma=True``,
crashes in every mode and chunk, even with no gradient taken: "Custom VJP bwd rule must
produce an output with the same type as the args tuple ... the manual axis types do not
match" (the bwd rule is run on a cotangent that is not varying over the mesh axis). The
original runs, with and without ``jax.value_and_grad``.
Exits 1 while the defect is there, 0 when fixed. Found by the fuzzer's ``shard`` family."""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close


@jax.custom_vjp
def grad_norm(z):  # identity; the backward divides the cotangent by its batch mean
    return z


grad_norm.defvjp(lambda z: (z, None), lambda _, g: (g / (jnp.mean(jnp.abs(g), axis=0) + 1.0),))


def f(w, x):
    return jnp.mean(jnp.tanh(grad_norm(x @ w)) ** 2)


mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))


def on_shards(g):
    body = lambda w, x: jax.lax.pmean(g(w, x), "d")  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
x = jnp.asarray(rng.normal(size=(32, 3)), jnp.float32)
ref = on_shards(f)(w, x)
try:
    got = on_shards(ja.serialize_axis(f, chunk=2, argnums=1, grad="remat"))(w, x)
    assert_tree_close(got, ref)
except Exception as e:
    print(f"DEFECT: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print("ok")
