"""``jax.vmap`` of a serialized function is exact for any ``in_axes`` over any argument.

The class of outside report r13: a region with one output that depends on the vmapped
argument and one that does not had gradients about 2x the original's. Checked here for values,
``jax.grad``, ``jax.vjp`` and ``jvp``-of-``grad``, in every mode, over each argument alone,
over several at once, with ``None`` on the data, nested, and with ``grad`` and ``vmap`` in
both orders.

The class of f12: a callback on a per-example value (ordered or unordered ``io_callback``,
``debug.callback``, ``debug.print``) under ``jax.vmap`` over a chunked or an unchunked
argument, in values, ``jax.vjp`` and ``jax.grad``, in every mode, runs as the original does:
the same values and the same calls (the callback's operand is batched exactly where the
original's is), or the original's own error where the original raises (an ordered
``io_callback`` on a batched value).
"""

from __future__ import annotations

import contextlib
import io
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, covering, modes, tiered

slow = pytest.mark.slow

_rs = np.random.RandomState(7)
W = jnp.asarray(_rs.normal(size=(5, 3)) * 0.5, jnp.float32)
X = jnp.asarray(_rs.normal(size=(12, 5)), jnp.float32)
T = jnp.asarray([0.5, 1.0, 2.0], jnp.float32)


def mixed(w, x, t):
    """Two region outputs: one depends on ``t``, one does not."""
    return jnp.sum(jnp.tanh(x @ w)) + jnp.sum(jnp.tanh(t * (x @ w)))


def mixed_outputs(w, x, t):
    h = x @ w
    return {"plain": jnp.sum(jnp.tanh(h)), "scaled": jnp.sum(jnp.tanh(t * h), 0)}


def batched_args(in_axes):
    """Arguments batched (size 3) where ``in_axes`` says."""
    base = (W, X, jnp.float32(0.7))
    out = []
    for a, ax in zip(base, in_axes, strict=True):
        if ax is None:
            out.append(a)
        else:
            stacked = jnp.stack([a * s for s in (1.0, 0.5, -0.75)])
            out.append(jnp.moveaxis(stacked, 0, ax))
    return tuple(out)


IN_AXES = [
    (None, None, 0),
    (0, None, None),
    (None, 0, None),
    (None, 1, None),
    (0, None, 0),
    (None, 0, 0),
    (0, 0, 0),
]


def _serialized(fun, grad):
    return ja.serialize_axis(fun, chunk=5, argnums=1, grad=grad)


@pytest.mark.parametrize("grad", GRAD_MODES)
def test_r13_grad_of_vmap_over_the_temperature(grad):
    def outer(g):
        def loss(w, x):
            return jnp.sum(jax.vmap(g, in_axes=(None, None, 0))(w, x, T))

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(W, X)

    assert_tree_close(outer(_serialized(mixed, grad)), outer(mixed), what="grad of vmap")


@pytest.mark.parametrize("grad", modes("remat", slow=("fused",)))
@pytest.mark.parametrize(
    "in_axes",
    [pytest.param(a, marks=() if i == 0 else pytest.mark.slow) for i, a in enumerate(IN_AXES)],
    ids=str,
)
def test_values_grad_and_vjp_for_any_in_axes(grad, in_axes):
    args = batched_args(in_axes)
    sf = _serialized(mixed_outputs, grad)

    def values(g):
        return jax.vmap(g, in_axes=in_axes)(*args)

    def grads(g):
        def loss(*a):
            out = jax.vmap(g, in_axes=in_axes)(*a)
            return jnp.sum(out["plain"] * 1.5) + jnp.sum(out["scaled"] ** 2)

        return jax.grad(loss, argnums=(0, 1, 2))(*args)

    def vjp(g):
        out, pull = jax.vjp(lambda *a: jax.vmap(g, in_axes=in_axes)(*a), *args)
        return pull(jax.tree.map(lambda o: jnp.cos(o) + 0.1, out))

    for what, run in [("values", values), ("grad", grads), ("vjp", vjp)]:
        assert_tree_close(run(sf), run(mixed_outputs), what=f"{what} under vmap{in_axes}")


@pytest.mark.parametrize("grad", modes("native", slow=GRAD_MODES))
@pytest.mark.slow
def test_vmap_of_grad_and_grad_of_vmap_agree(grad):
    sf = _serialized(mixed, grad)
    for g in (sf, mixed):
        vg = jax.vmap(jax.grad(g, argnums=(0, 1)), in_axes=(None, None, 0))(W, X, T)
        gv = jax.jacrev(lambda w, x, g=g: jax.vmap(g, in_axes=(None, None, 0))(w, x, T), (0, 1))(
            W, X
        )
        assert_tree_close(vg, gv, what="vmap(grad) against jacrev(vmap)")
    ref = jax.vmap(jax.grad(mixed, argnums=(0, 1)), in_axes=(None, None, 0))(W, X, T)
    got = jax.vmap(jax.grad(sf, argnums=(0, 1)), in_axes=(None, None, 0))(W, X, T)
    assert_tree_close(got, ref, what="vmap of grad")


@pytest.mark.parametrize("grad", modes("auto", slow=GRAD_MODES))
@pytest.mark.slow
def test_nested_vmaps(grad):
    ts = jnp.stack([T, 2 * T])  # [2, 3]
    xs = jnp.stack([X, X[::-1]])  # [2, 12, 5]

    def run(g):
        inner = jax.vmap(g, in_axes=(None, None, 0))
        outer = jax.vmap(inner, in_axes=(None, 0, 0))
        return jax.grad(lambda w: jnp.sum(outer(w, xs, ts)))(W)

    assert_tree_close(run(_serialized(mixed, grad)), run(mixed), what="grad of nested vmaps")


@pytest.mark.parametrize("grad", modes(slow=GRAD_MODES))
def test_jvp_of_grad_under_vmap(grad):
    sf = _serialized(mixed, grad)

    def run(g):
        def grad_w(w, t):
            return jax.grad(g)(w, X, t)

        f = jax.vmap(lambda t: jax.jvp(lambda w: grad_w(w, t), (W,), (jnp.ones_like(W),)), 0)
        return f(T)

    assert_tree_close(run(sf), run(mixed), what="vmap of jvp of grad")


ORDERS = list(itertools.permutations(["vmap", "grad", "jit"]))


@slow
@pytest.mark.parametrize(
    "order, grad",
    covering([(o,) for o in ORDERS], GRAD_MODES, per=2, ids=["-".join(o) for o in ORDERS]),
)
def test_transformation_orders(grad, order):
    sf = _serialized(mixed, grad)

    def build(g):
        f = g
        for t in order:
            if t == "vmap":
                f = jax.vmap(f, in_axes=(None, None, 0))
            elif t == "grad":
                f = jax.grad(lambda w, x, t, f=f: jnp.sum(f(w, x, t)))
            else:
                f = jax.jit(f)
        return f

    assert_tree_close(build(sf)(W, X, T), build(mixed)(W, X, T), what=" then ".join(order))


SEEN = {"calls": 0, "values": 0}


def _record(v):
    SEEN["calls"] += 1
    SEEN["values"] += int(np.size(v))


CALLBACKS = {
    "io_ordered": lambda v: io_callback(_record, None, v, ordered=True),
    "io_unordered": lambda v: io_callback(_record, None, v, ordered=False),
    "debug_callback": lambda v: jax.debug.callback(_record, v),
    "debug_print": lambda v: jax.debug.print("seen {v}", v=v),
}


def logged(kind):
    """``mixed`` with a callback on a per-example value that does not depend on ``t``."""

    def f(w, x, t):
        h = jnp.tanh(x @ w)
        CALLBACKS[kind](jax.lax.stop_gradient(h[:, 0]))
        return jnp.sum(jnp.tanh(h)) + jnp.sum(jnp.tanh(t * h))

    return f


F12 = ("io_ordered", "unchunked", "fused", "vjp")  # the default tier's case: the repro's
CALLBACK_AXES = {"chunked": ((None, 0, None), 1), "unchunked": ((None, None, 0), 2)}


def _callback_runs(in_axes):
    def values(g, *a):
        return jax.jit(jax.vmap(g, in_axes=in_axes))(*a)

    def vjp(g, *a):  # as f12 found it: vjp of vmap of jit
        out, pull = jax.vjp(jax.vmap(jax.jit(g), in_axes=in_axes), *a)
        return out, pull(jnp.cos(out))

    def grad(g, *a):
        return jax.grad(lambda *b: jnp.sum(jax.vmap(g, in_axes=in_axes)(*b)), (0, 1, 2))(*a)

    return {"values": values, "vjp": vjp, "grad": grad}


def _callback_outcome(run, f, args):
    """``(the value or the exception raised, what the callbacks saw, lines printed)``."""
    SEEN.update(calls=0, values=0)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            value = run(f, *args)
            jax.effects_barrier()
        except Exception as e:  # the original's error, compared below
            value = e
            with contextlib.suppress(Exception):
                jax.effects_barrier()
    return value, dict(SEEN), printed.getvalue().count("seen ")


@pytest.mark.parametrize(
    "kind, axis, grad, what",
    # every callback at every axis meets every mode and every run (not every triple)
    tiered(
        covering(
            list(itertools.product(CALLBACKS, CALLBACK_AXES)),
            GRAD_MODES,
            ("values", "vjp", "grad"),
        ),
        [F12],
    ),
)
def test_f12_callbacks_under_vmap(kind, axis, grad, what):
    in_axes, batched = CALLBACK_AXES[axis]
    args = list(batched_args((None, None, None)))
    args[batched] = jnp.stack([args[batched] * s for s in (1.0, 0.5, -0.75)])
    f = logged(kind)
    run = _callback_runs(in_axes)[what]
    expected, seen, printed = _callback_outcome(run, f, args)
    got, got_seen, got_printed = _callback_outcome(run, _serialized(f, grad), args)
    if isinstance(expected, Exception):
        assert type(got) is type(expected), got
        assert str(got).splitlines()[0] == str(expected).splitlines()[0]
    else:
        assert not isinstance(got, Exception), got
        assert_tree_close(got, expected, what=f"{what} of vmap over the {axis} argument")
    assert (got_seen, got_printed) == (seen, printed)
    assert seen["values"] + printed > 0 or isinstance(expected, Exception)
