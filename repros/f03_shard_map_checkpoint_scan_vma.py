"""f03: a loss with a ``jax.checkpoint`` or a ``lax.scan`` (over replicated layer weights)
inside, serialized and called inside ``jax.shard_map`` with the default ``check_vma=True``,
crashes: "Expected cotangent type float32[3,4] but got float32[3,4]{V:d}" (the replicated
weights' cotangent is varying over the mesh axis), with or without a gradient taken, inside
or outside the shard_map. In mode remat for an MLP mean; in auto/remat when the loss also
reduces over the batch before a nonlinearity (a softmax pooling, a clip of the batch mean);
fused and native run. The same losses without the checkpoint/scan run in every mode.
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


def f_checkpoint(w, ws, x):
    return jnp.mean(jax.checkpoint(lambda z: jnp.tanh(z @ w))(x) ** 2)


def f_scan(w, ws, x):
    h = jnp.tanh(x @ w)
    h, _ = jax.lax.scan(lambda c, v: (c + 0.5 * jnp.tanh(c @ v), None), h, ws)
    return jnp.mean(h**2)


mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("d",))


def on_shards(g):
    body = lambda w, ws, x: jax.lax.pmean(g(w, ws, x), "d")  # noqa: E731
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("d")), out_specs=P()))


rng = np.random.default_rng(0)
w = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
ws = jnp.asarray(rng.normal(size=(2, 4, 4)) / 2, jnp.float32)
x = jnp.asarray(rng.normal(size=(32, 3)), jnp.float32)
failed = False
for f in (f_checkpoint, f_scan):
    ref = on_shards(f)(w, ws, x)
    try:
        got = on_shards(ja.serialize_axis(f, chunk=2, argnums=2, grad="remat"))(w, ws, x)
        assert_tree_close(got, ref)
    except Exception as e:
        print(f"DEFECT ({f.__name__}): {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        failed = True
sys.exit(1 if failed else print("ok"))
