"""Packaging: the wheel holds the package as the source tree has it, and the one command that
installs the project with Flax on JAX 0.9 is the same in the README, the docs and CI.

The wheel: every module and data file of every package directory (``jaxpr_accum/``, and any
directory ``[tool.setuptools.package-dir]`` maps into it), ``py.typed``, the licence and
metadata that match the source, and nothing else. The wheel checked is ``$JAXPR_ACCUM_WHEEL``
(CI's, built by ``python -m build``), or else one built here from the checkout (``pip wheel``,
an isolated build: it needs the package index).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The JAX 0.9 install: the pins in the same pip call as the project, so that pip picks a Flax
#: that supports them (in two calls, Flax's own requirement would upgrade JAX).
JAX_0_9_INSTALL = re.compile(
    r"pip install -e '\.\[flax\]' 'jax==(0\.9\.\d+)' 'jaxlib==(0\.9\.\d+)'"
)


def test_the_jax_0_9_command_is_one_in_the_readme_the_docs_and_ci():
    """The README gives it, an install page gives the same, and CI runs the README's (it
    reads it from there, with the same pattern)."""
    readme = set(JAX_0_9_INSTALL.findall((ROOT / "README.md").read_text()))
    assert len(readme) == 1, readme
    ((jax_version, jaxlib_version),) = readme
    assert jax_version == jaxlib_version
    docs = set()
    for page in (ROOT / "docs").rglob("*.md"):
        docs |= set(JAX_0_9_INSTALL.findall(page.read_text()))
    assert docs == readme, docs
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and 'eval "$jax_0_9_install"' in ci
    assert "pip install -e '\\.\\[flax\\]' 'jax==0\\.9\\.[0-9]+' 'jaxlib==0\\.9\\.[0-9]+'" in ci


def test_the_readme_starts_with_its_two_commands_and_ci_runs_the_second():
    """A title, the one-line pitch, then the first code block: exactly the two commands for a
    fresh machine (install and run the demo; install and pass the tests). CI reads the second
    from the README with its own pattern, runs its setup in a clone named jaxpr_accum, and
    its ``python -m pytest -q`` as the default tier."""
    text = (ROOT / "README.md").read_text()
    before, block = re.match(r"(.*?)^```bash\n(.*?)^```", text, re.S | re.M).groups()
    assert before.startswith("# jaxpr_accum\n\n") and "`" in before, before
    assert len([p for p in before.split("\n\n") if p.strip()]) == 2, before  # title, pitch
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert block.splitlines() == [
        venv + "pip install -e '.[flax]' && python -m jaxpr_accum demo",
        venv + "pip install -e '.[test]' && python -m pytest -q",
    ], block
    ci = (ROOT / ".ci" / "run").read_text()
    pattern = re.search(r'readme_test="\$\(grep -m1 -E "(.*?)" README\.md\)"', ci).group(1)
    pattern = pattern.replace("\\\\", "\\")  # as bash passes it to grep -E
    assert [ln for ln in text.splitlines() if re.search(pattern, ln)][0] == block.splitlines()[1]
    assert 'git clone --quiet --no-hardlinks "$source_tree" "$workdir/jaxpr_accum"' in ci
    assert 'eval "$readme_setup"' in ci and "run_tier default" in ci


def _source_version() -> str:
    tree = ast.parse((ROOT / "jaxpr_accum" / "__init__.py").read_text())
    for node in tree.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if targets == ["__version__"]:
            return ast.literal_eval(node.value)
    raise AssertionError("no __version__ in jaxpr_accum/__init__.py")


def _package_dirs() -> dict[str, Path]:
    """Wheel path prefix -> source directory: ``jaxpr_accum`` and the mapped ones."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = config.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    dirs = {"jaxpr_accum": ROOT / "jaxpr_accum"}
    for package, directory in mapped.items():
        if package.split(".")[0] == "jaxpr_accum":
            dirs[package.replace(".", "/")] = ROOT / directory
    return dirs


def _source_files(directory: Path) -> list[Path]:
    """The files of ``directory`` that a clone has (tracked or new, not ignored)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "."],
            cwd=directory, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        files = [directory / f for f in listed.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        files = [p for p in directory.rglob("*") if p.is_file()]
    return [f for f in files if f.is_file() and "__pycache__" not in f.parts]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("JAXPR_ACCUM_WHEEL")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
    )
    (built,) = out.glob("jaxpr_accum-*.whl")
    return built


@pytest.mark.integration
def test_the_wheel_holds_every_module_and_data_file_of_the_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{prefix}/{path.relative_to(directory).as_posix()}"
        for prefix, directory in _package_dirs().items()
        for path in _source_files(directory)
    }
    assert "jaxpr_accum/py.typed" in expected and "jaxpr_accum/__init__.py" in expected
    assert len(expected) > 50, sorted(expected)
    missing = sorted(expected - names)
    assert not missing, f"left out of {wheel.name}: {missing}"
    version = _source_version()
    info = f"jaxpr_accum-{version}.dist-info/"
    extra = sorted(n for n in names - expected if not n.startswith(info))
    assert not extra, f"in {wheel.name} but not in the source tree: {extra}"
    assert f"{info}licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{info}METADATA").decode()
    assert f"\nVersion: {version}\n" in metadata
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    assert "Apache License" in zipfile.ZipFile(wheel).read(f"{info}licenses/LICENSE").decode()
