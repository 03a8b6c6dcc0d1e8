"""The differential fuzzer over transformation stacks (``tests/fuzz``), derandomized for CI.

Hypothesis draws a program from the grammar of the idioms users write and a stack of JAX
transformations; the stack applied to the original function is the oracle for the same stack
applied to ``ja.serialize_axis(f, chunk=k, grad=mode)``, every grad mode and chunk sizes of
every kind (1, a divisor, a non-divisor, the axis, more than the axis). A test fails when any
pair is a ``MISMATCH`` (a silently wrong value or gradient), a ``CRASH`` (the serialized
function raises where the original runs) or a ``FALLBACK`` (it raises an internal error under
``JAXPR_ACCUM_STRICT=1``, and without it falls back to a narrower plan), or when the fuzzer
itself generated a broken script; the message lists each failure class once with a standalone
repro script (the program's source, the stack, the chunk and the mode) of its smallest example.
The original failing under a stack, and the documented ``ja.SerializeError``, are counted, not
failures.

Tiers:

* slow (``-m slow``): ``sum(EXAMPLES.values())`` = 54 pairs, in one test per stack family
  (so that ``-n 2`` spreads them), and 2 pairs with each of issue 30's 16 idioms; the
  ``shard`` family needs 8 devices and runs in a subprocess (``python -m tests.fuzz``), in
  the integration tier: ``test_fuzz_sharding.py``.
  The open defect classes of :data:`KNOWN_OPEN` (each with its repro) are printed, not failed.
* default: a smoke run of a few pairs, and the planted-bug checks: the fuzzer must fail when
  ``ja.serialize_axis`` is replaced by a wrapper that gets the gradient wrong (the value right),
  the value wrong, raises, raises under ``JAXPR_ACCUM_STRICT=1`` only, or runs the user's
  callbacks twice; a fuzzer that cannot fail is a defect.

Longer random campaigns: ``python tests/fuzz/campaign.py --pairs 5000 --seed N``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

from .fuzz import idioms  # noqa: E402
from .fuzz.driver import assert_no_failures, run_examples  # noqa: E402
from .fuzz.runner import Result  # noqa: E402

#: pairs per stack family in one CI run (slow tier), 54 in all (the campaigns,
#: ``tests/fuzz/campaign.py``, run thousands; the slow tier's budget keeps these)
EXAMPLES = {
    "plain": 11,
    "reverse": 10,
    "vmap": 9,
    "vmap_unchunked": 8,
    "forward": 7,
    "mixed": 9,
}

#: issue 30's idioms (``tests/fuzz/idioms.py``), each in every program of its own test: 2 pairs
#: of one stack family (the families taken in turn); the random draws above have them too
IDIOMS = [*idioms.HEADS, *idioms.CALLBACKS]
IDIOM_PAIRS = 2


#: eager pairs (no outer ``jit``): one in four in ``plain``, none in the other families (an
#: eager pair under vmap or a derivative costs 3-10x a jitted one; the campaigns draw them in
#: every family, one in eight)
EAGER_ONE_IN = {"plain": 4}


#: open defect classes, each with its standalone repro in ``repros/``: still drawn, and printed
#: by the slow tier, but not failures there until fixed (then delete the entry); none is open
KNOWN_OPEN: dict[str, Callable[[Result], bool]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(EXAMPLES))
def test_fuzz_stack_family(family: str) -> None:
    n = EXAMPLES[family]
    eager = EAGER_ONE_IN.get(family, 0)
    _assert_no_new_failures(run_examples([family], n, derandomize=True, eager_one_in=eager), n)


@pytest.mark.slow
@pytest.mark.parametrize("idiom", IDIOMS)
def test_fuzz_issue30_idiom(idiom: str) -> None:
    family = list(EXAMPLES)[IDIOMS.index(idiom) % len(EXAMPLES)]
    seed = 30 + IDIOMS.index(idiom)  # a seed of its own: derandomized, every idiom draws alike
    results = run_examples(
        [family], IDIOM_PAIRS, derandomize=False, seed=seed, eager_one_in=0, idiom=idiom
    )
    _assert_no_new_failures(results, IDIOM_PAIRS)


def _assert_no_new_failures(results: list[Result], n: int) -> None:
    known = {r.pair: k for r in results for k, match in KNOWN_OPEN.items() if match(r)}
    for pair, k in known.items():
        print(f"known open defect {k}: {pair.summary()}")
    assert_no_failures([r for r in results if r.pair not in known], n - len(known))


def test_fuzz_smoke() -> None:
    """The default tier's few pairs: the grammar renders, runs, and agrees."""
    assert_no_failures(run_examples(["plain"], 2, derandomize=True), 2)


# ------------------------------------------------------------------------------------------
# Planted bugs: the fuzzer must catch them
# ------------------------------------------------------------------------------------------


@jax.custom_jvp
def _steep(x: Any) -> Any:
    return x


@_steep.defjvp
def _steep_jvp(primals: tuple, tangents: tuple) -> tuple:
    return primals[0], 1.5 * tangents[0]  # the right value, a derivative 1.5x too large


def _on_floats(fn: Any, tree: Any) -> Any:
    return jax.tree.map(lambda o: fn(o) if jnp.issubdtype(o.dtype, jnp.floating) else o, tree)


def _wrong_gradient(sf: Any) -> Any:
    return lambda *a, **k: _on_floats(_steep, sf(*a, **k))


def _wrong_value(sf: Any) -> Any:
    return lambda *a, **k: _on_floats(lambda o: o * (1 + 1e-3), sf(*a, **k))


def _raises(sf: Any) -> Any:
    def call(*a: Any, **k: Any) -> Any:
        raise RuntimeError("planted crash")

    return call


def _strict_only(sf: Any) -> Any:
    def call(*a: Any, **k: Any) -> Any:
        if os.environ.get("JAXPR_ACCUM_STRICT", "0") not in ("", "0"):
            raise RuntimeError("planted internal error")
        return sf(*a, **k)

    return call


def _twice(sf: Any) -> Any:
    def call(*a: Any, **k: Any) -> Any:
        sf(*a, **k)  # the right values, the user's callbacks run twice
        return sf(*a, **k)

    return call


PLANTED = {
    # bug: (family, the outcome it must produce, an idiom every program has)
    "wrong_gradient": (_wrong_gradient, "reverse", "MISMATCH", None),
    "wrong_value": (_wrong_value, "plain", "MISMATCH", None),
    "crash": (_raises, "plain", "CRASH", None),
    "fallback": (_strict_only, "plain", "FALLBACK", None),
    "callback_twice": (_twice, "plain", "MISMATCH", "debug_on_loss"),
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_fuzz_catches_planted_bug(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ja.serialize_axis`` replaced by a wrapper with a deliberate defect: every pair the
    original runs is a failure of the expected kind, and the tests' assertion fails."""
    plant, family, outcome, idiom = PLANTED[bug]
    real = ja.serialize_axis
    monkeypatch.setattr(ja, "serialize_axis", lambda f, **kw: plant(real(f, **kw)))
    results = run_examples([family], 1, derandomize=True, idiom=idiom)
    ran = [r for r in results if r.outcome not in ("ORIGINAL_FAILS", "EXPECTED_ERROR")]
    assert ran, [r.outcome for r in results]
    assert all(r.outcome == outcome for r in ran), [(r.outcome, r.cls) for r in ran]
    if idiom is not None:  # the values agree; the callbacks saw twice as many
        assert all(r.cls.endswith("(callback count)") for r in ran), [r.cls for r in ran]
    elif outcome == "MISMATCH":  # triaged against float64: wrong, not a precision loss
        assert all("wrong" in r.detail for r in ran), [r.detail for r in ran]
    with pytest.raises(AssertionError, match=outcome):
        assert_no_failures(results, len(results))


# ------------------------------------------------------------------------------------------
# The explain_mode family: explain names the mode whose program the call compiles
# ------------------------------------------------------------------------------------------


def _explain_mode_family(n: int) -> list[tuple[str, str]]:
    from hypothesis import HealthCheck, given, settings

    from .fuzz import explain_mode

    outcomes: list[tuple[str, str]] = []

    @settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), print_blob=False,
    )  # fmt: skip
    @given(explain_mode.mode_pairs())
    def search(mp: Any) -> None:
        outcomes.append((*explain_mode.check(mp), mp.pair.summary()))

    search()
    return outcomes


@pytest.mark.parametrize(
    "n", [pytest.param(1, id="smoke"), pytest.param(6, marks=pytest.mark.slow)]
)
def test_fuzz_explain_mode(n: int) -> None:
    """``explain(..., grad_argnums=diff)`` under auto names the mode whose StableHLO the
    call's ``value_and_grad`` compiles, on random programs and differentiated subsets
    (``tests/fuzz/explain_mode.py``); values and gradients the original's."""
    outcomes = _explain_mode_family(n)
    bad = [o for o in outcomes if o[0] == "MISMATCH"]
    assert not bad, "\n".join(" | ".join(o) for o in bad)
    assert sum(o[0] == "OK" for o in outcomes) >= n // 2, outcomes


@pytest.mark.slow
def test_fuzz_explain_mode_catches_an_explain_that_names_another_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: ``explain`` names ``native`` (or ``remat`` for a native plan) whatever the
    call compiles; the family must report ``MISMATCH``."""
    import dataclasses

    real = ja.SerializedFunction.explain

    def lying(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = real(self, *args, **kwargs)
        return dataclasses.replace(plan, grad="remat" if plan.grad == "native" else "native")

    monkeypatch.setattr(ja.SerializedFunction, "explain", lying)
    with pytest.raises(AssertionError, match="MISMATCH"):
        test_fuzz_explain_mode(1)
