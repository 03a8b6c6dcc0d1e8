"""jaxpr_accum: run the batch or sample axis of a JAX function in chunks, exactly.

``serialize_axis(chunk=k)`` traces the function to a jaxpr, finds the axis by dataflow
analysis, and rewrites that region into a chunked ``lax.scan`` with rematerialisation and
explicit cotangent accumulation. Same values, same gradients; memory that scales with ``k``.

The public names are those of ``__all__`` (and the ``jaxpr_accum.testing`` subpackage, loaded
on first use); ``dir(jaxpr_accum)`` lists them and the dunders only, and they report
``jaxpr_accum`` as their module, as JAX's do. The private modules (``jaxpr_accum._api`` ...)
stay importable, but are no part of the API.
"""

import importlib
from types import ModuleType

from jaxpr_accum import _compat
from jaxpr_accum._api import SerializedFunction, serialize_axis
from jaxpr_accum._api._measure import temp_bytes
from jaxpr_accum._api._sweep import Sweep
from jaxpr_accum._base._errors import ArgumentError, PlanWarning, SerializeError
from jaxpr_accum._base._settings import GRAD_MODES
from jaxpr_accum._compat import JaxVersionWarning, MissingInternal
from jaxpr_accum._report._plan import Plan
from jaxpr_accum._rules import register_rule

__all__ = [
    "GRAD_MODES",
    "ArgumentError",
    "JaxVersionWarning",
    "MissingInternal",
    "Plan",
    "PlanWarning",
    "SerializeError",
    "SerializedFunction",
    "Sweep",
    "register_rule",
    "serialize_axis",
    "temp_bytes",
]
# The one version source: the distribution's metadata reads it (pyproject.toml's
# ``[tool.setuptools.dynamic]``); tests/test_installed.py checks that the two agree.
__version__ = "0.1.0"

for _name in __all__:  # tracebacks and help() name the public module, not a private one
    if _name != "GRAD_MODES":  # a tuple of names has no module of its own
        globals()[_name].__module__ = __name__
del _name

# Once every rule table is built: on a JAX outside the tested series, the one warning, with
# the primitives the tables name that this JAX lacks (skipped).
_compat.check_jax_version()


def __dir__() -> list[str]:
    """The public names and the dunders (not the private submodules the import loads)."""
    names = {n for n in globals() if n.startswith("__") and n.endswith("__")}
    return sorted(names | set(__all__) | {"testing"})


def __getattr__(name: str) -> ModuleType:
    """``jaxpr_accum.testing`` after a plain ``import jaxpr_accum`` (loaded on first use)."""
    if name == "testing":
        return importlib.import_module("jaxpr_accum.testing")
    raise AttributeError(f"module 'jaxpr_accum' has no attribute {name!r}")
