"""The real-model zoo: small configurations of public example models, serialized as a user would.

Each :class:`Case` is a loss written in the style of a public project's example (the same
layers and calls: Flax linen and NNX, Equinox, Haiku, NumPyro, optax), with random inputs
(no weights, no datasets), sized so that activations over the batch or sample axis dominate
the parameters and so that the three checks of ``tests/test_real_models.py`` run in seconds
on a CPU:

- ``make() -> (loss, args)``: the loss, a plain function of array pytrees, and its arguments;
- how to serialize it: ``argnums=`` / ``axis=`` (microbatching), ``size=`` (an axis born
  inside: Monte-Carlo samples, particles) or neither (automatic);
- ``n``: the size of that axis; every check runs at ``chunk = n // 8``;
- ``expected_stops``: the primitives at which the chunked region may stop (empty by default:
  any stop is a failure of check (a));
- ``xfail``: per check (``"chunked"``, ``"exact"``, ``"memory"``), the known shortfall of the
  library that makes it fail, with the primitive and the measured figure. These are strict,
  so they fail (XPASS) once the library is fixed: then delete the entry.

The models import their library lazily (``make`` imports it), so that this module imports
without the optional ``models`` extra; ``tests/test_real_models.py`` skips a case whose
library is missing.

``python benchmarks/real_models.py`` prints the table of ``docs/real-models.md``. Shared by
the tests and the benchmarks (``benchmarks.zoo`` from the tests, ``zoo`` from a benchmark):
it imports the public API only, and nothing of the tests.
"""

from .case import Case
from .cases import CASES, available, case
from .checks import (
    CHECKS,
    MEMORY_LIMIT,
    Measured,
    count_loops,
    float_argnums,
    measure,
    serialized,
    stop_primitive,
    temp_bytes,
)

__all__ = [
    "CASES",
    "CHECKS",
    "MEMORY_LIMIT",
    "Case",
    "Measured",
    "available",
    "case",
    "count_loops",
    "float_argnums",
    "measure",
    "serialized",
    "stop_primitive",
    "temp_bytes",
]
