"""Exactness under composition: the original's values and gradients, whatever the caller does.

The composition matrix differentiates one ``SerializedFunction`` with respect to every subset
of its inputs, in two orders, under each wrapper (none, ``jit``, ``checkpoint``, ``cond``,
``scan``, ``vmap``, ``vjp``), in every gradient mode, in float32, float64, complex and with
streamed normalisers (a softmax and a logsumexp over the axis), at chunks that divide the
axis, that don't, 1 and larger than the axis; the unchunked original is the oracle every
time. The default tier runs one row per gradient mode; the full matrix
is ``slow``.

Then one regression class per defect found by adversarial use (outside reports r1-r19), each with
a variant of its own: the perturbed-input mask shared between traces, custom rules that mix
the batch, nested serialization, dtypes, shapes, devices, the ``size=`` choice, the analysis
on long chains, plans that cannot save memory, errors and read-only settings.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, NOT_WORTH_IT, assert_matches_original, covering, modes

_LIBRARY = Path(ja.__file__).resolve().parent


def _in_library(filename: str) -> bool:
    """Whether a frame's file is in the library's own package (wherever it is checked out)."""
    return Path(filename).resolve().is_relative_to(_LIBRARY)


def diagonal(names: list[str]) -> list:
    """``(mode, name)`` for every pair; the default tier keeps a diagonal that has every mode
    and every name at least once, the other pairs are ``slow``."""
    n = max(len(names), len(GRAD_MODES))
    keep = {(GRAD_MODES[i % len(GRAD_MODES)], names[i % len(names)]) for i in range(n)}
    return [
        (mode, name) if (mode, name) in keep else pytest.param(mode, name, marks=pytest.mark.slow)
        for mode in GRAD_MODES
        for name in names
    ]


N = 12


def _subsets(n: int) -> list[tuple[int, ...]]:
    return [c for r in range(1, n + 1) for c in itertools.combinations(range(n), r)]


#: every subset of the three inputs, each step to a set that gains or loses inputs (a mask
#: or residual left stale by the last differentiation shows in the next, either way)
GROW_AND_SHRINK = [(0,), (0, 1, 2), (1,), (0, 1), (2,), (1, 2), (0, 2), (0,)]
assert sorted(set(GROW_AND_SHRINK)) == sorted(_subsets(3))


# -- the programs --------------------------------------------------------------------------


def real_loss(w, b, x):
    return jnp.mean(jnp.tanh(x @ w + b) ** 2)


def complex_loss(w, b, x):
    """A characteristic-function loss: a complex sum over the axis."""
    return jnp.abs(jnp.sum(jnp.exp(1j * (x @ w) + b))) ** 2 / x.shape[0]


def softmax_loss(w, b, x):
    """Streamed normalisers: a softmax and a logsumexp over the axis."""
    h = jnp.tanh(x @ w + b)
    p = jax.nn.softmax(h.sum(1) * 3.0)
    return jnp.sum(p @ h) + jax.nn.logsumexp(h[:, 0] * 5.0)


def _args(kind: str, n: int = N) -> tuple:
    rs = np.random.RandomState(0)
    dtype = np.float64 if kind == "float64" else np.float32
    w = rs.normal(size=(4, 3)).astype(dtype) / 2
    b = rs.normal(size=(3,)).astype(dtype) / 4
    x = rs.normal(size=(n, 4)).astype(dtype)
    if kind == "complex":
        b = (b + 1j * rs.normal(size=(3,)) / 4).astype(np.complex64)
    return jnp.asarray(w), jnp.asarray(b), jnp.asarray(x)


def _loss(kind: str):
    return {"complex": complex_loss, "softmax": softmax_loss}.get(kind, real_loss)


WRAPPERS = {
    "none": lambda f: f,
    "jit": jax.jit,
    "checkpoint": jax.checkpoint,
    "cond": lambda f: lambda *a: lax.cond(True, f, lambda *b: 2.0 * f(*b), *a),
    "scan": lambda f: lambda *a: lax.scan(lambda c, _: (c + f(*a), None), 0.0 * f(*a), None, 2)[0],
    "vmap": lambda f: (
        lambda w, b, x: jnp.sum(jax.vmap(f, in_axes=(0, None, None))(jnp.stack([w, 2 * w]), b, x))
    ),
    "vjp": lambda f: lambda *a: jax.vjp(f, *a)[1](jnp.ones((), f(*a).dtype))[0].sum().real + f(*a),
}


def _grad(f, argnums):
    return jax.grad(lambda *a: jnp.real(f(*a)), argnums=argnums)


def check_subsets_in_orders(
    mode: str, kind: str, wrapper: str, chunk: int = 5, sequence: list | None = None
) -> int:
    """Differentiate one serialized function w.r.t. every subset, in an order that both
    grows and shrinks the differentiated set (``GROW_AND_SHRINK``; or w.r.t. the subsets of
    ``sequence``, in that order)."""
    ctx = jax.enable_x64(True) if kind == "float64" else _nullcontext()
    with ctx:
        args = _args(kind)
        loss = _loss(kind)
        sf = ja.serialize_axis(loss, chunk=chunk, argnums=2, grad=mode)
        wrap = WRAPPERS[wrapper]
        count = 0
        for argnums in sequence or GROW_AND_SHRINK:
            got = _grad(wrap(sf), argnums)(*args)
            ref = _grad(wrap(loss), argnums)(*args)
            assert_tree_close(got, ref, what=f"{wrapper} grad {argnums}")
            count += 1
        return count


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.mark.parametrize("mode", modes("auto", slow=GRAD_MODES))
@pytest.mark.slow
def test_composition_row(mode):
    """One row per mode in the default tier: a stale-mask sequence (all inputs, then one,
    then another, then all again) under ``jit``; the full matrix is ``slow``."""
    sequence = [(0, 1, 2), (0,), (2,), (0, 1, 2)]
    assert check_subsets_in_orders(mode, "float32", "jit", sequence=sequence) == 4


# float32 under every wrapper; float64 and complex under the wrappers that trace differently
# (none: eager; jit: staged; scan: a loop around the custom VJP).
MATRIX = [("float32", w) for w in sorted(WRAPPERS)] + [
    (kind, w) for kind in ("float64", "complex") for w in ("jit", "none", "scan")
]
# streamed normalisers: staged, in a loop, batched, and under a caller's vjp
MATRIX += [("softmax", w) for w in ("checkpoint", "scan", "vjp", "vmap")]


@pytest.mark.slow
@pytest.mark.parametrize("kind, wrapper, mode", covering(MATRIX, GRAD_MODES, per=1))
def test_composition_matrix(mode, kind, wrapper):
    assert check_subsets_in_orders(mode, kind, wrapper) == len(GROW_AND_SHRINK)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, mode, chunk",
    covering(["float32", "float64", "complex", "softmax"], GRAD_MODES, [1, 4, 5, N, N + 3], per=2),
)
def test_composition_chunks(mode, kind, chunk):
    with jax.enable_x64(True) if kind == "float64" else _nullcontext():
        args = _args(kind)
        loss = _loss(kind)
        sf = ja.serialize_axis(loss, chunk=chunk, argnums=2, grad=mode)
        assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize(
    "mode",
    modes("remat", slow=GRAD_MODES),
)
@pytest.mark.slow
def test_hessian_forward_over_reverse_and_reverse_over_reverse(mode):
    """``jax.hessian`` is ``jacfwd(jacrev)``: forward mode over the region's backward."""
    w, b, x = _args("float32")
    sf = ja.serialize_axis(real_loss, chunk=5, argnums=2, grad=mode)
    for hess in (jax.hessian, lambda f, argnums: jax.jacrev(jax.jacrev(f, argnums), argnums)):
        got = hess(sf, argnums=(0, 1))(w, b, x)
        ref = hess(real_loss, argnums=(0, 1))(w, b, x)
        assert_tree_close(got, ref, rtol={jnp.float32: 1e-3})
    tangent = jax.jvp(jax.grad(sf), (w, b, x), (w, b, x))[1]
    assert_tree_close(tangent, jax.jvp(jax.grad(real_loss), (w, b, x), (w, b, x))[1])


# -- 1. no state shared between differentiations (r1, r2) -----------------------------------


@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
@pytest.mark.slow
def test_perturbed_mask_does_not_leak_between_traces(mode):
    """r1/r2: after grads w.r.t. (w, x) then w alone, grad of jit/checkpoint(sf) is exact."""
    w, _, x = _args("float32")

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    jax.grad(sf, (0, 1))(w, x)
    jax.grad(sf, 0)(w, x)
    jax.grad(sf, 1)(w, x)
    for wrap in (jax.jit, jax.checkpoint, lambda f: f):
        got = jax.grad(wrap(sf), (0, 1))(w, x)
        assert_tree_close(got, jax.grad(loss, (0, 1))(w, x))


# -- 2. custom rules are analysed, never trusted (r3, r10, r11) -----------------------------


@jax.custom_vjp
def center_grad(v):
    return v


center_grad.defvjp(lambda v: (v, None), lambda _, g: (g - g.mean(0),))


@jax.custom_vjp
def per_batch_size(v):
    return v


per_batch_size.defvjp(lambda v: (v, None), lambda _, g: (g / g.shape[0],))


@jax.custom_vjp
def mean_residual(v):
    return v * 1.0


mean_residual.defvjp(lambda v: (v * 1.0, v.mean(0)), lambda m, g: (g * m,))


@jax.custom_jvp
def jvp_statistic(v):
    return jnp.sin(v)


jvp_statistic.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0] * jnp.std(p[0], 0)))


@jax.custom_vjp
def clip_grad(v):
    return v


clip_grad.defvjp(lambda v: (v, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


@jax.custom_vjp
def dense(w, x):
    return x @ w


dense.defvjp(lambda w, x: (x @ w, (w, x)), lambda r, g: (r[1].T @ g, g @ r[0].T))

MIXING = {
    "cotangent statistic": center_grad,
    "g.shape[0]": per_batch_size,
    "residual mean": mean_residual,
    "JVP statistic": jvp_statistic,
}


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # the region stops at the rule: may save nothing
@pytest.mark.parametrize("mode, name", diagonal(sorted(MIXING)))
def test_custom_rule_that_mixes_the_batch_is_exact(name, mode):
    """A rule that mixes the batch runs unchunked (or, for ``g.shape[0]``, its full-size
    jaxpr is resized, which computes what it did at full size); never per chunk."""
    fun = MIXING[name]
    w, _, x = _args("float32")

    def loss(w, x):
        return jnp.sum(jnp.sin(fun(jnp.tanh(x @ w))))

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    plan = sf.explain(w, x)  # analysed at plan time: no error deferred to jax.grad
    if name != "g.shape[0]":
        assert any(fun.__name__ in s for s in plan.stops), plan.stops
        assert any("test_exactness.py" in s for s in plan.stops), plan.stops
    assert_matches_original(sf, w, x, vmap=False)


@jax.custom_vjp
def position_scaled(v):
    return v * (1.0 + jnp.arange(v.shape[0], dtype=v.dtype)[:, None] / 16.0)


position_scaled.defvjp(
    lambda v: (position_scaled(v), jnp.arange(v.shape[0], dtype=v.dtype)),
    lambda i, g: (g * (1.0 + i[:, None] / 16.0),),
)


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # the region stops at the rule: may save nothing
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_rule_reading_a_whole_residual_along_the_axis_runs_unchunked(mode):
    """Review finding: a forward rule's residual computed from no input (``jnp.arange(n)``,
    so whole at chunk size too) that the backward rule reads row by row with the cotangent
    was sliced in the chunked backward rule: an internal shape error at plan time. Such a
    call runs unchunked, exactly, and ``explain`` names it."""
    w, _, x = _args("float32")

    def loss(w, x):
        return jnp.sum(jnp.tanh(position_scaled(x @ w)) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    plan = sf.explain(w, x)
    assert any("position_scaled" in s and "computes whole" in s for s in plan.stops), plan.stops
    assert_matches_original(sf, w, x, vmap=False)


@jax.custom_vjp
def position_scaled_cotangent(v):
    return v


position_scaled_cotangent.defvjp(
    lambda v: (v, None),
    lambda _, g: (g * (1.0 + jnp.arange(g.shape[0], dtype=g.dtype)[:, None] / 16.0),),
)


@jax.custom_vjp
def noised_cotangent(v, key):
    return v


noised_cotangent.defvjp(
    lambda v, key: (v, key),
    lambda key, g: (g + 0.01 * jax.random.normal(key, g.shape, g.dtype), None),
)


@pytest.mark.parametrize(
    "rule",
    [
        position_scaled_cotangent,
        pytest.param(lambda v: noised_cotangent(v, jax.random.key(1)), marks=pytest.mark.slow),
    ],
    ids=["positions", "noise-from-a-key-residual"],
)
@pytest.mark.parametrize("mode", modes("native", slow=GRAD_MODES))
def test_a_rule_reading_positions_is_chunked_under_jit_in_every_mode(mode, rule):
    """Review finding: a backward rule that reads its positions (``jnp.arange(g.shape[0])``)
    is resized per chunk, from the chunk's first position. Under ``grad="native"`` JAX traces
    the rules when it transposes the loop, outside the chunk's trace, and the first position
    they closed over escaped: ``jax.jit`` failed to lower ("No constant handler for type:
    DynamicJaxprTracer"). The position is now an argument of the rules. A DP-style rule
    drawing noise from a key residual reads its positions the same way."""
    w, _, x = _args("float32")

    def loss(w, x):
        return jnp.sum(jnp.tanh(rule(x @ w)) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    assert not sf.explain(w, x).stops
    got = jax.jit(jax.value_and_grad(sf, (0, 1)))(w, x)
    assert_tree_close(got, jax.jit(jax.value_and_grad(loss, (0, 1)))(w, x))
    assert_matches_original(sf, w, x, vmap=False)


def _custom_rule_closing_over(s, kind: str):
    """``v * 2`` with a custom rule that reads ``s`` from its closure: in the forward rule,
    the backward rule only, or a JVP rule; or ``v * 2 * s``, all three reading it."""
    if kind == "custom_jvp":

        @jax.custom_jvp
        def scaled(v):
            return v * 2.0

        scaled.defjvp(lambda p, t: (p[0] * 2.0, t[0] * 2.0 * s))
        return scaled

    if kind == "custom_vjp everywhere":  # the primal too: JAX makes ``s`` a constant operand

        @jax.custom_vjp
        def scaled(v):
            return v * 2.0 * s

        scaled.defvjp(lambda v: (v * 2.0 * s, (s,)), lambda res, g: (g * 2.0 * res[0],))
        return scaled

    @jax.custom_vjp
    def scaled(v):
        return v * 2.0

    if kind == "custom_vjp forward":
        scaled.defvjp(lambda v: (v * 2.0, (s,)), lambda res, g: (g * 2.0 * res[0],))
    else:
        scaled.defvjp(lambda v: (v * 2.0, None), lambda _, g: (g * 2.0 * s,))
    return scaled


CLOSURES = ["custom_vjp forward", "custom_vjp backward", "custom_vjp everywhere", "custom_jvp"]


@pytest.mark.parametrize("activation", [jnp.tanh, jax.jit(jnp.tanh)], ids=["plain", "jitted"])
@pytest.mark.parametrize("kind", CLOSURES)
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_rule_closing_over_a_value_of_the_function_runs_as_written(mode, kind, activation):
    """A custom rule defined inside the loss that reads a value the loss computed closes
    over a tracer of the library's trace, dead once tracing is over: JAX cannot
    differentiate such a program once staged (``jax.grad(jax.jit(loss))`` fails alike, "No
    constant handler for type"), and the chunked program failed so in every mode (review
    findings: a closure in the forward, the backward or the JVP rule). The original
    differentiates it (``jax.grad`` before ``jax.jit``): the function runs as written, with
    a warning that says how to have it chunked. A jitted call in the function makes tracing
    inline it, and the retraced custom function takes the closed-over value as an operand,
    whose forward rule JAX refuses a perturbed one (fuzz finding: planning failed there)."""
    w, _, x = _args("float32")

    def loss(w, x):
        scaled = _custom_rule_closing_over(jnp.sum(w**2), kind)
        return jnp.sum(activation(scaled(x @ w)) ** 2)

    for transform in (jax.grad, lambda f, i: jax.jit(jax.value_and_grad(f, i))):
        sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
        with pytest.warns(ja.PlanWarning, match="grad\\(jax.jit\\(f\\)\\)` fails alike"):
            got = transform(sf, 1)(w, x)
        assert_tree_close(got, transform(loss, 1)(w, x))
        assert sf.explain(w, x).chunk == 0
    with pytest.raises((TypeError, jax.errors.UnexpectedTracerError)):  # the warning's claim
        jax.block_until_ready(jax.grad(jax.jit(loss), 1)(w, x))


@pytest.mark.parametrize("kind", CLOSURES)
def test_a_rule_closing_over_a_row_of_a_vmap_inside_the_function_runs_as_written(kind):
    """Review finding: a custom rule inside a ``jax.vmap`` of the loss reading a per-row value
    closes over a tracer of that ``vmap``, dead once it returns: looking for closures traced
    the rule and raised ``UnexpectedTracerError``, so even a forward call failed. Such a rule
    runs as written: its forward calls are the original's (JAX cannot differentiate it)."""
    w, _, x = _args("float32")

    def loss(w, x):
        def row(r):
            return _custom_rule_closing_over(jnp.sum(r**2), kind)(r @ w)

        return jnp.sum(jnp.tanh(jax.vmap(row)(x)) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1)
    with pytest.warns(ja.PlanWarning, match="closes over an array"):
        assert_tree_close(sf(w, x), loss(w, x))
    assert_tree_close(jax.jit(sf)(w, x), jax.jit(loss)(w, x))
    assert_tree_close(jax.vmap(sf, (None, 0))(w, x[None]), jax.vmap(loss, (None, 0))(w, x[None]))


@pytest.mark.parametrize("outer", ["jit", "grad", "vmap"])
@pytest.mark.parametrize("kind", CLOSURES)
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_rule_closing_over_a_value_of_an_outer_transformation_runs_as_written(mode, kind, outer):
    """Review finding: a custom rule reading a tracer of a transformation around the call
    (``s = p ** 2`` under ``jax.jit``, ``jax.grad`` or ``jax.vmap`` of ``p``) failed to lower
    as well: it runs as written too, and an outer derivative through the rule's closure is
    the original's."""
    w, _, x = _args("float32")

    def outer_of(serialize: bool):
        def run(p, w, x):
            def loss(w, x):
                scaled = _custom_rule_closing_over(p**2, kind)
                return jnp.sum(jnp.tanh(scaled(x @ w)) ** 2)

            f = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode) if serialize else loss
            return jnp.sum(jax.grad(f, 1)(w, x))

        if outer == "jit":
            return jax.jit(run), jnp.float32(1.3)
        if outer == "grad":
            return jax.grad(run), jnp.float32(1.3)
        return jax.vmap(run, (0, None, None)), jnp.asarray([1.3, 0.2], jnp.float32)

    (want_of, p), (got_of, _) = outer_of(False), outer_of(True)
    with pytest.warns(ja.PlanWarning, match="closes over an array"):
        got = got_of(p, w, x)
    assert_tree_close(got, want_of(p, w, x))


_GAINS = jnp.linspace(0.5, 1.5, 3, dtype=jnp.float32)  # a constant the rules below close over


@jax.custom_vjp
def gained_tanh(z):
    return jnp.tanh(z) * _GAINS


gained_tanh.defvjp(
    lambda z: (jnp.tanh(z) * _GAINS, z),
    lambda z, g: (g * (1.0 - jnp.tanh(z) ** 2) * _GAINS,),
)


@pytest.mark.parametrize("per_example", [False, True], ids=["whole", "vmap-of-jit"])
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_custom_vjp_closing_over_a_constant_array_beside_a_jitted_call_is_chunked(
    mode, per_example
):
    """A custom VJP whose function closes over a constant array, in a function that also
    calls a jitted one: tracing inlines the jitted call by re-emitting every equation, and
    JAX passes the closed-over array as a plain operand, for which the forward rule refuses
    a tangent. Re-emitted with the array closed over again, it is the call's constant, as in
    the original: chunked, exact, no warning (it ran as written with a closure warning)."""
    w, _, x = _args("float32")

    def loss(w, x):
        z = x @ w
        h = jax.vmap(jax.jit(gained_tanh))(z) if per_example else gained_tanh(z)
        return jnp.sum(jax.jit(jnp.tanh)(h) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ja.PlanWarning)
        got = jax.jit(jax.value_and_grad(sf, (0, 1)))(w, x)
        plan = sf.explain(w, x)
    assert_tree_close(got, jax.jit(jax.value_and_grad(loss, (0, 1)))(w, x))
    assert plan.chunk == 5 and plan.counts["body"] > 0


_WRAPPED = {
    "plain": lambda f: f,
    "checkpoint": jax.checkpoint,
    "scan": lambda f: lambda z: lax.scan(lambda c, _: (f(c), None), z, None, length=2)[0],
}


@pytest.mark.parametrize(
    "wrapped", [w if w == "plain" else pytest.param(w, marks=pytest.mark.slow) for w in _WRAPPED]
)
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
@pytest.mark.slow
def test_forward_mode_over_a_custom_vjp_closing_over_a_constant_is_exact(mode, wrapped):
    """Review finding: ``jax.hessian`` (forward over reverse) of a loss whose custom VJP
    closes over a constant array, inside ``jax.checkpoint`` or a ``lax.scan``, raised JAX's
    "differentiation of a custom_vjp function with respect to a closed-over value" in every
    mode. The region's JVP differentiated every input, so the constant (an input of the
    region) got a zero tangent where JAX keeps a symbolic zero; it now differentiates the
    perturbed inputs only."""
    w, _, x = _args("float32")
    custom = _WRAPPED[wrapped](gained_tanh)

    def loss(w, x):
        return jnp.sum(custom(x @ w) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    assert sf.explain(w, x).chunk == 5
    want = jax.hessian(loss)(w, x)
    assert_tree_close(jax.hessian(sf)(w, x), want, rtol={jnp.float32: 1e-4})


@pytest.mark.parametrize(
    "residual",
    [3.0, np.float32(3.0), jnp.int32(3), (2.0, None)],
    ids=["python-float", "numpy-scalar", "jax-int", "float-and-none"],
)
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_rule_returning_a_constant_residual_is_chunked(mode, residual):
    """Review finding: a forward rule whose residual is a constant (a Python or NumPy
    number: a literal of the rule's jaxpr) failed the rule check ("unhashable type:
    'Literal'"), an internal error in every mode."""
    w, _, x = _args("float32")

    @jax.custom_vjp
    def scaled_gradient(v):
        return v

    def backward(res, g):
        n = res[0] if isinstance(res, tuple) else res
        return (g * n,)

    scaled_gradient.defvjp(lambda v: (v, residual), backward)

    def loss(w, x):
        return jnp.sum(jnp.tanh(scaled_gradient(x @ w)) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    assert not sf.explain(w, x).stops
    assert_matches_original(sf, w, x, vmap=False)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_custom_vjp_of_a_half_precision_value_is_chunked(mode, dtype):
    """Review finding: a custom VJP of a bfloat16 value had its cotangent typed ``float0``
    (NumPy does not count bfloat16 as inexact), so the user's backward rule failed at plan
    time ("Called clip with a float0 array"): an internal error, and the original ran."""
    w, _, x = _args("float32")

    def loss(w, x):
        return jnp.sum(jnp.tanh(clip_grad((x @ w).astype(dtype))).astype(jnp.float32) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    assert not sf.explain(w, x).stops
    assert_matches_original(sf, w, x, vmap=False)


@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_a_custom_vjp_that_saves_a_shape_as_a_residual_is_chunked(mode):
    """Breaker finding: a forward rule that saves ``m.shape`` beside ``m`` (its backward
    broadcasts to it) ran in JAX; here the backward rule was traced with the shape's entries
    as tracers, which ``broadcast_to`` refuses: an internal error, and the original ran. JAX
    hands a residual the rule returns as a constant to the backward rule as that value."""
    w, _, x = _args("float32")

    @jax.custom_vjp
    def square_rows(m):
        return jnp.sum(m**2, -1)

    def backward(residuals, g):
        m, shape = residuals
        return (jnp.broadcast_to(g[..., None], shape) * 2 * m,)

    square_rows.defvjp(lambda m: (square_rows(m), (m, m.shape)), backward)

    def loss(w, x):
        return jnp.mean(square_rows(jnp.tanh(x @ w)))

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    assert not sf.explain(w, x).stops
    assert_matches_original(sf, w, x, vmap=False)


@pytest.mark.parametrize("mode", modes("remat", "fused", slow=GRAD_MODES))
def test_polymorphic_custom_rules_are_chunked(mode):
    """r11: per-example custom rules (directly and under vmap) and a weight-gradient sum in a
    backward rule run at chunk size and match."""
    w, _, x = _args("float32")

    def loss(w, x):
        h = jax.vmap(clip_grad)(jnp.tanh(dense(w, x)))
        return jnp.sum(clip_grad(h) ** 2)

    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=mode)
    plan = sf.explain(w, x)
    assert plan.stops == [] and plan.counts["epilogue"] == 0, str(plan)
    assert_matches_original(sf, w, x, vmap=False)


@jax.custom_vjp
def tanh_scaled_grad(v):
    return jnp.tanh(v)


# not tanh's derivative: second-order derivatives show which rule JAX differentiated
tanh_scaled_grad.defvjp(lambda v: (jnp.tanh(v), jnp.tanh(v)), lambda y, g: (g * (1 - y * y) * 0.9,))


def _second_order_stacks(f):
    def weighted(tree):
        return sum(jnp.sum(jnp.cos(jnp.arange(v.size)).reshape(v.shape) * v) for v in tree)

    return {
        "hessian": jax.hessian(f, argnums=(0, 1)),
        "jacfwd(grad)": jax.jacfwd(jax.grad(f)),
        "jvp(grad)": lambda w, x: jax.jvp(jax.grad(f, (0, 1)), (w, x), (w, x)),
        "grad(grad)": jax.grad(lambda w, x: weighted(jax.grad(f, (0, 1))(w, x)), (0, 1)),
        "jacrev(grad x)": jax.jacrev(jax.grad(f, 1)),
        "scan>hessian": lambda w, x: jax.lax.scan(
            lambda c, s: (c + jax.hessian(f)(s * w, x), None),
            jnp.zeros(w.shape * 2),
            1.0 + jnp.arange(2.0),
        )[0],
    }


@jax.custom_jvp
def tanh_scaled_jvp(v):
    return jnp.tanh(v)


# not tanh's derivative either, and a rule whose primal is computed by the rule itself
tanh_scaled_jvp.defjvp(lambda p, t: (jnp.tanh(p[0]), 1.1 * (1 - jnp.tanh(p[0]) ** 2) * t[0]))


def _slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # a small problem: the loop may save nothing
@pytest.mark.parametrize(
    "mode, head, rule, stacks",
    # the default tier: the stack that found b01 (custom JVP); those that found f06/f07
    # (custom VJP) are slow
    [_slow("remat", "logsumexp", "custom_vjp", ("hessian", "grad(grad)"))]
    + [("remat", "logsumexp", "custom_jvp", ("grad(grad)",))]
    + [_slow(m, "logsumexp", "custom_vjp", None) for m in ("remat", "auto", "fused", "native")]
    + [_slow(m, "logsumexp", "custom_jvp", None) for m in ("remat", "fused")]
    + [_slow("remat", "sum", "custom_vjp", None)],
)
@pytest.mark.slow
def test_second_order_through_custom_rules(mode, head, rule, stacks):
    """f06, f07 and b01: second-order derivatives of a loss with custom rules that are not the
    true derivative (custom VJPs, per-example, batch-mixing and scaled; or a scaled custom
    JVP), under a plain sum and a streamed logsumexp. JAX differentiates a custom VJP's
    forward rule there, and a custom JVP rule's primal, never the custom derivative itself;
    so must the region."""
    w, _, x = _args("float32")
    x = x[:7]

    def loss(w, x):
        if rule == "custom_vjp":
            s = jnp.sin(center_grad(jax.vmap(clip_grad)(tanh_scaled_grad(dense(w, x)))))
        else:
            s = tanh_scaled_jvp(x @ w)
        if head == "sum":
            return jnp.sum(s**2)
        m = jax.lax.stop_gradient(jnp.max(s[:, 0]))
        return jnp.log(jnp.sum(jnp.exp(s[:, 0] - m))) + m

    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=mode)
    refs = _second_order_stacks(loss)
    for name, stack in _second_order_stacks(sf).items():
        if stacks is not None and name not in stacks:  # the default tier: one or two of six
            continue
        got, ref = stack(w, x), refs[name](w, x)
        assert_tree_close(got, ref, rtol={jnp.float32: 1e-3}, what=name)


# -- 3. nested use (r8) ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
@pytest.mark.slow
def test_serialized_inside_serialized(mode):
    w, _, _ = _args("float32")
    xx = jax.random.normal(jax.random.key(3), (6, N, 4))
    inner_loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    inner = ja.serialize_axis(inner_loss, chunk=5, argnums=1, grad=mode)

    def outer_ref(w, xx):
        return jnp.sum(jax.vmap(lambda xb: inner_loss(w, xb))(xx) ** 0.5)

    def outer(w, xx):
        return jnp.sum(jax.vmap(lambda xb: inner(w, xb))(xx) ** 0.5) + inner(w, xx[0])

    def outer_ref2(w, xx):
        return outer_ref(w, xx) + inner_loss(w, xx[0])

    sf = ja.serialize_axis(outer, chunk=4, argnums=1, grad=mode)
    # the outer plan sees through the inner region: no stop at it or in the library's files
    stops = sf.explain(w, xx).stops
    assert not any("serialized_region" in s or str(_LIBRARY) in s for s in stops), stops
    assert_matches_original(sf, w, xx, vmap=False)
    # and against the program with no serialized function at all (its only output is a scalar)
    got = jax.value_and_grad(sf, argnums=(0, 1))(w, xx)
    assert_tree_close(got, jax.value_and_grad(outer_ref2, argnums=(0, 1))(w, xx))


# -- 4. dtypes (r6, r7) ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", modes("remat", "fused", slow=GRAD_MODES))
@pytest.mark.slow
def test_float64_is_float64_accurate(mode):
    with jax.enable_x64(True):
        w, b, x = _args("float64", n=13)
        sf = ja.serialize_axis(real_loss, chunk=5, argnums=2, grad=mode)
        v, g = jax.value_and_grad(sf, (0, 1, 2))(w, b, x)
        rv, rg = jax.value_and_grad(real_loss, (0, 1, 2))(w, b, x)
        assert v.dtype == jnp.float64
        for a, r in zip(g, rg, strict=True):
            assert a.dtype == jnp.float64
            assert float(jnp.max(jnp.abs(a - r)) / jnp.max(jnp.abs(r))) < 1e-12
        assert abs(float(v - rv)) < 1e-14


@pytest.mark.parametrize("mode", modes("remat", slow=GRAD_MODES))
def test_complex_sums_are_exact(mode):
    """r7: fused refuses complex sums; every mode (auto included) is exact."""
    args = _args("complex")
    sf = ja.serialize_axis(complex_loss, chunk=5, argnums=2, grad=mode)
    assert sf.explain(*args).grad != "fused"
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.parametrize("mode", modes(slow=GRAD_MODES))
def test_complex_inputs_of_a_real_loss_are_exact_and_quiet(mode):
    """Review finding: fused contracted a complex input's Jacobian rows with its tangent and
    cast the complex part to the real sum with ``astype``, which JAX deprecates (a
    ``DeprecationWarning`` now, an error soon). The real part is taken explicitly."""
    rs = np.random.RandomState(5)
    w = jnp.asarray(rs.normal(size=(5, 3)) + 1j * rs.normal(size=(5, 3)), jnp.complex64)
    x = jnp.asarray(rs.normal(size=(10, 5)) + 1j * rs.normal(size=(10, 5)), jnp.complex64)

    def loss(w, x):
        return jnp.mean(jnp.abs(jnp.tanh(x @ w)) ** 2)

    sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        got = jax.value_and_grad(sf, argnums=(0, 1))(w, x)
        if mode == "fused":  # the contraction in question runs
            assert sf.explain(w, x).grad == "fused"
    assert_tree_close(got, jax.value_and_grad(loss, argnums=(0, 1))(w, x))


def test_accum_dtype_float64_without_x64_is_a_clear_error():
    with pytest.raises(ValueError, match="accum_dtype.*x64|accum_dtype.*64-bit"):
        ja.serialize_axis(real_loss, chunk=4, argnums=2, accum_dtype=jnp.float64)


def test_sum_accumulators_are_not_narrower_than_their_output():
    with jax.enable_x64(True):
        w, b, x = _args("float64")
        jaxpr = ja.serialize_axis(real_loss, chunk=5, argnums=2, grad="remat").jaxpr(w, b, x)
        scans = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"] or [
            e for e in _all_eqns(jaxpr.jaxpr) if e.primitive.name == "scan"
        ]
        for e in scans:
            for v in e.params["jaxpr"].jaxpr.invars[e.params["num_consts"] :][
                : e.params["num_carry"]
            ]:
                if jnp.issubdtype(v.aval.dtype, jnp.floating):
                    assert v.aval.dtype == jnp.float64, e


def _all_eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else [v]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


# -- 5. shapes (r4, r5, r9) ------------------------------------------------------------------


@pytest.mark.parametrize("mode", modes("fused", slow=GRAD_MODES))
def test_size_zero_axis_returns_what_the_original_returns(mode):
    w, b, _ = _args("float32")
    x = jnp.zeros((0, 4))
    sf = ja.serialize_axis(real_loss, chunk=4, argnums=2, grad=mode)
    plan = sf.explain(w, b, x)
    assert plan.axis_size == 0, str(plan)

    def total(w, b, x):
        return jnp.sum(jnp.tanh(x @ w + b) ** 2)

    sf_total = ja.serialize_axis(total, chunk=4, argnums=2, grad=mode)
    assert_matches_original(sf_total, w, b, x, vmap=False)
    np.testing.assert_array_equal(np.isnan(sf(w, b, x)), np.isnan(real_loss(w, b, x)))


@pytest.mark.parametrize("mode, where", diagonal(["top", "scan body", "while body"]))
@pytest.mark.slow
def test_nested_jit_constant_along_the_axis_is_sliced(mode, where):
    """r5: a constant of a nested jit that carries the axis, inside loop bodies."""
    w, _, x = _args("float32")
    const = np.arange(N * 4, dtype=np.float32).reshape(N, 4) / 50

    def f(w, x):
        scale = jax.jit(lambda a: a * const)
        h = jnp.tanh(x)
        if where == "top":
            h = scale(h)
        elif where == "scan body":
            h = lax.scan(lambda c, t: (c + scale(c) * t, None), h, jnp.arange(3.0))[0]
        else:
            h = lax.while_loop(
                lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + scale(c[1])), (0, h)
            )[1]
        return jnp.sum(jnp.tanh(h @ w) ** 2)

    sf = ja.serialize_axis(f, chunk=5, argnums=1, grad=mode)
    if where == "while body":  # JAX does not reverse-differentiate a while loop: values only
        assert_tree_close(sf(w, x), f(w, x))
    else:
        assert_matches_original(sf, w, x, vmap=False)


def test_symbolic_dimension_is_a_clear_error():
    from jax import export

    sf = ja.serialize_axis(real_loss, chunk=5, argnums=2)
    args = (
        jax.ShapeDtypeStruct((4, 3), jnp.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
        jax.ShapeDtypeStruct(export.symbolic_shape("b, 4"), jnp.float32),
    )
    export.export(jax.jit(real_loss))(*args)
    with pytest.raises(ja.SerializeError, match="argument 2 has the symbolic shape"):
        export.export(jax.jit(sf))(*args)


# -- 6. devices (r12) --------------------------------------------------------------------------


_DEVICE_ORDER_SCRIPT = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import numpy as np, jax.numpy as jnp
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    import jaxpr_accum as ja

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    rng = np.random.RandomState(0)
    w = rng.normal(size=(16, 4)).astype(np.float32)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    devs = jax.devices()
    sf = ja.serialize_axis(loss, chunk=8, argnums=1, mesh_axis="data")
    ref = jax.value_and_grad(loss)(w, x)
    for order in (devs, devs[::-1], devs[1:] + devs[:1]):
        mesh = Mesh(np.array(order), ("data",), axis_types=(AxisType.Auto,))
        args = (jax.device_put(w, NamedSharding(mesh, P())),
                jax.device_put(x, NamedSharding(mesh, P("data"))))
        v, g = jax.value_and_grad(sf)(*args)
        assert abs(float(v) - float(ref[0])) < 1e-6, (v, ref[0])
        assert float(jnp.max(jnp.abs(g - ref[1]))) < 1e-6
        with jax.set_mesh(mesh):
            assert abs(float(sf(*args)) - float(ref[0])) < 1e-6
    print("ok")
    """
)


@pytest.mark.integration
def test_one_function_on_meshes_that_differ_in_device_order():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(
        [sys.executable, "-c", _DEVICE_ORDER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


# -- 7. size= with several usable axes ---------------------------------------------------------


@pytest.mark.slow
def test_size_chooses_among_several_axes_by_cost():
    """An 8-sample Monte-Carlo axis beside 8-channel conv biases: the cost model picks."""
    rs = np.random.RandomState(0)
    kernel = jnp.asarray(rs.normal(size=(3, 3, 8, 8)) / 8, jnp.float32)
    bias = jnp.asarray(rs.normal(size=(8,)) / 8, jnp.float32)
    mu = jnp.asarray(rs.normal(size=(6, 6, 8)), jnp.float32)
    key = jax.random.key(0)

    def conv(h):
        y = lax.conv_general_dilated(
            h[None], kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )[0]
        return jnp.tanh(y + bias)

    def loss(mu, key):
        z = mu + jax.random.normal(key, (8, *mu.shape))
        return jnp.mean(jax.vmap(lambda h: conv(conv(h)))(z) ** 2)

    sf = ja.serialize_axis(loss, chunk=2, size=8)
    plan = sf.explain(mu, key)
    assert len(plan.candidates) >= 2, str(plan)
    assert "random" in plan.born or "normal" in plan.born or "add" in plan.born, str(plan)
    assert_matches_original(sf, mu, key, vmap=False)


# -- 8. the analysis terminates on long chains ---------------------------------------------------


@pytest.mark.slow
def test_long_chain_on_an_axis_carrying_constant():
    const = np.linspace(0, 1, N * 4, dtype=np.float32).reshape(N, 4)

    def f(x):
        c = jnp.asarray(const)
        for _ in range(150):
            c = jnp.sin(c)
        return jnp.sum(c * x)

    x = jnp.ones((N, 4))
    sf = ja.serialize_axis(f, chunk=5, argnums=0)
    assert_matches_original(sf, x, vmap=False)


# -- 9. never worse than the original ------------------------------------------------------------


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # the derivatives' own plans (auto plans per pattern)
@pytest.mark.slow
def test_a_plan_that_cannot_save_memory_says_so_and_warns_once():
    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.normal(size=(256, 16)), jnp.float32)
    wq = jnp.asarray(rs.normal(size=(16,)) / 4, jnp.float32)
    wv = jnp.asarray(rs.normal(size=(16, 16)) / 4, jnp.float32)

    def pool(wq, wv, x):  # centred pooling: log1p of x - mean(x) is outside the algebra
        s = x @ wq
        a = jnp.log1p((s - s.mean()) ** 2)
        return jnp.sum((a[:, None] * jnp.tanh(x @ wv)).sum(0) ** 2)

    sf = ja.serialize_axis(pool, chunk=32, argnums=2)
    plan = sf.explain(wq, wv, x)
    assert plan.warning is not None
    assert str(plan).startswith("note: this plan is not expected to save memory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sf(wq, wv, x)
        sf(wq, wv, x)
    assert len([w for w in caught if "not expected to save memory" in str(w.message)]) == 1
    assert_matches_original(sf, wq, wv, x, vmap=False)

    def mlp(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    assert ja.serialize_axis(mlp, chunk=32, argnums=1).explain(wv, x).warning is None

    def recurrent(w, xs):  # time-major: the batch is dim 1; the scan's activations count
        def step(h, xt):
            h = jnp.tanh(xt @ w + h @ w)
            return h, h

        _, hs = lax.scan(step, jnp.zeros(xs.shape[1:]), xs)
        return jnp.mean(jnp.tanh(hs.reshape(-1, 16) @ w) ** 2)

    xs = jnp.asarray(rs.normal(size=(12, 64, 16)), jnp.float32)
    assert ja.serialize_axis(recurrent, chunk=8, argnums=1, axis=1).explain(wv, xs).warning is None


# -- 10. errors are the user's -----------------------------------------------------------------


def test_a_users_shape_error_shows_at_most_one_library_frame():
    import traceback

    def bad(w, x):
        return jnp.sum(x @ w.T)  # (12, 4) @ (3, 4): mismatched

    w, _, x = _args("float32")
    sf = ja.serialize_axis(bad, chunk=5, argnums=1)
    with pytest.raises(TypeError) as info:
        sf(w, x)
    frames = traceback.extract_tb(info.value.__traceback__)
    # the library's own package, by path (not by name: a checkout named jaxpr_accum, with a
    # virtualenv inside it, holds this test and JAX's files too)
    assert sum(_in_library(f.filename) for f in frames) <= 1, frames


def test_emitted_equations_point_at_user_code():
    w, _, x = _args("float32")
    sf = ja.serialize_axis(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2), chunk=5, argnums=1)
    jaxpr = sf.jaxpr(w, x)
    text = str(jax.make_jaxpr(lambda *a: sf(*a))(w, x))
    assert "_build.py" not in text
    for e in _all_eqns(jaxpr.jaxpr):
        tb = e.source_info.traceback
        if tb is not None:
            files = [f.file_name for f in tb.frames]
            user = [f for f in files if not _in_library(f) and "/jax/" not in f]
            assert not user or "test_exactness.py" in user[0] or "site-packages" in user[0]


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # toys: a sum of x @ w saves nothing
@pytest.mark.parametrize("mode", modes("native", slow=GRAD_MODES))
def test_outputs_that_are_not_arrays(mode):
    w, _, x = _args("float32")
    none = ja.serialize_axis(lambda w, x: None, chunk=5, argnums=1, grad=mode)
    assert none(w, x) is None
    number = ja.serialize_axis(lambda w, x: (1.5, jnp.sum(x @ w)), chunk=5, argnums=1, grad=mode)
    assert_tree_close(number(w, x), jax.jit(lambda w, x: (1.5, jnp.sum(x @ w)))(w, x))
    text = ja.serialize_axis(lambda w, x: {"name": "loss", "v": jnp.sum(x @ w)}, chunk=5, argnums=1)
    with pytest.raises(TypeError, match=r"returned a str at output\['name'\]"):
        text(w, x)


def test_no_internal_error_reaches_the_user():
    """Odd but legal programs: an empty axis, a size-1 axis, an integer-only region."""
    w, b, _ = _args("float32")
    sf = ja.serialize_axis(real_loss, chunk=3, argnums=2)
    x = jnp.ones((0, 4))
    assert_tree_close(sf(w, b, x), real_loss(w, b, x))  # nothing to chunk: no warning
    x = jnp.ones((1, 4))
    with pytest.warns(ja.PlanWarning, match="one chunk of 3 holds the whole axis of 1"):
        assert_tree_close(sf(w, b, x), real_loss(w, b, x))
    ints = ja.serialize_axis(lambda x: jnp.sum(x * 2), chunk=3, argnums=0)
    with warnings.catch_warnings():  # an elementwise toy saves nothing: incidental here
        warnings.filterwarnings("ignore", ".*not expected to save memory", ja.PlanWarning)
        assert int(ints(jnp.arange(7))) == 42


@pytest.mark.parametrize("mode", ["auto", "remat", "fused", "native"])
def test_an_empty_axis_runs_as_written_in_every_mode_and_says_so(mode):
    """Size 0: every mode runs the program as written, and the plan says so (no loop, no hint
    to force a loop that an empty axis never builds)."""
    w, b, _ = _args("float32")
    x = jnp.ones((0, 4))
    sf = ja.serialize_axis(real_loss, chunk=3, argnums=2, grad=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a call on an empty axis warns nothing
        got = jax.value_and_grad(sf, argnums=(0, 1))(w, b, x)
    assert_tree_close(got, jax.value_and_grad(real_loss, argnums=(0, 1))(w, b, x))
    plan = sf.explain(w, b, x)
    assert plan.runs_as_written and plan.grad == "none"
    assert (
        plan.grad_reason
        == "the axis has size 0: there is nothing to chunk; the function runs as written"
    )
    text = str(plan)
    assert "all run as written (no loop)" in text
    assert "anyway" not in text and "hoisted" not in text and "fused does not apply" not in text


# -- 11. settings are read-only ----------------------------------------------------------------


def test_settings_are_read_only():
    w, b, x = _args("float32")
    sf = ja.serialize_axis(real_loss, chunk=5, argnums=2)
    sf(w, b, x)
    for name, value in [("chunk", 3), ("grad", "native"), ("argnums", 0), ("axis", 1)]:
        with pytest.raises(AttributeError, match="read-only"):
            setattr(sf, name, value)
    assert sf.chunk == 5 and sf.explain(w, b, x).chunk == 5
