"""The checkify family of the fuzzer (``tests/fuzz/checks.py``), derandomized for CI: under
``jax.experimental.checkify`` with every error set, a serialized function reports what the
original reports (the same ``err.get()`` text, the same line of the program where the
original names one), or no error where it reports none, in every grad mode, plain, under
``grad``, ``value_and_grad``, ``jvp`` and ``vmap`` (inside and outside ``checkify``), at each
step of a ``lax.scan`` of the user's, jitted and eager. The default tier runs a check that
the family can fail; the slow tier runs two pairs and the family. No difference is
tolerated: the loops that JAX derives from the region's passes (native's, ``jvp``'s,
``vmap``'s, the backward pass) report as the region's own rule does."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given

from .fuzz import checks
from .fuzz.driver import derandomized

#: pairs in the slow tier's run
PAIRS = 14


@pytest.mark.slow
@derandomized(PAIRS)
@given(checks.check_pairs())
def test_fuzz_check_family(tmp_path_factory, pair):
    failure = checks.check(pair, tmp_path_factory.mktemp("checks"))
    assume(failure not in (checks.ORIGINAL_RAISES, checks.FUSED_INFINITE_COTANGENT))
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


#: the pairs the family found failing once its programs ran their sites in a ``lax.scan`` of
#: the user's, each a class fixed since (docs/fuzzing.md)
IN_A_SCAN = {
    # ``jnp.take``'s lookup, inlined from its ``jit`` inside the scan, lost its line: its
    # check ranked as the package's own, after the NaN it makes
    "take in a scan": dataclasses.replace(
        PAIR, sites=(("index", -0.5), ("index", 0.7)), ops=(), steps=3, delays=(0.0, 0.0)
    ),
    # the lookup along a chunked row inside the scan named the chunk's shape, not the
    # operand's as written (``written_body`` held no nested equation)
    "row lookup in a scan": dataclasses.replace(
        PAIR,
        sites=(("nan", -0.5), ("index_row", -0.5)),
        ops=(),
        errors="index_checks",
        call="vmap_inside",
        jit=False,
        steps=3,
        delays=(0.6, 0.0),
    ),
    # the check first in the body fires at a later step, in another chunk: the original
    # reports the one of the earlier step
    "steps across chunks": dataclasses.replace(
        PAIR, sites=(("nan", 0.0), ("index", -0.9)), ops=(), steps=3, delays=(0.6, 0.0)
    ),
    # fused computes a chunk's tangents apart from its values: the clock restarted there, so
    # a NaN the tangents' ``add`` makes counted as sooner than the ``log`` that made it
    "tangents of a scan": dataclasses.replace(
        PAIR,
        sites=(("nan", 0.7), ("index", -2.0)),
        ops=(),
        call="grad",
        jit=False,
        grad="fused",
        steps=3,
        delays=(0.0, 0.0),
    ),
    # the backward pass runs the scan's steps from the last: of two NaNs there, the one made
    # at the last step (a custom VJP's lookup) comes first, not the one first in the body
    "backward pass of a scan": dataclasses.replace(
        PAIR,
        sites=(("backward_index", 0.7), ("index", -2.0)),
        ops=(),
        errors="nan_checks",
        call="grad",
        grad="fused",
        chunk=12,
        steps=3,
        delays=(0.6, 0.6),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(IN_A_SCAN.values()), ids=list(IN_A_SCAN))
def test_check_family_in_a_scan(tmp_path, pair):
    assert checks.check(pair, tmp_path) is None


#: the pairs the family found failing once it called the function (or its gradient) at each
#: step of a ``lax.scan`` of the user's (``STEP_SCALES``: different sites fire at different
#: steps), each a class fixed since; JAX traces the step once, so every step's checks have
#: the same codes
AT_EACH_STEP = {
    # a check at a later step, first in the program, replaced the earlier step's error (the
    # loop's forward pass merged its checks by code, not first come)
    "two NaNs at two steps": dataclasses.replace(
        PAIR,
        sites=(("nan", -0.9), ("nan", -0.5)),
        ops=("jnp.tanh({v})",),
        errors="nan_checks",
        call="grad_steps",
        jit=False,
    ),
    # likewise, by the checks the backward pass makes again in the chunks it recomputes
    "recomputed in the backward pass": dataclasses.replace(
        PAIR,
        sites=(("nan", -0.9), ("backward_index", 0.0)),
        ops=(),
        errors="nan_checks",
        call="grad_steps",
        grad="native",
        chunk=12,
    ),
    "recomputed, then a NaN after the region": dataclasses.replace(
        PAIR,
        sites=(("index_row", -0.9), ("backward_index", -0.5)),
        ops=(),
        errors="float_checks",
        call="grad_steps",
        grad="fused",
        chunk=4,
        tail=True,
    ),
    # a check that only the derivative makes (``h ** 3``'s ``3 * h ** 2``, in the chunks the
    # backward pass recomputes) at a later step replaced the earlier step's error: what the
    # loop's forward pass was entered with now travels to its backward pass in the error
    **{
        f"a derivative's check at a later step, {mode}": dataclasses.replace(
            PAIR,
            sites=(("index", 0.0),),
            ops=("{v} + 0.5 * {v} ** 3", "{v} * 1.5"),
            errors="float_checks",
            call="grad_steps",
            jit=False,
            grad=mode,
            steps=3,
            delays=(0.6, 0.0),
        )
        for mode in ("remat", "native")
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(AT_EACH_STEP.values()), ids=list(AT_EACH_STEP))
def test_check_family_at_each_step_of_a_scan(tmp_path, pair):
    assert checks.check(pair, tmp_path) is None


#: the pairs the family found failing once a NaN outside the region came between its lines
#: (it runs after the loop, its checks ordered as the program has them), each a class fixed
#: since: ``jax.vmap`` meets copies of the body in turn (batched, and an element's), whose
#: codes interleaved with the part's; a part of many checks ran out of codes; JAX hoists a
#: part of the forward pass out of a linearized loop of yours, whose codes were forgotten
BETWEEN_THE_BODY = {
    "copies of the body, a derivative's check": dataclasses.replace(
        PAIR,
        sites=(("backward_nan", 0.7), ("user", 0.0)),
        ops=(),
        errors="float_checks",
        call="grad_of_vmap",
        jit=False,
        grad="fused",
        chunk=4,
        outside=("between", "column", True),
    ),
    "a part of many checks": dataclasses.replace(
        PAIR,
        sites=(("user", -2.0), ("div", 0.0)),
        ops=("{v} * 1.5",),
        call="grad_of_vmap",
        jit=False,
        grad="remat",
        outside=("between", "whole", True),
    ),
    "a forward pass in two parts": dataclasses.replace(
        PAIR,
        sites=(("index_row", -0.5), ("nan", 0.7)),
        ops=("jnp.tanh({v})", "jnp.sin({v})"),
        errors="float_checks",
        call="grad",
        jit=False,
        grad="fused",
        steps=3,
        delays=(0.6, 0.6),
        outside=("between", "whole", True),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(BETWEEN_THE_BODY.values()), ids=list(BETWEEN_THE_BODY))
def test_check_family_between_the_body(tmp_path, pair):
    assert checks.check(pair, tmp_path) is None


@pytest.mark.slow
def test_two_kinds_in_a_scan_under_grad_in_remat(tmp_path):
    """Under ``value_and_grad`` the original orders the checks of its linearized scan as
    JAX's partial evaluation places them (the lookup before the division, the reverse of
    the body: JAX hoists the lookup, whose indices do not change, out of the loop); remat
    checks its forward pass as that linearization computes it, so it reports the same."""
    pair = dataclasses.replace(
        PAIR,
        sites=(("div", 0.0), ("index", -0.5)),
        ops=(),
        call="value_and_grad",
        chunk=4,
        steps=3,
        delays=(0.6, 0.0),
    )
    assert checks.check(pair, tmp_path) is None


@pytest.mark.slow
def test_fused_with_an_infinite_cotangent(tmp_path):
    """The documented difference (docs/errors.md), found by the family: ``+inf`` in a row
    makes the cotangent of the mean infinite; the original's NaN is made in its reduction
    (``reduce_sum``, at ``h = x * w``), fused's in its product with the Jacobian (``mul``)."""
    pair = dataclasses.replace(
        PAIR, sites=(("infinities", -0.9),), ops=(), call="grad", grad="fused", chunk=4
    )
    assert checks.check(pair, tmp_path) == checks.FUSED_INFINITE_COTANGENT
    remat = dataclasses.replace(pair, grad="remat")
    assert checks.check(remat, tmp_path) is None


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
