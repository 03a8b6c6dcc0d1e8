"""Nonzero tangents read off the equations (``_engine/_tangents``) against JAX's own JVP.

The oracle is ``_compat.nonzero_tangents``: JAX's JVP of the jaxpr with symbolic zeros. Where
``reached_outputs`` answers, its flags must be JAX's for every floating or complex output, for
every perturbation pattern: each rule of its tables on a program of its own, then random
programs mixing the smooth rules with ``stop_gradient``, zero-JVP functions, integer paths,
conditionals and custom derivative rules (the last two may answer None, never wrong). The
region's own flags (``Region.tangent_flags``) are then checked end to end: a callback that
reads only a ``stop_gradient`` sum is not differentiated, as in the original.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum import _compat
from jaxpr_accum._analysis._trace import inline_calls
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._engine._tangents import BLOCK, PROPAGATE, reached_outputs

#: A program of two float vectors and an int vector per rule of the tables.
RULE_PROGRAMS = {
    "add": lambda x, y, i: x + y,
    "sub": lambda x, y, i: x - y,
    "mul": lambda x, y, i: x * y,
    "div": lambda x, y, i: x / (y + 3.0),
    "neg": lambda x, y, i: -x,
    "max": lambda x, y, i: jnp.maximum(x, y),
    "min": lambda x, y, i: jnp.minimum(x, y),
    "abs": lambda x, y, i: jnp.abs(x),
    "square": lambda x, y, i: lax.square(x),
    "integer_pow": lambda x, y, i: x**3 + y**0,
    "pow": lambda x, y, i: lax.pow(jnp.abs(x) + 1.0, y),
    "exp": lambda x, y, i: jnp.exp(x),
    "exp2": lambda x, y, i: lax.exp2(x),
    "expm1": lambda x, y, i: jnp.expm1(x),
    "log": lambda x, y, i: jnp.log(jnp.abs(x) + 1.0),
    "log1p": lambda x, y, i: jnp.log1p(jnp.abs(x)),
    "tanh": lambda x, y, i: jnp.tanh(x),
    "logistic": lambda x, y, i: jax.nn.sigmoid(x),
    "sin": lambda x, y, i: jnp.sin(x),
    "cos": lambda x, y, i: jnp.cos(x),
    "tan": lambda x, y, i: lax.tan(x),
    "sqrt": lambda x, y, i: jnp.sqrt(jnp.abs(x) + 1.0),
    "rsqrt": lambda x, y, i: lax.rsqrt(jnp.abs(x) + 1.0),
    "cbrt": lambda x, y, i: lax.cbrt(x),
    "erf": lambda x, y, i: lax.erf(x),
    "erfc": lambda x, y, i: lax.erfc(x),
    "erf_inv": lambda x, y, i: lax.erf_inv(x / 10.0),
    "atan2": lambda x, y, i: lax.atan2(x, y),
    "clamp": lambda x, y, i: lax.clamp(-1.0, x, y),
    "select_n": lambda x, y, i: jnp.where(i > 0, x, y),
    "convert_element_type": lambda x, y, i: x.astype(jnp.bfloat16) + i.astype(jnp.bfloat16),
    "copy": lambda x, y, i: lax.copy_p.bind(x),
    "reduce_precision": lambda x, y, i: lax.reduce_precision(x, 5, 10),
    "reduce_sum": lambda x, y, i: jnp.sum(x * y),
    "reduce_max": lambda x, y, i: jnp.max(x),
    "reduce_min": lambda x, y, i: jnp.min(y),
    "cumsum": lambda x, y, i: jnp.cumsum(x),
    "dot_general": lambda x, y, i: x @ y,
    "broadcast_in_dim": lambda x, y, i: jnp.broadcast_to(x, (2, 4)),
    "reshape": lambda x, y, i: x.reshape(2, 2),
    "transpose": lambda x, y, i: jnp.outer(x, y).T,
    "squeeze": lambda x, y, i: lax.squeeze(x[None], (0,)),
    "concatenate": lambda x, y, i: jnp.concatenate([x, y]),
    "pad": lambda x, y, i: lax.pad(x, y[0], [(1, 1, 0)]),
    "slice": lambda x, y, i: x[1:3],
    "dynamic_slice": lambda x, y, i: lax.dynamic_slice(x, (i[0],), (2,)),
    "dynamic_update_slice": lambda x, y, i: lax.dynamic_update_slice(x, y[:2], (i[0],)),
    "gather": lambda x, y, i: x[i % 4],
    "rev": lambda x, y, i: lax.rev(x, (0,)),
    "stop_gradient": lambda x, y, i: lax.stop_gradient(x) + 0.0 * i,
    "sign": lambda x, y, i: jnp.sign(x),
    "floor": lambda x, y, i: jnp.floor(x),
    "ceil": lambda x, y, i: jnp.ceil(x),
    "round": lambda x, y, i: jnp.round(x),
    "bitcast_convert_type": lambda x, y, i: lax.bitcast_convert_type(
        lax.bitcast_convert_type(x, jnp.int32) + i, jnp.float32
    ),
}

PATTERNS = list(itertools.product([False, True], repeat=3))


def _jaxpr(fun, *args):
    return inline_calls(jax.make_jaxpr(fun)(*args))


def _compare(closed, perturbed) -> bool | None:
    """Whether ``reached_outputs`` agrees with JAX on the inexact outputs (None: no answer)."""
    jaxpr = closed.jaxpr
    ours = reached_outputs(jaxpr.eqns, jaxpr.invars, jaxpr.outvars, perturbed)
    if ours is None:
        return None
    jax_flags = _compat.nonzero_tangents(closed, list(perturbed))
    inexact = [has_float_dtype(v.aval) for v in jaxpr.outvars]
    pairs = zip(ours, jax_flags, inexact, strict=True)
    assert [(o, j) for o, j, f in pairs if f and o != j] == []
    return True


def _args():
    return (
        jnp.array([0.5, -1.0, 2.0, 0.25], jnp.float32),
        jnp.array([1.5, 0.5, -0.75, 3.0], jnp.float32),
        jnp.array([1, 0, 3, 2], jnp.int32),
    )


def test_the_tables_are_the_rule_programs():
    assert set(RULE_PROGRAMS) == PROPAGATE | BLOCK
    assert not PROPAGATE & BLOCK


@pytest.mark.parametrize("name", sorted(RULE_PROGRAMS))
def test_each_rule_gives_jax_flags(name):
    closed = _jaxpr(lambda x, y, i: [RULE_PROGRAMS[name](x, y, i), x * 0.0], *_args())
    assert name in {e.primitive.name for e in closed.jaxpr.eqns}, name
    for perturbed in PATTERNS:
        assert _compare(closed, perturbed), (name, perturbed)


# -- random programs --------------------------------------------------------------------------
UNARY = [
    jnp.sin, jnp.tanh, jnp.exp, lax.stop_gradient, jnp.floor, jnp.sign, jnp.abs,
    lambda a: a.astype(jnp.int32).astype(jnp.float32), lambda a: jnp.cumsum(a)[::-1],
    lambda a: jnp.where(a > 0, a, 0.0), lambda a: jnp.sum(a) * jnp.ones_like(a),
    lambda a: jax.nn.relu(a),  # a custom JVP: no answer, JAX's flags instead
    lambda a: lax.cond(jnp.sum(a) > 0, jnp.sin, jnp.cos, a),
]  # fmt: skip
BINARY = [
    jnp.add, jnp.multiply, jnp.maximum, lambda a, b: jnp.where(a > b, a, b),
    lambda a, b: jnp.concatenate([a, b])[1:5], lambda a, b: a * lax.stop_gradient(b),
    lambda a, b: jnp.outer(a, b) @ a,
]  # fmt: skip


@st.composite
def programs(draw):
    n_in = 3
    steps = draw(
        st.lists(
            st.tuples(
                st.booleans(),
                st.integers(0, len(BINARY) - 1),
                st.integers(0, len(UNARY) - 1),
                st.integers(0, 20),
                st.integers(0, 20),
            ),
            min_size=1,
            max_size=8,
        )
    )
    perturbed = draw(st.tuples(*[st.booleans()] * n_in))
    n_out = draw(st.integers(1, 3))
    return steps, perturbed, n_out


def _run(steps, n_out, *xs):
    values = list(xs)
    for binary, b, u, i, j in steps:
        a, c = values[i % len(values)], values[j % len(values)]
        values.append(BINARY[b](a, c) if binary else UNARY[u](a))
    return values[-n_out:]


@settings(max_examples=25, deadline=None)
@given(programs())
def test_random_programs_give_jax_flags_or_no_answer(program):
    steps, perturbed, n_out = program
    xs = [jnp.linspace(-1.0, 1.0, 4) * (k + 1) for k in range(len(perturbed))]
    closed = _jaxpr(lambda *a: _run(steps, n_out, *a), *xs)
    _compare(closed, perturbed)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(programs())
def test_random_programs_give_jax_flags_or_no_answer_many(program):
    test_random_programs_give_jax_flags_or_no_answer.hypothesis.inner_test(program)


# -- end to end -------------------------------------------------------------------------------
def test_a_stop_gradient_sum_read_by_a_callback_is_not_differentiated(monkeypatch):
    """A per-example value under ``stop_gradient``, summed and read by a callback with no
    JVP: the region's flags are read off the equations (no JVP of them is traced), give it
    a symbolic zero, and the value and gradient are the original's."""

    def no_jvp(*_):
        raise AssertionError("the region's tangent flags traced a JVP")

    monkeypatch.setattr(_compat, "nonzero_tangents", no_jvp)

    def loss(w, x):
        h = jnp.tanh(x @ w)
        logged = jnp.sum(lax.stop_gradient(h) ** 2)
        logged = jax.pure_callback(
            lambda v: np.asarray(v), jax.ShapeDtypeStruct((), jnp.float32), logged
        )
        return jnp.sum(jnp.sin(h)) + 0.0 * logged

    w = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3)
    x = jnp.linspace(-2.0, 2.0, 40, dtype=jnp.float32).reshape(10, 4)
    for grad in ("remat", "fused", "auto"):
        sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)
        got = jax.value_and_grad(sf)(w, x)
        want = jax.value_and_grad(loss)(w, x)
        ja.testing.assert_tree_close(got, want)
