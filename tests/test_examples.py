"""Smoke tests: every script in ``examples/`` runs with ``--quick`` and exits 0 (the demo:
``tests/test_demo.py``).

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

# The subprocesses start once per module (one xdist worker: loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("examples")]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    "mc_vae.py",
    "dropout_transformer.py",
    "nnx_grad_accum.py",
    "long_attention.py",
    "large_vocab_loss.py",
    "vmc_sr.py",
    "contrastive.py",
    "dp_sgd.py",
    "dpo.py",
]
COMMANDS = {name: [str(ROOT / "examples" / name), "--quick"] for name in EXAMPLES}
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def running():
    """Start every example at once; ``{name: Popen}``."""
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    env.setdefault("JAX_PLATFORMS", "cpu")
    procs = {
        name: subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, argv in COMMANDS.items()
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_example_runs(running, name):
    proc = running[name]
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{name} --quick ran past {TIMEOUT_S} s:\n{output[-4000:]}")
    assert proc.returncode == 0, f"{name} --quick failed:\n{output[-4000:]}"
    assert "XLA temp memory" in output
