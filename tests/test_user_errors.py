"""The user's errors stay the user's (issue 30, item 5).

A call traces and compiles the built program first (the library's stages: a failure there runs
the original, ``test_fallback``), then runs it uncaught. So an exception raised by the user's
code at run time (a raising ``io_callback``, ``pure_callback`` or ``debug.callback``, a
``checkify`` check, ``jax_debug_nans`` / ``jax_debug_infs``) propagates as the original raises
it (under ``jax.jit`` for a debug callback): same type, same first line, no ``PlanWarning``,
nothing run twice. Callbacks fire as often as in the original in every way of
calling (plain, ``jit``, ``grad``, ``value_and_grad``, ``jit(grad)``) and every gradient mode,
``memory=`` included (planning compiles, never runs). A callback (which has no JVP) on a
per-example value taken through ``stop_gradient`` or ``argmax`` differentiates as in the
original: the region gives such a value a symbolic zero tangent. In a two-pass (pairwise)
plan (SimCLR-like ``logsumexp(h @ h.T)``, a CLIP-like two-tower loss) every callback runs in
exactly one pass, seeing the original's values once each (f10). The tests run lenient
(``JAXPR_ACCUM_STRICT=0``), so a fallback would show as a warning and a second run rather than
as the strict suite's error.
"""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify, io_callback

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, covering

_rs = np.random.RandomState(30)
W = jnp.asarray(_rs.normal(size=(6, 6)) * 0.4, jnp.float32)
X = jnp.asarray(_rs.normal(size=(24, 6)), jnp.float32)
NOT_WORTH_IT = "(?s).*not expected to save"

calls: dict[str, int] = {}


def count(name: str):
    def callback(*values):
        calls[name] = calls.get(name, 0) + 1

    return callback


class UserError(Exception):
    pass


def refuse(loss):
    calls["refused"] = calls.get("refused", 0) + 1
    raise UserError(f"the user's callback refuses the loss {float(loss):.3f}")


def features(w, x):
    return jnp.tanh(jnp.tanh(x @ w) @ w)


def raising_loss(w, x):
    loss = jnp.mean(features(w, x) ** 2)
    io_callback(refuse, None, jax.lax.stop_gradient(loss))  # ordered: raised at a later barrier
    return loss


def raising_pure_loss(w, x):
    loss = jnp.mean(features(w, x) ** 2)
    out = jax.ShapeDtypeStruct((), jnp.float32)
    return loss + jax.pure_callback(lambda v: refuse(v) or v, out, jax.lax.stop_gradient(loss))


def raising_debug_loss(w, x):
    loss = jnp.mean(features(w, x) ** 2)
    jax.debug.callback(refuse, loss)
    return loss


def counted_loss(w, x):
    """A logging ``io_callback`` on the loss, a ``debug.callback`` on the per-example features
    (the region stops there: the features are stacked) and a ``debug.print``."""
    h = features(w, x)
    jax.debug.callback(count("features"), h)
    loss = jnp.mean(h**2)
    io_callback(count("loss"), None, jax.lax.stop_gradient(loss), ordered=True)
    jax.debug.print("loss {l}", l=loss)
    return loss


def nan_loss(w, x):
    return jnp.mean(jnp.log(features(w, x)))  # negative features: log gives NaN


def inf_loss(w, x):
    return jnp.mean(1.0 / (features(w, x) ** 2 * 0.0))  # +inf


def checked_loss(w, x):
    loss = jnp.mean(features(w, x) ** 2)
    checkify.check(loss < 0, "the loss must be negative, got {l}", l=loss)
    return loss


CALLS = {
    "plain": lambda f: f(W, X),
    "jit": lambda f: jax.jit(f)(W, X),
    "grad": lambda f: jax.grad(f, argnums=(0, 1))(W, X),
    "value_and_grad": lambda f: jax.value_and_grad(f)(W, X),
    "jit_grad": lambda f: jax.jit(jax.grad(f))(W, X),
}


@pytest.fixture(autouse=True)
def lenient(monkeypatch):
    monkeypatch.setenv("JAXPR_ACCUM_STRICT", "0")


def _drain_effects() -> None:
    """Wait for the effects of a call that raised, so that an error its ordered callbacks left
    pending is not raised by the next test's barrier (it is this call's, already counted)."""
    for _ in range(3):
        try:
            jax.effects_barrier()
            return
        except Exception:
            continue


def outcome(call, f):
    """``(the exception raised or None, callback counts, jaxpr_accum warnings)``."""
    value, counts, ours = outcome_with_value(call, f)
    return (value if isinstance(value, Exception) else None), counts, ours


def assert_raises_as_the_original(call, f, sf, error_type):
    expected, expected_calls, _ = outcome(call, f)
    got, got_calls, ours = outcome(call, sf)
    assert isinstance(expected, error_type), expected
    assert type(got) is type(expected), got
    assert str(got).splitlines()[0] == str(expected).splitlines()[0]
    assert ours == [], ours
    assert got_calls == expected_calls, (got_calls, expected_calls)


def _first_fast(values, fast):
    """``values`` with all but ``fast`` marked slow."""
    return [v if v == fast else pytest.param(v, marks=pytest.mark.slow) for v in values]


@pytest.mark.parametrize("how", _first_fast(CALLS, "plain"))
@pytest.mark.parametrize("grad", _first_fast(GRAD_MODES, "remat"))
def test_a_raising_callback_raises_once_as_in_the_original(how, grad):
    sf = ja.serialize_axis(raising_loss, chunk=5, argnums=1, grad=grad)
    assert sf.explain(W, X).counts["body"] > 0
    assert_raises_as_the_original(CALLS[how], raising_loss, sf, jax.errors.JaxRuntimeError)
    assert calls == {"refused": 1}
    assert "the user's callback refuses the loss" in str(outcome(CALLS[how], sf)[0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss, how",
    [(raising_pure_loss, h) for h in CALLS if h != "jit_grad"]
    + [(raising_debug_loss, h) for h in CALLS],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_pure_and_debug_callbacks_raise_once_as_in_the_original(loss, how):
    """Compared with the original under ``jax.jit``: eagerly, JAX calls a debug callback
    directly (its exception unwrapped); compiled, as the serialized function always is, it
    wraps it in a ``JaxRuntimeError``, as it does any callback's. (Under ``jit(grad)`` a pure
    callback that only the value needs is dead code: it may not run at all.)"""
    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad="remat")
    assert sf.explain(W, X).counts["body"] > 0
    assert_raises_as_the_original(CALLS[how], jax.jit(loss), sf, jax.errors.JaxRuntimeError)
    assert calls == {"refused": 1}


@pytest.mark.parametrize(
    "flag, loss, how, grad",
    [
        ("jax_debug_nans", nan_loss, "plain", "remat"),
        ("jax_debug_nans", nan_loss, "plain", "fused"),
        *(
            pytest.param(flag, loss, how, "remat", marks=pytest.mark.slow)
            for flag, loss in (("jax_debug_nans", nan_loss), ("jax_debug_infs", inf_loss))
            for how in ("plain", "jit", "grad")
            if (flag, how) != ("jax_debug_nans", "plain")
        ),
        pytest.param("jax_debug_infs", inf_loss, "jit", "auto", marks=pytest.mark.slow),
    ],
)
def test_debug_nans_raise_as_in_the_original(flag, loss, how, grad):
    """The same error, message included: the region's de-optimized run (JAX's, for a value
    found invalid) evaluates its equations as written, so the error names the user's
    operation (``log``), not ``serialized_region``. A value first made invalid in the
    backward pass names the loop (docs/semantics.md); every mode, before, in and after the
    loop: the NaN family of the fuzzer (``test_fuzz_nans``)."""
    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        assert sf.explain(W, X).counts["body"] > 0
    with getattr(jax, flag.removeprefix("jax_"))(True):  # jax.debug_nans / jax.debug_infs
        got, _, ours = outcome(CALLS[how], sf)
        expected, _, _ = outcome(CALLS[how], loss)
    assert isinstance(expected, FloatingPointError), expected
    assert type(got) is FloatingPointError and ours == [], (got, ours)
    # JAX's de-optimized run names the operation (``log``), not the region (review finding)
    assert str(got) == str(expected), (got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("how", CALLS)
def test_callbacks_fire_as_often_as_in_the_original(how, grad, capfd):
    sf = ja.serialize_axis(counted_loss, chunk=5, argnums=1, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        assert sf.explain(W, X).counts["body"] > 0
    capfd.readouterr()
    expected, expected_calls, _ = outcome(CALLS[how], counted_loss)
    printed = capfd.readouterr().out.count("loss ")
    got, got_calls, ours = outcome(CALLS[how], sf)
    assert expected is None and got is None and ours == [], (got, ours)
    assert got_calls == expected_calls and set(got_calls) == {"features", "loss"}, got_calls
    assert capfd.readouterr().out.count("loss ") == printed == 1


@pytest.mark.slow
def test_a_memory_budget_plans_without_running_the_callbacks():
    """``memory=`` compiles candidate chunks and the never-worse check compiles the plan
    against the original: both compile at abstract inputs, neither runs the program."""
    for sf in (
        ja.serialize_axis(counted_loss, memory=1 << 30, argnums=1),
        ja.serialize_axis(counted_loss, chunk=5, argnums=1),
    ):
        calls.clear()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
            sf.explain(W, X)
        jax.effects_barrier()
        assert calls == {}
        assert outcome(CALLS["value_and_grad"], sf)[1] == {"features": 1, "loss": 1}


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize(
    "wrap",
    [
        lambda f: checkify.checkify(f)(W, X)[0].throw(),
        lambda f: jax.jit(checkify.checkify(f))(W, X)[0].throw(),
        lambda f: f(W, X),  # a check outside checkify: jit cannot stage it, it runs as written
    ],
    ids=["checkify", "jit_checkify", "unchecked"],
)
def test_a_failing_check_raises_as_in_the_original(wrap, grad):
    sf = ja.serialize_axis(checked_loss, chunk=5, argnums=1, grad=grad)
    assert_raises_as_the_original(wrap, checked_loss, sf, checkify.JaxRuntimeError)


# -- callbacks on per-example values that carry no gradient -----------------------------------
def stopped(h):
    """A per-example value through ``stop_gradient``: its tangent is a symbolic zero."""
    return jax.lax.stop_gradient(h).sum(axis=1)


def zeros_of(name: str):
    def callback(v):
        count(name)(v)
        return np.zeros((), np.float32)

    return callback


def io_on_stopped(w, x):
    """An ``io_callback`` (it has no JVP) whose result joins the loss."""
    h = features(w, x)
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    seen = io_callback(zeros_of("io"), scalar, stopped(h)[0], ordered=True)
    return jnp.mean(h**2) + seen


def pure_on_stopped(w, x):
    """A ``pure_callback`` whose result the gradient needs (never dead code)."""
    h = features(w, x)
    seen = jax.pure_callback(zeros_of("pure"), jax.ShapeDtypeStruct((), jnp.float32), stopped(h))
    return jnp.mean(h**2) * (1.0 + seen)


def debug_on_stopped(w, x):
    h = features(w, x)
    jax.debug.callback(count("debug"), stopped(h))
    return jnp.mean(h**2)


def io_on_argmax(w, x):
    """An integer per-example path into a callback."""
    h = features(w, x)
    io_callback(count("argmax"), None, jnp.argmax(h, axis=1), ordered=True)
    return jnp.mean(h**2)


def every_stopped_callback(w, x):
    return sum(f(w, x) for f in (io_on_stopped, pure_on_stopped, debug_on_stopped, io_on_argmax))


STOPPED = (io_on_stopped, pure_on_stopped, debug_on_stopped, io_on_argmax, every_stopped_callback)
DIFFERENTIATED = {
    "grad": lambda f: jax.grad(f, argnums=(0, 1))(W, X),
    "value_and_grad": lambda f: jax.value_and_grad(f)(W, X),
    "jit_grad": lambda f: jax.jit(jax.grad(f, argnums=(0, 1)))(W, X),
    "jit_value_and_grad": lambda f: jax.jit(jax.value_and_grad(f))(W, X),
    "jvp": lambda f: jax.jvp(f, (W, X), (jnp.ones_like(W), jnp.ones_like(X))),
}


def assert_differentiates_as_the_original(loss, how, sf):
    """Same values and gradients as the original under ``jax.jit`` (the serialized function
    always compiles), each callback run as often, no fallback."""
    got, got_calls, ours = outcome_with_value(DIFFERENTIATED[how], sf)
    expected, expected_calls, _ = outcome_with_value(DIFFERENTIATED[how], jax.jit(loss))
    assert not isinstance(expected, Exception), expected
    assert not isinstance(got, Exception) and ours == [], (got, ours)
    assert_tree_close(got, expected)
    assert got_calls == expected_calls and got_calls, (got_calls, expected_calls)


def assert_plans_without_falling_back(sf, chunked=True):
    """The plan chunks a body (unless ``chunked`` is False) and warns of nothing but the cost
    model's toy-program notice: a fallback warns once, at planning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = sf.explain(W, X).counts
    ours = [str(w.message) for w in caught if issubclass(w.category, ja.PlanWarning)]
    assert [m for m in ours if "not expected to save" not in m] == [], ours
    assert counts["body"] > 0 or not chunked, counts


def outcome_with_value(call, f):
    """``outcome`` with the value instead of the exception (or the exception raised)."""
    calls.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = jax.block_until_ready(call(f))
            jax.effects_barrier()
        except Exception as e:
            value = e
            _drain_effects()
    ours = [
        str(w.message)
        for w in caught
        if issubclass(w.category, ja.PlanWarning) and "not expected to save" not in str(w.message)
    ]
    return value, dict(calls), ours


def test_a_callback_on_a_stopped_per_example_value_differentiates():
    """The repro: ``io_callback`` of a ``stop_gradient`` per-example value, ``jax.grad``."""
    sf = ja.serialize_axis(io_on_stopped, chunk=5, argnums=1, grad="remat")
    assert_plans_without_falling_back(sf)
    assert_differentiates_as_the_original(io_on_stopped, "grad", sf)


@pytest.mark.slow
@pytest.mark.parametrize(  # a covering: each loss in every mode and every way of calling
    "loss, grad, how",
    covering(STOPPED, GRAD_MODES, list(DIFFERENTIATED), ids=[f.__name__ for f in STOPPED]),
)
def test_callbacks_on_values_without_gradient_differentiate_as_in_the_original(loss, grad, how):
    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=grad)
    assert_plans_without_falling_back(sf)
    assert_differentiates_as_the_original(loss, how, sf)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 7, 24, 30])
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_callbacks_on_values_without_gradient_at_every_chunk(chunk, grad):
    sf = ja.serialize_axis(every_stopped_callback, chunk=chunk, argnums=1, grad=grad)
    assert_plans_without_falling_back(sf, chunked=chunk < X.shape[0])
    assert_differentiates_as_the_original(every_stopped_callback, "value_and_grad", sf)


# -- callbacks in a two-pass (pairwise) plan: each effect in exactly one pass (f10) -----------
# a batch of 48: at 24 auto measures the two passes as saving too little and runs as written
XP = jnp.asarray(_rs.normal(size=(48, 6)), jnp.float32)
YP = jnp.asarray(_rs.normal(size=(48, 4)), jnp.float32)
seen: dict[str, list] = {}
order: list[str] = []  # the names, call by call


def record(name: str, out=None):
    def callback(v):
        seen.setdefault(name, []).append(np.asarray(v))
        order.append(name)
        return out

    return callback


def logged(kind: str, name: str, v, joins: bool = False):
    """``v`` to a ``debug.callback`` or an ordered ``io_callback`` (``joins``: the io
    callback's result, a zero, is returned to join the loss); the values seen, per call, in
    ``seen[name]``."""
    if kind == "debug":
        jax.debug.callback(record(name), v)
        return 0.0
    out = jax.ShapeDtypeStruct((), jnp.float32) if joins else None
    got = io_callback(record(name, np.float32(0) if joins else None), out, v, ordered=True)
    return got if joins else 0.0


def simclr_logged(kind: str):
    """SimCLR-like: a callback on a per-example value of the embeddings (pass 1's) and on
    the loss (pass 2's); the io callback's result joins the loss."""

    def loss(w, x):
        h = jnp.tanh(x @ w)
        extra = logged(kind, "rows", jax.lax.stop_gradient(h[:, 0]), joins=True)
        value = jnp.mean(jax.nn.logsumexp(h @ h.T, axis=1)) + extra
        logged(kind, "loss", jax.lax.stop_gradient(value))
        return value

    return loss, (W, XP), 1


def clip_logged(kind: str):
    """CLIP-like two towers: a callback on a pre-activation of one tower (a value of the
    encoder that is not stacked), one on the other tower's embeddings, one on the loss."""

    def loss(w, x, y):
        pre = x @ w[0]
        a = jnp.tanh(pre)
        b = jnp.tanh(y @ w[1])
        logged(kind, "rows", jax.lax.stop_gradient(pre[:, 1]))
        logged(kind, "embeddings", jax.lax.stop_gradient(b.sum(axis=1)))
        logits = a @ b.T
        labels = jnp.arange(logits.shape[0])
        rows = -jnp.take_along_axis(jax.nn.log_softmax(logits, axis=1), labels[:, None], 1)
        cols = -jnp.take_along_axis(jax.nn.log_softmax(logits.T, axis=1), labels[:, None], 1)
        value = (rows.mean() + cols.mean()) / 2
        logged(kind, "loss", jax.lax.stop_gradient(value))
        return value

    return loss, ((W, W[:4]), XP, YP), (1, 2)


PAIRED = {"simclr": simclr_logged, "clip": clip_logged}
PAIRED_CALLS = {
    "jit": lambda f, a: jax.jit(f)(*a),
    "grad": lambda f, a: jax.grad(f, argnums=(0, 1))(*a),
    "jit_value_and_grad": lambda f, a: jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(*a),
}


def seen_by(call, f, args):
    """``(the result, {name: (calls, every value seen, in order)}, jaxpr_accum warnings)``."""
    seen.clear()
    order.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = jax.block_until_ready(call(f, args))
        jax.effects_barrier()
    ours = [str(w.message) for w in caught if issubclass(w.category, ja.PlanWarning)]
    values = {k: (len(v), np.concatenate([np.ravel(x) for x in v])) for k, v in seen.items()}
    return value, values, [m for m in ours if "not expected to save" not in m]


def assert_logged_as_the_original(program: str, kind: str, grad: str, how: str, chunk: int):
    f, args, argnums = PAIRED[program](kind)
    sf = ja.serialize_axis(f, chunk=chunk, argnums=argnums, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        plan = sf.explain(*args)
    if chunk < XP.shape[0]:  # two passes (one chunk of the whole batch needs no second)
        assert plan.second is not None and plan.pairs, str(plan)
    got, got_seen, ours = seen_by(PAIRED_CALLS[how], sf, args)
    expected, expected_seen, _ = seen_by(PAIRED_CALLS[how], jax.jit(f), args)
    assert ours == [], ours
    assert_tree_close(got, expected)
    assert (
        set(got_seen)
        == set(expected_seen)
        == {"rows", "loss"} | ({"embeddings"} if program == "clip" else set())
    ), (got_seen, expected_seen)
    for name, (n, values) in expected_seen.items():
        got_n, got_values = got_seen[name]
        if name == "loss":  # once, as in the original (a per-example callback may be chunked)
            assert got_n == n == 1, (got_n, n)
        assert got_values.shape == values.shape, (name, got_values.shape, values.shape)
        np.testing.assert_allclose(got_values, values, rtol=2e-5, atol=2e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "program, kind, grad, how",
    # every program and kind meets every mode and every call (not every triple)
    covering(list(itertools.product(PAIRED, ["debug", "io"])), GRAD_MODES, list(PAIRED_CALLS)),
)
def test_callbacks_in_two_passes_run_once_as_in_the_original(program, kind, grad, how):
    """f10: each callback in exactly one pass's program, its values seen once each."""
    assert_logged_as_the_original(program, kind, grad, how, chunk=5)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, 7, 48, 60])
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_callbacks_in_two_passes_at_every_chunk(chunk, grad):
    assert_logged_as_the_original("simclr", "io", grad, "jit_value_and_grad", chunk)


def effect_after_the_loss(w, x):
    """Two pairings, the second's embeddings scaled by an ordered ``io_callback`` that comes
    after the callback on the first's loss: pass 1 would run it before that callback, so the
    program runs in one pass, its effects in order."""
    h = jnp.tanh(x @ w)
    first = jnp.mean(jax.nn.logsumexp(h @ h.T, axis=1))
    logged("io", "loss", jax.lax.stop_gradient(first))
    ones = jax.ShapeDtypeStruct((x.shape[0], 1), jnp.float32)
    scale = io_callback(
        record("rows", np.ones((x.shape[0], 1), np.float32)),
        ones,
        jax.lax.stop_gradient(x[:, :1]),
        ordered=True,
    )
    g = h * scale
    return first + jnp.mean(jax.nn.logsumexp(g @ g.T, axis=1))


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
def test_effects_that_two_passes_would_reorder_run_in_one_pass(grad):
    sf = ja.serialize_axis(effect_after_the_loss, chunk=5, argnums=1, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        assert sf.explain(W, XP).second is None
    call = PAIRED_CALLS["jit_value_and_grad"]
    got, got_seen, ours = seen_by(call, sf, (W, XP))
    got_order = order[:]
    expected, expected_seen, _ = seen_by(call, jax.jit(effect_after_the_loss), (W, XP))
    assert ours == [] and got_order == order == ["loss", "rows"], (ours, got_order, order)
    assert_tree_close(got, expected)
    for name, (_, values) in expected_seen.items():
        np.testing.assert_allclose(got_seen[name][1], values, rtol=2e-5, atol=2e-6)
