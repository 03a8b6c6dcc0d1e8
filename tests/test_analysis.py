"""The axis analysis itself: a worklist fixpoint over a lattice with a conflict value.

It always terminates (long chains, forwards and backwards, at the top level and inside loop
bodies), a value the axis would occupy at two places is ``CONFLICT`` and every equation
touching it a barrier, and its result does not depend on the order of the equations.
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum._base._lattice import CONFLICT, AxisLoc
from jaxpr_accum._engine._axes import Analysis
from jaxpr_accum._engine._table import RULES
from jaxpr_accum._rules.elementwise import Elementwise

from .oracle import NOT_WORTH_IT, assert_matches_original

N = 16


def _x(n: int = N, m: int = 4, seed: int = 0) -> jax.Array:
    return jnp.asarray(np.random.RandomState(seed).normal(size=(n, m)), jnp.float32)


def _analyse(f, *args, argnum: int = 0, dim: int = 0) -> tuple[Analysis, jax.extend.core.Jaxpr]:
    jaxpr = jax.make_jaxpr(f)(*args).jaxpr
    size = args[argnum].shape[dim]
    return Analysis(jaxpr, size).run([(jaxpr.invars[argnum], AxisLoc(dim))]), jaxpr


def _stops(plan) -> set[str]:
    """``plan.stops`` without source locations (they differ between two equivalent programs)."""
    return {re.sub(r" at \S+:\d+ \([^)]*\)", "", s) for s in plan.stops}


# -- termination ---------------------------------------------------------------------------


def test_long_chain_on_an_axis_carrying_constant_is_chunked():
    # The axis reaches the constant backwards from `c * x`, through 200 equations.
    def f(x):
        c = jnp.asarray(np.ones((N, 4), np.float32))
        for _ in range(200):
            c = jnp.sin(c)
        return jnp.sum(c * x)

    sf = ja.serialize_axis(f, chunk=4, argnums=0)
    plan = sf.explain(_x())
    assert plan.counts["body"] >= 200, str(plan)
    assert not plan.stops, str(plan)
    assert_matches_original(sf, _x(), vmap=False)


@pytest.mark.slow
def test_long_backward_chain_in_a_scan_body_terminates_quickly():
    # Inside the body a closed-over constant goes through 150 equations; the axis is learnt
    # at the last one (`h * x`) and must travel back to the body's input, one step per
    # equation, and from there to the scan's operand outside.
    def f(x, w):
        c0 = jnp.asarray(np.ones((N, 4), np.float32))

        def body(carry, _):
            h = c0
            for _ in range(150):
                h = jnp.sin(h)
            return carry + h * x, None

        out, _ = lax.scan(body, w, None, length=3)
        return jnp.sum(out)

    x, w = _x(), _x(seed=1)
    t0 = time.perf_counter()
    analysis, jaxpr = _analyse(f, x, w)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0, f"analysis took {elapsed:.1f} s"
    (scan_idx,) = [i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "scan"]
    scan = jaxpr.eqns[scan_idx]
    body = scan.params["jaxpr"].jaxpr
    ctx = ((scan_idx, ("jaxpr",)),)
    assert all(analysis.loc(ctx, e.outvars[0]) == AxisLoc(0) for e in body.eqns)
    assert all(analysis.loc(ctx, v) == AxisLoc(0) for v in body.invars)
    assert all(analysis.loc((), v) == AxisLoc(0) for v in scan.invars)
    assert not analysis.barriers and not analysis.conflicts

    sf = ja.serialize_axis(f, chunk=4, argnums=0)
    assert not sf.explain(x, w).stops
    assert_matches_original(sf, x, w, vmap=False)


# -- conflicts -----------------------------------------------------------------------------


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # a toy stopped at its barrier: saves nothing
def test_two_places_in_one_operation_is_a_barrier():
    """``x + x.T`` puts the axis at two places: a barrier of the analysis. It pairs the axis
    with itself, so the planner runs it by rows of ``x`` against the whole ``x`` (issue 23)."""

    def f(x):
        return jnp.sum(jnp.tanh(x + x.T)) + jnp.sum(jnp.sin(x))

    x = _x(N, N)
    analysis, jaxpr = _analyse(f, x)
    add = next(i for i, e in enumerate(jaxpr.eqns) if e.primitive is lax.add_p)
    assert ((), add) in analysis.barriers
    sf = ja.serialize_axis(f, chunk=4, argnums=0)
    plan = sf.explain(x)
    assert plan.pairs and not plan.stops, str(plan)
    assert plan.counts["body"] > 0, str(plan)
    assert_matches_original(sf, x, vmap=False)


def _gram_diagonal(y):
    # sum_j y[j, i] * y[i, j]: batch over dim 0 of y.T and of y, contract dim 1 of both.
    return lax.dot_general(y.T, y, (((1,), (1,)), ((0,), (0,))))


def test_a_value_at_two_places_is_a_conflict_and_every_equation_touching_it_a_barrier():
    def f(x):
        y = jnp.sin(x)
        return jnp.sum(_gram_diagonal(y)) + jnp.sum(jnp.tanh(x))

    x = _x(N, N)
    analysis, jaxpr = _analyse(f, x)
    y = jaxpr.eqns[0].outvars[0]  # sin(x): dot_general wants it at dims 0 and 1
    assert ((), y) in analysis.conflicts and all(ctx == () for ctx, _ in analysis.conflicts)
    assert analysis.fact((), y) is CONFLICT
    assert analysis.conflicted((), y) and analysis.loc((), y) is None
    touching = [i for i, e in enumerate(jaxpr.eqns) if y in e.invars or y in e.outvars]
    assert [jaxpr.eqns[i].primitive.name for i in touching] == ["sin", "transpose", "dot_general"]
    for i in touching:
        assert analysis.touches((), jaxpr.eqns[i])
        assert "two places" in analysis.barriers[((), i)]

    sf = ja.serialize_axis(f, chunk=4, argnums=0)
    plan = sf.explain(x)
    assert any("two places" in s for s in plan.stops), str(plan)
    assert plan.counts["body"] > 0, str(plan)  # tanh(x) and its sum are still chunked
    assert_matches_original(sf, x, vmap=False)


def test_a_conflict_inside_a_sub_jaxpr_stops_the_call():
    @jax.jit
    def inner(y):
        return _gram_diagonal(jnp.sin(y))

    def f(x):
        return jnp.sum(inner(x)) + jnp.sum(jnp.cos(x))

    x = _x(N, N)
    analysis, _ = _analyse(f, x)
    assert analysis.conflicts and all(ctx for ctx, _ in analysis.conflicts)
    sf = ja.serialize_axis(f, chunk=4, argnums=0)
    plan = sf.explain(x)
    assert any("two places" in s for s in plan.stops), str(plan)
    assert_matches_original(sf, x, vmap=False)


# -- order independence --------------------------------------------------------------------


def _reordered(jaxpr):
    """The same equations in another valid order: Kahn's algorithm, latest ready first."""
    defined_by = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    deps = [
        {defined_by[v] for v in e.invars if isinstance(v, jax.extend.core.Var) and v in defined_by}
        for e in jaxpr.eqns
    ]
    done: list[int] = []
    left = set(range(len(jaxpr.eqns)))
    while left:
        ready = [i for i in left if deps[i] <= set(done)]
        i = max(ready)
        done.append(i)
        left.remove(i)
    assert done != sorted(done)
    return jaxpr.replace(eqns=[jaxpr.eqns[i] for i in done])


def _by_equation(analysis, jaxpr):
    barriers = {id(jaxpr.eqns[i]) for (ctx, i) in analysis.barriers if ctx == ()}
    hoists = {id(jaxpr.eqns[i]) for (ctx, i) in analysis.hoists if ctx == ()}
    reductions = {
        (id(jaxpr.eqns[i]), tuple(sorted(r.items())))
        for (ctx, i), r in analysis.reductions.items()
        if ctx == ()
    }
    locs = {v: loc for (ctx, v), loc in analysis.locs.items() if ctx == ()}
    conflicts = {v for (ctx, v) in analysis.conflicts if ctx == ()}
    return barriers, hoists, reductions, locs, conflicts


def _mixed(x, w):
    y = jnp.sin(x)
    g = jnp.sum(_gram_diagonal(y))  # a conflict
    h = jnp.sum(jnp.tanh(x @ w) * x)  # chunkable, reduced
    k = jnp.sum(jnp.cumsum(jnp.cos(x), axis=0))  # a barrier
    c = jnp.ones((N, N))
    for _ in range(30):  # learnt backwards from the end
        c = jnp.exp(-c)
    m = jnp.sum(c * x)
    return g + h + k + m


def test_analysis_does_not_depend_on_equation_order():
    x, w = _x(N, N), _x(N, N, seed=1)
    jaxpr = jax.make_jaxpr(_mixed)(x, w).jaxpr
    other = _reordered(jaxpr)
    seeds = [(jaxpr.invars[0], AxisLoc(0))]
    a = Analysis(jaxpr, N).run(seeds)
    b = Analysis(other, N).run(seeds)
    assert _by_equation(a, jaxpr) == _by_equation(b, other)
    assert a.conflicts and a.barriers and a.reductions


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # toys with several stops: the plans save nothing
@pytest.mark.slow
def test_plans_do_not_depend_on_statement_order():
    def f_a(x, w):
        y = jnp.sin(x)
        g = jnp.sum(_gram_diagonal(y))
        h = jnp.sum(jnp.tanh(x @ w) * x)
        k = jnp.sum(jnp.cumsum(jnp.cos(x), axis=0))
        return g + h + k

    def f_b(x, w):
        k = jnp.sum(jnp.cumsum(jnp.cos(x), axis=0))
        h = jnp.sum(jnp.tanh(x @ w) * x)
        y = jnp.sin(x)
        g = jnp.sum(_gram_diagonal(y))
        return g + h + k

    x, w = _x(N, N), _x(N, N, seed=1)
    plans = []
    for f in (f_a, f_b):
        sf = ja.serialize_axis(f, chunk=4, argnums=0)
        plans.append(sf.explain(x, w))
        assert_matches_original(sf, x, w, vmap=False)
    a, b = (p.counts for p in plans)
    assert a["body"] == b["body"] and a["prologue"] + a["epilogue"] == b["prologue"] + b["epilogue"]
    # (where the equations outside the loop run follows the program: ``_analysis/_order.py``)
    assert _stops(plans[0]) == _stops(plans[1])
    assert len(plans[0].stops) >= 2


# -- the finalize hook ---------------------------------------------------------------------


class _Finalizing(Elementwise):
    def __init__(self) -> None:
        self.calls: list = []

    def finalize(self, eqn, view):
        self.calls.append(view.key)
        if len(self.calls) == 2:
            view.barrier("finalized")


def test_finalize_runs_once_per_equation_in_order_and_may_mark_barriers():
    def f(x):
        return jnp.sum(jnp.sin(jnp.sin(jnp.sin(x)) * 2.0))

    saved = RULES[lax.sin_p]
    RULES[lax.sin_p] = rule = _Finalizing()
    try:
        analysis, jaxpr = _analyse(f, _x())
    finally:
        RULES[lax.sin_p] = saved
    sins = [((), i) for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "sin"]
    assert rule.calls == sins
    assert analysis.barriers == {sins[1]: "finalized"}
