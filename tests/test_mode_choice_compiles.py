"""Auto chooses the gradient mode by its estimate alone: the first call of
``jax.jit(jax.value_and_grad(sf))`` compiles no candidate program to choose it (counted at
``jax.stages.Lowered.compile``, which every measurement of the library goes through; the
call's own compile does not), in one pass and in two (SimCLR's NT-Xent, which pairs the
batch with itself). The cases are ones the first call used to settle by compiling both
modes: the chunked inputs are differentiated. ``explain`` for the same differentiation
names the mode the call compiles (the call's program is the one pinned to that mode), and
values and gradients are the original's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .test_pairwise import simclr


def _tanh_squares(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def _one_pass():
    rs = np.random.RandomState(0)
    w = jnp.asarray(rs.normal(size=(16, 64)) / 4, jnp.float32)
    x = jnp.asarray(rs.normal(size=(256, 16)), jnp.float32)
    return _tanh_squares, (w, x), 1, dict(chunk=32)


def _two_passes():
    loss, args, argnums = simclr("matmul", -jnp.inf, learnt=True)
    return loss, args, argnums, dict(chunk=3)


@pytest.mark.parametrize("make", [_one_pass, _two_passes], ids=["one-pass", "simclr"])
def test_the_first_call_compiles_no_candidate_to_choose_the_mode(make, monkeypatch):
    f, args, argnums, kw = make()
    diff = tuple(range(len(args)))  # every argument: the chunked data included
    compiles = []
    compile_ = jax.stages.Lowered.compile

    def counted(self, *a, **k):
        compiles.append(self)
        return compile_(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", counted)
    sf = ja.serialize_axis(f, argnums=argnums, **kw)
    got = jax.jit(jax.value_and_grad(sf, argnums=diff))(*args)
    assert not compiles, f"{len(compiles)} programs compiled to plan the first call"
    assert_tree_close(got, jax.jit(jax.value_and_grad(f, argnums=diff))(*args))

    plan = sf.explain(*args, grad_argnums=diff)
    assert "measured" not in plan.grad_reason and not compiles, plan.grad_reason
    pinned = ja.serialize_axis(f, argnums=argnums, grad=plan.grad, **kw)

    def hlo(g):
        return jax.jit(jax.value_and_grad(g, argnums=diff)).lower(*args).as_text()

    assert hlo(sf) == hlo(pinned), plan
