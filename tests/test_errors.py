"""Errors name the cause: the primitive that forced the region to stop or retreat, and its
user source line; bad arguments are ``ValueError``s that name the argument."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxpr_accum as ja

T, B, H = 4, 6, 3
W = jnp.ones((H, H)) * 0.1
X = jnp.ones((T, B, H))


def merged_then_cumsum(w, x):
    h = jnp.tanh(x.reshape(T * B, H) @ w)
    return jnp.cumsum(h, 0).sum()


def merged_then_gather(w, x, idx):
    h = jnp.tanh(x.reshape(T * B, H) @ w)
    return h[idx].sum()


@pytest.mark.parametrize(
    "fun, args, primitive",
    [(merged_then_cumsum, (W, X), "cumsum"), (merged_then_gather, (W, X, jnp.arange(5)), "gather")],
)
def test_a_retreat_names_the_primitive_that_forced_it(fun, args, primitive):
    """A merged (time-major) axis that must stay whole for a ``cumsum`` or a gather along
    the merged dimension: the error lists that primitive first, with its line, and every
    retreating equation names it."""
    sf = ja.serialize_axis(fun, chunk=2, argnums=1, axis=1)
    with pytest.raises(ja.SerializeError) as info:
        sf(*args)
    lines = str(info.value).splitlines()
    stops = [line for line in lines if "stopped by" in line]
    assert stops[0].strip().startswith(f"stopped by `{primitive}` at"), str(info.value)
    assert "test_errors.py" in stops[0], stops[0]
    assert all(f"`{primitive}` at" in line for line in stops[1:]), str(info.value)


def test_a_result_read_later_without_the_axis_is_named():
    """A body equation with a result that neither carries the axis nor reduces it, read
    after the loop, says so (not "needs a value reduced over the whole axis")."""

    def f(w, x):
        def step(h, _):
            return jnp.tanh(h @ w), w.sum()

        h, ws = jax.lax.scan(step, x, None, length=2)
        return h.sum() + ws.sum()

    with pytest.raises(ja.SerializeError) as info:
        ja.serialize_axis(f, chunk=2, argnums=1).explain(W, jnp.ones((6, H)))
    message = str(info.value)
    assert "stopped by `scan`" in message and "test_errors.py" in message, message
    assert "(float32[2]) is read later but neither carries the axis nor reduces it" in message
    assert "reduced over the whole axis" not in message, message


def test_in_axes_on_a_python_scalar_is_a_value_error():
    def f(w, x, t):
        return jnp.sum(jnp.tanh(x @ w) * t)

    sf = ja.serialize_axis(f, chunk=2, in_axes=(None, 0, 0))
    with pytest.raises(ValueError, match=r"`in_axes` 0 names args\[2\], a float and not an array"):
        sf(W, jnp.ones((6, H)), 2.0)


def test_serializing_a_serialized_function_again_says_so():
    """The outer serialization meets the inner one's region, already chunked: the error says
    what to do in the user's terms (not "register a rule" for the library's own primitive)."""

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    inner = ja.serialize_axis(loss, chunk=5, argnums=1)
    outer = ja.serialize_axis(lambda w, x: inner(w, x), chunk=3, argnums=1)
    x = jnp.linspace(-1, 1, 36).reshape(12, 3)
    with pytest.raises(ja.SerializeError, match=r"inner `serialize_axis`.*`\.original`") as info:
        outer(W, x)
    assert "register_rule" not in str(info.value)
    # serializing the inner function's original works, and is the same function
    again = ja.serialize_axis(inner.original, chunk=3, argnums=1)
    assert jnp.allclose(again(W, x), loss(W, x))


def test_a_custom_rule_that_calls_itself_gives_its_reason_once():
    """JAX's ``odeint`` calls its own custom-VJP function in its forward rule. Solving the
    whole batch as one state (not ``vmap``-ped: one adaptive step size for every row), its
    forward rule mixes the rows: that stop is named once, not wrapped in a second
    description of the same function; a line JAX keeps no user frame for is left
    out rather than printed as ``<unknown>``."""
    from jax.experimental.ode import odeint

    ts = jnp.linspace(0.0, 1.0, 3)

    def loss(w, y0s):
        return jnp.mean(odeint(lambda y, t, w: jnp.tanh(y @ w), y0s, ts, w) ** 2)

    sf = ja.serialize_axis(loss, chunk=2, argnums=1)
    (text, *_) = sf.explain(jnp.ones((2, 2)) * 0.1, jnp.ones((8, 2))).stops
    assert text.count("mixes positions along the axis") == 1, text
    assert text.count("the call runs unchunked") == 1 and "<unknown>" not in text, text
    assert "`_odeint`" in text, text
