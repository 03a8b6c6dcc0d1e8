"""The ``explain_mode`` family: ``explain`` names the mode whose program the call compiles.

A pair of the ``plain`` family (a program of ``programs.py``, its data chunked), its axis
lengthened to 64-256 rows in 4 to 16 chunks, is serialized under ``grad="auto"`` with no
stack; a random non-empty subset of its floating arguments (``diff``) is differentiated.
``sf.explain(*args, grad_argnums=diff)`` names a mode, and the StableHLO text of
``jax.jit(jax.value_and_grad(scal(sf), diff))`` must equal that of the same function pinned
to the mode (``grad=plan.grad``), or, where the plan runs the function as written, hold the
original's loops and no other; its value and gradients must be the original's. Outcomes:
``OK``, ``MISMATCH`` (another program, or other numbers), ``TWO_MODES`` (a two-pass plan,
``_pairwise``, whose passes auto put in two modes, as the report's two gradient-mode lines
say: no one ``grad=`` pins it, only the values are compared) and ``EXPECTED`` (the original
fails, or the documented ``SerializeError``); anything the serialized function raises
propagates.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from typing import Any

import jax
from hypothesis import strategies as st

from .runner import Pair, pairs, script
from .stacks import FLOAT


@dataclasses.dataclass(frozen=True)
class ModePair:
    pair: Pair  # mode "auto", no stack
    diff: tuple[int, ...]  # the positional arguments differentiated


@st.composite
def mode_pairs(draw: Any) -> ModePair:
    pair = draw(pairs("plain", eager_one_in=0))
    # at the grammar's sizes (N <= 13) auto runs most programs as written: a longer axis,
    # cut in 4 to 16 chunks, gives it loops to choose a mode for
    n = draw(st.sampled_from((64, 128, 256)))
    program = dataclasses.replace(pair.program, n=n)
    chunk = n // draw(st.sampled_from((4, 8, 16)))
    pair = dataclasses.replace(
        pair, program=program, chunk=chunk, chunk_kind="divisor", layers=(), mode="auto",
        family="explain_mode",
    )  # fmt: skip
    floats = [i for i, n in enumerate(pair.program.args) if n in FLOAT]
    diff = draw(st.sets(st.sampled_from(floats), min_size=1))
    return ModePair(pair, tuple(sorted(diff)))


def _namespace(pair: Pair) -> dict:
    """The names ``pair``'s repro script defines (``f``, ``make_args``, ``serialized``)."""
    module = types.ModuleType("fuzz_explain_mode")  # a real module: flax dataclasses look it up
    sys.modules[module.__name__] = module
    try:
        exec(compile(script(pair), f"<explain_mode {pair.seed}>", "exec"), module.__dict__)
    finally:
        sys.modules.pop(module.__name__, None)
    return module.__dict__


def _value_and_grad(ns: dict, g: Any, diff: tuple[int, ...]) -> Any:
    """``jax.value_and_grad`` of the runtime's scalar of ``g``'s floating outputs."""
    return jax.value_and_grad(lambda *a: ns["scal"](g(*a)), argnums=diff)


def _text(ns: dict, g: Any, diff: tuple[int, ...], args: Any) -> str:
    """StableHLO of the jitted ``_value_and_grad``, without locations or module name."""
    lowered = jax.jit(_value_and_grad(ns, g, diff)).lower(*args)
    return lowered.as_text(debug_info=False).split("\n", 1)[1]


def _loops(closed: Any) -> list[str]:
    """The top-level loops of a traced program, in order."""
    loops = ("scan", "while", "serialized_region")
    return [e.primitive.name for e in closed.jaxpr.eqns if e.primitive.name in loops]


def check(mp: ModePair) -> tuple[str, str]:
    """``(outcome, detail)`` of one pair (see the module docstring)."""
    import jaxpr_accum as ja
    from jaxpr_accum.testing import assert_tree_close

    pair, diff = mp.pair, mp.diff
    ns = _namespace(pair)
    args = ns["make_args"](pair.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = _value_and_grad(ns, ns["f"], diff)(*args)
        except Exception as error:  # the original fails: not the library's
            return "EXPECTED", f"the original raises {type(error).__name__}"
        sf = ns["serialized"]()
        try:
            plan = sf.explain(*args, grad_argnums=diff)
        except ja.SerializeError as error:
            return "EXPECTED", f"SerializeError: {str(error)[:100]}"
        text = _text(ns, sf, diff, args)
        got = _value_and_grad(ns, sf, diff)(*args)
        modes = {plan.grad} | ({plan.second.grad} if plan.second is not None else set())
        if plan.runs_as_written:  # the program as written: the original's loops, no others
            same = _loops(sf.jaxpr(*args)) == _loops(jax.make_jaxpr(ns["f"])(*args))
        elif len(modes) > 1:  # two passes in two modes: no one ``grad=`` pins both
            same = None
        else:
            pinned = _namespace(dataclasses.replace(pair, mode=plan.grad))["serialized"]()
            same = text == _text(ns, pinned, diff, args)
    if same is False:
        return "MISMATCH", f"explain names {plan.grad}; the call compiles another program"
    try:
        assert_tree_close(got, want)
    except AssertionError as error:
        return "MISMATCH", f"values: {str(error)[:300]}"
    return ("OK", plan.grad) if same else ("TWO_MODES", " and ".join(sorted(modes)))
