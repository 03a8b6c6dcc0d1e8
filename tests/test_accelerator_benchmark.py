"""``benchmarks/accelerator.py`` at its tiny size on the CPU, so the script measured on a TPU
cannot rot: every program compiles, the serialized ones save memory and agree with the
original's gradient, and the largest-batch search runs."""

from __future__ import annotations

import re

import pytest

from benchmarks import accelerator

pytestmark = pytest.mark.slow


def test_the_accelerator_benchmark_runs_at_its_tiny_size(capsys):
    accelerator.main(["--size", "tiny", "--largest"])
    out = capsys.readouterr().out
    rows = re.findall(
        r"^(serialize_axis, chunk \d+)\s+([\d.]+ \w+)\s+([\d.]+)\s.*?([\d.e+-]+)$", out, re.M
    )
    assert len(rows) == 3, out  # two chunks of the model, one of SimCLR
    for name, _, ratio, rel_l2 in rows:
        assert float(ratio) < 1.0, (name, out)
        assert float(rel_l2) < 1e-5, (name, out)
    assert out.count("largest batch that fits") == 4, out
