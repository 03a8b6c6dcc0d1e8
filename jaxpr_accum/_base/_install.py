"""The install command for an optional extra, as this copy of the package was installed: from
a clone (the package directory sits in a source checkout, beside its ``pyproject.toml``),
``pip install -e '.[extra]'``; from a wheel, ``pip install 'jaxpr-accum[extra]'``."""

from __future__ import annotations

from pathlib import Path

#: The package directory: in a clone, the checkout's ``jaxpr_accum/``; else site-packages'.
_PACKAGE = Path(__file__).resolve().parents[1]


def from_a_clone(package: Path = _PACKAGE) -> bool:
    """Whether the package runs from a source checkout (an editable install or a path)."""
    return (package.parent / "pyproject.toml").is_file()


def install_hint(extra: str, package: Path = _PACKAGE) -> str:
    """The pip command that adds ``extra`` to this install."""
    if from_a_clone(package):
        return f"pip install -e '.[{extra}]'"
    return f"pip install 'jaxpr-accum[{extra}]'"
