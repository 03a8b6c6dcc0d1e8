"""Loops per row: ``jax.vmap`` of a ``lax.while_loop`` whose condition depends on the row
becomes a ``while`` whose condition has one entry per position; each row iterates until its
own condition fails. The chunked loop gives every row the iterations it has in the original
(values, forward-mode derivatives through the loop, reverse-mode derivatives of what follows
it), and JAX's ``odeint`` under ``vmap`` over trajectories, built on such a loop, is chunked,
exact and saves memory."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.experimental.ode import odeint

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, NOT_WORTH_IT

#: loop bodies as users write them: (carry, w) -> carry; the carry is (count, state)
BODIES = {
    "decay": lambda c, w: (c[0] + 1, c[1] * 0.8 + w[0]),
    "grow": lambda c, w: (c[0] + 1, jnp.sin(c[1]) * 1.5 + jnp.abs(c[1]).sum() * 0.1 + 0.3),
    "matmul": lambda c, w: (c[0] + 1, jnp.tanh(c[1] @ w) + c[1] + 0.2),
}


def _per_row_program(body, threshold: float, nested: bool):
    def one_row(r, w):
        cond = lambda c: (jnp.abs(c[1]).sum() < threshold) & (c[0] < 50)  # noqa: E731
        return lax.while_loop(cond, lambda c: body(c, w), (0, r))

    def f(w, x):
        per_row = jax.vmap(one_row, in_axes=(0, None))
        if nested:  # the axis at dimension 1 of a condition with two entries per row
            per_row = jax.vmap(per_row, in_axes=(1, None), out_axes=1)
        n, h = per_row(x, w)
        return jnp.sum(jnp.tanh(h) ** 2) + 0.01 * jnp.sum(n.astype(jnp.float32))

    return f


@pytest.mark.slow
@pytest.mark.filterwarnings(NOT_WORTH_IT)
@given(
    body=st.sampled_from(sorted(BODIES)),
    n=st.integers(1, 13),
    chunk=st.integers(1, 15),
    threshold=st.floats(0.5, 8.0),
    nested=st.booleans(),
    grad=st.sampled_from(GRAD_MODES),
    seed=st.integers(0, 2**16),
)
def test_a_loop_per_row_gives_each_row_its_iterations(
    body, n, chunk, threshold, nested, grad, seed
):
    rs = np.random.RandomState(seed)
    w = jnp.asarray(rs.normal(size=(4, 4)) / 3, jnp.float32)
    x = jnp.asarray(rs.normal(size=(3, n, 4) if nested else (n, 4)), jnp.float32)
    f = _per_row_program(BODIES[body], threshold, nested)
    sf = ja.serialize_axis(f, chunk=chunk, argnums=1, axis=1 if nested else 0, grad=grad)
    assert not sf.explain(w, x).stops, str(sf.explain(w, x))
    assert_tree_close(jax.jit(sf)(w, x), jax.jit(f)(w, x))
    tangents = (jnp.ones_like(w), jnp.cos(x))  # forward mode through the loop
    assert_tree_close(jax.jvp(sf, (w, x), tangents), jax.jvp(f, (w, x), tangents))


def _neural_ode(w, y0s):
    ts = jnp.linspace(0.0, 1.0, 5)
    field = lambda y, t, w: jnp.tanh(y @ w)  # noqa: E731
    return jnp.mean(jax.vmap(lambda y0: odeint(field, y0, ts, w))(y0s) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_odeint_per_trajectory_saves_memory(grad):
    """At 512 trajectories in chunks of 64: XLA's temp memory of ``value_and_grad`` at most
    0.3 of the original's (measured 0.12), values and gradients the original's."""
    n = 512
    w = jnp.ones((2, 2)) * 0.1
    y0s = jax.random.normal(jax.random.key(0), (n, 2))
    sf = ja.serialize_axis(_neural_ode, chunk=n // 8, argnums=1, grad=grad)
    assert sf.explain(w, y0s).counts["body"] > 0 and not sf.explain(w, y0s).stops

    def compiled(f):
        return jax.jit(jax.value_and_grad(f, (0, 1))).lower(w, y0s).compile()

    with warnings.catch_warnings():
        warnings.simplefilter("error", ja.PlanWarning)
        got = compiled(sf)(w, y0s)
    assert_tree_close(got, compiled(_neural_ode)(w, y0s))
    temp = {f: compiled(f).memory_analysis().temp_size_in_bytes for f in (sf, _neural_ode)}
    assert temp[sf] <= 0.3 * temp[_neural_ode], temp
