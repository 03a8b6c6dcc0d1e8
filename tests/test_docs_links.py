"""Every document the repository cites is in the repository.

Reads every Markdown, Python, TOML and YAML file that git knows of (tracked, or untracked and
not ignored) for two kinds of reference:

- a Markdown link or image, ``[text](target)`` or ``![alt](target)`` (Markdown files only:
  in Python, ``f[i](x)`` is code); ``http(s)://`` and ``mailto:`` targets are not followed;
- a bare mention of a Markdown file, a word ending in ``.md`` (all four kinds of file): the
  mkdocs nav, a docstring's "see docs/faq.md", a comment. A name right after a quote is a
  string literal of code (a file a test writes), not a citation; the files the project's
  tools write (``WRITTEN``) are outputs, not documents.

A reference resolves when its path (the part before ``#``) names an existing file relative
to the citing file's folder, to the repository root, or to ``docs/`` (where the site's pages
cite each other and the mkdocs nav names them). A ``#anchor`` into a Markdown file must
name one of its headings (slugged as mkdocs' ``toc`` and GitHub do) or an explicit
``id``. Glob patterns (a ``*`` in the name) are not references. What does not exist yet
(a page another branch adds) may be cited only once it exists: the check reads the tree as
it is at test time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".md", ".py", ".toml", ".yml", ".yaml")
#: Markdown files that the project's tools write (outputs, not documents it cites).
WRITTEN = {"summary.md"}  # tests/fuzz/campaign.py's per-campaign summary

_URL = re.compile(r"(?:https?|mailto|ftp):[^\s)>\]'\"`]*")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_BARE = re.compile(r"(?<![\w*{}<$%.'\"-])((?:[\w.-]+/)*[\w-][\w.-]*\.md)(#[\w-]+)?(?![\w*-])")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
_EXPLICIT_ID = re.compile(r"""\bid=["']([^"']+)["']|\{#([\w-]+)\}""")


def repository_files() -> list[Path]:
    """The files git knows of (tracked, or untracked and not ignored) with a checked suffix."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = sorted({n for n in out.split("\0") if n.endswith(SUFFIXES)})
    this = Path(__file__).resolve()  # its probe cites missing pages on purpose
    return [ROOT / n for n in names if (ROOT / n).is_file() and ROOT / n != this]


def slug(heading: str) -> str:
    """The anchor of a heading, as Python-Markdown's ``toc`` (mkdocs) and GitHub make it:
    markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    """The anchors a Markdown page defines: its headings' slugs (repeats numbered ``-1``,
    ``-2``, ...) and explicit ids."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    repeats: dict[str, int] = {}
    for heading in _HEADING.findall(text):
        base = slug(heading)
        n = repeats.get(base, 0)
        repeats[base] = n + 1
        found |= {base} if n == 0 else {f"{base}_{n}", f"{base}-{n}"}  # mkdocs, GitHub
    for a, b in _EXPLICIT_ID.findall(text):
        found.add(a or b)
    return found


def references(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every reference in ``path``: Markdown links in Markdown files, bare
    ``.md`` mentions everywhere; URLs and in-page anchors left out."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if path.suffix == ".md":
            for target in _LINK.findall(line):
                if not _URL.match(target) and not target.startswith("#"):
                    found.append((lineno, target))
        for name, anchor in _BARE.findall(_URL.sub(" ", line)):
            found.append((lineno, name + anchor))
    return list(dict.fromkeys(found))  # a link's target is a bare mention too


def unresolved(path: Path, target: str) -> str | None:
    """Why ``target``, cited in ``path``, does not resolve; ``None`` when it does."""
    name, _, anchor = target.partition("#")
    if Path(name).name in WRITTEN:
        return None
    bases = (path.parent, ROOT, ROOT / "docs")
    hits = [b / name for b in bases if (b / name).exists()]
    if not hits:
        return f"no file {name!r} (relative to {_shown(path.parent)}/, the root or docs/)"
    page = hits[0]
    if anchor and page.suffix == ".md" and page.is_file() and anchor not in anchors(page):
        return f"no heading or id {anchor!r} in {_shown(hits[0])}"
    return None


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_references(files: list[Path]) -> list[str]:
    problems = []
    for path in files:
        for lineno, target in references(path):
            why = unresolved(path, target)
            if why is not None:
                problems.append(f"{_shown(path)}:{lineno}: {target}: {why}")
    return problems


def test_every_cited_document_exists(tmp_path: Path) -> None:
    try:
        files = repository_files()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    problems = broken_references(files)
    assert not problems, "references to documents the repository does not contain:\n" + (
        "\n".join(problems)
    )
    # The scan is not vacuous: it sees the README's links, the nav's pages, the cross-page
    # anchors, and reports a missing page, a missing anchor and a bare mention.
    cited = {t for p in files for _, t in references(p)}
    assert {"docs/quickstart.md", "index.md", "api.md#gradient-modes"} <= cited, sorted(cited)
    page = tmp_path / "docs" / "probe.md"  # cites the repository's pages through docs/
    page.parent.mkdir()
    bad = "[a](missing.md) [b](api.md#no-such-heading) [c](#local) [d](https://x.org/y.md)\n"
    page.write_text(bad + "See DESIGN.md, docs/*.md and README.md.\n", encoding="utf-8")
    found = broken_references([page])
    assert [p.split(": ", 1)[1].split(":")[0] for p in found] == [
        "missing.md",
        "api.md#no-such-heading",
        "DESIGN.md",
    ], found
