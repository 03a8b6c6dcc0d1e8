"""``grad="auto"``: fused or remat by memory, counting only the sums that carry gradients."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum._base._settings import GRAD_MODES
from jaxpr_accum._modes._mode import AUTO, mode_named
from jaxpr_accum.testing import assert_tree_close

from .oracle import NOT_WORTH_IT, assert_matches_original

RS = np.random.RandomState(0)
W = jnp.asarray(RS.normal(size=(8, 5)) / 3, jnp.float32)
X = jnp.asarray(RS.normal(size=(64, 8)), jnp.float32)
Y = jnp.asarray(RS.randint(0, 5, size=64), jnp.int32)


def loss_and_accuracy(w, x, y):
    logits = x @ w
    loss = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))
    accuracy = jnp.mean(jnp.argmax(logits, -1) == y)  # through argmax: no gradient
    tokens = jnp.sum((y > 0).astype(jnp.float32))  # from integer labels: no gradient
    scale = jnp.mean(jax.lax.stop_gradient(logits) ** 2)  # through stop_gradient: none
    return loss, accuracy, tokens, scale


@pytest.mark.slow
def test_sums_without_gradients_do_not_count():
    sf = ja.serialize_axis(loss_and_accuracy, chunk=48, argnums=(1, 2))
    plan = sf.explain(W, X, Y, grad_argnums=0)  # the weights: no chunked input's gradient
    assert plan.grad == "fused", plan.grad_reason
    assert "1 gradient-carrying" in plan.grad_reason
    assert_matches_original(sf, W, X, Y, vmap=False)


def two_losses(w, x):
    h = jnp.tanh(x @ w)
    return jnp.mean(h**2), jnp.mean(jnp.abs(h))


def test_several_gradient_carrying_sums_take_remat():
    """Two gradient-carrying entries: fused would pull back two Jacobian rows per chunk,
    slower than remat's second forward pass, and hold a second input-sized gradient."""
    narrow = jnp.asarray(RS.normal(size=(2, 512)) / 3, jnp.float32)  # activations >> inputs
    x = jnp.asarray(RS.normal(size=(64, 2)), jnp.float32)
    sf = ja.serialize_axis(two_losses, chunk=16, argnums=1)
    plan = sf.explain(narrow, x)
    assert plan.grad == "remat", plan.grad_reason
    assert "2 gradient-carrying sum entries" in plan.grad_reason
    assert "slower than remat's second forward pass" in plan.grad_reason
    assert_matches_original(sf, narrow, x, vmap=False)


def test_one_entry_dense_model_takes_fused_for_the_weights_gradient():
    """Auto weighs what the caller differentiates: for ``jax.value_and_grad`` with respect
    to the weights it takes fused (no extra estimated) and compiles that program;
    ``explain`` of every floating argument, the data included, takes remat, as fused would
    hold the data's gradient from the forward pass."""
    ws = [jnp.asarray(RS.normal(size=(32, 32)) / 6, jnp.float32) for _ in range(3)]
    x = jnp.asarray(RS.normal(size=(256, 32)), jnp.float32)

    def mlp(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    def temp(sf):
        vg = jax.jit(jax.value_and_grad(sf))
        return vg.lower(ws, x).compile().memory_analysis().temp_size_in_bytes

    sf = ja.serialize_axis(mlp, chunk=32, argnums=1)
    plan = sf.explain(ws, x, grad_argnums=0)
    assert plan.grad == "fused", plan.grad_reason
    assert "fused would hold 0 B more than remat's estimated" in plan.grad_reason, plan
    everything = sf.explain(ws, x)
    assert everything.grad == "remat", everything.grad_reason
    assert "32.0 KiB: the differentiated chunked inputs' gradients" in everything.grad_reason
    fused = ja.serialize_axis(mlp, chunk=32, argnums=1, grad="fused")
    assert temp(sf) == temp(fused), plan
    assert_tree_close(jax.value_and_grad(sf)(ws, x), jax.value_and_grad(mlp)(ws, x))


def per_example_mlp(ws, x, y):
    """An MLP written per example and ``vmap``-ped over the batch, as Equinox models are:
    XLA holds one chunk's activation more under fused than under remat on this form."""

    def one(x):
        for w in ws[:-1]:
            x = jax.nn.relu(w @ x)
        return ws[-1] @ x

    return jnp.mean((y - jax.vmap(one)(x)) ** 2)


def _hlo(sf, argnums, *args):
    """The StableHLO text of ``jax.jit(jax.value_and_grad(sf, argnums))`` (no source
    locations), its module name cut."""
    lowered = jax.jit(jax.value_and_grad(sf, argnums)).lower(*args)
    return lowered.as_text(debug_info=False).split("\n", 1)[1]


def _per_example_problem():
    ws = [
        jnp.asarray(RS.normal(size=(256, 16)) / 4, jnp.float32),
        jnp.asarray(RS.normal(size=(256, 256)) / 16, jnp.float32),
        jnp.asarray(RS.normal(size=(4, 256)) / 16, jnp.float32),
    ]
    x = jnp.asarray(RS.normal(size=(2048, 16)), jnp.float32)
    y = jnp.asarray(RS.normal(size=(2048, 4)), jnp.float32)
    return ws, x, y


def test_explain_with_the_calls_grad_argnums_names_the_mode_the_call_compiles():
    """``explain(..., grad_argnums=0)`` plans for the call's differentiation (the weights
    only) by the call's own path: the mode it names is the one whose program the call under
    ``jax.grad`` compiles, and ``planned_for`` says which differentiation each planned for."""
    ws, x, y = _per_example_problem()
    sf = ja.serialize_axis(per_example_mlp, chunk=256, argnums=(1, 2))
    told, every = sf.explain(ws, x, y, grad_argnums=0), sf.explain(ws, x, y)
    assert "with respect to `ws[0]`, `ws[1]`, `ws[2]` (the call's)" in told.planned_for, told
    assert "every floating argument (`ws[0]`, `ws[1]`, `ws[2]` and 2 more)" in every.planned_for
    assert "planned for: " in str(told)
    pinned = ja.serialize_axis(per_example_mlp, chunk=256, argnums=(1, 2), grad=told.grad)
    assert _hlo(sf, 0, ws, x, y) == _hlo(pinned, 0, ws, x, y)
    assert_tree_close(
        jax.value_and_grad(sf)(ws, x, y), jax.value_and_grad(per_example_mlp)(ws, x, y)
    )


def _temp(f, *args):
    lowered = jax.jit(jax.value_and_grad(f)).lower(*args)
    return lowered.compile().memory_analysis().temp_size_in_bytes


def test_auto_is_within_10_percent_of_the_better_mode_on_a_per_example_mlp():
    """The per-example MLP differentiated with respect to its weights: XLA holds one chunk's
    activation more under fused than under remat (1.27 vs 1.02 MiB), which the estimate
    counts, so auto takes remat with nothing compiled. ``explain`` (every floating argument
    differentiated) names the mode whose program the call compiles, and auto is within 10%
    of the better mode. The same MLP written on the batch keeps fused (XLA holds one
    activation fewer under fused there)."""
    ws, x, y = _per_example_problem()
    temps = {
        grad: _temp(
            ja.serialize_axis(per_example_mlp, chunk=256, argnums=(1, 2), grad=grad), ws, x, y
        )
        for grad in ("auto", "remat", "fused")
    }
    assert temps["auto"] <= 1.1 * min(temps["remat"], temps["fused"]), temps
    sf = ja.serialize_axis(per_example_mlp, chunk=256, argnums=(1, 2))
    told = sf.explain(ws, x, y)
    pinned = ja.serialize_axis(per_example_mlp, chunk=256, argnums=(1, 2), grad=told.grad)
    assert _hlo(sf, 0, ws, x, y) == _hlo(pinned, 0, ws, x, y), told.grad_reason
    assert "one chunk's activation" in told.grad_reason, told.grad_reason

    def on_the_batch(ws, x, y):
        h = x
        for w in ws[:-1]:
            h = jax.nn.relu(h @ w.T)
        return jnp.mean((y - h @ ws[-1].T) ** 2)

    plan = ja.serialize_axis(on_the_batch, chunk=256, argnums=(1, 2)).explain(
        ws, x, y, grad_argnums=0
    )
    assert plan.grad == "fused" and "activation" not in plan.grad_reason, plan.grad_reason


def test_explain_grad_argnums_is_checked():
    sf = ja.serialize_axis(per_example_mlp, chunk=8, argnums=(1, 2))
    args = ([W.T], X, X[:, :5])
    with pytest.raises(ValueError, match="out of range for a call with 3 positional"):
        sf.explain(*args, grad_argnums=3)
    with pytest.raises(TypeError, match="must be an int or a tuple of ints"):
        sf.explain(*args, grad_argnums="0")


@pytest.mark.slow
def test_differentiated_data_takes_remat_by_the_estimate():
    """An autoencoder differentiated with respect to its data measures 2.5x remat's memory
    under fused (one entry, no epilogue): the estimate counts the data's gradient, which
    fused stacks from the forward pass, and auto's memory is remat's, with no compile."""
    w1 = jnp.asarray(RS.normal(size=(128, 32)) / 11, jnp.float32)
    w2 = jnp.asarray(RS.normal(size=(32, 128)) / 6, jnp.float32)
    x = jnp.asarray(RS.normal(size=(256, 128)), jnp.float32)

    def autoencoder(p, x):
        return jnp.mean((jnp.tanh(x @ p[0]) @ p[1] - x) ** 2)

    def temp(sf):
        vg = jax.jit(jax.value_and_grad(sf, argnums=(0, 1)))
        return vg.lower((w1, w2), x).compile().memory_analysis().temp_size_in_bytes

    kw = dict(chunk=32, argnums=1)
    sf = ja.serialize_axis(autoencoder, **kw)
    plan = sf.explain((w1, w2), x)
    assert plan.grad == "remat", plan.grad_reason
    assert "more (the differentiated chunked inputs' gradients" in plan.grad_reason, plan
    assert "measured" not in plan.grad_reason, plan
    fused = temp(ja.serialize_axis(autoencoder, grad="fused", **kw))
    remat = temp(ja.serialize_axis(autoencoder, grad="remat", **kw))
    assert fused > 1.1 * remat and temp(sf) <= 1.1 * min(fused, remat), (fused, remat, temp(sf))
    assert_matches_original(sf, (w1, w2), x, vmap=False)


def test_gradients_held_over_a_large_epilogue_take_remat():
    """One entry, but the program after the loop materialises more than a chunk's
    activations: fused would hold the invariant inputs' gradients across its backward."""
    w = jnp.asarray(RS.normal(size=(64, 512)) / 8, jnp.float32)
    big = jnp.asarray(RS.normal(size=(512, 512)) / 20, jnp.float32)
    x = jnp.asarray(RS.normal(size=(64, 64)), jnp.float32)

    def head(w, big, x):
        s = jnp.tanh(x @ w).sum()  # one entry: a sum over the batch
        return jnp.tanh(s * big).sum()  # a large computation after the loop

    sf = ja.serialize_axis(head, chunk=8, argnums=2)
    plan = sf.explain(w, big, x)
    assert plan.grad == "remat", plan.grad_reason
    assert "more than 10% more" in plan.grad_reason, plan
    assert_matches_original(sf, w, big, x, vmap=False)


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # the point of the test
def test_a_plan_not_expected_to_save_runs_as_written():
    """Never worse: auto runs a plan not expected to save memory as written (no loop),
    says why, and warns once; an explicit mode runs the loop anyway."""
    big = jnp.asarray(RS.normal(size=(2048, 4)) / 30, jnp.float32)  # inputs >> activations
    wide = jnp.asarray(RS.normal(size=(64, 2048)), jnp.float32)
    sf = ja.serialize_axis(two_losses, chunk=4, argnums=1)
    plan = sf.explain(big, wide)
    assert plan.runs_as_written and "the function runs as written" in plan.warning, plan
    assert plan.grad == "none", plan  # the value users read when no loop runs
    assert "pass grad='remat'" in plan.warning, plan
    names = {e.primitive.name for e in sf.jaxpr(big, wide).eqns}
    assert "serialized_region" not in names and "scan" not in names, names
    assert_matches_original(sf, big, wide, vmap=False)

    forced = ja.serialize_axis(two_losses, chunk=4, argnums=1, grad="remat")
    plan = forced.explain(big, wide)
    assert plan.grad == "remat" and "not expected to save memory" in plan.warning, plan
    assert "serialized_region" in {e.primitive.name for e in forced.jaxpr(big, wide).eqns}
    assert_matches_original(forced, big, wide, vmap=False)


@pytest.mark.slow
def test_auto_where_the_program_cannot_be_measured_alone():
    """The never-worse check compiles the program out of the caller's context; where that
    cannot be done (a collective over the caller's ``vmap`` axis name; a ``while_loop``,
    which has no reverse mode, under a plain call) the estimate decides, with no fallback
    (the tests run strict) and the original's values."""
    w = jnp.asarray(RS.normal(size=(16, 128)) / 4, jnp.float32)
    xs = jnp.asarray(RS.normal(size=(2, 96, 16)), jnp.float32)

    def centred_over_the_vmap_axis(w, x):
        h = jnp.tanh(x @ w)
        centre = jax.lax.pmean(jnp.mean(h, 0), "b")  # over the caller's vmap axis
        return jnp.mean(h**2) - jnp.sum(centre**2)

    sf = ja.serialize_axis(centred_over_the_vmap_axis, chunk=8, argnums=1)
    for f in (lambda g: g, jax.grad):
        got = jax.vmap(f(sf), (None, 0), axis_name="b")(w, xs)
        want = jax.vmap(f(centred_over_the_vmap_axis), (None, 0), axis_name="b")(w, xs)
        assert_tree_close(got, want)

    def halve_until_small(row):
        return jax.lax.while_loop(lambda r: jnp.max(jnp.abs(r)) > 0.1, lambda r: r * 0.5, row)

    def halved_until_small(w, x):
        return jnp.mean(jax.vmap(halve_until_small)(jnp.tanh(x @ w)) ** 2)

    sf = ja.serialize_axis(halved_until_small, chunk=8, argnums=1)
    x = xs[0]
    t = (jnp.ones_like(w), jnp.ones_like(x))
    assert not sf.explain(w, x).stops  # a loop per row: chunked with the rest
    assert_tree_close(sf(w, x), halved_until_small(w, x))
    assert_tree_close(jax.jvp(sf, (w, x), t), jax.jvp(halved_until_small, (w, x), t))


def test_each_mode_name_is_parsed_once_into_its_mode():
    """``GRAD_MODES`` is the one list of names; inside the package a mode is its ``Mode``,
    and a plan reports the name of the mode that runs."""
    modes = [mode_named(name) for name in GRAD_MODES]
    assert [m.name for m in modes] == list(GRAD_MODES) and len(set(map(id, modes))) == 4
    w, x = jnp.ones((3, 2)), jnp.ones((8, 3))
    for mode in modes:
        if mode is not AUTO:  # a request, which reports the mode it chose
            sf = ja.serialize_axis(_tanh_sum, chunk=4, argnums=1, grad=mode.name)
            assert sf.explain(w, x).grad == mode.name


def _tanh_sum(w, x):
    return jnp.sum(jnp.tanh(x @ w))


def _mode_lines(plan) -> list[str]:
    """The gradient-mode line of ``str(plan)`` and its indented detail lines."""
    lines = str(plan).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  gradient mode: "))
    end = start + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return lines[start:end]


@pytest.mark.parametrize(
    "grad, sentence",
    [
        ("auto", r"remat, chosen by auto: fused would save a forward pass per chunk but hold "
         r"\S+ \S*B more \(the differentiated chunked inputs' gradients, from the forward "
         r"pass\), more than 10% more than remat's estimated \S+ \S*B"),
        ("remat", r"remat, as requested: each chunk's forward pass runs again in the backward "
         r"pass \(grad='auto' weighs it against fused, which runs it once\)"),
        ("fused", r"fused, as requested: value and gradient in one pass"),
        ("native", r"native, as requested: JAX differentiates the chunked scan itself .*"),
    ],
)  # fmt: skip
def test_the_gradient_mode_line_is_one_sentence_then_indented_detail(grad, sentence):
    """The mode, why, and what the other mode costs, in one line a user can act on; the
    estimate's figures on further lines, indented under it."""
    w, x = jnp.ones((16, 64)) / 4, jnp.ones((256, 16))
    sf = ja.serialize_axis(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2), chunk=32, argnums=1)
    plan = ja.serialize_axis(sf.original, chunk=32, argnums=1, grad=grad).explain(w, x)
    head, *detail = _mode_lines(plan)
    assert re.fullmatch(r"  gradient mode: " + sentence, head), head
    assert "(" not in head.split(": ", 2)[-1].split(")", 1)[-1], head  # no nested asides after
    assert all(ln.startswith("    ") for ln in detail), detail
    if grad in ("auto", "fused"):
        assert any("1 gradient-carrying sum entry" in ln for ln in detail), detail
    if grad == "auto":
        assert any("(of which " in ln for ln in detail), detail


def test_auto_choosing_fused_says_what_it_costs_against_remat():
    """Samples born inside (the parameters differentiated, not the samples): the estimate
    decides, and the sentence gives fused's extra memory against remat's estimate."""

    def loss(w, key):
        z = jax.random.normal(key, (16, 8, 64))
        return jnp.mean(jax.vmap(lambda z: jnp.tanh(z @ w))(z) ** 2)

    w = jnp.ones((64, 128)) / 8
    plan = ja.serialize_axis(loss, chunk=4).explain(w, jax.random.key(0))
    head, *detail = _mode_lines(plan)
    sentence = (
        r"  gradient mode: fused, chosen by auto: value and gradient in one pass, one forward "
        r"pass per chunk fewer than remat, for \S+ \S*B more memory \(within 10% of remat's "
        r"estimated \S+ \S*B\)"
    )
    assert re.fullmatch(sentence, head), head
    assert not any("measured" in ln for ln in detail), detail
