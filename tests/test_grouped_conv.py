"""Per-example gradients of conv nets (DP-SGD): the axis as a convolution's groups.

Under ``jax.vmap``, each example's *weight* gradient of a convolution is a convolution whose
feature groups hold the examples (``feature_group_count = N``), with reshapes (some with
``dimensions``) moving the axis in and out of the feature dimension; for a conv that already
groups its features (depthwise), the weight gradient groups its batch and ``vmap`` puts the
examples into the batch groups. Each program here is DP-SGD's: per-example gradients,
clipped by their norm and summed. It is serialized over the examples and compared with the
unchunked original (values and gradients, ``tests/oracle.py``); the plan must have no stop.
Then grouped convolutions whose groups are *not* the axis: chunked where that is exact (the
axis in the conv batch; groups a multiple of the axis with the axis their major factor), a
stop where it is not (groups that do not divide by the axis; the axis a minor factor).

Tiers: the default tier runs one program (2-D NHWC, stride 2, a chunk that does not divide
the axis); the slow tier every form, padding and stride at several chunk sizes.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_accum as ja

from .oracle import NOT_WORTH_IT, assert_matches_original, find_eqns

N = 10


def _rand(shape, seed, scale=1.0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape) * scale, jnp.float32)


def _conv(strides, padding, dn, groups=1, rhs_dilation=None):
    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, strides, padding, rhs_dilation=rhs_dilation, dimension_numbers=dn,
            feature_group_count=groups,
        )  # fmt: skip

    return conv


# name: (conv, example shape, weight shape). Depthwise convs give the batch-group form.
FORMS = {
    "2d_nhwc_stride2_same": (
        _conv((2, 2), "SAME", ("NHWC", "HWIO", "NHWC")),
        (7, 7, 2),
        (3, 3, 2, 4),
    ),
    "2d_nchw_padded_dilated": (
        _conv((1, 1), ((1, 0), (0, 2)), ("NCHW", "OIHW", "NCHW"), rhs_dilation=(2, 1)),
        (2, 6, 5),
        (3, 2, 2, 3),
    ),
    "1d_nwc_stride2_valid": (_conv((2,), "VALID", ("NWC", "WIO", "NWC")), (11, 3), (3, 3, 2)),
    "2d_depthwise_batch_groups": (
        _conv((1, 1), "SAME", ("NHWC", "HWIO", "NHWC"), groups=2),
        (5, 5, 2),
        (3, 3, 1, 2),
    ),
    "1d_depthwise_multiplier2_stride2": (
        _conv((2,), ((1, 1),), ("NWC", "WIO", "NWC"), groups=3),
        (9, 3),
        (3, 1, 6),
    ),
}


def dp_sgd(conv, clip=1.0):
    """DP-SGD's private gradient without the noise: per-example gradients (single-example
    batches under ``vmap``), clipped to norm ``clip``, summed; and the per-example norms."""

    def loss(w, x):
        return jnp.sum(jnp.tanh(conv(x[None], w)) ** 2)

    def clipped_sum(w, xs):
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, xs)
        axes = tuple(range(1, g.ndim))
        norms = jnp.sqrt(jnp.sum(g**2, axis=axes))
        scale = jnp.maximum(norms / clip, 1.0).reshape((-1,) + (1,) * len(axes))
        return jnp.sum(g / scale, 0), norms

    return clipped_sum


def check(f, *args, chunk, grad="remat", stops=(), vmap=False):
    """Serialize ``f`` over ``args[1]``; the plan stops exactly at ``stops`` (primitive names);
    values and gradients equal the original's."""
    sf = ja.serialize_axis(f, chunk=chunk, argnums=1, grad=grad)
    plan = sf.explain(*args)
    assert plan.counts["body"] > 0, f"nothing chunked:\n{plan}"
    assert sorted({str(s).split("`")[1] for s in plan.stops}) == sorted(stops), str(plan)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT.split(":")[1], ja.PlanWarning)
        assert_matches_original(sf, *args, vmap=vmap)
    return sf


def _args(form, n=N):
    _, example, weight = FORMS[form]
    return _rand(weight, 0, scale=0.4), _rand((n, *example), 1)


def test_dp_sgd_conv_chunks_through_the_grouped_weight_gradient():
    """The weight gradient's conv has the examples as its feature groups: chunked, exact."""
    w, xs = _args("2d_nhwc_stride2_same")
    sf = check(dp_sgd(FORMS["2d_nhwc_stride2_same"][0]), w, xs, chunk=3)
    convs = find_eqns(sf.jaxpr(w, xs), "conv_general_dilated")
    assert any(e.params["feature_group_count"] == 3 for e in convs), convs  # k groups


BATCH_GROUPS = ("2d_depthwise_batch_groups", "1d_depthwise_multiplier2_stride2")


@pytest.mark.slow
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("chunk", [1, 3, 5, N, 16])
def test_dp_sgd_conv_forms(form, chunk):
    w, xs = _args(form)
    f = dp_sgd(FORMS[form][0])
    jaxpr = jax.make_jaxpr(f)(w, xs)
    name = "batch_group_count" if form in BATCH_GROUPS else "feature_group_count"
    counts = [e.params[name] for e in find_eqns(jaxpr, "conv_general_dilated")]
    assert any(c >= N and c % N == 0 for c in counts), jaxpr  # N x (the conv's own) groups
    check(f, w, xs, chunk=chunk, vmap=chunk == 3)


@pytest.mark.slow
@pytest.mark.parametrize("grad", ["native", "fused", "auto"])
def test_dp_sgd_conv_other_modes(grad):
    w, xs = _args("2d_depthwise_batch_groups")
    check(dp_sgd(FORMS["2d_depthwise_batch_groups"][0]), w, xs, chunk=4, grad=grad)


def _channels(x, minor):
    """``x`` [N, H, W, C] as one image with N * C channels: the axis the major factor of the
    channels, or (``minor``) the minor one."""
    x = jnp.moveaxis(x, 0, -1 if minor else -2)  # [H, W, C, N] or [H, W, N, C]
    return x.reshape(1, *x.shape[:2], -1)


def _grouped_over_channels(groups, minor=False):
    def f(w, x):
        y = lax.conv_general_dilated(
            _channels(x, minor), w, (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups,
        )  # fmt: skip
        return jnp.sum(jnp.tanh(y) ** 2)

    return f


@pytest.mark.slow
@pytest.mark.parametrize(
    "groups, minor, stops",
    [
        (2 * N, False, ()),  # one group per channel, the axis their major factor: chunked
        (N, False, ()),  # one group per example
        (2, False, ("conv_general_dilated",)),  # each group mixes examples
        (2 * N, True, ("conv_general_dilated", "reshape")),  # the axis a minor factor
    ],
)
@pytest.mark.parametrize("chunk", [3, 5])
def test_grouped_conv_whose_groups_are_not_the_axis(groups, minor, stops, chunk):
    x = _rand((N, 5, 5, 2), 2)
    w = _rand((3, 3, 2 * N // groups, 2 * groups), 3, scale=0.3)  # the kernel too along the axis
    check(_grouped_over_channels(groups, minor), w, x, chunk=chunk, stops=stops)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [3, 5])
def test_grouped_conv_with_the_axis_in_its_batch(chunk):
    """An ordinary grouped conv over a batch of examples: its groups are channels, chunked."""
    conv = _conv((1, 1), "SAME", ("NHWC", "HWIO", "NHWC"), groups=2)

    def f(w, x):
        return jnp.sum(jnp.tanh(conv(x, w)) ** 2)

    check(f, _rand((3, 3, 2, 4), 4, scale=0.4), _rand((N, 5, 5, 4), 5), chunk=chunk)


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's canonical labels")
def test_chunked_grouped_convolutions_are_canonical_on_cpu():
    """Inside the loop XLA:CPU does not canonicalize a convolution for its fast kernel (a
    per-example weight gradient has labels like ``f01b_i01o->01bf``): the chunked ones are
    emitted canonical, so every convolution of the compiled program is."""
    w, xs = _args("2d_nhwc_stride2_same")
    sf = ja.serialize_axis(dp_sgd(FORMS["2d_nhwc_stride2_same"][0]), chunk=5, argnums=1)
    hlo = jax.jit(sf).lower(w, xs).compile().as_text()
    labels = [
        line.split("dim_labels=")[1].split(",")[0]
        for line in hlo.splitlines()
        if " convolution(" in line
    ]
    assert labels and all(label == "b01f_01io->b01f" for label in labels), labels
