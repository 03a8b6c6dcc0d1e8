"""``jaxpr_accum.PlanWarning``: public, a ``UserWarning``, the only category the library issues,
and attributed to the line of the user's code that called into the library, also through
``jax.jit`` and ``jax.grad``, so that Python's filters and "once per location" work."""

from __future__ import annotations

import ast
import inspect
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import jaxpr_accum as ja
from jaxpr_accum._base import _errors

X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
NOT_WORTH_IT = "not expected to save memory"


def loss(x):
    return jnp.sum(jnp.sin(x) ** 2)


def whole_axis():
    """A function whose plan warns at its first call: one chunk holds the whole axis."""
    return ja.serialize_axis(loss, chunk=4, argnums=0)


def here() -> int:
    """The line number of the caller's next line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def test_plan_warning_is_a_public_user_warning():
    assert "PlanWarning" in ja.__all__
    assert issubclass(ja.PlanWarning, UserWarning)
    assert ja.PlanWarning is _errors.PlanWarning
    assert not issubclass(ja.PlanWarning, DeprecationWarning)


def _record(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, ja.PlanWarning)]


@pytest.mark.parametrize("how", ["direct", "jit", "grad", "jit of a user function"])
def test_the_warning_points_at_the_callers_line(how):
    sf = whole_axis()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if how == "direct":
            line = here()
            sf(X)
        elif how == "jit":
            line = here()
            jax.jit(sf)(X)
        elif how == "grad":
            line = here()
            jax.grad(sf)(X)
        else:
            line = here()
            jax.jit(lambda x: 2.0 * sf(x))(X)
    (w,) = caught  # exactly one warning, and it is ours
    assert w.category is ja.PlanWarning
    assert NOT_WORTH_IT in str(w.message)
    assert w.filename == __file__, (w.filename, how)
    assert w.lineno == line, (w.lineno, line, how)


def test_a_function_warns_once_across_kinds_of_call():
    """A plain call, ``jax.grad`` and ``jax.jit`` plan apart (per perturbation pattern and
    kind of call); the same warning is given once per function, as the docs say."""
    sf = whole_axis()
    caught = _record(lambda: (sf(X), jax.grad(sf)(X), jax.jit(sf)(X), sf(X)))
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert len(_record(lambda: whole_axis()(X))) == 1  # a new function warns again


def test_ignoring_the_category_silences_it():
    sf = whole_axis()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=ja.PlanWarning)
        sf(X)
        jax.grad(whole_axis())(X)
    assert caught == []


def test_pytest_warns_sees_it():
    with pytest.warns(ja.PlanWarning, match=NOT_WORTH_IT) as record:
        whole_axis()(X)
    assert [w.filename for w in record] == [__file__]


def test_once_per_location_uses_the_callers_registry():
    """The "default" action shows a warning once per (message, category, module, line): two
    calls from one line warn once, a call from another line warns again."""

    def call_twice_from_one_line():
        for _ in range(2):
            whole_axis()(X)

    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        globals().pop("__warningregistry__", None)
        call_twice_from_one_line()
        assert len(caught) == 1, [str(w.message) for w in caught]
        whole_axis()(X)  # another line
        assert len(caught) == 2
    assert {w.filename for w in caught} == {__file__}


def test_the_stack_walk_skips_the_library_and_jax():
    """``_errors.warn`` called from a frame of this file: attributed to this file's line."""
    line = here()
    (w,) = _record(lambda: _errors.warn("a message"))
    assert (w.filename, w.lineno, w.category) == (__file__, line, ja.PlanWarning)
    assert _errors._internal("jaxpr_accum._api") and _errors._internal("jax._src.api")
    assert _errors._internal("flax.linen.module") and not _errors._internal("jaxpr_accumulate")
    assert not _errors._internal("tests.test_warnings") and not _errors._internal("jaxtyping")


def test_every_warning_of_the_package_goes_through_the_helper():
    """No ``warnings.warn`` / ``warn_explicit`` call in the package except the helper's own."""
    package = Path(ja.__file__).parent
    calls = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("warn", "warn_explicit")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "warnings"
            ):
                calls.append(f"{path.relative_to(package)}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("_base/_errors.py:"), calls


def stacks_a_cumsum(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.cumsum(h, axis=0) * h)  # the line the warning names


def test_a_warning_about_a_stop_names_the_primitive_and_the_users_line():
    """The region stops at a ``cumsum`` over the batch and stacks its input back to full
    size: the warning says so, naming the ``cumsum`` and the line of this file."""
    w, x = jnp.ones((16, 64)) / 4, jnp.ones((256, 16))
    line = stacks_a_cumsum.__code__.co_firstlineno + 2
    sf = ja.serialize_axis(stacks_a_cumsum, chunk=32, argnums=1)
    with pytest.warns(ja.PlanWarning, match=NOT_WORTH_IT) as record:
        sf(w, x)
    (message,) = [str(r.message) for r in record if NOT_WORTH_IT in str(r.message)]
    assert f"the region stops at `cumsum` at {__file__}:{line} (stacks_a_cumsum)" in message


def stacks_a_square_cumsum(w, x):
    h = jnp.tanh(x @ w)
    return jnp.sum(jnp.cumsum(h, axis=0) ** 2)


def test_never_worse_measures_the_program_the_call_compiles():
    """The check weighs the chunked program as the call runs it, under ``jax.jit``: measured
    outside it, this program's loop measured 0.98 of the original and ran as written, where
    the call's own compiled ``value_and_grad`` holds 0.68 of it."""
    w, x = jnp.ones((16, 64)) / 4, jnp.ones((256, 16))
    sf = ja.serialize_axis(stacks_a_square_cumsum, chunk=32, argnums=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ja.PlanWarning)
        plan = sf.explain(w, x)
    ratio = ja.temp_bytes(sf, w, x) / ja.temp_bytes(stacks_a_square_cumsum, w, x)
    assert not plan.runs_as_written and ratio < 0.9, (plan.grad_reason, ratio)


def mse(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


def test_argnums_naming_the_parameters_gets_a_hint():
    """``argnums=0`` names the weights (as ``jax.grad``'s would): no axis of the batch's size,
    which both other arguments share, so the warning says what ``argnums`` means and which
    to pass; naming the data gets no hint."""
    w, x, y = jnp.ones((8, 32)) / 4, jnp.ones((512, 8)), jnp.zeros((512, 32))
    with pytest.warns(ja.PlanWarning) as record:
        ja.serialize_axis(mse, chunk=4, argnums=0)(w, x, y)
    (hint,) = [str(r.message) for r in record if "looks like parameters" in str(r.message)]
    assert "argument 0 looks like parameters, not a batch: it has no axis of size 512" in hint
    assert "pass argnums=(1, 2)" in hint, hint
    plan = ja.serialize_axis(mse, chunk=4, argnums=0).explain(w, x, y)
    assert "looks like parameters" in (plan.warning or ""), plan
    with warnings.catch_warnings(record=True) as right:
        warnings.simplefilter("always")
        ja.serialize_axis(mse, chunk=128, argnums=(1, 2))(w, x, y)
    assert not [r for r in right if "looks like parameters" in str(r.message)], right


def test_a_warning_without_a_stop_names_where_the_axis_is_born():
    """Samples drawn inside, one chunk holding all 16: the warning names the draw that
    creates the axis and its line in this file."""

    def loss(w, key):
        z = jax.random.normal(key, (16, 3))  # the line the warning names
        return jnp.sum(jnp.tanh(z @ w))

    line = loss.__code__.co_firstlineno + 1
    sf = ja.serialize_axis(loss, chunk=16, size=16)
    with pytest.warns(ja.PlanWarning) as record:
        sf(jnp.ones((3, 2)), jax.random.key(0))
    messages = [str(r.message) for r in record]
    assert any(
        f"the chunked axis is born at dimension 0 of `random_bits` at {__file__}:{line}" in m
        for m in messages
    ), messages
