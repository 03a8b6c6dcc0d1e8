"""The differential fuzzer over transformation stacks (``tests/fuzz``), derandomized for CI.

Hypothesis draws a program from the grammar of the idioms users write and a stack of JAX
transformations; the stack applied to the original function is the oracle for the same stack
applied to ``ja.serialize_axis(f, chunk=k, grad=mode)``, every grad mode and chunk sizes of
every kind (1, a divisor, a non-divisor, the axis, more than the axis). A test fails when any
pair is a ``MISMATCH`` (a silently wrong value or gradient) or a ``CRASH`` (the serialized
function raises where the original runs), or when the fuzzer itself generated a broken
script; the message lists each failure class once with a standalone repro script (the
program's source, the stack, the chunk and the mode) of its smallest example. The original
failing under a stack, and the documented ``ja.SerializeError``, are counted, not failures.

The slow tier runs ``sum(EXAMPLES.values())`` = 300 pairs, in one test per stack family
(so that ``-n 2`` spreads them); the ``shard`` family needs 8 devices and runs in a
subprocess (``python -m tests.fuzz``), in the integration tier: ``test_fuzz_sharding.py``.
Longer random campaigns: ``python benchmarks/fuzz_campaign.py --pairs 5000 --seed N``.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")

from .fuzz.driver import assert_no_failures, run_examples  # noqa: E402

pytestmark = pytest.mark.slow

#: pairs per stack family in one CI run (slow tier), 300 in all
EXAMPLES = {
    "plain": 60,
    "reverse": 55,
    "vmap": 50,
    "vmap_unchunked": 45,
    "forward": 40,
    "mixed": 50,
}


@pytest.mark.parametrize("family", list(EXAMPLES))
def test_fuzz_stack_family(family: str) -> None:
    n = EXAMPLES[family]
    assert_no_failures(run_examples([family], n, derandomize=True), n)
