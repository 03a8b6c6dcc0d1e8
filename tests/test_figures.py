"""The figures the README and the docs state about the project (test counts, tier times,
example memory) are the ones ``docs/figures.py`` recorded in ``docs/figures.json``: every
``<!--fig:KEY-->VALUE`` mark of its pages agrees with the record (counts and bytes exact,
ratios to the digits shown, times within 25%), and no figure of that kind is left unmarked.
The integration tier checks that the recorded test counts are what the tiers collect now
(rerun ``python docs/figures.py`` after adding tests)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("figures", ROOT / "docs" / "figures.py")
assert _spec is not None and _spec.loader is not None
figures = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = figures
_spec.loader.exec_module(figures)

RECORD = json.loads(figures.RECORD.read_text())
#: A figure about the project, outside code blocks: a count of tests, seconds, bytes.
_FIGURE = re.compile(r"(?<![\w.,-])(\d[\d,.]*)(?= ?(?:tests\b|s wall|CPU-seconds|B\b))")
_CODE = re.compile(r"^```.*?^```", re.S | re.M)


def _marks(page: Path) -> list[tuple[str, str]]:
    return figures.MARK.findall(page.read_text())


def test_every_marked_figure_is_the_recorded_one():
    seen = 0
    for page in figures.PAGES:
        for key, shown in _marks(page):
            recorded = figures.lookup(RECORD, key)
            assert figures.agrees(key, recorded, shown), (page.name, key, shown, recorded)
            seen += 1
    assert seen >= 30, seen  # the README's picture and figures, the overview, the quick start


def test_no_figure_of_the_project_is_left_unmarked():
    for page in figures.PAGES:
        text = _CODE.sub("", page.read_text())
        for m in _FIGURE.finditer(text):
            before = text[: m.start()]
            assert re.search(r"<!--fig:[\w.]+-->$", before), (
                page.name,
                m.group(0),
                text[m.start() - 80 : m.end() + 20],
            )


def test_the_check_compares_as_stated(tmp_path):
    """Counts and bytes exact, ratios to the digits shown, times within 25%; and writing the
    pages puts the recorded figures back."""
    agrees = figures.agrees
    assert agrees("tests.default", 555, "555") and not agrees("tests.default", 555, "556")
    assert agrees("models.mc.before", 13107264, "13,107,264")
    assert not agrees("models.mc.before", 13107264, "13,107,265")
    assert agrees("models.mc.ratio", 0.03, "0.03") and not agrees("models.mc.ratio", 0.03, "0.04")
    assert agrees("models.mc.grad_rel", 4e-07, "4e-07") and not agrees("x.grad_rel", 4e-07, "3e-07")
    assert agrees("times.demo.wall_s", 20, "24") and not agrees("times.demo.wall_s", 20, "26")
    page = tmp_path / "page.md"
    page.write_text("<!--fig:tests.default-->1 tests, <!--fig:models.mc.before-->2 B\n")
    record = {"tests": {"default": 562}, "models": {"mc": {"before": 13107264}}}
    old = figures.PAGES
    try:
        figures.PAGES = [page]
        assert figures.write_pages(record) == [page]
    finally:
        figures.PAGES = old
    assert (
        page.read_text()
        == "<!--fig:tests.default-->562 tests, <!--fig:models.mc.before-->13,107,264 B\n"
    )


@pytest.mark.integration
def test_the_recorded_test_counts_are_what_the_tiers_collect():
    counts = figures.count_tests()
    assert counts == {tier: RECORD["tests"][tier] for tier in figures.TIERS}, (
        "rerun `python docs/figures.py --section tests`; commit docs/figures.json and the pages"
    )
