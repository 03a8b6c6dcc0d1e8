"""The public API's types, as a type checker sees them: mypy on ``tests/typecheck/public_api.py``
(the wrapped function's signature kept through ``serialize_axis``, direct and as a decorator;
``explain``, ``jaxpr`` and ``sweep`` precisely typed) must flag exactly its lines marked
``# mypy: error``, among them deliberate mismatches, so the check can fail."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ROOT / "tests" / "typecheck" / "public_api.py"


def test_mypy_flags_exactly_the_marked_lines(tmp_path):
    pytest.importorskip("mypy")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--no-error-summary", str(CHECKED)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    flagged = {int(m.group(1)) for m in re.finditer(r"public_api\.py:(\d+): error:", run.stdout)}
    lines = CHECKED.read_text().splitlines()
    marked = {i for i, line in enumerate(lines, 1) if line.endswith("# mypy: error")}
    assert len(marked) >= 5, marked
    assert flagged == marked, run.stdout + run.stderr
    assert run.returncode == 1, run.stdout + run.stderr
