"""The checkify family of the fuzzer (``tests/fuzz/checks.py``), derandomized for CI: under
``jax.experimental.checkify`` with every error set, a serialized function reports what the
original reports (the same ``err.get()`` text, the same line of the program where the
original names one), or no error where it reports none, in every grad mode, plain, under
``grad``, ``value_and_grad``, ``jvp`` and ``vmap`` (inside and outside ``checkify``), jitted
and eager. The default tier runs a check that the family can fail; the slow tier runs two
pairs and the family. No difference is tolerated: the loops that JAX derives from the
region's passes (native's, ``jvp``'s, ``vmap``'s, the backward pass) report as the region's
own rule does."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given

from .fuzz import checks
from .fuzz.driver import derandomized

#: pairs in the slow tier's run
PAIRS = 20


@pytest.mark.slow
@derandomized(PAIRS)
@given(checks.check_pairs())
def test_fuzz_check_family(tmp_path_factory, pair):
    failure = checks.check(pair, tmp_path_factory.mktemp("checks"))
    assume(failure != checks.ORIGINAL_RAISES)
    assert failure is None, failure


PAIR = checks.CheckPair(
    sites=(("index", -0.5), ("nan", 0.0)),
    ops=("jnp.tanh({v})",),
    errors="all_checks",
    call="forward",
    jit=True,
    grad="remat",
    chunk=5,
)


#: two out-of-bounds lookups: the first fires in row 10 only (the remainder), the second in
#: rows 5, 9 and 10; the original reports the first, as must the region's own rule
ORDER_PAIR = dataclasses.replace(
    PAIR, sites=(("index", -0.9), ("index", 0.0)), errors="index_checks"
)


@pytest.mark.slow
@pytest.mark.parametrize("pair", [PAIR, ORDER_PAIR], ids=["kinds", "order"])
def test_check_family_pair(tmp_path, pair):
    assert checks.check(pair, tmp_path) is None


def test_check_family_can_fail(tmp_path):
    """The report differs where the error differs: another first erroring row (the index
    names it), and another kind of error first."""
    f, file = checks.load(PAIR, tmp_path)
    expected = checks.report(PAIR, f, file)
    assert expected[0] is not None
    later = dataclasses.replace(PAIR, sites=(("index", 0.0), ("nan", 0.0)))
    g, file2 = checks.load(later, tmp_path)
    assert checks.report(later, g, file2)[0] != expected[0]
    swapped = dataclasses.replace(PAIR, sites=(("nan", 0.0), ("index", -0.5)))
    h, file3 = checks.load(swapped, tmp_path)
    assert checks.report(swapped, h, file3)[0] != expected[0]
