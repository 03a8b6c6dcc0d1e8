"""f09: inside ``jax.shard_map`` (``check_vma=True``), ``grad="fused"`` with the serialized axis
along a replicated weight's own dimension (here the hidden units of ``w``; the fuzzer's
automatic axis chose them) gave that weight's gradient 8x the original's on 8 devices,
silently: as f08, for a chunked input instead of an invariant one. Found by the fuzzer's
``shard`` family (seed 808, ``grad>shard_map>grad``). Exits 1 while the defect is there."""

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


def f(w, x):
    return jnp.mean(jax.checkpoint(lambda z: jnp.tanh(z @ w))(x) ** 2)


mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))


def grads_on_shards(g):
    def per_shard(w, x):
        dw, dx = jax.grad(g, argnums=(0, 1))(w, x)
        return jax.lax.pmean(dw, "d"), dx

    specs = dict(in_specs=(P(), P("d")), out_specs=(P(), P("d")))
    return jax.jit(jax.shard_map(per_shard, mesh=mesh, **specs))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 6)), jnp.float32)
x = jnp.asarray(rng.normal(size=(64, 3)), jnp.float32)
ref = grads_on_shards(f)(w, x)
try:
    sf = ja.serialize_axis(f, chunk=2, in_axes=(1, None), grad="fused")  # w's hidden units
    assert_tree_close(grads_on_shards(sf)(w, x), ref)
except Exception as e:
    print(f"DEFECT: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print("ok")
