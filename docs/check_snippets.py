"""Run the Python snippets of the Markdown pages in docs/ and compare what they print.

Usage: ``python docs/check_snippets.py [-v] [--venvs DIR] [page ...]`` (default: every page
in ``PAGES``; ``-v`` prints what each block prints, e.g. to refresh the outputs shown on a
page). The test suite runs it too: ``tests/test_docs_snippets.py``, in the ``integration``
tier, with ``--venvs``'s isolation.

**As a reader runs them.** With ``--venvs DIR``, each page runs in a virtualenv holding only
the page's install line (``install_line``: the first ``pip install -e .`` or
``pip install -e '.[extras]'`` on the page; a page with none needs only the library, ``pip
install -e .``), made once under ``DIR`` per distinct line and shared by the pages that give
it: a snippet that imports what its page's line does not install fails. Without it, the
scripts run in this interpreter with the checkout on ``PYTHONPATH``.

Every ```` ```python ```` block of a page runs, in order, in one script per page, so a
block may use names defined by the blocks above it. An HTML comment just before a block
changes that (it does not show when the page is rendered):

- ``<!-- fresh -->``: the block starts a new script (e.g. one that sets ``XLA_FLAGS`` before
  importing JAX);
- ``<!-- skip -->``: the block is not run (sketches with placeholders such as ``load_rows``).

**Outputs.** A ```` ```text ```` block that immediately follows a python block (nothing but
blank lines and the marks below between them) is that block's expected standard output, and
must match what the block prints: lines are compared after removing trailing whitespace and
leading and trailing blank lines, and

- a line that is just ``...`` stands for any number of lines (none included), and ``...``
  inside a line for any text on that line (as in doctest's ``ELLIPSIS``);
- ``<!-- output: approximate -->`` just before the text block: every number in it matches any
  number (for timings, byte counts and addresses that vary from run to run);
- ``<!-- output: skip -->`` just before the text block: it is not compared (an illustration,
  not the block's output).

Blocks in other languages (```` ```bash ````, or text blocks after prose) are never run or
compared. Each script is written to ``<page stem>.py`` in a temporary directory and runs in
its own subprocess from the repository root (the temporary directory is removed from what
it prints, so source locations in reports read ``quickstart.py:12``), with
``JAX_PLATFORMS=cpu`` unless set, and without
``XLA_FLAGS`` (a script that needs several CPU devices sets it before importing JAX). Exit
status: the number of failed scripts plus the number of outputs that do not match.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
#: Pages with Python snippets, all of them complete programs or marked ``skip``.
PAGES = [
    "index.md",
    "quickstart.md",
    "how-it-works.md",
    "api.md",
    "errors.md",
    "semantics.md",
    "limitations.md",
    "faq.md",
    "multi-device.md",
    "testing.md",
    "normalisers.md",
    "jacobians.md",
    "dp-sgd.md",
    "pairwise.md",
]
TIMEOUT_S = 900

_INSTALL = re.compile(r"pip install -e (?:'\.\[[\w,]+\]'|\.(?![\w\[]))")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*(.*?)\s*-->")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# Written between two blocks of a script, on the blank line that separates them, so the line
# numbers of the script are those of the blocks joined by one blank line.
_SENTINEL = "@@check_snippets: next block@@"
_SEPARATOR = f'__import__("sys").stdout.write("\\n{_SENTINEL}\\n")'


@dataclass
class Snippet:
    """One python block: its code, where it is, and the output shown after it (if any)."""

    line: int
    code: str
    expected: str | None = None
    expected_line: int = 0
    approximate: bool = False


@dataclass
class Script:
    snippets: list[Snippet] = field(default_factory=list)

    @property
    def code(self) -> str:
        return (_SEPARATOR + "\n").join(s.code for s in self.snippets)


def _marks(text: str) -> set[str]:
    """The HTML comments at the end of ``text`` (just before a fence), normalised."""
    marks: set[str] = set()
    tail = text.rstrip()
    while tail.endswith("-->"):
        start = tail.rfind("<!--")
        if start < 0:
            break
        m = _MARK.fullmatch(tail[start:])
        if m:
            marks.add(" ".join(m.group(1).split()))
        tail = tail[:start].rstrip()
    return marks


def scripts(page: Path) -> list[Script]:
    """The page's python blocks, grouped into scripts, with their expected outputs."""
    text = page.read_text()
    out: list[Script] = []
    last: Snippet | None = None  # the python block just before, if nothing came between
    pos = 0
    for m in _FENCE.finditer(text):
        between, pos = text[pos : m.start()], m.end()
        lang, code = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        marks = _marks(between)
        follows = last if last is not None and not _MARK.sub("", between).strip() else None
        last = None
        if lang == "python":
            if "skip" in marks:
                continue
            snippet = Snippet(line=line, code=code)
            if "fresh" in marks or not out:
                out.append(Script())
            out[-1].snippets.append(snippet)
            last = snippet
        elif lang == "text" and follows is not None and "output: skip" not in marks:
            follows.expected = code
            follows.expected_line = line
            follows.approximate = "output: approximate" in marks
    return out


def _normalise(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _line_pattern(line: str, approximate: bool) -> str:
    parts = []
    for i, piece in enumerate(line.split("...")):
        if i:
            parts.append(r"[^\n]*?")
        if approximate:
            pieces = _NUMBER.split(piece)
            parts.append(_NUMBER.pattern.join(re.escape(p) for p in pieces))
        else:
            parts.append(re.escape(piece))
    return "".join(parts)


def matches(expected: str, got: str, *, approximate: bool = False) -> bool:
    """Whether ``got`` (printed) matches ``expected`` (shown), with the rules above."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if ln.strip() == "..." else _line_pattern(ln, approximate) + r"\n"
        for ln in _normalise(expected)
    )
    got_lines = _normalise(got)
    return re.fullmatch(pattern, "".join(ln + "\n" for ln in got_lines)) is not None


@dataclass
class Result:
    """One script's run: its exit status, and a message per problem found."""

    name: str
    returncode: int
    seconds: float
    outputs: list[str]
    stdout: str
    stderr: str
    problems: list[str]


def install_line(page: Path) -> str:
    """The page's install line (see the module docstring)."""
    m = _INSTALL.search(page.read_text())
    return m.group(0) if m else "pip install -e ."


def venv_python(line: str, venvs: Path) -> Path:
    """The python of a virtualenv under ``venvs`` holding only ``line``'s install (made once,
    under a lock, so parallel test workers share it)."""
    name = re.sub(r"\W+", "_", line.removeprefix("pip install -e ")).strip("_") or "library"
    where = venvs / name
    python = where / "bin" / "python"
    venvs.mkdir(parents=True, exist_ok=True)
    with open(venvs / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (where / "installed").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(where)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, *shlex.split(line)[2:]], cwd=ROOT, check=True)
            (where / "installed").write_text(line + "\n")
    return python


def run_script(page: Path, index: int, script: Script, python: Path | None = None) -> Result:
    name = f"{page.name} script {index + 1}"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env.setdefault("JAX_PLATFORMS", "cpu")
    if python is None:  # this interpreter, the checkout importable
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    else:  # the page's virtualenv: only what its install line installed
        env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{page.stem.replace('-', '_')}.py"
        path.write_text(script.code)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [str(python or sys.executable), str(path)],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=env,
                timeout=TIMEOUT_S,
            )
            returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            returncode = -1
            stdout = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode()
            stderr = f"ran past {TIMEOUT_S} s"
        took = time.perf_counter() - start
        for prefix in {f"{tmp}{os.sep}", f"{os.path.realpath(tmp)}{os.sep}"}:
            stdout, stderr = stdout.replace(prefix, ""), stderr.replace(prefix, "")
    outputs = stdout.split(f"\n{_SENTINEL}\n")
    stdout = "\n".join(outputs)
    problems = []
    if returncode:
        problems.append(f"{name} exited with {returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    for snippet, got in zip(script.snippets, outputs, strict=False):
        if snippet.expected is None:
            continue
        if not matches(snippet.expected, got, approximate=snippet.approximate):
            diff = "\n".join(
                difflib.unified_diff(
                    _normalise(snippet.expected),
                    _normalise(got),
                    f"shown at {page.name}:{snippet.expected_line}",
                    f"printed by the block at {page.name}:{snippet.line}",
                    lineterm="",
                )
            )
            problems.append(f"{name}: the output shown does not match what is printed\n{diff}")
    return Result(name, returncode, took, outputs, stdout, stderr, problems)


def check_page(page: Path, verbose: bool = False, venvs: Path | None = None) -> list[str]:
    """Run every script of ``page`` (in its install line's virtualenv under ``venvs``, if
    given); the problems found (empty: the page is right)."""
    problems: list[str] = []
    python = None if venvs is None else venv_python(install_line(page), venvs)
    for i, script in enumerate(scripts(page)):
        result = run_script(page, i, script, python)
        status = "ok" if not result.problems else "FAILED"
        n_compared = sum(s.expected is not None for s in script.snippets)
        print(
            f"{result.name}: {status} ({result.seconds:.1f} s, "
            f"{n_compared} output{'s' if n_compared != 1 else ''} compared)",
            flush=True,
        )
        if verbose:
            for snippet, got in zip(script.snippets, result.outputs, strict=False):
                if got.strip():
                    print(f"--- printed by the block at {page.name}:{snippet.line}")
                    print("\n".join(_normalise(got)))
        for problem in result.problems:
            print(problem, flush=True)
        problems.extend(result.problems)
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--venvs", type=Path, help="run each page in its install line's venv")
    parser.add_argument("pages", nargs="*", type=Path)
    options = parser.parse_args(argv)
    pages = options.pages or [DOCS / p for p in PAGES]
    return sum(len(check_page(page, options.verbose, options.venvs)) for page in pages)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
