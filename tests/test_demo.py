"""``python -m jaxpr_accum demo``: it says first what it will do, reports progress on stderr and
results on stdout, and runs ``examples/mc_vae.py``'s model, which the wheel ships as
``jaxpr_accum.examples``; the report's candidate list shows what a user would act on."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax.numpy as jnp
import pytest

import jaxpr_accum as ja
from jaxpr_accum._report._plan_text import CandidateAxis

ROOT = Path(__file__).resolve().parent.parent
FIRST_LINE_CPU_S = 5.0  # the intro is printed before anything is traced or compiled


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux ``/proc``; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.integration
def test_demo_quick_says_what_it_does_first_then_progress_on_stderr_results_on_stdout():
    env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
    env.setdefault("JAX_PLATFORMS", "cpu")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxpr_accum", "demo", "--quick"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    start = time.perf_counter()
    first = proc.stdout.readline()
    first_wall, first_cpu, err_before = time.perf_counter() - start, _cpu_seconds(proc.pid), [*err]
    out = first + proc.stdout.read()
    proc.wait(timeout=600)
    reader.join(timeout=10)
    stderr = "".join(err)
    assert proc.returncode == 0, out[-3000:] + stderr[-3000:]

    assert first.startswith("jaxpr_accum demo: a Monte-Carlo encoder-decoder"), first
    assert "examples/mc_vae.py" in first and "chunks of 4" in first, first
    # nothing was started before it: the stderr reader may win the race for the first
    # progress line, written right after, at 0.0 s, but for no later one
    assert all("[   0.0 s]" in line for line in err_before), err_before
    if first_cpu is not None:
        assert first_cpu < FIRST_LINE_CPU_S, (first_cpu, first_wall)

    steps = [s for s in stderr.splitlines() if s.startswith("jaxpr_accum ")]
    for step in (
        "initialising the parameters",
        "planning chunk 4",
        "compiling and checking original",
        "compiling and checking chunk 4",
        "timing round 1/",
        "done",
    ):
        assert any(step in s for s in steps), (step, stderr)
    assert "temp memory" not in stderr and "result:" not in stderr, stderr

    assert "temp memory" in out and "result: OK" in out, out
    assert "jaxpr_accum sweep [" not in out and "jaxpr_accum demo  [" not in out, out
    assert "examples/mc_vae.py:" in out, out  # the plan points at the example's lines
    for word in ("seed", "motivating"):
        assert word not in (out + stderr).lower(), out + stderr


def test_the_report_lists_only_candidates_that_save_memory_and_counts_the_others():
    """``str(plan)`` and its HTML list the chosen axis, the others estimated to save memory
    (the best 5), and a count of the rest: those that save less, those that cost memory."""
    plan = ja.serialize_axis(jnp.sin, chunk=2, grad="remat").explain(jnp.ones((8, 3)))
    chosen = CandidateAxis(8, "dimension 0 of x", 1000, True)
    saving = [CandidateAxis(4, f"saving {i}", 100 + i, False) for i in range(7)]
    costly = [CandidateAxis(3, f"costly {i}", -32, False) for i in range(4)]
    text = str(dataclasses.replace(plan, candidates=[*costly, chosen, *saving]))
    listed = [line.strip() for line in text.splitlines() if line.startswith("    size ")]
    assert listed[0] == "size 8 at dimension 0 of x: 1000 B (chosen)", text
    assert [s.split(":")[0] for s in listed[1:]] == [
        f"size 4 at saving {i}" for i in (6, 5, 4, 3, 2)
    ]
    assert "and 2 more that would save less, 4 that would not save memory" in text, text
    assert "costs memory" not in text, text
    html = dataclasses.replace(plan, candidates=[chosen, *costly])._repr_html_()
    assert "costly" not in html and "and 4 more that would not save memory" in html, html
    only = str(dataclasses.replace(plan, candidates=[chosen, *saving[:2]]))
    assert "saving 1" in only and "saving 0" in only and "that would" not in only, only


def test_the_wheel_ships_every_package_and_the_examples():
    """``pyproject.toml`` lists the packages (``examples/`` is ``jaxpr_accum.examples``, where
    the demo imports its model from): every package directory must be in the list."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "jaxpr_accum").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == found | {"jaxpr_accum.examples"}
    assert setuptools["package-dir"] == {"jaxpr_accum.examples": "examples"}
    assert (ROOT / "examples" / "__init__.py").is_file()


def test_install_hints_suit_how_the_package_was_installed(tmp_path):
    """From a clone (a ``pyproject.toml`` beside the package): ``pip install -e '.[extra]'``;
    from a wheel (site-packages): ``pip install 'jaxpr-accum[extra]'``. This checkout is a
    clone, so the library's own hints (the demo's, ``Sweep.plot``'s) take the first form."""
    from jaxpr_accum._base._install import from_a_clone, install_hint

    clone, wheel = tmp_path / "jaxpr_accum", tmp_path / "site-packages"
    (clone / "jaxpr_accum").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\n")
    (wheel / "jaxpr_accum").mkdir(parents=True)
    assert install_hint("flax", clone / "jaxpr_accum") == "pip install -e '.[flax]'"
    assert install_hint("flax", wheel / "jaxpr_accum") == "pip install 'jaxpr-accum[flax]'"
    assert from_a_clone() and install_hint("plot") == "pip install -e '.[plot]'"
