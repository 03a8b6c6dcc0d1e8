"""An OpenAI-ES generation (evosax OpenES: antithetic noise concatenate([z, -z]) along the
population, fitness by jax.vmap, gradient noise.T @ fitness) serialized over its population with
size=P: it raised "nothing can be chunked ... stopped by `concatenate`". Exits 0 when it is
chunked (no stop), exact in value and gradient, with XLA temp memory at most 0.3 of the original
at chunk P/8."""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXPR_ACCUM_STRICT"] = "1"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

P, D = 1024, 64
X = jax.random.normal(jax.random.key(1), (512, D))


def generation(mean, rng):
    z_plus = jax.random.normal(rng, (P // 2, D))
    z = jnp.concatenate([z_plus, -1.0 * z_plus])
    x = mean + 0.1 * z
    fit = jax.vmap(lambda w: jnp.mean(jnp.tanh(X @ w) ** 2))(x)
    return jnp.dot(z.T, fit) / (P * 0.1)


def temp(f, *a):
    return jax.jit(f).lower(*a).compile().memory_analysis().temp_size_in_bytes


args = (jnp.full(D, 0.05), jax.random.PRNGKey(0))
sf = ja.serialize_axis(generation, chunk=P // 8, size=P)
try:
    plan = sf.explain(*args)
except ja.SerializeError as e:
    print("SerializeError:", str(e)[:600])
    sys.exit(1)
print(plan.counts, [str(s)[:200] for s in plan.stops])
same = jnp.allclose(jax.jit(sf)(*args), jax.jit(generation)(*args), rtol=1e-4, atol=1e-6)
loss = lambda f: lambda m, k: jnp.sum(f(m, k) ** 2)  # noqa: E731
g_sf, g = jax.grad(loss(sf))(*args), jax.grad(loss(generation))(*args)
same = same and bool(jnp.allclose(g_sf, g, rtol=1e-4, atol=1e-7))
ratio = temp(sf, *args) / temp(generation, *args)
print(f"exact: {same}, temp memory ratio at chunk P/8: {ratio:.3f}")
sys.exit(0 if same and plan.counts["body"] > 0 and not plan.stops and ratio <= 0.3 else 1)
