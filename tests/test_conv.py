"""``_conv.canonical_conv`` equals ``lax.conv_general_dilated`` (values and both gradients),
and the chunked backward's convolutions come out canonical for XLA:CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum._engine._conv import canonical_conv, canonicalize

CASES = [
    # lhs shape, rhs shape, strides, padding, lhs_dil, rhs_dil, dimension numbers, groups
    ((2, 9, 9, 4), (3, 3, 4, 6), (1, 1), "SAME", (1, 1), (1, 1), ("NHWC", "HWIO", "NHWC"), 1),
    ((2, 9, 9, 4), (3, 3, 4, 6), (2, 2), "VALID", (1, 1), (1, 1), ("NHWC", "HWIO", "NHWC"), 1),
    (
        (2, 4, 9, 9),
        (6, 4, 3, 3),
        (1, 2),
        ((1, 2), (0, 1)),
        (1, 1),
        (2, 1),
        ("NCHW", "OIHW", "NCHW"),
        1,
    ),
    ((2, 9, 9, 4), (3, 3, 2, 6), (1, 1), "SAME", (1, 1), (1, 1), ("NHWC", "HWIO", "NHWC"), 2),
    (
        (2, 5, 5, 4),
        (3, 3, 4, 3),
        (1, 1),
        ((2, 2), (2, 2)),
        (2, 2),
        (1, 1),
        ("NHWC", "HWIO", "NHWC"),
        1,
    ),
]


@pytest.mark.slow  # every case compiles convolutions eagerly
@pytest.mark.parametrize("case", [pytest.param(c, id=f"case{i}") for i, c in enumerate(CASES)])
def test_canonical_conv_matches_lax(case):
    lhs_shape, rhs_shape, strides, padding, lhs_dil, rhs_dil, dn, groups = case
    k1, k2 = jax.random.split(jax.random.key(0))
    lhs, rhs = jax.random.normal(k1, lhs_shape), jax.random.normal(k2, rhs_shape)

    def conv(a, b):
        return lax.conv_general_dilated(
            a, b, strides, padding, lhs_dil, rhs_dil, dn, feature_group_count=groups
        )

    (eqn,) = [e for e in jax.make_jaxpr(conv)(lhs, rhs).eqns if "conv" in e.primitive.name]
    ref = conv(lhs, rhs)
    out = canonical_conv(lhs, rhs, **eqn.params)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    ct = jax.random.normal(jax.random.key(1), ref.shape)
    _, pull = jax.vjp(conv, lhs, rhs)
    got = canonicalize(pull)(ct)
    for g, r in zip(got, pull(ct), strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_chunked_backward_convolutions_are_canonical():
    def loss(w, x):
        h = lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(jnp.tanh(h) ** 2)

    w = jax.random.normal(jax.random.key(0), (3, 3, 4, 4)) * 0.3
    x = jax.random.normal(jax.random.key(1), (8, 6, 6, 4))
    sf = ja.serialize_axis(loss, chunk=2, argnums=1, grad="remat")
    hlo = jax.jit(jax.grad(sf)).lower(w, x).compile().as_text()
    labels = [
        line.split("dim_labels=")[1].split(",")[0]
        for line in hlo.splitlines()
        if " convolution(" in line
    ]
    assert labels and all(label == "b01f_01io->b01f" for label in labels), labels
    np.testing.assert_allclose(jax.grad(sf)(w, x), jax.grad(loss)(w, x), rtol=1e-4, atol=1e-4)
