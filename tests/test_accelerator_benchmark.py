"""``benchmarks/accelerator.py`` at its tiny size on the CPU, so the script measured on a TPU
cannot rot: every program compiles, the serialized ones save memory and agree with the
original's gradient, and the largest-batch search runs."""

from __future__ import annotations

import re

import pytest

from benchmarks import accelerator

pytestmark = pytest.mark.slow


def test_the_accelerator_benchmark_runs_at_its_tiny_size(capsys):
    accelerator.main(["--size", "tiny", "--steps", "measure", "compare", "largest"])
    out = capsys.readouterr().out
    ratios = re.findall(r"^(serialize_axis, chunk \d+)\s+[\d.]+ \w+\s+([\d.]+)\s", out, re.M)
    agreements = re.findall(
        r"^gradient at highest precision, (serialize_axis, chunk \d+): relative L2 (\S+)$",
        out,
        re.M,
    )
    assert len(ratios) == len(agreements) == 2, out  # one chunk of the model, one of SimCLR
    for name, ratio in ratios:
        assert float(ratio) < 1.0, (name, out)
    for name, rel_l2 in agreements:
        assert float(rel_l2) < 1e-5, (name, out)
    assert out.count("largest batch that fits") == 3, out  # the original, serialized, by hand
