"""``serialize_axis(f, memory=...)``: the chunk chosen from a budget of compiled memory.

The measure is the search's own: XLA's temp bytes of ``jax.jit(jax.value_and_grad(...))`` with
respect to the floating arguments. Each test checks a property of the choice against a brute
force over fixed chunks, never the search's internals.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum._planning import _budget, _chunk_search

from .oracle import assert_matches_original


def loss(w, x, y):
    h = jnp.tanh(x @ w)
    h = jnp.tanh(h @ w.T @ w)
    return jnp.mean((h - y) ** 2)


W = jax.random.normal(jax.random.key(0), (32, 32)) / 6
X = jax.random.normal(jax.random.key(1), (256, 32))
Y = jax.random.normal(jax.random.key(2), (256, 32))
ARGS = (W, X, Y)


def measured(sf, args):
    """The memory the budget bounds, for a function with a fixed chunk."""
    return _budget.temp_bytes(lambda *a: jax.tree.leaves(sf(*a)), list(args), [0, 1, 2])


@pytest.fixture(scope="module")
def at_chunk():
    cache = {}

    def m(k):
        if k not in cache:
            with warnings.catch_warnings():  # chunk 256 is the whole axis: incidental here
                warnings.filterwarnings("ignore", ".*holds the whole axis", ja.PlanWarning)
                # the mode auto's estimate picks: remat (fused would hold the gradients of
                # x and y, the chunked inputs, from the forward pass; measured 1.46x at 64)
                sf = ja.serialize_axis(loss, chunk=k, argnums=(1, 2), grad="remat")
                cache[k] = measured(sf, ARGS)
        return cache[k]

    return m


@pytest.fixture
def compiles(monkeypatch):
    """The number of programs the search has compiled since the test began."""
    count = [0]
    real = _budget.temp_bytes

    def counting(*a, **k):
        count[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(_budget, "temp_bytes", counting)
    return count


@pytest.mark.slow
def test_chosen_chunk_fits_no_chunk_twice_as_large_does_and_is_exact(at_chunk):
    limit = (at_chunk(1) + at_chunk(256)) // 2
    sf = ja.serialize_axis(loss, memory=limit, argnums=(1, 2))
    plan = sf.explain(*ARGS)
    k = plan.chunk
    assert plan.budget.measured == at_chunk(k) <= limit
    assert 2 * k > 256 or at_chunk(2 * k) > limit
    assert_matches_original(sf, *ARGS, vmap=False)


def test_generous_budget_is_one_chunk_after_one_compile(compiles):
    sf = ja.serialize_axis(loss, memory="1 GiB", argnums=(1, 2))
    with pytest.warns(ja.PlanWarning, match="one chunk of 256 holds the whole axis of 256"):
        np.testing.assert_allclose(sf(*ARGS), loss(*ARGS), rtol=1e-5)
    assert sf.explain(*ARGS).chunk == 256
    assert compiles[0] == 2  # the search's one, and the original's, for explain
    ((_, prepared),) = sf._plans.cache.items()
    assert prepared.plan.budget.original is None  # explain reports it, the cache is unchanged
    assert sf.explain(*ARGS).budget.original == sf._plans.original_bytes[prepared]
    assert compiles[0] == 2  # measured once per signature


@pytest.mark.slow
def test_choice_is_reused_by_later_calls_jit_and_grad(compiles, at_chunk):
    sf = ja.serialize_axis(loss, memory=(at_chunk(1) + at_chunk(256)) // 2, argnums=(1, 2))
    value = sf(*ARGS)
    n = compiles[0]
    assert 2 <= n <= 2 * _chunk_search.MAX_COMPILES
    np.testing.assert_allclose(jax.jit(sf)(*ARGS), value, rtol=1e-6)
    assert compiles[0] == n  # the same call signature under jit: the same choice
    # jax.grad perturbs only ``w``: the budget is for that, a search of its own, once
    g = jax.grad(sf)(*ARGS)
    np.testing.assert_allclose(g, jax.grad(loss)(*ARGS), rtol=2e-4, atol=1e-7)
    m = compiles[0]
    assert m > n
    # Re-traced on every call (it closes over a tracer), but the choice is cached.
    jax.grad(lambda s: sf(W * s, X, Y))(1.0)
    jax.grad(lambda s: sf(W * s, X, Y))(2.0)
    assert compiles[0] == m


@pytest.mark.slow
def test_explain_reports_the_search(at_chunk):
    sf = ja.serialize_axis(loss, memory=(at_chunk(1) + at_chunk(256)) // 2, argnums=(1, 2))
    text = str(sf.explain(*ARGS))
    for needle in ("memory budget:", "chosen: chunk", "original (unchunked):", "fitted model:"):
        assert needle in text, text
    assert "chunks tried" in text
    assert repr(sf).startswith("serialize_axis('loss', memory=")


def test_impossible_budget_names_the_smallest_memory_and_what_dominates():
    sf = ja.serialize_axis(loss, memory="1 KiB", argnums=(1, 2))
    with pytest.raises(ja.SerializeError) as info:
        sf(*ARGS)
    msg = str(info.value)
    assert "pairs the axis" not in msg
    assert "the smallest measured is" in msg and "at chunk 1" in msg
    assert "What dominates it" in msg and "parameter gradients" in msg
    assert "grad='remat'" not in msg  # auto tried remat itself
    # each measurement names its mode: the same chunk in two modes is two figures
    tried = re.search(r"tried: (.*?)\)\.", msg).group(1).split(", ")
    assert all(re.fullmatch(r"\d+ -> \S+ \S+ \[(fused|remat)\]", t) for t in tried), tried


def test_impossible_fused_budget_points_to_remat():
    """Fused requested and fitting at no chunk: the error says remat holds no Jacobian rows,
    and names no part whose estimate exceeds what was measured."""
    sf = ja.serialize_axis(loss, memory="1 KiB", argnums=(1, 2), grad="fused")
    with pytest.raises(ja.SerializeError, match="`grad='remat'` holds no Jacobian rows") as info:
        sf(*ARGS)
    assert "(fused gradients;" in str(info.value)


def test_impossible_budget_dominated_by_the_unchunked_prologue():
    def f(w, x):
        big = jnp.sin(jnp.outer(w, w))  # [2048, 2048], computed once before the loop
        return jnp.sum(jnp.tanh(x * jnp.sum(big)))

    sf = ja.serialize_axis(f, memory="1 MiB", argnums=1)
    with pytest.raises(ja.SerializeError, match="prologue and epilogue"):
        sf(jnp.ones(2048), jnp.ones((64, 8)))


def test_impossible_budget_of_a_pairing_points_to_chunk():
    """The budget search plans one pass, with a pairing's pairs after the loop on the full axis:
    a budget that only two passes meet names ``chunk=``, which plans them; a function with no
    pairing says nothing of it (the test above)."""

    def simclr(w, x):
        z = jnp.tanh(x @ w)
        return jnp.mean(jax.nn.logsumexp(z @ z.T, axis=1))

    sf = ja.serialize_axis(simclr, memory="1 KiB", argnums=1)
    with pytest.raises(ja.SerializeError, match="pairs the axis with itself.*`chunk=` runs it"):
        sf(jnp.ones((4, 8)) / 4, jnp.ones((64, 4)))


@pytest.mark.parametrize(
    "kwargs, error, needle",
    [
        ({"memory": 0}, ValueError, "memory"),
        ({"memory": -5}, ValueError, "memory"),
        ({"memory": "lots"}, ValueError, "cannot parse"),
        ({"memory": "2 XB"}, ValueError, "cannot parse"),
        ({"memory": "0 MiB"}, ValueError, "at least 1 byte"),
        ({"memory": "1e400B"}, ValueError, "out of range"),
        ({"memory": "1e309 GB"}, ValueError, "out of range"),
        ({"memory": 1.5}, ValueError, r"\(0, 1\]"),
        ({"memory": 0.0}, ValueError, r"\(0, 1\]"),
        ({"memory": True}, TypeError, "memory"),
        ({"memory": [1]}, TypeError, "memory"),
        ({"memory": jnp.array(0.5)}, TypeError, "`memory` must be"),  # not NumPy's message
        ({"memory": np.array([4096])}, TypeError, "`memory` must be"),
        ({"memory": "1 GiB", "chunk": 4}, ValueError, "exactly one of `chunk`"),
        ({}, ValueError, "exactly one of `chunk`"),
    ],
)
def test_bad_budgets_fail_at_decoration(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        ja.serialize_axis(loss, **kwargs)


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("512 MiB", 512 * 2**20),
        ("2GB", 2 * 10**9),
        ("2 g", 2 * 10**9),
        ("1.5 GiB", 3 * 2**29),
        ("100", 100),
        (np.int64(100), 100),
        (np.float32(0.5), 0.5),
    ],
)
def test_units(text, nbytes):
    assert ja.serialize_axis(loss, memory=text).memory == nbytes


def test_fraction_needs_a_device_that_reports_its_limit():
    sf = ja.serialize_axis(loss, memory=0.5, argnums=(1, 2))
    if jax.devices()[0].memory_stats() is not None:
        pytest.skip("this device reports a memory limit")
    with pytest.raises(ValueError, match="reports none.*memory='2 GiB'"):
        sf(*ARGS)


@pytest.mark.slow
def test_nnx_train_step_under_nnx_jit():
    optax = pytest.importorskip("optax")
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(8, 64, rngs=rngs)
            self.l2 = nnx.Linear(64, 1, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x)))[:, 0]

    def mse(model, x, y):
        return jnp.mean((model(x) - y) ** 2)

    x = jax.random.normal(jax.random.key(0), (64, 8))
    y = jax.random.normal(jax.random.key(1), (64,))
    models = [MLP(nnx.Rngs(0)) for _ in range(2)]
    opts = [nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param) for m in models]
    sloss = ja.serialize_axis(mse, memory="40 KiB", argnums=1)

    def make_step(loss_fn):
        @nnx.jit
        def step(model, opt, x, y):
            value, grads = nnx.value_and_grad(loss_fn)(model, x, y)
            opt.update(model, grads)
            return value

        return step

    steps = [make_step(mse), make_step(sloss)]
    for _ in range(3):
        a, b = (step(m, o, x, y) for step, m, o in zip(steps, models, opts, strict=True))
        np.testing.assert_allclose(b, a, rtol=2e-5)
    plan = sloss.explain(models[1], x, y)
    assert plan.budget.measured <= 40 * 1024 and 1 <= plan.chunk <= 64


@pytest.mark.slow
def test_chosen_chunk_is_within_a_factor_two_of_the_brute_force_best(at_chunk):
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for limit in np.geomspace(at_chunk(1), at_chunk(256), 5)[1:-1]:
        sf = ja.serialize_axis(loss, memory=int(limit), argnums=(1, 2))
        k = sf.explain(*ARGS).chunk
        best = max(c for c in sizes if at_chunk(c) <= limit)
        assert at_chunk(k) <= limit and 2 * k > best, (limit, k, best)


@pytest.mark.slow
def test_remat_is_chosen_where_the_fused_accumulators_do_not_fit():
    # Gradients w.r.t. the chunked x: fused keeps its full-size Jacobian row at any chunk.
    sf_fused = ja.serialize_axis(loss, chunk=1, argnums=(1, 2), grad="fused")
    sf_remat = ja.serialize_axis(loss, chunk=1, argnums=(1, 2), grad="remat")
    fused, remat = measured(sf_fused, ARGS), measured(sf_remat, ARGS)
    assert remat < fused
    sf = ja.serialize_axis(loss, memory=(remat + fused) // 2, argnums=(1, 2))
    plan = sf.explain(*ARGS)
    assert plan.grad == "remat", plan.grad_reason
    # either auto's weighing already prefers remat, or the search found fused does not fit
    assert "fused would hold" in plan.grad_reason or "does not fit" in plan.grad_reason
    assert_matches_original(sf, *ARGS, vmap=False)


def _plan_of(sf, pattern_call):
    """The plan the call under ``pattern_call`` used (the cache holds one per pattern)."""
    pattern_call()
    plans = {k[1]: p.plan for k, p in sf._plans.cache.items()}
    return plans


@pytest.mark.filterwarnings("ignore:.*holds the whole axis:jaxpr_accum.PlanWarning")
@pytest.mark.slow
def test_budget_is_for_what_the_caller_differentiates():
    """r19: ``jax.grad(sf)`` of the parameters only is budgeted for that gradient, not for
    the gradients of every floating argument; a plain call (or ``explain``) keeps the
    conservative one; the caller's own ``jax.jit(jax.grad(sf))`` fits the budget."""
    w = jax.random.normal(jax.random.key(0), (32, 64)) * 0.2
    x = jax.random.normal(jax.random.key(1), (256, 32))

    def f(w, x):
        return jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w.T) ** 2)

    def temp(fn, argnums):
        grad = jax.jit(jax.value_and_grad(fn, argnums=argnums))
        return grad.lower(w, x).compile().memory_analysis().temp_size_in_bytes

    budget = 147456  # 144 KiB: the original's params-only gradient (160 KiB) does not fit
    sf = ja.serialize_axis(f, memory=budget, argnums=1)
    _plan_of(sf, lambda: jax.grad(sf)(w, x))
    plans = _plan_of(sf, lambda: sf.explain(w, x))
    assert set(plans) == {(True, False), None}, plans
    assert "with respect to w" in "\n".join(plans[(True, False)].budget.lines())
    assert "with respect to w, x" in "\n".join(plans[None].budget.lines())
    assert temp(sf, 0) <= budget, (temp(sf, 0), budget)
    assert_matches_original(sf, w, x, vmap=False)


@pytest.mark.slow
def test_a_prime_axis_gets_the_largest_chunk_that_fits_with_a_remainder():
    w = jax.random.normal(jax.random.key(0), (32, 64)) * 0.2
    x = jax.random.normal(jax.random.key(1), (257, 32))

    def f(w, x):
        return jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w.T) ** 2)

    def at(k):
        sf = ja.serialize_axis(f, chunk=k, argnums=1)
        return _budget.temp_bytes(lambda *a: [sf(*a)], [w, x], [0])

    budget = at(64) + 64
    sf = ja.serialize_axis(f, memory=budget, argnums=1)
    plans = _plan_of(sf, lambda: jax.grad(sf)(w, x))
    chunk = plans[(True, False)].chunk
    assert 64 <= chunk < 257 and 257 % chunk, chunk
    assert at(chunk) <= budget
    assert at(2 * chunk) > budget
