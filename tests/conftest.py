"""Test configuration: one CPU device, Hypothesis profiles.

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

import jax  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    max_examples=12,
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
