"""Correctness check for conv_canonical: values and gradients vs lax.conv_general_dilated,
plus: every convolution left in the optimized HLO of a scan body is canonical.

Run: python check_conv_canonical.py   (CPU, ~1 minute)
"""

from __future__ import annotations

import itertools
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_canonical import canonicalize_convs, conv_canonical  # noqa: E402
from conv_canonical import conv_general_dilated as conv_fixed  # noqa: E402

RTOL, ATOL = 1e-5, 1e-5
CANONICAL = {1: "b0f_0io->b0f", 2: "b01f_01io->b01f", 3: "b012f_012io->b012f"}


def close(a, b, what):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=ATOL,
                                   err_msg=what)


def conv_labels(f, *args):
    hlo = jax.jit(f).lower(*args).compile().as_text()
    return re.findall(r" convolution\(.*?dim_labels=([^,\s]+)", hlo)


def check_case(key, lhs_shape, rhs_shape, dn, **kw):
    k1, k2, k3 = jax.random.split(key, 3)
    lhs = jax.random.normal(k1, lhs_shape, jnp.float32)
    rhs = jax.random.normal(k2, rhs_shape, jnp.float32)

    def f_ref(l, r):
        return lax.conv_general_dilated(l, r, dimension_numbers=dn, **kw)

    def f_new(l, r):
        return conv_fixed(l, r, dimension_numbers=dn, **kw)

    out = f_ref(lhs, rhs)
    ct = jax.random.normal(k3, out.shape, out.dtype)
    what = f"{lhs_shape} {rhs_shape} {dn} {kw}"
    close(f_new(lhs, rhs), out, what + " value")
    _, vjp_ref = jax.vjp(f_ref, lhs, rhs)
    _, vjp_new = jax.vjp(f_new, lhs, rhs)
    close(jax.jit(vjp_new)(ct), vjp_ref(ct), what + " grads")

    # The same pullback inside a lax.scan: all convolutions must be canonical.
    def scanned(l, r, ct):
        def body(c, _):
            _, vjp = jax.vjp(f_new, l, r)
            dl, dr = vjp(ct)
            return (c[0] + dl, c[1] + dr), None
        return lax.scan(body, (jnp.zeros_like(l), jnp.zeros_like(r)), None, length=2)[0]

    nsp = len(lhs_shape) - 2
    labels = conv_labels(scanned, lhs, rhs, ct)
    assert labels and all(x == CANONICAL[nsp] for x in labels), (what, labels)
    close(scanned(lhs, rhs, ct), jax.tree.map(lambda a: 2 * a, vjp_ref(ct)), what + " scan")


def main():
    key = jax.random.PRNGKey(0)
    n = 0
    # 2-D NHWC/HWIO (flax default): strides, padding kinds, odd sizes, rhs/lhs dilation.
    for stride, pad, hw in itertools.product((1, 2), ("SAME", "VALID", ((1, 2), (0, 1))),
                                             (8, 9)):
        check_case(key, (3, hw, hw + 1, 4), (3, 3, 4, 5), ("NHWC", "HWIO", "NHWC"),
                   window_strides=(stride, stride), padding=pad)
        n += 1
    check_case(key, (2, 9, 9, 4), (3, 2, 4, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(2, 1), padding="SAME", rhs_dilation=(2, 1))
    check_case(key, (2, 5, 5, 4), (3, 3, 4, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(1, 1), padding=((2, 2), (1, 1)), lhs_dilation=(2, 2))
    # 1x1 conv, 4x4/stride-4 "patchify" conv.
    check_case(key, (2, 8, 8, 4), (1, 1, 4, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(1, 1), padding="VALID")
    check_case(key, (2, 8, 8, 3), (4, 4, 3, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(4, 4), padding="VALID")
    # Groups (depthwise / grouped) and batch groups.
    check_case(key, (2, 8, 8, 6), (3, 3, 1, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(1, 1), padding="SAME", feature_group_count=6)
    check_case(key, (2, 8, 8, 4), (3, 3, 2, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(2, 2), padding="SAME", feature_group_count=2)
    check_case(key, (4, 8, 8, 3), (3, 3, 3, 6), ("NHWC", "HWIO", "NHWC"),
               window_strides=(1, 1), padding="SAME", batch_group_count=2)
    # Other layouts, 1-D, 3-D.
    check_case(key, (2, 4, 9, 9), (5, 4, 3, 3), ("NCHW", "OIHW", "NCHW"),
               window_strides=(2, 2), padding="SAME")
    check_case(key, (2, 10, 4), (3, 4, 5), ("NWC", "WIO", "NWC"),
               window_strides=(2,), padding="SAME")
    check_case(key, (2, 5, 6, 6, 3), (3, 3, 3, 3, 4), ("NDHWC", "DHWIO", "NDHWC"),
               window_strides=(1, 2, 1), padding="SAME")
    n += 10
    print(f"{n} conv configurations: values/grads match lax (rtol {RTOL}), scan HLO canonical")

    # conv_canonical takes the jaxpr equation params directly.
    x = jax.random.normal(key, (2, 8, 8, 4))
    w = jax.random.normal(key, (3, 3, 4, 5))
    eqn = jax.make_jaxpr(lambda a, b: lax.conv_general_dilated(
        a, b, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))(x, w).eqns[0]
    close(conv_canonical(x, w, **eqn.params), lax.conv_general_dilated_p.bind(x, w, **eqn.params),
          "eqn params")

    # vmap (per-example weights -> feature groups) and jax.checkpoint / grad of grad-free use.
    xs = jax.random.normal(key, (3, 2, 8, 8, 4))
    ws = jax.random.normal(key, (3, 3, 3, 4, 5))
    dn = ("NHWC", "HWIO", "NHWC")

    def loss(conv):
        return lambda x, w: jnp.sum(jnp.tanh(conv(x, w, (1, 1), "SAME", dimension_numbers=dn)))

    ref = jax.grad(lambda x, w: jax.vmap(loss(lax.conv_general_dilated))(x, w).sum(),
                   (0, 1))(xs, ws)
    new = jax.grad(lambda x, w: jax.vmap(jax.checkpoint(loss(conv_fixed)))(x, w).sum(),
                   (0, 1))(xs, ws)
    close(new, ref, "vmap+checkpoint")
    for w_axis, w in ((None, ws[0]), (0, ws)):  # shared and per-example weights
        def grads(xs, w, w_axis=w_axis):
            return jax.grad(lambda x, w: jax.vmap(loss(conv_fixed), (0, w_axis))(x, w).sum(),
                            (0, 1))(xs, w)
        labels = conv_labels(lambda xs, w: lax.scan(
            lambda c, _: (c, grads(xs, w)), 0.0, None, length=2)[1], xs, w)
        assert all(x == CANONICAL[2] for x in labels), labels

    # canonicalize_convs on a whole pullback (no custom_vjp, plain lax convs in the model).
    def pullback(x, w):
        return jax.vjp(loss(lax.conv_general_dilated), x, w)[1](1.0)

    close(canonicalize_convs(pullback)(xs[0], ws[0]), pullback(xs[0], ws[0]), "rewrite")
    labels = conv_labels(lambda x, w: lax.scan(
        lambda c, _: (c, canonicalize_convs(pullback)(x, w)), 0.0, None, length=2)[1],
        xs[0], ws[0])
    assert all(x == CANONICAL[2] for x in labels), labels
    print("eqn params, vmap+checkpoint, canonicalize_convs(pullback): ok")


if __name__ == "__main__":
    main()
