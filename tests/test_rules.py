"""One small program per rule family the rewriter claims to support.

Every program is serialized over its batch axis (``argnums`` or ``size``) and compared with
the unchunked original, values and reverse-mode derivatives with respect to every float input
(``jaxpr_accum.testing.assert_matches_original``), in both ``grad="remat"`` and
``grad="native"``. The batch axis has length ``N = 10``; chunk sizes 3 and 5 (a non-divisor
and a divisor) are used throughout, and 1 and ``>= N`` where cheap. Where chunking is
expected, the plan of ``explain`` must count some chunked equations (the region is not
empty), so a rule that silently turned into a barrier (leaving everything unchunked) fails
the test.

Tiers: the default tier runs every family once, in ``grad="remat"`` with chunk 3 (a
non-divisor: full chunks and a remainder); the other parametrisations are ``slow``.
"""

from __future__ import annotations

import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental.ode import odeint
from jax.interpreters import ad, mlir

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import assert_matches_original, modes

N = 10
NOT_WORTH_IT = "(?s).*not expected to save memory"  # the PlanWarning of a plan that saves nothing
CHUNKS = [3, 5]


def _rand(shape, seed, dtype=jnp.float32, scale=1.0):
    return jnp.asarray(np.random.RandomState(seed).normal(size=shape) * scale, dtype)


def _ints(shape, high, seed):
    return jnp.asarray(np.random.RandomState(seed).randint(0, high, size=shape), jnp.int32)


def check(
    f,
    *args,
    chunk,
    grad,
    argnums=None,
    size=None,
    wrt=None,
    expect_chunked=True,
    expect_whole=True,
    rtol=None,
):
    """Serialize ``f`` and compare it with the original; returns the ``Plan``.

    ``expect_chunked``: the plan must count some chunked equations. ``expect_whole``: the
    region must not have stopped anywhere (every rule on the way is known and chunkable).
    ``wrt``: compare value and gradient with respect to these arguments only (a scalar ``f``
    that JAX cannot reverse-differentiate with respect to the others); by default, every
    floating input (``jaxpr_accum.testing.assert_matches_original``). ``rtol``: as there."""
    kw = {"argnums": argnums} if argnums is not None else {"size": size}
    sf = ja.serialize_axis(f, chunk=chunk, grad=grad, **kw)
    plan = sf.explain(*args)
    if expect_chunked:
        assert plan.counts["body"] > 0, f"nothing chunked:\n{plan}"
    if expect_whole:
        assert not plan.stops, str(plan)
    with warnings.catch_warnings():
        # Toy sizes (N = 10, a few features): the cost model may expect no saving and the first
        # call then warns. Incidental here: what is tested is the rule, by exactness.
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        if wrt is None:
            assert_matches_original(sf, *args, rtol=rtol, vmap=False)
        else:
            got = jax.value_and_grad(sf, argnums=wrt)(*args)
            assert_tree_close(got, jax.value_and_grad(f, argnums=wrt)(*args), rtol=rtol)
    return plan


# Each family runs in both gradient modes, once with a chunk that does not divide N (3) and
# once with one that does (5); a few families also run with chunk 1 and chunk > N. The first
# parametrisation is the default tier's; the others are the slow tier's.
slow = pytest.mark.slow
cases = pytest.mark.parametrize(
    "grad, chunk", [("remat", 3), pytest.param("native", 5, marks=slow)]
)
cases_wide = pytest.mark.parametrize(
    "grad, chunk",
    [
        ("remat", 3),
        pytest.param("native", 5, marks=slow),
        pytest.param("native", 1, marks=slow),
        pytest.param("remat", 12, marks=slow),
    ],
)
grad_mode = pytest.mark.parametrize("grad", modes("remat", slow=("native",)))


# --------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------


def f_unary(x):
    return _unary(x).sum()


def _unary(x):
    return (
        jnp.sin(x)
        + jnp.exp(-(x**2))
        + jnp.log1p(x * x)
        + jnp.tanh(x) * jnp.abs(x)
        + jnp.sqrt(x * x + 1.0)
        + jax.nn.sigmoid(x)
        - jnp.cos(x) * jnp.floor(x)
        + jnp.sign(x) * jnp.expm1(-jnp.abs(x))
        + lax.rsqrt(x * x + 2.0)
        + jnp.arctan(x)
    )


@cases_wide
def test_elementwise_unary(grad, chunk):
    x = _rand((N, 4), 0)
    check(f_unary, x, chunk=chunk, grad=grad, argnums=0)


def f_binary(x, y):
    yp = jnp.abs(y) + 0.5
    return (
        x * y
        + x / yp
        - jnp.maximum(x, y)
        + jnp.minimum(x, 2.0 * y)
        + jnp.power(yp, x)
        + jnp.arctan2(x, yp)
        + lax.rem(x, yp)
        + jnp.hypot(x, yp)
    )


@cases
def test_elementwise_binary(grad, chunk):
    x, y = _rand((N, 4), 1), _rand((N, 4), 2)
    check(f_binary, x, y, chunk=chunk, grad=grad, argnums=(0, 1))


def f_ternary(x, y):
    a = jnp.where(x > 0, x * y, jnp.sin(y))  # select_n
    b = lax.clamp(-0.5, x, 0.5)  # clamp
    c = jnp.clip(y * 2.0, -1.0, 1.0)
    d = lax.select(x < y, x, y)
    e = lax.select_n(jnp.asarray(x > 0, jnp.int32) + jnp.asarray(y > 0, jnp.int32), x, y, x * y)
    return a + b + c + d + e


@cases
def test_elementwise_ternary_select_clamp(grad, chunk):
    x, y = _rand((N, 4), 3), _rand((N, 4), 4)
    check(f_ternary, x, y, chunk=chunk, grad=grad, argnums=(0, 1))


def test_ternary_program_uses_clamp_and_select_n():
    """The program above really contains the primitives the test is named after."""
    x, y = _rand((N, 4), 3), _rand((N, 4), 4)
    names = {e.primitive.name for e in jax.make_jaxpr(f_ternary)(x, y).jaxpr.eqns}
    assert {"clamp", "select_n"} <= names, names


def f_convert_pow(x):
    y = _convert_pow(x)
    return y, y.sum()


def _convert_pow(x):
    b = x.astype(jnp.bfloat16).astype(jnp.float32)  # convert_element_type (differentiable)
    h = x.astype(jnp.float16).astype(jnp.float32) * 0.5
    i = jnp.floor(x * 3.0).astype(jnp.int32)  # to int: no gradient
    return b * x + h + x**3 + (x**2) * i.astype(jnp.float32) + lax.integer_pow(x, -2)


@cases
def test_elementwise_convert_integer_pow(grad, chunk):
    x = jnp.abs(_rand((N, 4), 5)) + 0.5
    check(f_convert_pow, x, chunk=chunk, grad=grad, argnums=0)


def f_compare(x, y):
    m = (
        (x > y).astype(jnp.float32)
        + (x >= 0.1).astype(jnp.float32) * 2
        + (x < y * 0.5).astype(jnp.float32) * 3
        + (x <= -0.2).astype(jnp.float32) * 5
        + (jnp.round(x) == jnp.round(y)).astype(jnp.float32) * 7
        + (jnp.round(x) != 0).astype(jnp.float32) * 11
    )
    return m * x * y, m


@cases
def test_elementwise_comparisons(grad, chunk):
    x, y = _rand((N, 4), 6), _rand((N, 4), 7)
    check(f_compare, x, y, chunk=chunk, grad=grad, argnums=(0, 1))


def f_bitwise(x, i, j):
    b = (i & 3) | ((j ^ 5) >> 1)
    b = b + (~i & 0xFF) + lax.shift_left(j, 2) + lax.shift_right_logical(i, 1) + (i % 7)
    b = b + lax.population_count(i) - jnp.where(i > j, i, j)
    flag = jnp.logical_and(i > 2, jnp.logical_not(j > 4)) | jnp.logical_xor(i > 1, j > 1)
    return x * b.astype(jnp.float32) + flag.astype(jnp.float32), b, flag


@cases
def test_elementwise_bitwise_ints(grad, chunk):
    x = _rand((N, 4), 8)
    i, j = _ints((N, 4), 100, 9), _ints((N, 4), 100, 10)
    check(f_bitwise, x, i, j, chunk=chunk, grad=grad, argnums=(0, 1, 2))


def _elementwise_size1_broadcast(x, y):
    return jnp.tanh(x * y + y).sum() + (x - y).sum(axis=0)


@cases
def test_elementwise_size1_broadcast(grad, chunk):
    x, y = _rand((N, 4), 11), _rand((1, 4), 12)
    check(_elementwise_size1_broadcast, x, y, chunk=chunk, grad=grad, argnums=0)


def _elementwise_scalar_broadcast(x, s):
    return jnp.sin(x * s + 2.0) * s - s / (1.0 + x * x), (x * 3.0).sum() * s


@cases
def test_elementwise_scalar_broadcast(grad, chunk):
    x, s = _rand((N, 4), 13), jnp.float32(0.7)
    check(_elementwise_scalar_broadcast, x, s, chunk=chunk, grad=grad, argnums=0)


# --------------------------------------------------------------------------------------
# Shape
# --------------------------------------------------------------------------------------


def _shape_broadcast_in_dim(x, w):
    b = jnp.broadcast_to(x[:, :, None], (N, 4, 3))  # broadcast_in_dim carrying the axis
    c = lax.broadcast_in_dim(w, (N, 4, 3), (1, 2))  # a param broadcast to the axis
    return jnp.tanh(b * c + x[:, None, :].mean(-1, keepdims=True)).sum()


@cases
def test_shape_broadcast_in_dim(grad, chunk):
    x, w = _rand((N, 4), 14), _rand((4, 3), 15)
    check(_shape_broadcast_in_dim, x, w, chunk=chunk, grad=grad, argnums=0)


def _shape_reshape_split_merge(x, w):
    h = x.reshape(N, 2, 3) * w  # split
    h = jnp.tanh(h).reshape(N, 6)  # merge
    g = x.reshape(N * 6) * 2.0  # merge the axis into a bigger dim (major factor)
    return h.sum() + jnp.sin(g).reshape(N, 3, 2).sum(), h


@cases
def test_shape_reshape_split_merge(grad, chunk):
    x, w = _rand((N, 6), 16), _rand((2, 3), 17)
    check(_shape_reshape_split_merge, x, w, chunk=chunk, grad=grad, argnums=0)


def _shape_transpose(x):
    t = jnp.transpose(x, (2, 0, 1))  # [4, N, 3]
    u = jnp.sin(t) * jnp.swapaxes(x, 1, 2).transpose(1, 0, 2)
    return u, u.sum(axis=(0, 2))


@cases
def test_shape_transpose(grad, chunk):
    x = _rand((N, 3, 4), 18)
    check(_shape_transpose, x, chunk=chunk, grad=grad, argnums=0)


def _shape_squeeze_expand_dims(x):
    s = jnp.squeeze(x, 1)  # [N, 4]
    e = jnp.expand_dims(jnp.tanh(s), -1) * jnp.expand_dims(s, 1)  # [N, 4, 4]
    return lax.squeeze(e[:, :1], (1,)).sum() + e.sum()


@cases
def test_shape_squeeze_expand_dims(grad, chunk):
    x = _rand((N, 1, 4), 19)
    check(_shape_squeeze_expand_dims, x, chunk=chunk, grad=grad, argnums=0)


def _shape_iota_along_axis(x):
    pos = jnp.arange(N)[:, None]  # iota along the axis
    h = pos * x + lax.broadcasted_iota(jnp.float32, (N, 4), 0) * jnp.sin(x)
    return h, (h * h).sum()


@cases_wide
def test_shape_iota_along_axis(grad, chunk):
    """iota along the serialized axis must count from the chunk's offset."""

    x = _rand((N, 4), 20)
    check(_shape_iota_along_axis, x, chunk=chunk, grad=grad, argnums=0)


def _shape_iota_other_axis(x):
    h = jnp.arange(4)[None, :] * x + lax.broadcasted_iota(jnp.int32, (N, 4), 1) * x**2
    return h.sum()


@cases
def test_shape_iota_other_axis(grad, chunk):
    x = _rand((N, 4), 21)
    check(_shape_iota_other_axis, x, chunk=chunk, grad=grad, argnums=0)


def _shape_slice_pad_concat_rev_other_axis(x):
    a = x[:, 1:4]  # slice
    b = jnp.pad(a, ((0, 0), (1, 2)))  # pad -> [N, 6]
    c = lax.pad(x, 0.5, ((0, 0, 0), (0, -1, 1)))  # interior + negative padding
    d = jnp.concatenate([x, jnp.sin(x)], axis=1)[:, :6]  # concatenate -> slice
    e = x[:, ::-1]  # rev
    g = x[:, ::2]  # strided slice
    return b * d + c[:, :6] + jnp.concatenate([e, e], axis=1)[:, :6] * 0.5, (g * g).sum()


@cases
def test_shape_slice_pad_concat_rev_other_axis(grad, chunk):
    x = _rand((N, 5), 22)
    check(_shape_slice_pad_concat_rev_other_axis, x, chunk=chunk, grad=grad, argnums=0)


def _shape_dynamic_slice_update_other_axis(x, u, i):
    s = lax.dynamic_slice_in_dim(x, i, 2, axis=1)  # [N, 2]
    v = lax.dynamic_update_slice_in_dim(x, jnp.tanh(u) * s, i + 1, axis=1)
    w = lax.dynamic_slice(v, (0, i), (N, 3))  # full-length axis in the slice sizes
    return v.sum() + (w * w).sum(), v


@cases
def test_shape_dynamic_slice_update_other_axis(grad, chunk):
    x, u = _rand((N, 6), 23), _rand((N, 2), 24)
    check(
        _shape_dynamic_slice_update_other_axis,
        x,
        u,
        jnp.int32(2),
        chunk=chunk,
        grad=grad,
        argnums=(0, 1),
    )


# --------------------------------------------------------------------------------------
# Gather / scatter
# --------------------------------------------------------------------------------------


def _gather_embedding_lookup(table, ids, w):
    e = table[ids]  # [N, T, D]
    return jnp.tanh(e @ w).sum() + (e**2).mean()


@cases_wide
def test_gather_embedding_lookup(grad, chunk):
    table, w = _rand((7, 4), 25), _rand((4, 3), 26)
    ids = _ints((N, 5), 7, 27)
    check(_gather_embedding_lookup, table, ids, w, chunk=chunk, grad=grad, argnums=1)


def _gather_take_along_other_axis(x, idx):
    t = jnp.take_along_axis(x, idx, axis=1)  # [N, 2]
    return jnp.sin(t).sum(), t


@cases
def test_gather_take_along_other_axis(grad, chunk):
    x = _rand((N, 5), 28)
    idx = _ints((N, 2), 5, 29)
    check(_gather_take_along_other_axis, x, idx, chunk=chunk, grad=grad, argnums=(0, 1))


def _gather_one_hot_cross_entropy(w, x, labels):
    logits = x @ w
    onehot = jax.nn.one_hot(labels, 3)
    return -(onehot * jax.nn.log_softmax(logits)).sum() / N


@cases
def test_gather_one_hot_cross_entropy(grad, chunk):
    w, x = _rand((4, 3), 30), _rand((N, 4), 31)
    labels = _ints((N,), 3, 32)
    check(_gather_one_hot_cross_entropy, w, x, labels, chunk=chunk, grad=grad, argnums=(1, 2))


def _scatter_set_add_other_axis(x, y):
    a = x.at[:, 0].set(y[:, 0] * 2.0)  # scatter along the feature axis
    b = a.at[:, 2].add(jnp.sin(y[:, 1]))  # scatter-add
    c = b.at[:, 1].set(b[:, 1] * y[:, 2])
    return (c * c).sum(), c


@cases
def test_scatter_set_add_other_axis(grad, chunk):
    x, y = _rand((N, 4), 33), _rand((N, 3), 34)
    check(_scatter_set_add_other_axis, x, y, chunk=chunk, grad=grad, argnums=(0, 1))


def _scatter_per_row(x, y):
    """Each row writes its own row (``arange`` rows, labels as columns): the one-hot built by
    a scatter, and a per-row ``add`` into the chunked ``x``."""
    rows = jnp.arange(x.shape[0])
    onehot = jnp.zeros_like(x).at[rows, y].set(1.0)
    bumped = x.at[rows, y].add(jnp.sin(x[:, 0]))
    return -(onehot * jax.nn.log_softmax(bumped)).sum(), bumped


@cases_wide
def test_scatter_per_row(grad, chunk):
    x, y = _rand((N, 4), 35), _ints((N,), 4, 36)
    plan = check(_scatter_per_row, x, y, chunk=chunk, grad=grad, argnums=(0, 1))
    assert "scatter" not in str(plan.stops)


def _scatter_whole_indices(x, u, rows, cols):
    """Whole indices (a permutation, repeats, out of bounds both ways) and whole updates
    written into rows of the chunked ``x``, in every scatter mode and combining form."""
    a = x.at[rows, cols].set(u)  # FILL_OR_DROP: out-of-bounds writes dropped
    b = a.at[rows, cols].add(u * u, mode="clip")
    c = b.at[rows[::-1], cols].multiply(1.5, mode="promise_in_bounds")
    d = c.at[jnp.arange(N), jnp.arange(N) % 4].max(u[:N])
    return jnp.sum(jnp.tanh(d) * x), d


@cases_wide
def test_scatter_whole_indices_into_rows(grad, chunk):
    x, u = _rand((N, 4), 37), _rand((2 * N,), 38)
    rows = jnp.asarray(
        [*np.random.RandomState(39).permutation(N), 0, 0, 3, N - 1, N, N + 4, -1, -3, 2, 2],
        jnp.int32,
    )
    cols = _ints((2 * N,), 4, 40)
    check(_scatter_whole_indices, x, u, rows, cols, chunk=chunk, grad=grad, argnums=0)


# --------------------------------------------------------------------------------------
# Contractions
# --------------------------------------------------------------------------------------


def _dot_axis_as_batch_dim(a, b):
    c = jnp.einsum("nij,njk->nik", a, b)
    return jnp.tanh(c).sum(), c


@cases
def test_dot_axis_as_batch_dim(grad, chunk):
    a, b = _rand((N, 2, 3), 35), _rand((N, 3, 4), 36)
    check(_dot_axis_as_batch_dim, a, b, chunk=chunk, grad=grad, argnums=(0, 1))


def _dot_axis_as_free_dim(w, x, b):
    h = jnp.tanh(x @ w + b)  # axis free on the lhs
    g = w @ h.T  # axis free on the rhs: [4, N]
    return (h * h).sum() + g.sum()


@cases_wide
def test_dot_axis_as_free_dim(grad, chunk):
    w, x, b = _rand((4, 3), 37), _rand((N, 4), 38), _rand((3,), 39)
    check(_dot_axis_as_free_dim, w, x, b, chunk=chunk, grad=grad, argnums=1)


def _dot_axis_as_contracting_dim(x, y):
    g = jnp.tanh(x).T @ y  # [4, 3], contracts N
    return g, jnp.einsum("ni,ni->", x, x)


@cases
def test_dot_axis_as_contracting_dim(grad, chunk):
    """``x.T @ y`` over the axis: an accumulated sum of per-chunk products."""

    x, y = _rand((N, 4), 40), _rand((N, 3), 41)
    plan = check(_dot_axis_as_contracting_dim, x, y, chunk=chunk, grad=grad, argnums=(0, 1))
    assert any("dot_general" in r for r in plan.reduced_at), str(plan)


def _conv(x, k):
    return lax.conv_general_dilated(
        x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _conv_vmapped_per_sample_merged_batch(k, x):
    y = jax.vmap(lambda xi: jnp.tanh(_conv(xi, k)))(x)  # x: [N, B, H, W, C]
    return (y * y).sum()


@cases
def test_conv_vmapped_per_sample_merged_batch(grad, chunk):
    """vmap of a per-sample NHWC conv: the axis is merged into the conv batch [N*B, ...]."""

    k, x = _rand((3, 3, 2, 3), 42, scale=0.3), _rand((N, 2, 5, 5, 2), 43)
    check(_conv_vmapped_per_sample_merged_batch, k, x, chunk=chunk, grad=grad, argnums=1)


def _conv_nhwc_axis_as_batch(k, x):
    y = jax.nn.relu(_conv(x, k))
    return (y**2).mean(), y


@cases
def test_conv_nhwc_axis_as_batch(grad, chunk):
    k, x = _rand((3, 3, 2, 3), 44, scale=0.3), _rand((N, 5, 5, 2), 45)
    check(_conv_nhwc_axis_as_batch, k, x, chunk=chunk, grad=grad, argnums=1)


# --------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------


def _reductions_over_axis(w, x):
    h = jnp.tanh(x @ w)
    return h.sum(0), h.max(0), h.min(0), (1.0 + 0.1 * h).prod(0), jnp.max(h)


@cases_wide
def test_reductions_over_axis(grad, chunk):
    w, x = _rand((4, 3), 46), _rand((N, 4), 47)
    check(_reductions_over_axis, w, x, chunk=chunk, grad=grad, argnums=1)


def _reductions_over_other_axes(x):
    return (
        x.sum(1),
        x.max(1).sum(1) + x.min(2).sum(1),
        (1.0 + 0.1 * x).prod(axis=(1, 2)),
        jnp.any(x > 1.0, axis=2),
        jnp.all(x > -1.0, axis=1),
    )


@cases
def test_reductions_over_other_axes(grad, chunk):
    x = _rand((N, 3, 4), 48)
    check(_reductions_over_other_axes, x, chunk=chunk, grad=grad, argnums=0)


def _argmax_argmin_other_axis(x):
    i = jnp.argmax(x, axis=1)
    j = jnp.argmin(x, axis=1)
    picked = jnp.take_along_axis(x, i[:, None], axis=1)
    return i, j, (picked**2).sum()


@cases
def test_argmax_argmin_other_axis(grad, chunk):
    x = _rand((N, 5), 49)
    check(_argmax_argmin_other_axis, x, chunk=chunk, grad=grad, argnums=0)


def _cumsum_sort_topk_other_axis(x):
    c = jnp.cumsum(x, axis=1) + lax.cummax(x, axis=1) + jnp.cumprod(1 + 0.1 * x, axis=1)
    s = jnp.sort(x, axis=1)
    v, i = lax.top_k(x, 2)
    return c * s, v.sum() + jnp.sin(s).sum(), i


@cases
@pytest.mark.slow
def test_cumsum_sort_topk_other_axis(grad, chunk):
    x = _rand((N, 5), 50)
    check(_cumsum_sort_topk_other_axis, x, chunk=chunk, grad=grad, argnums=0)


def _reduce_window_pool_other_axes(x):
    avg = lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID") / 4.0
    mx = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return (avg**2).sum() + mx.sum(), avg


@cases
def test_reduce_window_pool_other_axes(grad, chunk):
    x = _rand((N, 4, 4, 2), 51)
    check(_reduce_window_pool_other_axes, x, chunk=chunk, grad=grad, argnums=0)


# --------------------------------------------------------------------------------------
# Higher-order primitives inside the region
# --------------------------------------------------------------------------------------

W44 = _rand((4, 4), 52, scale=0.5)


_jit_helper = jax.jit(lambda a, w: jnp.tanh(a @ w))


def _hof_jit_helper(w, x):
    return (_jit_helper(x, w) ** 2).sum()


@cases
def test_hof_jit_helper(grad, chunk):
    check(_hof_jit_helper, W44, _rand((N, 4), 53), chunk=chunk, grad=grad, argnums=1)


_remat_helper = jax.checkpoint(lambda a, w: jnp.sin(jnp.tanh(a @ w) @ w))


def _hof_checkpoint_helper(w, x):
    return (_remat_helper(x, w) ** 2).sum()


@cases
def test_hof_checkpoint_helper(grad, chunk):
    check(_hof_checkpoint_helper, W44, _rand((N, 4), 54), chunk=chunk, grad=grad, argnums=1)


def _hof_scan_over_other_dim_axis_in_carry(
    w, x
):  # x: [N, T, D]; scan over T, the batch axis lives in the carry
    def step(h, xt):
        h = jnp.tanh(h @ w + xt)
        return h, h.sum(-1)

    h, ys = lax.scan(step, jnp.zeros((N, 4)), jnp.swapaxes(x, 0, 1))
    return (h**2).sum() + ys.sum(), ys  # ys: [T, N] stacked along dim 1


@cases
def test_hof_scan_over_other_dim_axis_in_carry(grad, chunk):
    check(
        _hof_scan_over_other_dim_axis_in_carry,
        W44,
        _rand((N, 3, 4), 55),
        chunk=chunk,
        grad=grad,
        argnums=1,
    )


def _hof_fori_loop(w, x):
    h = lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w + i), x)
    return (h**2).sum()


@cases
def test_hof_fori_loop(grad, chunk):
    check(_hof_fori_loop, W44, _rand((N, 4), 56), chunk=chunk, grad=grad, argnums=1)


def _hof_while_loop(w, x):
    def cond(c):
        return c[0] < 3

    def body(c):
        i, h = c
        return i + 1, jnp.sin(h) * 1.5 + i.astype(jnp.float32)

    _, h = lax.while_loop(cond, body, (0, x))
    return jnp.tanh(h @ w).sum()


@cases
def test_hof_while_loop(grad, chunk):
    """A while_loop on the batch-carrying value; it is not differentiated (JAX cannot
    reverse-differentiate while_loop), the parameter after it is."""

    check(_hof_while_loop, W44, _rand((N, 4), 57), chunk=chunk, grad=grad, argnums=1, wrt=0)


def _hof_while_loop_per_row(w, x):
    """``vmap`` of a loop whose condition is per row: each row iterates until its own
    condition fails (a row's count, and its state, differ from the others'), frozen after."""

    def one_row(r):
        def body(c):
            n, h = c
            return n + 1, jnp.sin(h) * 1.5 + jnp.abs(h).sum() * 0.1 + 0.3

        return lax.while_loop(lambda c: jnp.abs(c[1]).sum() < 4.0, body, (0, r))

    n, h = jax.vmap(one_row)(x)
    return jnp.tanh(h @ w).sum() + n.astype(jnp.float32).sum()


@cases
def test_hof_while_loop_per_row(grad, chunk):
    check(_hof_while_loop_per_row, W44, _rand((N, 4), 63), chunk=chunk, grad=grad, argnums=1, wrt=0)


def _odeint_per_trajectory(w, y0s):
    """A neural ODE under ``vmap``: odeint's adaptive loop runs per trajectory, its custom
    VJP (which calls ``odeint`` again, on the augmented state) too."""
    ts = jnp.linspace(0.0, 1.0, 3)
    field = lambda y, t, w: jnp.tanh(y @ w)  # noqa: E731
    return jnp.mean(jax.vmap(lambda y0: odeint(field, y0, ts, w))(y0s) ** 2)


@cases
@pytest.mark.slow
def test_odeint_per_trajectory(grad, chunk):
    check(_odeint_per_trajectory, W44 / 4, _rand((N, 4), 64), chunk=chunk, grad=grad, argnums=1)


def _hof_cond_non_axis_predicate(w, x, p):
    h = x @ w
    h = lax.cond(p > 0, lambda h: jnp.tanh(h) * p, lambda h: h * h + p, h)
    return h.sum(), h


@pytest.mark.parametrize(
    "grad, chunk, p", [("remat", 3, 1.0), pytest.param("native", 5, -1.0, marks=slow)]
)
def test_hof_cond_non_axis_predicate(grad, chunk, p):
    check(
        _hof_cond_non_axis_predicate,
        W44,
        _rand((N, 4), 58),
        jnp.float32(p),
        chunk=chunk,
        grad=grad,
        argnums=1,
    )


def _hof_library_custom_jvp(w, x):
    h = x @ w
    return (jax.nn.relu(h) + jax.nn.softplus(h) + jax.nn.silu(h)).sum() + jnp.logaddexp(
        h, 1.0
    ).sum()


@cases
def test_hof_library_custom_jvp(grad, chunk):
    check(_hof_library_custom_jvp, W44, _rand((N, 4), 59), chunk=chunk, grad=grad, argnums=1)


@jax.custom_jvp
def odd_sin(x):
    return jnp.sin(x)


@odd_sin.defjvp
def _odd_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.sin(x), 3.0 * x * t  # deliberately NOT cos(x) * t


@jax.custom_vjp
def odd_tanh(x):
    return jnp.tanh(x)


def _odd_tanh_fwd(x):
    return jnp.tanh(x), x


def _odd_tanh_bwd(x, g):
    return (g * (2.0 + x),)  # deliberately NOT g * (1 - tanh(x)**2)


odd_tanh.defvjp(_odd_tanh_fwd, _odd_tanh_bwd)


def test_custom_rules_differ_from_automatic():
    """Sanity: the original's gradients follow the custom rules below, which differ from what
    autodiff of the primal would give; so a rewriter that dropped a rule would fail the
    comparison with the original in the two tests that follow."""
    x = jnp.float32(0.3)
    assert np.isclose(jax.grad(odd_sin)(x), 3.0 * x)
    assert not np.isclose(jax.grad(odd_sin)(x), jnp.cos(x))
    assert np.isclose(jax.grad(odd_tanh)(x), 2.0 + x)
    assert not np.isclose(jax.grad(odd_tanh)(x), 1 - jnp.tanh(x) ** 2)


def _hof_user_custom_jvp_rule_kept(w, x):
    return (odd_sin(x @ w) ** 2).sum()


@cases
def test_hof_user_custom_jvp_rule_kept(grad, chunk):
    w, x = W44, _rand((N, 4), 60)
    check(_hof_user_custom_jvp_rule_kept, w, x, chunk=chunk, grad=grad, argnums=1)


def _hof_user_custom_vjp_rule_kept(w, x):
    return (odd_tanh(x @ w) * 1.5).sum()


@cases
def test_hof_user_custom_vjp_rule_kept(grad, chunk):
    w, x = W44, _rand((N, 4), 61)
    check(_hof_user_custom_vjp_rule_kept, w, x, chunk=chunk, grad=grad, argnums=1)


# --------------------------------------------------------------------------------------
# Barriers and user rules
# --------------------------------------------------------------------------------------


def _barrier_cumsum_along_axis_after_prefix(w, x):
    h = jnp.tanh(x @ w)  # chunkable prefix
    c = jnp.cumsum(h, axis=0)  # mixes positions along the axis
    return (c * c).sum()


@cases
def test_barrier_cumsum_along_axis_after_prefix(grad, chunk):
    plan = check(
        _barrier_cumsum_along_axis_after_prefix,
        W44,
        _rand((N, 4), 62),
        chunk=chunk,
        grad=grad,
        argnums=1,
        expect_whole=False,
    )
    assert any("cumsum" in s for s in plan.stops), str(plan)


def _make_primitive(name, scale):
    prim = jax.extend.core.Primitive(name)

    def impl(x):
        return x * scale

    prim.def_impl(impl)
    prim.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    ad.defjvp(prim, lambda g, x: g * scale)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))
    return prim


unknown_p = _make_primitive("jaxpr_accum_test_unknown_scale", 2.0)
registered_p = _make_primitive("jaxpr_accum_test_registered_scale", 3.0)
ja.register_rule(registered_p, "elementwise")


def test_custom_primitive_works_unserialized():
    x = jnp.arange(3.0)
    np.testing.assert_allclose(registered_p.bind(x), 3 * x)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: unknown_p.bind(x).sum()))(x), 2.0)


def _unknown_primitive_raises_serialize_error(x):
    return unknown_p.bind(x)


@grad_mode
def test_unknown_primitive_raises_serialize_error(grad):
    sf = ja.serialize_axis(_unknown_primitive_raises_serialize_error, chunk=3, grad=grad, argnums=0)
    with pytest.raises(ja.SerializeError) as info:
        sf(_rand((N, 4), 63))
    msg = str(info.value)
    assert "jaxpr_accum_test_unknown_scale" in msg, msg
    assert "register_rule" in msg, msg


@grad_mode
def test_unknown_primitive_explain_raises_serialize_error(grad):
    sf = ja.serialize_axis(lambda x: unknown_p.bind(x), chunk=3, grad=grad, argnums=0)
    with pytest.raises(ja.SerializeError):
        sf.explain(_rand((N, 4), 63))


def _unknown_primitive_after_prefix_is_exact(w, x):
    return (unknown_p.bind(jnp.tanh(x @ w)) ** 2).sum()


@cases
def test_unknown_primitive_after_prefix_is_exact(grad, chunk):
    """An unknown primitive after a chunkable prefix: the prefix is chunked, the rest runs
    unchunked, and the plan's stops name the primitive."""

    plan = check(
        _unknown_primitive_after_prefix_is_exact,
        W44,
        _rand((N, 4), 64),
        chunk=chunk,
        grad=grad,
        argnums=1,
        expect_whole=False,
    )
    assert any("jaxpr_accum_test_unknown_scale" in s for s in plan.stops), str(plan)


def _register_rule_elementwise_custom_primitive(w, x):
    h = registered_p.bind(jnp.tanh(x @ w))
    return (h**2).sum()


@cases
def test_register_rule_elementwise_custom_primitive(grad, chunk):
    plan = check(
        _register_rule_elementwise_custom_primitive,
        W44,
        _rand((N, 4), 65),
        chunk=chunk,
        grad=grad,
        argnums=1,
    )
    assert "jaxpr_accum_test_registered_scale" not in str(plan), str(plan)
    assert not plan.stops, str(plan)


def _register_rule_alone_is_chunkable(x):
    return registered_p.bind(x)


@grad_mode
def test_register_rule_alone_is_chunkable(grad):
    """The registered primitive on the input directly (nothing else to chunk)."""

    check(_register_rule_alone_is_chunkable, _rand((N, 4), 66), chunk=3, grad=grad, argnums=0)


def test_register_rule_rejects_bad_arguments():
    with pytest.raises(TypeError):
        ja.register_rule(42, "elementwise")
    with pytest.raises(TypeError):
        ja.register_rule("sin", "not-a-rule")  # a bad rule for a real primitive
    with pytest.raises(ValueError, match="no primitive named"):
        ja.register_rule("jaxpr_accum_test_never_used", "elementwise")
