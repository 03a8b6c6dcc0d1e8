"""f04: a loss with a nonlinear function of a batch statistic (``log(var(h, axis=0))``, the
batch variance over the serialized axis), serialized and called inside ``jax.shard_map`` with
the default ``check_vma=True``, crashes in modes auto/remat/fused (chunk 1 or 2), with no
gradient taken: "unexpected JAX type (e.g. shape/dtype) for argument to VJP function: got
float32[4]{V:d}, but expected float32[4]". native runs; so does a plain per-example mean.
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
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.log(jnp.var(h, axis=0) + 0.1))


mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))


def on_shards(g):
    body = lambda w, x: jax.lax.pmean(g(w, x), "d")  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("d")), out_specs=P()))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
x = jnp.asarray(rng.normal(size=(32, 3)), jnp.float32)
ref = on_shards(f)(w, x)
try:
    got = on_shards(ja.serialize_axis(f, chunk=2, argnums=1, grad="fused"))(w, x)
    assert_tree_close(got, ref)
except Exception as e:
    print(f"DEFECT: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    sys.exit(1)
print("ok")
