"""Test configuration: one CPU device, Hypothesis profiles, test tiers.

Tiers (markers registered in ``pyproject.toml``): the default run, ``python -m pytest -q``,
is the fast tier (``-m 'not slow and not integration'`` in ``addopts``); ``-m slow`` runs
the full parametrisation matrices, the models and long property runs; ``-m integration``
runs what starts subprocesses (examples, docs snippets, multi-device and multi-process
checks); ``-m ''`` runs everything. Tests tier themselves, where they are written: a module's
``pytestmark``, a test's ``@pytest.mark.slow`` or a parameter's ``pytest.param(...,
marks=pytest.mark.slow)`` (``tests/oracle.py``'s ``modes`` splits the gradient modes). A test
is in exactly one tier: marking it both ``slow`` and ``integration`` is an error, so that
running the three tiers runs every test once. In the default tier a
``jaxpr_accum.PlanWarning`` that the test neither asserts nor filters is an error.

Workers: ``-n 2 --dist loadgroup`` (``addopts``). A module whose tests must share one worker
(a module fixture that starts subprocesses, or computes a whole sweep) is marked
``xdist_group``. pytest-xdist 3.8 groups by a suffix of the node id that pytest 9 no longer
reads, so it would split each group over the workers: the ``test`` extra pins ``pytest<9``,
where it works.

Profiles (select with ``HYPOTHESIS_PROFILE=<name>``; default ``ci``):

* ``ci``: few examples, derandomized (the same examples on every run), no example database.
* ``dev``: more examples, random, with the local example database.
* ``thorough``: many examples, for an occasional long run.
"""

from __future__ import annotations

import os

# Everything on one CPU device, set before JAX is imported anywhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# Every internal fallback is an error in the project's own tests (``_fallback``).
os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    max_examples=9,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW,
)
settings.register_profile(
    "dev", max_examples=40, deadline=None, print_blob=True, suppress_health_check=_SLOW
)
settings.register_profile(
    "thorough", max_examples=400, deadline=None, print_blob=True, suppress_health_check=_SLOW
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


TIERS = ("slow", "integration")
PLAN_WARNINGS_ARE_ERRORS = "error::jaxpr_accum.PlanWarning"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            # The default tier shows no warning that no test expects: a PlanWarning is an
            # error unless the test asserts it (pytest.warns) or filters it itself (its own
            # filterwarnings marks and catch_warnings blocks take precedence over this one).
            item.add_marker(pytest.mark.filterwarnings(PLAN_WARNINGS_ARE_ERRORS), append=False)
    both = [item.nodeid for item in items if all(item.get_closest_marker(t) for t in TIERS)]
    if both:
        raise pytest.UsageError(
            "a test is in one tier: marked both 'slow' and 'integration': " + ", ".join(both)
        )
