"""Serialized functions compose with JAX transforms and take any kind of input.

Tiers: the default tier runs each composition in ``grad="remat"`` (native mode's own
transforms, jvp and hessian, are in it too); the ``grad="native"`` rows and the second chunk
sizes are ``slow``. ``tests/test_exactness.py`` has one composition row per gradient mode in
the default tier and the full matrix in the slow tier.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from . import models
from .oracle import NOT_WORTH_IT, assert_matches_original, modes

slow = pytest.mark.slow
GRAD_MODES = modes("remat", slow=("native",))


pytestmark = pytest.mark.xdist_group("compose")  # one worker builds the module's `mlp` once


@pytest.fixture(scope="module")
def mlp():
    return models.make_mlp(n=10)


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_jit_of_grad(mlp, grad):
    loss, args = mlp
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)
    got = jax.jit(jax.grad(sf))(*args)
    ref = jax.jit(jax.grad(loss))(*args)
    assert_tree_close(got, ref, what="jit(grad(sf))")


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_grad_of_jit(mlp, grad):
    loss, args = mlp
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)
    got = jax.grad(jax.jit(sf))(*args)
    ref = jax.grad(jax.jit(loss))(*args)
    assert_tree_close(got, ref, what="grad(jit(sf))")


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_serialize_a_jitted_function(mlp, grad):
    loss, args = mlp
    jitted = jax.jit(loss)
    sf = ja.serialize_axis(jitted, chunk=4, argnums=1, grad=grad)
    assert sf.original is jitted
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_value_and_grad(mlp, grad):
    loss, args = mlp
    sf = ja.serialize_axis(loss, chunk=4, argnums=1, grad=grad)
    got = jax.jit(jax.value_and_grad(sf, argnums=(0, 1)))(*args)
    ref = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(*args)
    assert_tree_close(got, ref, what="value_and_grad")


@pytest.mark.slow
def test_value_and_grad_auto(mlp):
    loss, args = mlp
    sf = ja.serialize_axis(loss, chunk=4, argnums=1)  # grad="auto"
    got = jax.value_and_grad(sf)(*args)
    ref = jax.value_and_grad(loss)(*args)
    assert_tree_close(got, ref, what="value_and_grad (auto)")


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_vmap_of_serialized(mlp, grad):
    """vmap over an extra leading axis of the batch, parameters shared."""
    loss, (params, (x, y)) = mlp
    xs = jnp.stack([x, 2.0 * x, -x])
    ys = jnp.stack([y, y + 1.0, 0.5 * y])
    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)

    def batched(fun):
        return jax.vmap(fun, in_axes=(None, 0))

    got = batched(sf)(params, (xs, ys))
    ref = batched(loss)(params, (xs, ys))
    assert_tree_close(got, ref, what="vmap(sf)")

    def total(fun):
        return lambda p, b: batched(fun)(p, b).sum()

    got_g = jax.jit(jax.grad(total(sf), argnums=(0, 1)))(params, (xs, ys))
    ref_g = jax.jit(jax.grad(total(loss), argnums=(0, 1)))(params, (xs, ys))
    assert_tree_close(got_g, ref_g, what="grad of vmap(sf)")


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_vmap_over_parameters(mlp, grad):
    """vmap over a leading axis of the (loop-invariant) parameters."""
    loss, (params, batch) = mlp
    ps = jax.tree.map(lambda p: jnp.stack([p, 0.5 * p]), params)
    sf = ja.serialize_axis(loss, chunk=4, argnums=1, grad=grad)
    got = jax.vmap(sf, in_axes=(0, None))(ps, batch)
    ref = jax.vmap(loss, in_axes=(0, None))(ps, batch)
    assert_tree_close(got, ref, what="vmap(sf) over params")
    got_g = jax.vmap(jax.grad(sf), in_axes=(0, None))(ps, batch)
    ref_g = jax.vmap(jax.grad(loss), in_axes=(0, None))(ps, batch)
    assert_tree_close(got_g, ref_g, what="vmap(grad(sf)) over params")


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_closure_over_traced_parameters(mlp, grad):
    """Inside jax.grad of an outer function, sf closes over the parameter tracer."""
    loss, (params, batch) = mlp

    def outer(serialize):
        def fn(params, scale):
            def inner(b):
                return loss(jax.tree.map(lambda p: p * scale, params), b)

            inner_fn = (
                ja.serialize_axis(inner, chunk=3, argnums=0, grad=grad) if serialize else inner
            )
            return inner_fn(batch) * scale

        return fn

    scale = jnp.float32(1.3)
    assert_tree_close(outer(True)(params, scale), outer(False)(params, scale))
    got = jax.grad(outer(True), argnums=(0, 1))(params, scale)
    ref = jax.grad(outer(False), argnums=(0, 1))(params, scale)
    assert_tree_close(got, ref, what="grad through closed-over tracer")
    got = jax.jit(jax.grad(outer(True), argnums=(0, 1)))(params, scale)
    assert_tree_close(got, ref, what="jit(grad) through closed-over tracer")


@pytest.mark.parametrize(
    "inner, outer",
    [("remat", "native")]
    + [pytest.param(m, "remat", marks=pytest.mark.slow) for m in ja.GRAD_MODES],
)
def test_a_serialized_function_vmapped_inside_another(inner, outer):
    """The outer function vmaps the inner serialized one over a stack of batches and is
    itself serialized over the stack: the outer rewrite reads the inner's vmapped chunk loop
    (one equation, ``serialized_region_loop``) inline (a breaker found it refused)."""
    rs = np.random.RandomState(1)
    w = jnp.asarray(rs.normal(size=(3, 4)) / 2, jnp.float32)
    x = jnp.asarray(rs.normal(size=(10, 3)), jnp.float32)
    xs = jnp.stack([x, -x, 2 * x])

    def per_batch(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def stacked(f):
        return lambda w, xs: jax.vmap(lambda b: f(w, b))(xs).sum()

    sf = ja.serialize_axis(per_batch, chunk=4, argnums=1, grad=inner)
    so = ja.serialize_axis(stacked(sf), chunk=1, argnums=1, grad=outer)
    assert_tree_close(so(w, xs), stacked(per_batch)(w, xs))
    assert_tree_close(jax.grad(so)(w, xs), jax.grad(stacked(per_batch))(w, xs), what="grad")


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_closure_over_concrete_array(grad):
    w = jnp.asarray(np.random.RandomState(0).normal(size=(3, 4)), jnp.float32)

    def f(x):
        return jnp.tanh(x @ w).sum()

    x = jnp.asarray(np.random.RandomState(1).normal(size=(7, 3)), jnp.float32)
    sf = ja.serialize_axis(f, chunk=2, argnums=0, grad=grad)
    assert_matches_original(sf, x, vmap=False)


# --------------------------------------------------------------------------------------
# Integer and PRNG-key inputs
# --------------------------------------------------------------------------------------


def _cross_entropy_setup(n=11, d=4, classes=5):
    rs = np.random.RandomState(2)
    w = jnp.asarray(rs.normal(size=(d, classes)), jnp.float32)
    b = jnp.asarray(rs.normal(size=(classes,)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(n, d)), jnp.float32)
    labels = jnp.asarray(rs.randint(0, classes, size=(n,)), jnp.int32)

    def xent(params, x, labels):
        w, b = params
        logits = x @ w + b
        logp = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
        return -picked.mean()

    return xent, ((w, b), x, labels)


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [3, pytest.param(4, marks=slow)])
@pytest.mark.slow
def test_integer_labels(grad, chunk):
    f, args = _cross_entropy_setup()
    sf = ja.serialize_axis(f, chunk=chunk, argnums=(1, 2), grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_integer_labels_one_hot(grad):
    """Labels through jax.nn.one_hot (an iota/eq along the class axis)."""
    rs = np.random.RandomState(3)
    w = jnp.asarray(rs.normal(size=(4, 6)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(9, 4)), jnp.float32)
    labels = jnp.asarray(rs.randint(0, 6, size=(9,)), jnp.int32)

    def f(w, x, labels):
        logits = x @ w
        return -(jax.nn.one_hot(labels, 6) * jax.nn.log_softmax(logits)).sum(-1).mean()

    sf = ja.serialize_axis(f, chunk=4, argnums=(1, 2), grad=grad)
    assert_matches_original(sf, w, x, labels, vmap=False)


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_vjp_with_integer_input_gives_float0(grad):
    f, args = _cross_entropy_setup()
    sf = ja.serialize_axis(f, chunk=4, argnums=(1, 2), grad=grad)
    out_ref, vjp_ref = jax.vjp(f, *args)
    out_got, vjp_got = jax.vjp(sf, *args)
    assert_tree_close(out_got, out_ref)
    ct = jnp.float32(1.7)
    got = vjp_got(ct)
    ref = vjp_ref(ct)
    assert got[2].dtype == jax.dtypes.float0
    assert_tree_close(got, ref, what="vjp cotangents incl. float0")


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("chunk", [2, pytest.param(5, marks=slow)])
def test_integer_output_is_exact(grad, chunk):
    """An integer output (count of correct predictions) alongside the loss."""
    f, args = _cross_entropy_setup()

    def loss_and_correct(params, x, labels):
        w, b = params
        logits = x @ w + b
        preds = jnp.argmax(logits, -1)  # a stacked integer output
        correct = (preds == labels).sum()  # an accumulated integer output
        return f(params, x, labels), correct, preds

    sf = ja.serialize_axis(loss_and_correct, chunk=chunk, argnums=(1, 2), grad=grad)
    assert_matches_original(sf, *args, vmap=False)


def _dropout_setup(key):
    rs = np.random.RandomState(4)
    w = jnp.asarray(rs.normal(size=(5, 6)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(10, 5)), jnp.float32)

    def f(w, x, key):
        h = jnp.tanh(x @ w)
        keep = jax.random.bernoulli(key, 0.7, h.shape)
        h = jnp.where(keep, h / 0.7, 0.0)
        noise = jax.random.normal(jax.random.fold_in(key, 1), h.shape)
        return ((h + 0.1 * noise) ** 2).sum(-1).mean()

    return f, (w, x, key)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize(
    "make_key",
    [lambda: jax.random.key(7), lambda: jax.random.PRNGKey(7)],
    ids=["typed_key", "raw_uint32_key"],
)
def test_prng_key_input_dropout(grad, make_key):
    """A key passed as an argument; dropout masks must be bit-identical to the original."""
    f, args = _dropout_setup(make_key())
    sf = ja.serialize_axis(f, chunk=3, argnums=1, grad=grad)
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_per_example_keys_microbatched(grad):
    """A batch of keys (one per example) serialized together with the data."""
    rs = np.random.RandomState(5)
    w = jnp.asarray(rs.normal(size=(3, 4)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(8, 3)), jnp.float32)
    keys = jax.random.split(jax.random.key(3), 8)

    def f(w, x, keys):
        def one(xi, ki):
            h = jnp.sin(xi @ w)
            return (h * jax.random.normal(ki, h.shape)).sum()

        return jax.vmap(one)(x, keys).sum()

    sf = ja.serialize_axis(f, chunk=3, argnums=(1, 2), grad=grad)
    assert_matches_original(sf, w, x, keys, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_vjp_with_key_input(grad):
    f, args = _dropout_setup(jax.random.key(0))
    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad=grad)
    out_ref, vjp_ref = jax.vjp(f, *args)
    out_got, vjp_got = jax.vjp(sf, *args)
    assert_tree_close(out_got, out_ref)
    assert_tree_close(vjp_got(jnp.float32(1.0)), vjp_ref(jnp.float32(1.0)))


# --------------------------------------------------------------------------------------
# Pytrees and static arguments
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_pytree_inputs_and_outputs(grad):
    rs = np.random.RandomState(6)
    params = {
        "dense": {"w": jnp.asarray(rs.normal(size=(3, 4)), jnp.float32)},
        "scale": jnp.float32(0.7),
        "bias": (jnp.zeros(4, jnp.float32) + 0.1, jnp.ones(4, jnp.float32)),
    }
    data = {"x": jnp.asarray(rs.normal(size=(9, 3)), jnp.float32), "w": jnp.ones((9,))}

    def f(params, data):
        h = data["x"] @ params["dense"]["w"] + params["bias"][0]
        h = jnp.tanh(h) * params["bias"][1] * params["scale"]
        per_example = (h**2).sum(-1) * data["w"]
        return {
            "loss": per_example.mean(),
            "aux": (h.max(), per_example),  # a max accumulator and a stacked output
        }

    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad=grad)
    assert_matches_original(sf, params, data, vmap=False)


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # a toy (6 rows) whose plan may save nothing
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_tuple_argument_and_tuple_output(grad):
    rs = np.random.RandomState(7)
    w = jnp.asarray(rs.normal(size=(4, 2)), jnp.float32)
    xy = (
        jnp.asarray(rs.normal(size=(6, 4)), jnp.float32),
        jnp.asarray(rs.normal(size=(6, 2)), jnp.float32),
    )

    def f(w, xy):
        x, y = xy
        r = x @ w - y
        return (r**2).sum(), jnp.abs(r).sum(0)

    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad=grad)
    assert_matches_original(sf, w, xy, vmap=False)


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_static_python_arguments(grad):
    """A Python int and a str passed positionally are static, like jit callers pass them."""
    rs = np.random.RandomState(8)
    w = jnp.asarray(rs.normal(size=(3, 5)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(7, 3)), jnp.float32)

    def f(w, x, power, activation):
        h = x @ w
        h = jnp.tanh(h) if activation == "tanh" else jnp.sin(h)
        return (h**power).sum(-1).mean()

    sf = ja.serialize_axis(f, chunk=3, argnums=1, grad=grad)
    assert_matches_original(sf, w, x, 2, "tanh", vmap=False)
    assert_matches_original(sf, w, x, 3, "sin", vmap=False)  # a different static value: a new trace


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_static_int_controls_shape(grad):
    """A static Python int used as a shape inside the function (e.g. a number of samples)."""
    rs = np.random.RandomState(9)
    w = jnp.asarray(rs.normal(size=(2, 3)), jnp.float32)
    mu = jnp.asarray(rs.normal(size=(2,)), jnp.float32)

    def f(w, mu, key, n_samples):
        z = mu + jax.random.normal(key, (n_samples, 2))
        return jnp.tanh(z @ w).sum() / n_samples

    sf = ja.serialize_axis(f, chunk=4, size=10, grad=grad)
    assert_matches_original(sf, w, mu, jax.random.key(1), 10, vmap=False)


@pytest.mark.slow
def test_cache_respects_shapes(mlp):
    """A second call with a different batch size gives that batch size's results."""
    loss, args = mlp
    sf = ja.serialize_axis(loss, chunk=4, argnums=1)
    assert_matches_original(sf, *args, vmap=False)
    loss2, args2 = models.make_mlp(n=7, seed=1)
    assert_matches_original(sf, *args2, vmap=False)


def _precisions(f, *args, precision: str) -> list[str]:
    """The precisions of every dot in ``jit(value_and_grad(f))`` lowered under ``precision``."""
    import re

    with jax.default_matmul_precision(precision):
        text = jax.jit(jax.value_and_grad(f)).lower(*args).as_text()
    return sorted(re.findall(r"precision = \[(\w+), \w+\]", text))


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("order", [("default", "highest"), ("highest", "default")])
def test_a_plan_is_not_reused_under_another_matmul_precision(grad, order):
    """Tracing bakes ``jax.default_matmul_precision`` into every dot: a plan cached at one
    precision and reused at another ran the dots at the first (on a TPU a serialized gradient
    compiled under ``highest`` after a call at the default differed by 0.4%). Each precision
    gets its own plan, and the program's dots run at the original's precisions."""
    rs = np.random.RandomState(3)
    w = jnp.asarray(rs.normal(size=(4, 4)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(16, 4)), jnp.float32)

    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad=grad)
    for precision in order:
        got = _precisions(sf, w, x, precision=precision)
        assert got and set(got) == set(_precisions(f, w, x, precision=precision)), precision


# --------------------------------------------------------------------------------------
# Higher order (native mode is differentiated by JAX itself)
# --------------------------------------------------------------------------------------


def _small_problem():
    rs = np.random.RandomState(10)
    w = jnp.asarray(rs.normal(size=(3, 2)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(7, 3)), jnp.float32)

    def f(w, x):
        return (jnp.sin(x @ w) ** 2).sum()

    return f, w, x


def test_native_jvp():
    f, w, x = _small_problem()
    sf = ja.serialize_axis(f, chunk=3, argnums=1, grad="native")
    tw = jnp.ones_like(w)
    tx = jnp.full_like(x, 0.5)
    got = jax.jvp(sf, (w, x), (tw, tx))
    ref = jax.jvp(f, (w, x), (tw, tx))
    assert_tree_close(got, ref, what="jvp")


@pytest.mark.slow
def test_native_hessian():
    f, w, x = _small_problem()
    sf = ja.serialize_axis(f, chunk=3, argnums=1, grad="native")
    got = jax.hessian(sf)(w, x)
    ref = jax.hessian(f)(w, x)
    assert_tree_close(got, ref, rtol={jnp.float32: 1e-3}, what="hessian")


# --------------------------------------------------------------------------------------
# Transforms and control flow inside the region keep their own rules
# --------------------------------------------------------------------------------------


@jax.custom_vjp
def _clip_gradient(h):
    return h


def _clip_fwd(h):
    return h, None


def _clip_bwd(_, g):
    return (jnp.clip(g, -0.1, 0.1),)


_clip_gradient.defvjp(_clip_fwd, _clip_bwd)


@jax.custom_jvp
def _soft_abs(h):
    return jnp.sqrt(h * h + 1e-3)


@_soft_abs.defjvp
def _soft_abs_jvp(primals, tangents):
    (h,), (t,) = primals, tangents
    return _soft_abs(h), 3.0 * jnp.sign(h) * t  # deliberately not the true derivative


def _inner_programs():
    rs = np.random.RandomState(11)
    w = jnp.asarray(rs.normal(size=(3, 4)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(9, 5, 3)), jnp.float32)  # [batch, time, features]

    def custom_vjp_f(w, x):
        return (_clip_gradient(jnp.tanh(x @ w)) ** 2).sum()

    def custom_jvp_f(w, x):
        return _soft_abs(x @ w).sum()

    def checkpoint_f(w, x):
        return (jax.checkpoint(lambda h: jnp.sin(jnp.tanh(h @ w)))(x) ** 2).sum()

    def checkpoint_reduce_inside_f(w, x):
        return jax.checkpoint(lambda h: jnp.sin(jnp.tanh(h @ w)).sum())(x)

    def nested_jit_f(w, x):
        inner = jax.jit(lambda h: jnp.tanh(h @ w))
        return (inner(x) * jax.jit(jnp.sin)(x.sum(-1, keepdims=True))).sum()

    def scan_over_time_f(w, x):
        def per_example(seq):
            def step(c, xt):
                c = jnp.tanh(c + xt @ w)
                return c, c.sum()

            c, ys = jax.lax.scan(step, jnp.zeros(4), seq)
            return c.sum() + ys.sum()

        return jax.vmap(per_example)(x).sum()

    def cond_f(w, x):
        def per_example(xi):
            s = xi.sum()
            return jax.lax.cond(
                s > 0, lambda h: jnp.tanh(h @ w).sum(), lambda h: (h @ w).sum() ** 2, xi
            )

        return jax.vmap(per_example)(x).sum()

    def while_f(w, x):
        def per_example(xi):
            h = jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w[:, :3]), xi)
            return h.sum()

        return jax.vmap(per_example)(x).sum()

    def while_dynamic_f(w, x):
        def per_example(xi):
            def cond(carry):
                i, h = carry
                return i < 3

            def body(carry):
                i, h = carry
                return i + 1, jnp.tanh(h @ w[:, :3])

            _, h = jax.lax.while_loop(cond, body, (0, xi))
            return h.sum()

        return jax.vmap(per_example)(x).sum()

    return (
        {
            "custom_vjp": custom_vjp_f,
            "custom_jvp": custom_jvp_f,
            "checkpoint": checkpoint_f,
            "checkpoint_reduce_inside": checkpoint_reduce_inside_f,
            "nested_jit": nested_jit_f,
            "scan": scan_over_time_f,
            "cond": cond_f,
            "fori_loop": while_f,
        },
        {"while_loop": while_dynamic_f},
        (w, x),
    )


_DIFFERENTIABLE, _FORWARD_ONLY, _INNER_ARGS = _inner_programs()


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize(
    "name",
    [n if n in ("scan", "cond") else pytest.param(n, marks=slow) for n in sorted(_DIFFERENTIABLE)],
)
def test_inner_transforms_and_control_flow(grad, name):
    f = _DIFFERENTIABLE[name]
    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad=grad)
    assert_matches_original(sf, *_INNER_ARGS, vmap=False)


@pytest.mark.parametrize("wrap", ["checkpoint", "policy", "twice", "jit>checkpoint"])
def test_checkpoint_around_the_whole_loss_is_chunked(wrap):
    """a02: ``serialize_axis(jax.checkpoint(loss))``, the reduction over the batch inside the
    checkpoint, is chunked as the loss itself is (the tail checkpoint is inlined), in value and
    gradient."""
    w, x = _INNER_ARGS

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.max(x @ w)

    policy = jax.checkpoint_policies.dots_saveable
    f = {
        "checkpoint": jax.checkpoint(loss),
        "policy": jax.checkpoint(loss, policy=policy),
        "twice": jax.checkpoint(jax.checkpoint(loss)),
        "jit>checkpoint": jax.jit(jax.checkpoint(loss)),
    }[wrap]
    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad="remat")
    plan = sf.explain(w, x)
    assert plan.stops == [] and plan.grad == "remat", str(plan)
    assert_matches_original(sf, w, x, vmap=False)


def test_checkpoint_whose_result_is_computed_with_further_is_named():
    """A checkpoint that is not the function's result still hides its reduction: the error
    names the checkpoint and what to do."""
    w, x = _INNER_ARGS

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    sf = ja.serialize_axis(lambda w, x: 2 * jax.checkpoint(loss)(w, x), chunk=4, argnums=1)
    with pytest.raises(ja.SerializeError, match="serialize the function it wraps"):
        sf(w, x)


@pytest.mark.parametrize("name", sorted(_FORWARD_ONLY))
def test_inner_while_loop_forward(name):
    """A while_loop is not reverse-differentiable: values, and jvp in native mode."""
    f = _FORWARD_ONLY[name]
    sf = ja.serialize_axis(f, chunk=4, argnums=1, grad="native")
    assert_tree_close(sf(*_INNER_ARGS), f(*_INNER_ARGS))
    got = jax.jvp(
        lambda x: sf(_INNER_ARGS[0], x), (_INNER_ARGS[1],), (jnp.ones_like(_INNER_ARGS[1]),)
    )
    ref = jax.jvp(
        lambda x: f(_INNER_ARGS[0], x), (_INNER_ARGS[1],), (jnp.ones_like(_INNER_ARGS[1]),)
    )
    assert_tree_close(got, ref, what="jvp through while_loop")


# --------------------------------------------------------------------------------------
# The axis at other positions
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_argnums_axis_1(grad):
    """Microbatching along axis 1 of the named arguments (x is [features, batch])."""
    rs = np.random.RandomState(12)
    w = jnp.asarray(rs.normal(size=(3, 4)), jnp.float32)
    xt = jnp.asarray(rs.normal(size=(3, 10)), jnp.float32)
    yt = jnp.asarray(rs.normal(size=(4, 10)), jnp.float32)

    def f(w, xt, yt):
        return ((jnp.tanh(w.T @ xt) - yt) ** 2).sum()

    sf = ja.serialize_axis(f, chunk=3, argnums=(1, 2), axis=1, grad=grad)
    assert_matches_original(sf, w, xt, yt, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_sample_axis_born_at_position_1_with_axis_none(grad):
    """axis=None: the 9-sample axis is born at position 1 of the random draw."""
    rs = np.random.RandomState(13)
    w = jnp.asarray(rs.normal(size=(2, 3)), jnp.float32)
    mu = jnp.asarray(rs.normal(size=(4, 1, 2)), jnp.float32)

    def f(w, mu, key):
        z = mu + jax.random.normal(key, (4, 9, 2))  # [batch, samples, latent]
        return (jnp.sin(z @ w) ** 2).mean()

    sf = ja.serialize_axis(f, chunk=4, axis=None, grad=grad)
    assert_matches_original(sf, w, mu, jax.random.key(5), vmap=False)
    plan = sf.explain(w, mu, jax.random.key(5))
    assert plan.axis_size == 9, str(plan)


@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.slow
def test_size_hint_axis_at_position_1(grad):
    rs = np.random.RandomState(14)
    w = jnp.asarray(rs.normal(size=(2, 3)), jnp.float32)
    mu = jnp.asarray(rs.normal(size=(4, 1, 2)), jnp.float32)

    def f(w, mu, key):
        z = mu + jax.random.normal(key, (4, 9, 2))
        return (jnp.sin(z @ w) ** 2).mean()

    sf = ja.serialize_axis(f, chunk=2, size=9, axis=None, grad=grad)
    assert_matches_original(sf, w, mu, jax.random.key(6), vmap=False)
