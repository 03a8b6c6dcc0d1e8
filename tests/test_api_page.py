"""The API page as a reader sees it: built with ``mkdocs build --strict`` and rendered in
headless Chromium, each public object is documented once (one heading per object), and no
signature is wider than the content column (mkdocstrings wraps them with the docs extra's
formatter at ``mkdocs.yml``'s ``line_length``). A control signature, one long line added to
the page, must be caught, so the check can fail. Needs the ``docs`` extra and Chromium
(``apt-get install chromium``); CI has both, and there a missing browser fails."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
#: Runs after the page has loaded and laid out; writes what it measured into the page.
CHECK = """
window.addEventListener("load", () => {
  const column = document.querySelector("article.md-content__inner");
  const control = document.createElement("div");
  control.className = "doc-signature control";
  control.innerHTML = "<pre><code>" + "x".repeat(300) + "</code></pre>";
  column.appendChild(control);
  const measure = (el) => {
    const code = el.querySelector("code") || el;
    return {text: el.textContent.slice(0, 60), width: el.getBoundingClientRect().width,
            scroll: code.scrollWidth, client: code.clientWidth};
  };
  const signatures = [...document.querySelectorAll(".doc-signature:not(.control)")];
  const out = document.createElement("pre");
  out.id = "dom-check";
  out.textContent = JSON.stringify({
    column: column.getBoundingClientRect().width,
    control: measure(control),
    signatures: signatures.map(measure),
    ids: [...document.querySelectorAll(".doc-heading[id]")].map((el) => el.id),
  });
  document.body.appendChild(out);
});
"""
PUBLIC = [
    "serialize_axis", "SerializedFunction", "Plan", "Sweep", "temp_bytes", "register_rule",
    "testing",
]  # fmt: skip


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if os.environ.get("CI"):
        pytest.fail("no Chromium on CI (.ci/run installs it with apt-get)")
    pytest.skip("no Chromium: apt-get install chromium")


def test_the_api_page_documents_each_object_once_with_signatures_that_fit(tmp_path):
    browser = _chromium()
    if importlib.util.find_spec("mkdocs") is None and not os.environ.get("CI"):
        pytest.skip("no mkdocs: pip install -e '.[docs]'")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    (site / "check.js").write_text(CHECK)
    page = site / "api" / "index.html"
    page.write_text(
        page.read_text().replace("</body>", '<script src="../check.js"></script></body>')
    )
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
         "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="dom-check">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    seen = json.loads(
        found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )
    column, control = seen["column"], seen["control"]
    assert column > 300, seen
    assert control["scroll"] > control["client"], control  # the check sees an overflow
    assert len(seen["signatures"]) >= 10, seen["signatures"]
    for signature in seen["signatures"]:
        assert signature["scroll"] <= signature["client"] + 1, signature
        assert signature["width"] <= column + 1, (signature, column)
    counts = Counter(seen["ids"])
    assert all(n == 1 for n in counts.values()), counts
    assert {f"jaxpr_accum.{name}" for name in PUBLIC} <= set(counts), sorted(counts)
