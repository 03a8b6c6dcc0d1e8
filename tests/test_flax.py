"""Flax users: NNX modules as arguments and linen ``apply``, against the undecorated originals.

NNX state the call mutates (the ``nnx.Rngs`` counters behind ``nnx.Dropout``) must be left as
the original call leaves it, so a second call draws what the original's second call draws.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxpr_accum as ja

from .oracle import assert_matches_original, modes


class DropoutMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jax.nn.relu(self.l1(x))))[:, 0]


def mse(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


X = jax.random.normal(jax.random.key(0), (20, 8))
Y = jax.random.normal(jax.random.key(1), (20,))


def _max_diff(a, b):
    return max(jax.tree.leaves(jax.tree.map(lambda p, q: float(jnp.abs(p - q).max()), a, b)))


@pytest.mark.parametrize("grad", modes("remat", slow=("auto",)))
@pytest.mark.slow
def test_nnx_value_and_grad_with_dropout_then_second_call(grad):
    original, serialized = DropoutMLP(nnx.Rngs(0, dropout=1)), DropoutMLP(nnx.Rngs(0, dropout=1))
    sloss = ja.serialize_axis(mse, chunk=6, argnums=1, grad=grad)
    losses = []
    for _ in range(2):
        l1, g1 = nnx.value_and_grad(mse)(original, X, Y)
        l2, g2 = nnx.value_and_grad(sloss)(serialized, X, Y)
        np.testing.assert_allclose(l2, l1, rtol=2e-5)
        assert _max_diff(g1, g2) <= 2e-4 * max(
            1.0, max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1))
        )
        assert int(serialized.drop.rngs.count[...]) == int(original.drop.rngs.count[...])
        losses.append(float(l1))
    assert losses[0] != losses[1]  # the second call drew a different mask


@pytest.mark.slow
def test_nnx_train_step_under_nnx_jit():
    models = [DropoutMLP(nnx.Rngs(0, dropout=1)) for _ in range(2)]
    opts = [nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param) for m in models]

    def make_step(loss_fn):
        @nnx.jit
        def step(model, opt, x, y):
            loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
            opt.update(model, grads)
            return loss

        return step

    steps = [make_step(mse), make_step(ja.serialize_axis(mse, chunk=6, argnums=1))]
    for _ in range(3):
        a, b = (step(m, o, X, Y) for step, m, o in zip(steps, models, opts, strict=True))
        np.testing.assert_allclose(b, a, rtol=2e-5)
    params = [nnx.state(m, nnx.Param) for m in models]
    assert _max_diff(*params) <= 1e-4


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        x = nn.Dropout(0.3, deterministic=not train)(nn.relu(x))
        return nn.Dense(1)(x)


@pytest.mark.slow
@pytest.mark.parametrize("grad", modes("remat", "native"))
def test_linen_apply_with_dropout_and_batch_stats(grad):
    net = LinenNet()
    x = jax.random.normal(jax.random.key(0), (24, 8))
    variables = net.init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x, False)
    key = jax.random.key(3)
    sapply = ja.serialize_axis(net.apply, chunk=5, argnums=1, grad=grad)

    def loss(apply, params, stats):
        y, updates = apply(
            {"params": params, "batch_stats": stats},
            x,
            True,
            rngs={"dropout": key},
            mutable=["batch_stats"],
        )
        return jnp.mean(y**2), updates

    args = (variables["params"], variables["batch_stats"])
    (a, ua), ga = jax.value_and_grad(loss, argnums=1, has_aux=True)(net.apply, *args)
    (b, ub), gb = jax.value_and_grad(loss, argnums=1, has_aux=True)(sapply, *args)
    np.testing.assert_allclose(b, a, rtol=2e-5)
    assert _max_diff(ga, gb) <= 2e-4
    assert _max_diff(ua, ub) <= 1e-5


@pytest.mark.slow
def test_linen_apply_dropout_only_matches_original():
    class Drop(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(3)(nn.Dropout(0.5, deterministic=False)(nn.Dense(16)(x)))

    net = Drop()
    x = jax.random.normal(jax.random.key(4), (12, 8))
    params = net.init({"params": jax.random.key(5), "dropout": jax.random.key(6)}, x)
    key = jax.random.key(7)

    def f(params, x):
        return net.apply(params, x, rngs={"dropout": key})

    assert_matches_original(ja.serialize_axis(f, chunk=5, argnums=1), params, x, vmap=False)


@pytest.mark.parametrize("grad", modes("remat", slow=("auto", "fused", "native")))
def test_nnx_module_not_differentiated_under_grad_and_jvp_of_the_data(grad):
    """A module passed as an ordinary argument while the caller differentiates only the data
    (fuzzer f05): nothing of it changes, so nothing is written back into it from inside the
    caller's trace (NNX forbids that); a module the call does change (dropout's counter) is
    still written back (the test above)."""
    lin = nnx.Linear(8, 5, rngs=nnx.Rngs(0))

    def f(lin, x):
        return jnp.mean(jnp.tanh(lin(x)) ** 2)

    sf = ja.serialize_axis(f, chunk=6, argnums=1, grad=grad)
    np.testing.assert_allclose(
        jax.grad(sf, argnums=1)(lin, X), jax.grad(f, argnums=1)(lin, X), rtol=2e-5, atol=1e-7
    )
    t = jnp.cos(X)
    got, want = jax.jvp(lambda x: sf(lin, x), (X,), (t,)), jax.jvp(lambda x: f(lin, x), (X,), (t,))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)
