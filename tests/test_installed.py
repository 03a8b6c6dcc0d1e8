"""Import-level checks of the package as a user gets it: its version, its public names, its
exceptions, its type information, its ``repr``, and one exact serialized call.

Self-contained (no helper of ``tests/``), so CI also runs this file against the installed
wheel, from a directory where the checkout is not importable (``.ci/run``); there
``JAXPR_ACCUM_INSTALLED=1`` makes the version check strict (the imported package must be the
installed distribution's).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxpr_accum as ja
from jaxpr_accum._api import _naming
from jaxpr_accum._base._settings import SETTING_NAMES

PACKAGE = Path(ja.__file__).resolve().parent
#: Exceptions the package raises and catches itself, never at a user: name -> why.
INTERNAL_EXCEPTIONS = {"NotStreamable": "the streaming planner's 'outside the algebra'"}


def _imported_distribution() -> importlib.metadata.Distribution | None:
    """The installed ``jaxpr-accum`` distribution if it is the imported package (a wheel's
    files, or an editable install of this checkout); None where none is, or another is."""
    try:
        dist = importlib.metadata.distribution("jaxpr-accum")
    except importlib.metadata.PackageNotFoundError:
        return None
    if Path(dist.locate_file("jaxpr_accum/__init__.py")).resolve() == PACKAGE / "__init__.py":
        return dist  # installed from a wheel
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    editable_of = Path(url.removeprefix("file://")).resolve() if url.startswith("file:") else None
    return dist if editable_of == PACKAGE.parent else None


def test_the_version_is_the_installed_distributions():
    """One version source: ``__version__``, which the metadata reads (pyproject.toml's dynamic
    version, checked where the checkout is at hand)."""
    pyproject = PACKAGE.parent / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        assert 'dynamic = ["version"]' in text
        assert 'version = {attr = "jaxpr_accum.__version__"}' in text
        assert not re.search(r'^version = "', text, re.M), "a second, static version"
    dist = _imported_distribution()
    if dist is None:
        assert os.environ.get("JAXPR_ACCUM_INSTALLED") != "1", "jaxpr_accum is not installed"
        pytest.skip(f"the imported {PACKAGE} is not an installed distribution's")
    assert dist.version == ja.__version__, (
        f"installed metadata {dist.version} != jaxpr_accum.__version__ {ja.__version__}: "
        "reinstall (pip install -e .)"
    )


def test_dir_lists_the_public_names_and_dunders_only():
    names = dir(ja)
    assert set(ja.__all__) <= set(names)
    private = [n for n in names if n.startswith("_") and not n.endswith("__")]
    assert not private, private
    public = [n for n in names if not n.startswith("_")]
    assert set(public) <= {*ja.__all__, "testing"}, public
    for name in ja.__all__:
        assert getattr(ja, name) is not None
    assert importlib.import_module("jaxpr_accum._api").serialize_axis is ja.serialize_axis


def _raised_and_defined(path: Path) -> tuple[set[str], set[str]]:
    """The names ``raise X(...)`` / ``raise X`` / ``raise mod.X(...)`` raise in ``path``, and
    the classes it defines."""
    names, classes = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Attribute):
                names.add(target.attr)
            elif isinstance(target, ast.Name):
                names.add(target.id)
    return names, classes


def test_every_exception_of_the_package_raised_at_a_user_is_exported_and_documented():
    """Each exception class the package defines and raises is public (or caught internally,
    ``INTERNAL_EXCEPTIONS``); each public exception and warning has a docstring with an
    example. Builtins (``ValueError`` ...) need no export."""
    found = [_raised_and_defined(p) for p in PACKAGE.rglob("*.py")]
    ours = set().union(*(r for r, _ in found)) & set().union(*(c for _, c in found))
    assert ours >= {"SerializeError", "ArgumentError", "MissingInternal"}, ours
    assert ours - set(INTERNAL_EXCEPTIONS) <= set(ja.__all__), ours
    for name in ja.__all__:
        obj = getattr(ja, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert obj.__doc__ and "Examples:" in obj.__doc__, name
    assert issubclass(ja.ArgumentError, ValueError) and issubclass(ja.SerializeError, ValueError)
    assert not issubclass(ja.ArgumentError, ja.SerializeError)
    assert "ArgumentError" in ja.SerializeError.__doc__
    assert "SerializeError" in ja.ArgumentError.__doc__
    assert issubclass(ja.JaxVersionWarning, ja.PlanWarning)


def test_type_information_ships():
    assert (PACKAGE / "py.typed").is_file()


def test_the_repr_shows_every_setting_not_at_its_default():
    def f(x):
        return x

    assert set(_naming.ORDER) == SETTING_NAMES
    assert repr(ja.serialize_axis(f, chunk=4)) == "serialize_axis('f', chunk=4)"
    sf = ja.serialize_axis(
        f, chunk=2, axis=1, argnums=(0,), grad="remat", accum_dtype=jnp.float32, mesh_axis="d"
    )
    assert repr(sf) == (
        "serialize_axis('f', chunk=2, axis=1, argnums=(0,), grad='remat', "
        "accum_dtype='float32', mesh_axis=('d',))"
    )
    assert repr(ja.serialize_axis(f, memory="1 KiB", axis=None, size=3)) == (
        "serialize_axis('f', memory=1024, axis=None, size=3)"
    )
    by_leaf = ja.serialize_axis(f, chunk=3, in_axes=(None, 0))
    assert repr(by_leaf) == "serialize_axis('f', chunk=3, in_axes=(None, 0))"
    specs = (jax.sharding.PartitionSpec("d", None), None)
    by_spec = ja.serialize_axis(f, chunk=3, argnums=1, param_specs=specs)
    assert repr(by_spec) == f"serialize_axis('f', chunk=3, argnums=(1,), param_specs={specs!r})"
    shown = {"chunk", "memory", "axis", "argnums", "grad", "accum_dtype", "mesh_axis", "size"}
    once = ja.serialize_axis(f, chunk=3, gather="once")
    assert repr(once) == "serialize_axis('f', chunk=3, gather='once')"
    assert shown | {"in_axes", "param_specs", "gather"} == SETTING_NAMES  # every setting above


def test_a_serialized_call_is_the_originals():
    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    w, x = jnp.linspace(-1.0, 1.0, 6).reshape(3, 2), jnp.linspace(0.0, 2.0, 30).reshape(10, 3)
    sf = ja.serialize_axis(loss, chunk=4, argnums=1, grad="remat")  # 2 chunks of 4, and 2
    value, grads = jax.value_and_grad(sf, argnums=(0, 1))(w, x)
    want_value, want_grads = jax.value_and_grad(loss, argnums=(0, 1))(w, x)
    assert jnp.allclose(value, want_value, rtol=1e-6)
    for got, want in zip(grads, want_grads, strict=True):
        assert jnp.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert sf.explain(w, x).n_chunks == 3


def test_the_install_hints_suit_this_install():
    """Installed from a wheel (``JAXPR_ACCUM_INSTALLED=1``, CI's wheel venv): the hints name
    the distribution (``pip install 'jaxpr-accum[flax]'``); from a clone, the editable form."""
    from jaxpr_accum._base._install import install_hint

    wheel = not (PACKAGE.parent / "pyproject.toml").exists()
    if os.environ.get("JAXPR_ACCUM_INSTALLED") == "1":
        assert wheel, PACKAGE
    expected = "pip install 'jaxpr-accum[flax]'" if wheel else "pip install -e '.[flax]'"
    assert install_hint("flax") == expected
