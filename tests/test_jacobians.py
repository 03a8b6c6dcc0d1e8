"""Chunked Jacobians: ``jax.jacrev``, ``jax.jacfwd``, ``jax.hessian`` serialized over their basis.

A Jacobian built by ``jax.jacrev`` (``jax.jacfwd``) is a ``vmap`` of a pullback (pushforward)
over a basis of the outputs (inputs): an axis born inside the function, at an ``iota`` of JAX's
basis construction, which ``size=`` names. Serializing it computes the Jacobian a block of rows
(columns) at a time. Checked against the unserialized Jacobian function, in every gradient
mode: the Jacobian itself and its reverse-mode derivatives (``testing.assert_matches_original``:
a ``jax.vjp`` with a random cotangent), a loss built on the Jacobian (its squared Frobenius
norm, summed inside the serialized function, so that the region's output is a sum and the
fused mode applies) under ``jax.value_and_grad``, and a ``jax.jvp`` of the Jacobian. Also:
automatic mode (no ``size=``) finds the basis axis, even where the batch has the same size, and
the memory of a Jacobian whose basis dominates is a fraction of the original's.

The default tier runs one mode per form for the Jacobians themselves and one case of each
derivative check; the full matrix is ``slow``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, assert_matches_original

slow = pytest.mark.slow
CHUNK = 7  # divides none of the basis sizes below: every loop has a remainder

_rs = np.random.RandomState(5)
ROWS, D_IN, HIDDEN = 24, 6, 8
PARAMS = {
    "w1": jnp.asarray(_rs.normal(size=(D_IN, HIDDEN)) / D_IN**0.5, jnp.float32),
    "w2": jnp.asarray(_rs.normal(size=(HIDDEN,)) / HIDDEN**0.5, jnp.float32),
}
X = jnp.asarray(_rs.normal(size=(ROWS, D_IN)), jnp.float32)
N_PARAMS = D_IN * HIDDEN + HIDDEN  # 56


def model(p, x):  # one output per row
    return jnp.tanh(x @ p["w1"]) @ p["w2"]


def loss(p, x):
    return jnp.mean(model(p, x) ** 2)


def jacrev(p, x):  # [rows, *params]: basis over the rows' outputs
    return jax.jacrev(model)(p, x)


def jacfwd(p, x):  # [rows, *params]: basis over the parameters
    return jax.jacfwd(model)(p, x)


def hessian(p, x):  # jacfwd of jacrev: basis over the parameters
    return jax.hessian(loss)(p, x)


#: form -> (Jacobian function, size of its basis axis)
FORMS = {"jacrev": (jacrev, ROWS), "jacfwd": (jacfwd, N_PARAMS), "hessian": (hessian, N_PARAMS)}
#: the default tier's mode for each form (the rest of the matrix is slow; the default tier's
#: Hessian is test_automatic_mode_finds_the_basis_axis's)
DEFAULT = {"jacrev": "auto", "jacfwd": "native", "hessian": None}


def matrix(default: dict[str, str | None]) -> list:
    """(form, mode) pairs: the one named in ``default`` for each form, and two more modes
    per form in rotation, marked slow (every mode meets every form across the tests)."""
    rows = []
    for i, form in enumerate(FORMS):
        others = [m for m in GRAD_MODES if m != default[form]]
        rows.append(pytest.param(form, default[form] or others.pop(i % 3), marks=()))
        if default[form] is None:
            rows[-1] = pytest.param(*rows[-1].values, marks=slow)
        rows += [pytest.param(form, m, marks=slow) for m in others[i % 2 :][:2]]
    return rows


def squared_norm(jac_fun):
    """A loss on the Jacobian: its squared Frobenius norm, a Jacobian penalty."""

    def penalty(p, x):
        return sum(jnp.sum(j**2) for j in jax.tree.leaves(jac_fun(p, x)))

    return penalty


def born_at_basis(sf, *args) -> bool:
    return "`iota`" in sf.explain(*args).born


@pytest.mark.parametrize("form,grad", matrix(DEFAULT))
def test_jacobian_serialized_over_its_basis(form, grad):
    fun, size = FORMS[form]
    sf = ja.serialize_axis(fun, chunk=CHUNK, size=size, grad=grad)
    assert born_at_basis(sf, PARAMS, X), sf.explain(PARAMS, X)
    assert_tree_close(sf(PARAMS, X), fun(PARAMS, X))


@pytest.mark.parametrize("form,grad", matrix({"jacrev": "remat", "jacfwd": None, "hessian": None}))
def test_reverse_mode_derivatives_of_a_jacobian(form, grad):
    fun, size = FORMS[form]
    sf = ja.serialize_axis(fun, chunk=CHUNK, size=size, grad=grad)
    assert_matches_original(sf, PARAMS, X, vmap=False)


@pytest.mark.parametrize("form,grad", matrix({"jacrev": None, "jacfwd": "fused", "hessian": None}))
@pytest.mark.slow
def test_loss_on_the_jacobian(form, grad):
    fun, size = FORMS[form]
    penalty = squared_norm(fun)
    sf = ja.serialize_axis(penalty, chunk=CHUNK, size=size, grad=grad)
    assert born_at_basis(sf, PARAMS, X)
    got = jax.value_and_grad(sf, argnums=(0, 1))(PARAMS, X)
    assert_tree_close(got, jax.value_and_grad(penalty, argnums=(0, 1))(PARAMS, X))


@pytest.mark.parametrize(
    "grad", [pytest.param(m, marks=() if m == "auto" else slow) for m in GRAD_MODES]
)
@pytest.mark.slow
def test_jvp_of_a_jacobian(grad):
    sf = ja.serialize_axis(jacrev, chunk=CHUNK, size=ROWS, grad=grad)
    tangents = (jax.tree.map(jnp.cos, PARAMS), jnp.sin(X))
    got = jax.jvp(sf, (PARAMS, X), tangents)
    assert_tree_close(got, jax.jvp(jacrev, (PARAMS, X), tangents))


@pytest.mark.parametrize("form", ["jacrev", "jacfwd", "hessian"])
@pytest.mark.slow
def test_automatic_mode_finds_the_basis_axis(form):
    # for jacrev the batch has the basis's size (one output per row): both are candidates,
    # and the basis is the one that saves; for jacfwd and hessian the batch is a candidate
    # expected to save less
    fun, size = FORMS[form]
    sf = ja.serialize_axis(fun, chunk=CHUNK)
    plan = sf.explain(PARAMS, X)
    assert plan.axis_size == size and "`iota`" in plan.born, plan
    assert_tree_close(sf(PARAMS, X), fun(PARAMS, X))


@pytest.mark.slow
def test_memory_of_a_jacobian_whose_basis_dominates():
    # jacfwd over 512 parameters: the original holds every basis vector's pushforward
    # through the hidden layer at once ([512, 64, 32] and more); chunks of 64 hold 64
    # (measured: 0.14 of the original's temp memory)
    rows, d_in, hidden = 64, 15, 32
    ks = jax.random.split(jax.random.key(0), 3)
    p = {
        "w1": jax.random.normal(ks[0], (d_in, hidden)) / d_in**0.5,
        "w2": jax.random.normal(ks[1], (hidden,)) / hidden**0.5,
    }
    x = jax.random.normal(ks[2], (rows, d_in))
    n = d_in * hidden + hidden

    def temp(f):
        return jax.jit(f).lower(p, x).compile().memory_analysis().temp_size_in_bytes

    sf = ja.serialize_axis(jacfwd, chunk=n // 8, size=n)
    original, serialized = temp(jacfwd), temp(sf)
    assert serialized <= 0.25 * original, (serialized, original)
