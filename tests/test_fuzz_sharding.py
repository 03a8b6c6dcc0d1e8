"""The fuzzer's ``shard`` family: ``jax.shard_map`` stacks on 8 CPU devices.

A serialized function called inside ``jax.shard_map`` (per-shard microbatching,
``in_specs=(P(), P('d'), ...)``, default ``check_vma=True``), with ``jax.grad`` /
``jax.value_and_grad`` / ``jit`` / ``checkpoint`` inside and ``jit`` / ``grad`` outside. The
device count is fixed when JAX starts and the test process has one device (``conftest.py``),
so the pairs run in a subprocess, ``python -m tests.fuzz --families shard``, that prints one
JSON result per line; the assertion is the one of ``test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .fuzz.driver import assert_no_failures, result_from_json

pytestmark = pytest.mark.integration  # a subprocess with 8 CPU devices

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 16


def test_fuzz_shard_map_8_devices() -> None:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["JAXPR_ACCUM_STRICT"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "tests.fuzz", "--families", "shard", "--examples", str(EXAMPLES)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = [result_from_json(json.loads(ln)) for ln in proc.stdout.splitlines() if ln]
    assert_no_failures(results, EXAMPLES)
