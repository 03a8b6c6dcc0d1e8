"""Smoke tests: every script in ``examples/`` runs with ``--quick`` and exits 0.

Each example asserts that its serialized loss and gradients agree with the undecorated
original's (relative 2e-4), so exit status 0 means the example's claim holds. The scripts
are started together, as subprocesses, and each test waits for its own. XLA compilation
dominates their time, so they run with XLA's backend optimisation off
(``--xla_backend_optimization_level=0``: about 3x faster to compile on CPU; the examples'
checks apply unchanged, and the memory figures they print were the same in our runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flax")
pytest.importorskip("optax")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["mc_vae.py", "dropout_transformer.py", "nnx_grad_accum.py"]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def running():
    """Start every example at once; ``{name: Popen}``."""
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    env.setdefault("JAX_PLATFORMS", "cpu")
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / name), "--quick"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in EXAMPLES
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(running, name):
    proc = running[name]
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"examples/{name} --quick ran past {TIMEOUT_S} s:\n{output[-4000:]}")
    assert proc.returncode == 0, f"examples/{name} --quick failed:\n{output[-4000:]}"
    assert "XLA temp memory" in output
