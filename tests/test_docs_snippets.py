"""The docs run: every python snippet of every page in ``docs/check_snippets.PAGES`` runs, and
what it prints matches the output the page shows after it (``docs/check_snippets.py`` has the
rules: ``...`` placeholders, ``<!-- output: approximate -->``, ``<!-- fresh -->``,
``<!-- skip -->``). Each page's scripts run in subprocesses, in a virtualenv holding only the
page's install line (one per distinct line, shared by the pages and the xdist workers of the
run), so a snippet that imports what its page does not install fails: the integration tier.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_snippets", ROOT / "docs" / "check_snippets.py"
)
check_snippets = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = check_snippets  # dataclasses look their module up there
_spec.loader.exec_module(check_snippets)


@pytest.fixture(scope="session")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the pages' virtualenvs are made: this run's, shared by its xdist workers."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "snippet-venvs"


@pytest.mark.parametrize("page", check_snippets.PAGES)
def test_page_snippets_run_and_print_what_the_page_shows(page: str, venvs: Path) -> None:
    path = ROOT / "docs" / page
    problems = check_snippets.check_page(path, venvs=venvs)
    assert not problems, "\n\n".join(problems)


def test_each_page_gives_the_install_line_its_snippets_need() -> None:
    """The lines the pages give (the pages that import Flax or call ``plot()`` name its
    extra); and a snippet run in a virtualenv without what it imports fails."""
    lines = {
        page: check_snippets.install_line(ROOT / "docs" / page) for page in check_snippets.PAGES
    }
    assert lines["quickstart.md"] == "pip install -e '.[flax,plot]'", lines
    assert lines["testing.md"] == "pip install -e '.[flax,testing]'", lines
    assert lines["faq.md"] == lines["index.md"] == "pip install -e '.[flax]'", lines
    assert lines["api.md"] == lines["errors.md"] == "pip install -e .", lines
    assert len(set(lines.values())) <= 4, lines  # the pages share four virtualenvs


def test_a_snippet_importing_what_its_page_does_not_install_fails(
    tmp_path: Path, venvs: Path
) -> None:
    page = tmp_path / "page.md"
    page.write_text("Install: `pip install -e .`.\n\n```python\nimport flax\n```\n")
    (problem,) = check_snippets.check_page(page, venvs=venvs)
    assert "No module named 'flax'" in problem, problem


def test_every_page_with_python_snippets_is_checked() -> None:
    pages = {p.name for p in (ROOT / "docs").glob("*.md") if "```python" in p.read_text()}
    assert pages <= set(check_snippets.PAGES), sorted(pages - set(check_snippets.PAGES))


def test_output_matching_rules() -> None:
    """The comparison itself: trailing whitespace, ``...`` lines and in-line ``...``,
    approximate numbers."""
    matches = check_snippets.matches
    assert matches("a  \nb\n\n", "\na\nb   \n")
    assert not matches("a\nb", "a\nc")
    assert not matches("a", "a\nb")
    assert matches("a\n...\nd", "a\nb\nc\nd")
    assert matches("a\n...\nd", "a\nd")
    assert not matches("a\n...\nd", "a\nb\ne")
    assert matches("took ... s", "took 1.5 s")
    assert not matches("took 1.5 s", "took 2.5 s")
    assert matches("took 1.5 s, 3 MiB", "took 2.25 s, 12 MiB", approximate=True)
    assert not matches("took 1.5 s", "took 2.5 ms", approximate=True)


def test_text_after_a_python_block_is_its_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint('one')\n```\n\n```text\none\n```\n\n"
        "Prose.\n\n```text\nnot an output\n```\n\n"
        "<!-- fresh -->\n```python\nprint(2)\n```\n\n<!-- output: skip -->\n```text\n3\n```\n\n"
        "```python\nprint(4.5)\n```\n<!-- output: approximate -->\n```text\n4.0\n```\n\n"
        "<!-- skip -->\n```python\nraise SystemExit(1)\n```\n"
    )
    scripts = check_snippets.scripts(page)
    assert [[s.expected for s in script.snippets] for script in scripts] == [
        ["one\n"],
        [None, "4.0\n"],
    ]
    assert scripts[1].snippets[1].approximate
    assert check_snippets.check_page(page) == []
    page.write_text("```python\nprint('one')\n```\n\n```text\ntwo\n```\n")
    (problem,) = check_snippets.check_page(page)
    assert "-two" in problem and "+one" in problem, problem
