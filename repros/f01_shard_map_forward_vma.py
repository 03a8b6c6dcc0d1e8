"""f01: ``grad="auto"`` with ``chunk=1``, called inside ``jax.shard_map`` with the default
``check_vma=True`` (replicated weights, sharded data), crashes: "dot_general requires varying
manual axes to match" -- with or without ``jax.value_and_grad`` inside. The original runs;
so do the modes remat/fused/native at chunk 1 and every mode at chunk 2.
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


def f(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)


mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))


def on_shards(g):
    body = lambda w, x: jax.lax.pmean(g(w, x), "d")  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
ref = on_shards(f)(w, x)
try:
    got = on_shards(ja.serialize_axis(f, chunk=1, argnums=1, grad="auto"))(w, x)
    assert_tree_close(got, ref)
except Exception as e:
    print(f"DEFECT: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print("ok")
