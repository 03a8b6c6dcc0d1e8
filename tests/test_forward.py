"""Forward-mode differentiation of a serialized function, in every mode, chunked.

``jax.jvp``, ``jax.jacfwd`` and ``jax.linearize`` (its linear function applied to several
tangents) against the original, for tangents of the parameters, of the chunked data and of
closed-over values, for an axis named by ``argnums`` and for one born inside the function
(Monte-Carlo samples, whose draws stay bit-identical). Compositions: jvp under ``jax.vmap``
and ``jax.jit``, ``jax.grad`` of a jvp, jvp of ``jax.grad``, ``jax.hessian``, ``jacfwd`` of
``jacrev``. Structure: the jvp program scans over chunks and holds no full-size activation;
its memory is a fraction of the original's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, iter_eqns, modes

slow = pytest.mark.slow

_rs = np.random.RandomState(11)
W1 = jnp.asarray(_rs.normal(size=(5, 8)) * 0.4, jnp.float32)
W2 = jnp.asarray(_rs.normal(size=(8, 3)) * 0.4, jnp.float32)
X = jnp.asarray(_rs.normal(size=(12, 5)), jnp.float32)
PARAMS = {"w1": W1, "w2": W2}


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"])
    return jnp.mean(jnp.tanh(h @ params["w2"]) ** 2)


def per_example(params, x):  # a vector output: the rows of the batch
    return jnp.tanh(jnp.tanh(x @ params["w1"]) @ params["w2"]).sum(1)


def mc_samples(params, mu, key):  # the axis born inside: 16 Monte-Carlo samples
    z = mu + jax.random.normal(key, (16, *mu.shape))
    return jnp.mean(jax.vmap(lambda zi: jnp.tanh(zi @ params["w1"]) @ params["w2"])(z) ** 2)


def tangents_like(tree, scale=1.0):
    return jax.tree.map(lambda a: jnp.cos(a * 3.0) * scale, tree)


def serialized(fun, grad, **kw):
    kw.setdefault("argnums", 1)
    return ja.serialize_axis(fun, chunk=5, grad=grad, **kw)


@pytest.mark.parametrize("grad", modes("auto", slow=GRAD_MODES))
@pytest.mark.parametrize("fun", [mlp, per_example], ids=["scalar", "per-example"])
@pytest.mark.slow
def test_jvp_wrt_every_input(fun, grad):
    sf = serialized(fun, grad)
    primals = (PARAMS, X)
    for tangents in [
        (tangents_like(PARAMS), jnp.zeros_like(X)),
        (jax.tree.map(jnp.zeros_like, PARAMS), tangents_like(X)),
        (tangents_like(PARAMS), tangents_like(X, 0.5)),
    ]:
        assert_tree_close(jax.jvp(sf, primals, tangents), jax.jvp(fun, primals, tangents))


@pytest.mark.parametrize("grad", modes("remat", slow=GRAD_MODES))
@pytest.mark.slow
def test_jacfwd(grad):
    sf = serialized(per_example, grad)
    for argnums in (0, 1):
        got = jax.jacfwd(sf, argnums=argnums)(PARAMS, X)
        assert_tree_close(got, jax.jacfwd(per_example, argnums=argnums)(PARAMS, X))


@pytest.mark.parametrize("grad", modes("fused", slow=GRAD_MODES))
@pytest.mark.slow
def test_linearize_applied_to_several_tangents(grad):
    sf = serialized(mlp, grad)
    out, f_lin = jax.linearize(sf, PARAMS, X)
    ref_out, ref_lin = jax.linearize(mlp, PARAMS, X)
    assert_tree_close(out, ref_out)
    for scale in (1.0, -0.5, 3.0):
        tangents = (tangents_like(PARAMS, scale), tangents_like(X, scale))
        assert_tree_close(f_lin(*tangents), ref_lin(*tangents), what=f"f_lin at scale {scale}")
    batch = jnp.stack([tangents_like(X, s) for s in (1.0, 2.0)])
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    assert_tree_close(
        jax.vmap(lambda t: f_lin(zeros, t))(batch), jax.vmap(lambda t: ref_lin(zeros, t))(batch)
    )


def weighted(params, x, y):  # two chunked inputs: data and per-row weights
    return jnp.mean(jnp.tanh(x @ params["w1"]) @ params["w2"] * y[:, None])


@pytest.mark.parametrize("grad", modes("native", slow=GRAD_MODES))
def test_linearize_with_a_chunked_input_held_constant(grad):
    """Forward mode with respect to some of the chunked inputs: the per-row weights ``y``
    are chunked but not perturbed (closed over by the caller), so their tangent is absent
    and the loop slices only the tangents it has."""
    y = jnp.cos(jnp.arange(12.0))
    sf = ja.serialize_axis(weighted, chunk=5, argnums=(1, 2), grad=grad)
    out, f_lin = jax.linearize(lambda p, x: sf(p, x, y), PARAMS, X)
    ref_out, ref_lin = jax.linearize(lambda p, x: weighted(p, x, y), PARAMS, X)
    tangents = (tangents_like(PARAMS), tangents_like(X))
    assert_tree_close((out, f_lin(*tangents)), (ref_out, ref_lin(*tangents)))
    t_x = tangents_like(X, -2.0)
    got = jax.jvp(lambda x: sf(PARAMS, x, y), (X,), (t_x,))
    assert_tree_close(got, jax.jvp(lambda x: weighted(PARAMS, x, y), (X,), (t_x,)))


@pytest.mark.parametrize("grad", modes(slow=GRAD_MODES))
def test_closed_over_values(grad):
    def outer(w2):
        def f(w1, x):
            return jnp.mean(jnp.tanh(jnp.tanh(x @ w1) @ w2))

        return f

    def run(make):
        return jax.jvp(lambda w2: make(w2)(W1, X), (W2,), (jnp.ones_like(W2),))

    got = run(lambda w2: serialized(outer(w2), grad))
    assert_tree_close(got, run(outer))


@pytest.mark.parametrize("grad", modes("remat", slow=GRAD_MODES))
@pytest.mark.slow
def test_axis_born_inside_with_random_draws(grad):
    sf = ja.serialize_axis(mc_samples, chunk=4, size=16, grad=grad)
    mu, key = jnp.ones((3, 5)) * 0.1, jax.random.key(3)
    primals, tangents = (PARAMS, mu), (tangents_like(PARAMS), jnp.ones_like(mu))

    def jvp(f):
        return jax.jvp(lambda p, m: f(p, m, key), primals, tangents)

    assert_tree_close(jvp(sf), jvp(mc_samples))
    assert sf.explain(PARAMS, mu, key).axis_size == 16


@pytest.mark.parametrize("grad", modes("fused", slow=GRAD_MODES))
@pytest.mark.slow
def test_compositions(grad):
    sf = serialized(mlp, grad)
    t = (tangents_like(PARAMS), tangents_like(X))
    cases = {
        "jit(jvp)": lambda f: jax.jit(lambda p, x: jax.jvp(f, (p, x), t))(PARAMS, X),
        "vmap(jvp)": lambda f: jax.vmap(lambda x: jax.jvp(f, (PARAMS, x), (t[0], t[1])), in_axes=0)(
            jnp.stack([X, -X])
        ),
        "grad(jvp)": lambda f: jax.grad(lambda p: jax.jvp(f, (p, X), t)[1])(PARAMS),
        "jvp(grad)": lambda f: jax.jvp(jax.grad(f), (PARAMS, X), t),
        "hessian": lambda f: jax.hessian(lambda w2: f({"w1": W1, "w2": w2}, X))(W2),
        "jacfwd(jacrev)": lambda f: jax.jacfwd(jax.jacrev(f, argnums=1), argnums=0)(PARAMS, X),
    }
    for name, run in cases.items():
        assert_tree_close(run(sf), run(mlp), what=f"{name} ({grad})")


@pytest.mark.parametrize("grad", modes("remat", "native"))
def test_jvp_program_scans_over_chunks_without_full_size_activations(grad):
    n, chunk = 40, 8
    x = jnp.asarray(np.random.RandomState(0).normal(size=(n, 5)), jnp.float32)
    sf = ja.serialize_axis(mlp, chunk=chunk, argnums=1, grad=grad)
    t = (tangents_like(PARAMS), tangents_like(x))
    jaxpr = jax.make_jaxpr(lambda p, x: jax.jvp(sf, (p, x), t))(PARAMS, x)
    scans = [e for e in iter_eqns(jaxpr) if e.primitive.name == "scan"]
    assert any(e.params["length"] == n // chunk for e in scans), jaxpr
    big = [
        e
        for e in iter_eqns(jaxpr)
        for v in e.outvars
        if getattr(v.aval, "shape", ())[:1] == (n,)
        and len(v.aval.shape) == 2
        and v.aval.shape[1] == 8
    ]
    assert not big, [str(e) for e in big]


@pytest.mark.slow
def test_jvp_memory_scales_with_the_chunk():
    d, n, layers = 64, 512, 4
    ks = jax.random.split(jax.random.key(0), layers + 1)
    ws = [jax.random.normal(k, (d, d)) / d**0.5 for k in ks[:layers]]
    x = jax.random.normal(ks[layers], (n, d))

    def deep(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    def temp(f):
        def jvp(ws, x):
            return jax.jvp(f, (ws, x), ([jnp.ones_like(w) for w in ws], x))

        return jax.jit(jvp).lower(ws, x).compile().memory_analysis().temp_size_in_bytes

    sf = ja.serialize_axis(deep, chunk=n // 8, argnums=1)
    assert temp(sf) <= 0.5 * temp(deep), (temp(sf), temp(deep))
