"""The rewritten program has the promised shape: a scan over chunks, a remat'd body, no
full-size buffers; dead-code elimination prunes a region output that nothing reads. Sub-jaxprs
are found generically (``oracle.iter_eqns``)."""

from __future__ import annotations

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum import _compat
from jaxpr_accum.testing import assert_tree_close

from . import models
from .oracle import (
    NOT_WORTH_IT,
    assert_matches_original,
    eqn_sub_jaxprs,
    find_eqns,
    iter_eqns,
    modes,
)

# The checkpoint primitive is called "checkpoint" in older JAX and "remat2" in jax 0.10.
REMAT_NAMES = ("checkpoint", "remat", "remat2")
REGION = "serialized_region"  # the region primitive (``_region_p``)

_rs = np.random.RandomState(0)
W = jnp.asarray(_rs.normal(size=(3, 4)), jnp.float32)


def loss(w, x):
    return jnp.tanh(x @ w).sum()


def _x(n):
    return jnp.asarray(np.random.RandomState(n).normal(size=(n, 3)), jnp.float32)


def _scans_with_remat_body(jaxpr):
    out = []
    for eqn in find_eqns(jaxpr, "scan"):
        body = [e for sub in eqn_sub_jaxprs(eqn) for e in iter_eqns(sub)]
        if any(e.primitive.name in REMAT_NAMES for e in body):
            out.append(eqn)
    return out


@pytest.mark.parametrize("n, chunk", [(8, 2), (8, 4), (10, 4), (10, 3), (7, 1)])
def test_native_is_scan_of_checkpoint(n, chunk):
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad="native")
    jaxpr = sf.jaxpr(W, _x(n))
    scans = _scans_with_remat_body(jaxpr)
    assert scans, f"no scan with a checkpointed body in:\n{jaxpr}"
    assert [e.params["length"] for e in scans] == [n // chunk], jaxpr


@pytest.mark.parametrize("n, chunk", [(8, 2), (8, 4), (10, 4), (10, 3), (7, 1)])
def test_remat_is_the_region_primitive_around_scan(n, chunk):
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad="remat")
    jaxpr = sf.jaxpr(W, _x(n))
    calls = find_eqns(jaxpr, REGION)
    assert calls, f"no {REGION} in:\n{jaxpr}"
    lengths = [
        e.params["length"]
        for call in calls
        for sub in eqn_sub_jaxprs(call)
        for e in iter_eqns(sub)
        if e.primitive.name == "scan"
    ]
    assert lengths == [n // chunk], jaxpr


@pytest.mark.parametrize("grad", modes("remat", "native"))
def test_chunked_body_runs_at_chunk_size(grad):
    """No equation anywhere in the rewritten program produces a full-batch activation."""
    n, chunk = 12, 4
    x = _x(n)

    def f(w, x):
        h = jnp.tanh(x @ w)  # [12, 4]: the full activation must not appear
        return (h * h).sum()

    sf = ja.serialize_axis(f, chunk=chunk, argnums=1, grad=grad)
    jaxpr = sf.jaxpr(W, x)
    big = [e for e in iter_eqns(jaxpr) for v in e.outvars if getattr(v.aval, "shape", ()) == (n, 4)]
    assert not big, f"full-size values {[str(e) for e in big]} in:\n{jaxpr}"


# --------------------------------------------------------------------------------------
# Seed 1: the automatically found 16-sample axis
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed1():
    return models.make_seed1()


@pytest.mark.parametrize(
    "chunk, length", [pytest.param(4, 4, marks=pytest.mark.slow), (3, 5), (1, 16)]
)
@pytest.mark.slow
def test_seed1_scan_over_samples(seed1, chunk, length):
    """No hint: the scan runs over the 16 samples (16 // chunk iterations), not the batch."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=chunk, grad="native")
    jaxpr = sf.jaxpr(*args)
    scans = _scans_with_remat_body(jaxpr)
    assert [e.params["length"] for e in scans] == [length], jaxpr


@pytest.mark.parametrize("grad", modes("remat", slow=("native",)))
@pytest.mark.slow
def test_seed1_no_full_size_buffers(seed1, grad):
    """Neither the random draws nor the decoder's activations exist at 16 samples at once."""
    loss, args = seed1
    chunk = 4
    sf = ja.serialize_axis(loss, chunk=chunk, grad=grad)
    jaxpr = sf.jaxpr(*args)
    x = args[1]
    full = models.SEED1_SAMPLES * math.prod(x.shape)  # one channel, all samples
    big = []
    for e in iter_eqns(jaxpr):
        for v in e.outvars:
            shape = getattr(v.aval, "shape", None)
            if shape is not None and math.prod(shape) >= full:
                big.append(f"{e.primitive.name}: {v.aval}")
    assert not big, f"full-size buffers {big} in:\n{jaxpr}"
    bits = find_eqns(jaxpr, "random_bits", "threefry2x32")
    assert bits, "no random draw left in the program"
    assert_tree_close(sf(*args), loss(*args))


@pytest.mark.slow
def test_seed1_encoder_hoisted(seed1):
    """The encoder does not depend on the sample axis: its convolutions run once, outside
    the loop (2 outside the scan, the decoder's 2 inside)."""
    loss, args = seed1
    sf = ja.serialize_axis(loss, chunk=4, grad="native")
    jaxpr = sf.jaxpr(*args)
    scans = _scans_with_remat_body(jaxpr)
    assert len(scans) == 1, jaxpr
    inside = {
        id(e)
        for sub in eqn_sub_jaxprs(scans[0])
        for e in iter_eqns(sub)
        if e.primitive.name == "conv_general_dilated"
    }
    all_convs = [e for e in iter_eqns(jaxpr) if e.primitive.name == "conv_general_dilated"]
    outside = [e for e in all_convs if id(e) not in inside]
    # The encoder's two convs run once before the loop; the decoder's two are inside the scan.
    # A remainder call (none here: 4 divides 16) would add copies outside.
    assert len(inside) == 2, jaxpr
    assert len(outside) == 2, jaxpr
    for e in outside:
        assert e.outvars[0].aval.shape[0] == args[1].shape[0], e


def test_remainder_uses_same_body_at_remainder_size():
    """chunk=4 over 10: 2 full chunks in the scan, a remainder of 2 (no padding)."""
    n, chunk = 10, 4
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad="native")
    jaxpr = sf.jaxpr(W, _x(n))
    dots = [e for e in iter_eqns(jaxpr) if e.primitive.name == "dot_general"]
    rows = sorted(e.outvars[0].aval.shape[0] for e in dots)
    assert rows == [n % chunk, chunk], rows


def test_jaxpr_eval_matches():
    n = 9
    sf = ja.serialize_axis(loss, chunk=4, argnums=1, grad="native")
    jaxpr = sf.jaxpr(W, _x(n))
    (got,) = jax.extend.core.jaxpr_as_fun(jaxpr)(W, _x(n))
    np.testing.assert_allclose(np.asarray(got), np.asarray(loss(W, _x(n))), rtol=2e-4)


@pytest.mark.parametrize("grad", modes("remat", slow=("native",)))
def test_dropout_bits_generated_per_chunk(grad):
    """Dropout over a microbatched input: the random bits are drawn per chunk inside the loop,
    never as one u32[N, ...] buffer, and the values still equal the original's."""
    n, chunk = 12, 4
    rs = np.random.RandomState(3)
    w = jnp.asarray(rs.normal(size=(5, 6)), jnp.float32)
    x = jnp.asarray(rs.normal(size=(n, 5)), jnp.float32)
    key = jax.random.key(2)

    def f(w, x, key):
        h = jnp.tanh(x @ w)
        keep = jax.random.bernoulli(key, 0.7, h.shape)
        return (jnp.where(keep, h / 0.7, 0.0) ** 2).sum()

    sf = ja.serialize_axis(f, chunk=chunk, argnums=1, grad=grad)
    jaxpr = sf.jaxpr(w, x, key)
    full = [
        f"{e.primitive.name}: {v.aval}"
        for e in iter_eqns(jaxpr)
        for v in e.outvars
        if getattr(v.aval, "shape", ())[:1] == (n,) and math.prod(v.aval.shape) >= n * 6
    ]
    assert not full, f"full-size values {full} in:\n{jaxpr}"
    assert find_eqns(jaxpr, "random_bits", "threefry2x32"), jaxpr
    assert_matches_original(sf, w, x, key, vmap=False)


def two_sums(w, x):
    h = jnp.tanh(x @ w)
    return {"value": jnp.sum(h**2), "metric": jnp.sum(jnp.cos(3 * h) * jnp.sin(h))}


def only_value(w, x):
    return two_sums(w, x)["value"]


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # a chunk holding the whole axis
@pytest.mark.parametrize("grad", modes("remat", slow=("fused",)))
@pytest.mark.parametrize(
    "n, chunk",
    [(10, 4), *(pytest.param(*c, marks=pytest.mark.slow) for c in [(8, 8), (7, 1), (8, 9)])],
)
@pytest.mark.slow
def test_dce_drops_an_unused_region_output(grad, n, chunk):
    """A program that reads only the value of a region that also computes a metric: JAX's
    dead-code elimination leaves the region the equations of a region built for the value
    alone, and the pruned program's values, gradients, JVP and ``vmap`` are the original's."""
    x = _x(n)
    sf = ja.serialize_axis(two_sums, chunk=chunk, argnums=1, grad=grad)
    program = jax.make_jaxpr(lambda w, x: sf(w, x)["value"])(W, x)
    pruned = _compat.dce(program)
    alone = ja.serialize_axis(only_value, chunk=chunk, argnums=1, grad=grad).jaxpr(W, x)

    def inner(jaxpr):
        [region] = find_eqns(jaxpr, REGION)
        return len(region.outvars), len(list(iter_eqns(region.params["jaxpr"])))

    (outs, full), (kept, dced), (_, wanted) = inner(program), inner(pruned), inner(alone)
    assert (outs, kept) == (2, 1)
    assert dced == wanted < full, (dced, wanted, full)

    f = jax.extend.core.jaxpr_as_fun(pruned)

    def run(g):
        xs = jnp.stack([x, -0.5 * x])
        return (
            g(W, x),
            jax.grad(g, argnums=(0, 1))(W, x),
            jax.jvp(g, (W, x), (jnp.ones_like(W), jnp.cos(x))),
            jax.vmap(g, in_axes=(None, 0))(W, xs),
        )

    assert_tree_close(run(lambda w, x: f(w, x)[0]), run(only_value), what="pruned program")


@pytest.mark.parametrize("grad", modes("remat", slow=("fused", "native", "auto")))
@pytest.mark.slow
def test_a_plan_is_freed_with_its_function(grad):
    """JAX's caches keyed by equation parameters hold the region (which owns the whole plan)
    weakly: once the serialized function is gone, no region outlives it (held strongly, each
    stayed until 2,048 later cache entries evicted it)."""
    import gc
    import weakref

    from jaxpr_accum._build._region import Region

    def live_regions() -> int:
        gc.collect()
        return sum(isinstance(o, Region) for o in gc.get_objects())

    before = live_regions()
    x = _x(10)
    sf = ja.serialize_axis(two_sums, chunk=4, argnums=1, grad=grad)
    jax.grad(lambda w, x, f=sf: f(w, x)["value"])(W, x)
    jax.jit(sf)(W, x)
    jax.vmap(sf, in_axes=(None, 0))(W, jnp.stack([x, x]))
    sf.jaxpr(W, x)
    assert live_regions() > before
    function = weakref.ref(sf)
    del sf
    assert function() is None
    assert live_regions() == before


@pytest.mark.slow
def test_planning_pauses_the_collector_and_restores_it():
    """Planning runs with Python's cyclic collector paused (its full collections walked the
    whole heap several times per plan) and leaves it as it found it: enabled again after a
    plan, after a plan that raised, and still disabled where the caller disabled it. The
    user's function is traced with the collector as the caller has it, and a process with
    another Python thread is not paused at all. Planning is seen from a custom JVP rule,
    which the validation of the backward pass calls; a plain call never does."""
    import gc
    import threading

    in_rule: list[bool] = []
    in_trace: list[bool] = []

    @jax.custom_jvp
    def act(v):
        return jnp.tanh(v)

    @act.defjvp
    def _(primals, tangents):
        in_rule.append(gc.isenabled())
        return act(primals[0]), (1 - jnp.tanh(primals[0]) ** 2) * tangents[0]

    def f(w, x):
        in_trace.append(gc.isenabled())
        return jnp.sum(act(x @ w))

    def planned() -> tuple[list[bool], list[bool]]:
        in_rule.clear()
        in_trace.clear()
        ja.serialize_axis(f, chunk=4, argnums=1)(W, x)
        return list(in_rule), list(in_trace)

    x = _x(10)
    assert gc.isenabled()
    assert threading.active_count() == 1, "needs a process with no other Python thread"
    rule, trace = planned()
    assert rule and not any(rule) and all(trace) and gc.isenabled()

    def raises(w, x):
        raise RuntimeError("the user's own error")

    with pytest.raises(RuntimeError, match="the user's own error"):
        ja.serialize_axis(raises, chunk=4, argnums=1)(W, x)
    assert gc.isenabled()

    gc.disable()
    try:
        rule, trace = planned()
        assert rule and not any(rule) and not any(trace) and not gc.isenabled()
    finally:
        gc.enable()

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        rule, trace = planned()
        assert rule and all(rule) and all(trace) and gc.isenabled()
    finally:
        release.set()
        other.join()
