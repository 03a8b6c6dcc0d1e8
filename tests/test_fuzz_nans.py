"""The NaN/Inf family of the fuzzer (``tests/fuzz/nans.py``), derandomized for CI: under
``jax_debug_nans`` / ``jax_debug_infs``, a value first made invalid in the forward pass is
reported as the original reports it (the primitive and the program's line), in every grad
mode, before, in and after the loop, plain, jitted and differentiated. The default tier runs
a few pairs and checks that the family can fail; the slow tier runs the family."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given

from .fuzz import nans
from .fuzz.driver import derandomized

#: pairs in the slow tier's run
PAIRS = 20


@pytest.mark.slow
@derandomized(PAIRS)
@given(nans.nan_pairs())
def test_fuzz_nan_family(tmp_path_factory, pair):
    failure = nans.check(pair, tmp_path_factory.mktemp("nans"))
    assume(failure not in (nans.NO_ERROR, nans.RESIDUAL_ONLY))
    assert failure is None, failure


#: found by the family (CI's draws of 20 pairs): an Inf absorbed by ``tanh`` before any result,
#: its gradient a NaN, under ``jax_debug_infs`` and an eager ``jax.value_and_grad``
RESIDUAL = nans.NanPair(
    (), "jnp.exp(-200.0 * h)", ("jnp.tanh({v})",), "body", "value_and_grad", "auto", 4
)


def test_an_inf_that_only_residuals_hold_is_classified(tmp_path):
    assert nans.check(RESIDUAL, tmp_path) == nans.RESIDUAL_ONLY


@pytest.mark.xfail(strict=True, reason="the loop keeps no residuals (docs/semantics.md)")
def test_an_inf_that_only_residuals_hold_is_reported_as_the_original_does(tmp_path):
    f, file = nans.load(RESIDUAL, tmp_path)
    expected = nans.report(RESIDUAL, nans.jax.jit(f), file)
    sf = nans.ja.serialize_axis(f, chunk=RESIDUAL.chunk, argnums=1, grad=RESIDUAL.grad)
    assert nans.report(RESIDUAL, sf, file) == expected


FAST = [
    nans.NanPair(("jnp.tanh({v})",), "jnp.log(h)", ("{v} * {v}",), "body", call, grad, chunk)
    for call, grad, chunk in [
        ("jit_value_and_grad", "fused", 5),
        ("jit_value_and_grad", "native", 4),
        ("jit", "remat", nans.N),
    ]
] + [
    nans.NanPair((), "jnp.exp(-200.0 * h)", (), "body", "jit_grad", "auto", 5),
    nans.NanPair((), "jnp.arccosh(h + 1.0)", ("jnp.cos({v})",), "epilogue", "jit", "fused", 5),
    nans.NanPair(("jnp.sin({v})",), "jnp.sqrt(h)", (), "prologue", "value_and_grad", "remat", 4),
]


@pytest.mark.parametrize("pair", FAST, ids=lambda p: p.summary())
def test_nan_family_pairs(tmp_path, pair):
    assert nans.check(pair, tmp_path) is None


def test_nan_family_can_fail(tmp_path):
    """The family fails where the report differs: the same program with the invalid value
    made one line later in the serialized function's copy (its line no longer the original's)
    and with another primitive."""
    pair = FAST[0]
    f, file = nans.load(pair, tmp_path)
    expected = nans.report(pair, f, file)
    shifted = dataclasses.replace(pair, before=(*pair.before, "{v} * 1.0"))
    g, file2 = nans.load(shifted, tmp_path)
    got = nans.report(shifted, nans.ja.serialize_axis(g, chunk=5, argnums=1, grad="fused"), file2)
    assert got[0] == expected[0] and got[1] == expected[1] + 1, (got, expected)
    other = dataclasses.replace(pair, maker="jnp.sqrt(h)")
    h, file3 = nans.load(other, tmp_path)
    assert nans.report(other, h, file3)[0] != expected[0]
