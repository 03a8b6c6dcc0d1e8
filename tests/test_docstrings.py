"""Every public function and method has the docstring sections the API page renders: ``Args``
where it takes arguments, ``Returns`` where it returns something (Google style, as
``mkdocs.yml`` parses them)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import jaxpr_accum as ja
from jaxpr_accum import testing


def _public() -> Iterator[tuple[str, Callable]]:
    for module, names in ((ja, ja.__all__), (testing, testing.__all__)):
        for name in names:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj) and not issubclass(obj, BaseException | Warning):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and inspect.isfunction(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_every_public_function_and_method_has_its_sections():
    checked, missing = 0, []
    for name, fun in _public():
        doc = inspect.getdoc(fun) or ""
        signature = inspect.signature(fun)
        takes = [p for p in signature.parameters if p not in ("self", "cls")]
        returns = signature.return_annotation not in ("None", None, inspect.Signature.empty)
        if takes and "Args:" not in doc:
            missing.append(f"{name}: Args")
        if returns and "Returns:" not in doc:
            missing.append(f"{name}: Returns")
        checked += 1
    assert not missing, missing
    assert checked >= 15, checked  # serialize_axis, the methods of SerializedFunction, Plan, ...
