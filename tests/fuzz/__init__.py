"""A differential fuzzer over transformation stacks: the original function is the oracle.

Hypothesis draws a program (``programs.py``: the idioms users write) and a stack of JAX
transformations around it (``stacks.py``); the same stack is applied to the original and to
``ja.serialize_axis(f, chunk=k, grad=mode)``, and the results must agree leaf by leaf
(``runner.py``). Entry points: ``tests/test_fuzz.py`` (CI, derandomized) and
``tests/fuzz/campaign.py`` (long random campaigns with a summary of failure classes).
"""

from .runner import FAILURES, OUTCOMES, Pair, Result, pairs, run_pair, script, shrink
from .stacks import FAMILIES

__all__ = [
    "FAILURES",
    "FAMILIES",
    "OUTCOMES",
    "Pair",
    "Result",
    "pairs",
    "run_pair",
    "script",
    "shrink",
]
