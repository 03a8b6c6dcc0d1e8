"""Importing a generated program: its source written to a file of its own, so that errors and
reports name a real file and line."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


def import_program(source: str, stem: str, directory: Path) -> tuple[Any, str]:
    """``(f, its file)``: ``source`` written to ``directory/stem.py`` and imported; ``f`` is
    the module's function ``f``."""
    path = directory / f"{stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.f, str(path)
