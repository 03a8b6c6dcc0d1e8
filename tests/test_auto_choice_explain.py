"""``explain`` names the mode the call compiles: over the cases of the auto-choice benchmark
(``benchmarks/auto_choice_cases.py``), ``sf.explain(*args, grad_argnums=diff)`` under
``grad="auto"`` names a mode, and the StableHLO of the call's
``jax.jit(jax.value_and_grad(sf, diff))`` is the text of the same function pinned to that mode
(``grad=plan.grad``), or, where the plan runs the function as written, has the original's
loops and no other. Values and
gradients are the original's. Two fast cases run in the default tier (an estimated pick: the
weights' gradient of issue 20's MLP; the ``has_aux`` metrics), every case of the benchmark's
quick set in the slow tier."""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings

import jax
import pytest

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)

import auto_choice_cases  # noqa: E402
from zoo import checks  # noqa: E402

FAST = ("issue20-mlp", "metrics")


@functools.lru_cache(maxsize=1)
def _cases() -> dict:
    return {c.key: c for c in auto_choice_cases.make_cases(quick=True)}


def _params():
    for key in _cases():
        marks = () if key in FAST else (pytest.mark.slow,)
        yield pytest.param(key, id=key, marks=marks)


def _text(f, diff, has_aux, args) -> str:
    """StableHLO of ``jax.jit(jax.value_and_grad(f, diff))`` at ``args``, without source
    locations or the module's name."""
    vg = jax.value_and_grad(f, argnums=diff, has_aux=has_aux)
    return jax.jit(vg).lower(*args).as_text(debug_info=False).split("\n", 1)[1]


def _loops(closed) -> list[str]:
    loops = ("scan", "while", "serialized_region")
    return [e.primitive.name for e in closed.jaxpr.eqns if e.primitive.name in loops]


@pytest.mark.parametrize("key", list(_params()))
@pytest.mark.slow
def test_explain_names_the_mode_the_call_compiles(key: str) -> None:
    case = _cases()[key]
    loss, args = case.make()
    diff = case.argnums or checks.float_argnums(args)
    kw = dict(chunk=case.chunk, **case.serialize_kw)
    with warnings.catch_warnings(record=True) as record:  # a plan run as written warns
        warnings.simplefilter("always", ja.PlanWarning)
        sf = ja.serialize_axis(loss, **kw)
        plan = sf.explain(*args, grad_argnums=diff)
        text = _text(sf, diff, case.has_aux, args)
        got = jax.value_and_grad(sf, argnums=diff, has_aux=case.has_aux)(*args)
    warned = {str(w.message) for w in record if issubclass(w.category, ja.PlanWarning)}
    assert all(plan.warning is not None and plan.warning in w for w in warned), (warned, plan)
    assert "(the call's)" in plan.planned_for, plan.planned_for
    if plan.runs_as_written:  # the program as written: the original's loops, no others
        assert _loops(sf.jaxpr(*args)) == _loops(jax.make_jaxpr(loss)(*args)), key
    else:
        pinned = ja.serialize_axis(loss, grad=plan.grad, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ja.PlanWarning)  # the same plan's, asserted above
            assert text == _text(pinned, diff, case.has_aux, args), (key, plan.grad)
    want = jax.value_and_grad(loss, argnums=diff, has_aux=case.has_aux)(*args)
    assert_tree_close(got, want)


def test_the_compiled_text_with_its_metadata_is_the_pinned_modes() -> None:
    """The compiled program, metadata included (the name scopes of each region's loops,
    named after the region's body, not numbered per trace), is the pinned mode's text."""
    case = _cases()["issue20-mlp"]
    loss, args = case.make()
    diff = case.argnums or checks.float_argnums(args)
    kw = dict(chunk=case.chunk, **case.serialize_kw)
    auto = ja.serialize_axis(loss, **kw)
    pinned = ja.serialize_axis(loss, grad=auto.explain(*args, grad_argnums=diff).grad, **kw)

    def compiled(f) -> str:
        vg = jax.value_and_grad(f, argnums=diff, has_aux=case.has_aux)
        text = jax.jit(vg).lower(*args).compile().as_text()
        return re.sub(r"^HloModule [^,]*", "HloModule", text)

    auto_text, pinned_text = (compiled(f) for f in (auto, pinned))  # one line, one column
    assert "jaxpr_accum_chunks" in auto_text
    assert auto_text == pinned_text
