"""Run the Python snippets of the Markdown pages in docs/, to check that they still work.

Usage: ``python docs/check_snippets.py [-v] [PAGE.md ...]`` (default: the pages in ``PAGES``;
``-v`` prints what each script prints, e.g. to refresh the outputs shown on a page).

Every ```` ```python ```` block of a page runs, in order, in one script per page, so a
block may use names defined by the blocks above it. An HTML comment just before a block
changes that (it does not show when the page is rendered):

- ``<!-- fresh -->``: the block starts a new script (e.g. one that sets ``XLA_FLAGS`` before
  importing JAX);
- ``<!-- skip -->``: the block is not run (sketches with placeholders such as ``load_rows``).

Blocks in other languages (```` ```text ````, ```` ```bash ````) are never run. Each script runs
in its own subprocess from the repository root; a page fails if any of its scripts exits
non-zero. Exit status: the number of failed scripts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parent
#: Pages whose snippets are complete programs. (multi-device.md shows fragments that use
#: names such as ``params`` and ``loss`` without defining them.)
PAGES = ["index.md", "quickstart.md", "how-it-works.md", "api.md", "limitations.md", "faq.md"]
BLOCK = re.compile(r"(?:<!--\s*(fresh|skip)\s*-->\s*\n)?```python\n(.*?)```", re.S)


def scripts(page: Path) -> list[str]:
    out: list[str] = []
    for mark, code in BLOCK.findall(page.read_text()):
        if mark == "skip":
            continue
        if mark == "fresh" or not out:
            out.append(code)
        else:
            out[-1] += "\n" + code
    return out


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    pages = [Path(p) for p in argv if p != "-v"] or [DOCS / p for p in PAGES]
    failed = 0
    for page in pages:
        for i, code in enumerate(scripts(page)):
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
                f.write(code)
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, f.name], capture_output=True, text=True, cwd=DOCS.parent
            )
            took = time.perf_counter() - start
            status = "ok" if proc.returncode == 0 else "FAILED"
            print(f"{page.name} script {i + 1}: {status} ({took:.1f} s)")
            if verbose:
                print(proc.stdout)
            if proc.returncode:
                failed += 1
                print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
