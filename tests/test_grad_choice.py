"""``grad="auto"``: fused or remat by memory, counting only the sums that carry gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja

from .oracle import NOT_WORTH_IT, assert_matches_original

RS = np.random.RandomState(0)
W = jnp.asarray(RS.normal(size=(8, 5)) / 3, jnp.float32)
X = jnp.asarray(RS.normal(size=(64, 8)), jnp.float32)
Y = jnp.asarray(RS.randint(0, 5, size=64), jnp.int32)


def loss_and_accuracy(w, x, y):
    logits = x @ w
    loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
    accuracy = jnp.mean(jnp.argmax(logits, -1) == y)  # through argmax: no gradient
    tokens = jnp.sum((y > 0).astype(jnp.float32))  # from integer labels: no gradient
    return loss, accuracy, tokens


def test_sums_without_gradients_do_not_count():
    sf = ja.serialize_axis(loss_and_accuracy, chunk=48, argnums=(1, 2))
    plan = sf.explain(W, X, Y)
    assert plan.grad == "fused", plan.grad_reason
    assert "1 gradient-carrying" in plan.grad_reason
    assert_matches_original(loss_and_accuracy, sf, W, X, Y)


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # inputs >> activations: no saving expected
def test_several_gradient_carrying_sums_weigh_memory():
    big = jnp.asarray(RS.normal(size=(2048, 4)) / 30, jnp.float32)  # inputs >> activations
    wide = jnp.asarray(RS.normal(size=(64, 2048)), jnp.float32)

    def two_losses(w, x):
        h = jnp.tanh(x @ w)
        return jnp.mean(h**2), jnp.mean(jnp.abs(h))

    sf = ja.serialize_axis(two_losses, chunk=4, argnums=1)
    plan = sf.explain(big, wide)
    reason = "more than half of one chunk's estimated activations"
    assert plan.grad == "remat" and reason in plan.grad_reason, plan
    assert_matches_original(two_losses, sf, big, wide)

    narrow = jnp.asarray(RS.normal(size=(2, 512)) / 3, jnp.float32)  # activations >> inputs
    x = jnp.asarray(RS.normal(size=(64, 2)), jnp.float32)
    plan = ja.serialize_axis(two_losses, chunk=16, argnums=1).explain(narrow, x)
    assert plan.grad == "fused", plan.grad_reason
    assert_matches_original(
        two_losses, ja.serialize_axis(two_losses, chunk=16, argnums=1), narrow, x
    )
