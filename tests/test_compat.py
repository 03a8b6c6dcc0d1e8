"""The JAX-version layer (``jaxpr_accum._compat``): each helper that touches a private or
version-dependent piece of JAX, exercised on the installed JAX (CI runs JAX 0.9.x and 0.10.x);
the once-only warning on an untested JAX; the clear error where an internal has moved; the
package's own primitive tables against a user's names."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum import _compat
from jaxpr_accum._base import _dtypes
from jaxpr_accum._compat import _lookup
from jaxpr_accum._engine import _table

COMPAT = Path(_compat.__file__).parent
SERIES = ".".join(jax.__version__.split(".")[:2])
#: Primitives the package's tables name that JAX 0.9 does not have (added in JAX 0.10).
NEWER_THAN_0_9 = {"mulhi", "ormqr", "stack", "unstack", "stage"}


def _eqn(fun, *args, name):
    """The first top-level equation of ``fun``'s jaxpr whose primitive is ``name``."""
    closed = jax.make_jaxpr(fun)(*args)
    return next(e for e in closed.jaxpr.eqns if e.primitive.name == name)


# -- versions ----------------------------------------------------------------------------------


def test_the_installed_jax_is_a_tested_one():
    assert SERIES in _compat.TESTED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _compat.check_jax_version()
        assert _compat.check_jax_version("0.9.2") and _compat.check_jax_version("0.10.0")


def test_a_newer_jax_warns_once(monkeypatch):
    """One warning, whatever the calls; it lists the rule-table entries this JAX lacks."""
    monkeypatch.setattr(_lookup, "_warned", False)
    monkeypatch.setattr(_lookup, "ABSENT", {"no_such_primitive_b", "no_such_primitive_a"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not _compat.check_jax_version("0.11.0")
        assert not _compat.check_jax_version("0.11.1")
        assert not _compat.check_jax_version("1.0.0")
    assert len(caught) == 1, [str(w.message) for w in caught]
    (w,) = caught
    assert issubclass(w.category, _compat.JaxVersionWarning)
    assert issubclass(w.category, ja.PlanWarning) and ja.JaxVersionWarning is w.category
    assert "0.11.0" in str(w.message) and "0.9.x and 0.10.x" in str(w.message)
    assert str(w.message).endswith(
        "; its rule tables name primitives this JAX does not have, skipped: "
        "no_such_primitive_a, no_such_primitive_b"
    )


#: A fresh interpreter with a JAX that says it is 0.99.0 and has no ``igamma_grad_a`` primitive
#: (every module's reference to it removed, so no lookup finds it), then the package imported.
_WITHOUT_IGAMMA_GRAD_A = """
import sys, warnings
import jax
from jax.extend.core import Primitive
jax.__version__ = "0.99.0"
for module in list(sys.modules.values()):
    if module is not None and module.__name__.split(".")[0] in ("jax", "jaxlib"):
        for attr, value in list(vars(module).items()):
            if isinstance(value, Primitive) and value.name == "igamma_grad_a":
                delattr(module, attr)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax.numpy as jnp
    import jaxpr_accum as ja
    from jaxpr_accum import _compat
    _compat.check_jax_version()
    sf = ja.serialize_axis(lambda w, x: jnp.sum(jnp.tanh(x @ w)), chunk=2, argnums=1)
    value = float(sf(jnp.ones((3, 2)), jnp.ones((6, 3))))
mine = [w for w in caught if issubclass(w.category, _compat.JaxVersionWarning)]
print(len(mine), round(value, 4), sorted(_compat.ABSENT))
print(mine[0].filename == "<string>", mine[0].message)
"""


@pytest.mark.integration
def test_a_newer_jax_without_a_primitive_a_table_names_imports_and_warns_once():
    """A fresh interpreter where JAX says it is 0.99.0 and has no ``igamma_grad_a``: the import
    skips the table entries for it and records them, warns once (at the user's import, the
    skipped primitive named), and the rest works."""
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_IGAMMA_GRAD_A], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    expected = round(float(jnp.sum(jnp.tanh(jnp.ones((6, 3)) @ jnp.ones((3, 2))))), 4)
    assert out[0] == f"1 {expected} ['igamma_grad_a']", out
    assert out[1].startswith("True jaxpr_accum is tested with JAX 0.9.x and 0.10.x, not 0.99.0")
    assert out[1].endswith("this JAX does not have, skipped: igamma_grad_a"), out[1]


# -- internals that have moved -----------------------------------------------------------------


def test_a_missing_internal_is_a_clear_error(monkeypatch):
    from jax._src.interpreters import partial_eval

    closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0)
    _lookup.internal.cache_clear()
    monkeypatch.delattr(partial_eval, "dce_jaxpr")
    try:
        with pytest.raises(RuntimeError) as info:
            _compat.dce(closed)
    finally:
        _lookup.internal.cache_clear()
    assert isinstance(info.value, _compat.MissingInternal)
    assert str(info.value) == (
        "jaxpr_accum needs jax._src.interpreters.partial_eval.dce_jaxpr, which JAX "
        f"{jax.__version__} does not have; tested with JAX 0.9.x and 0.10.x"
    )
    with pytest.raises(_compat.MissingInternal, match=r"needs jax\._src\.no_such_module\.f,"):
        _lookup.internal("jax._src.no_such_module.f")


def test_a_missing_parameter_is_a_clear_error():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
    eqn = _eqn(f, 1.0, name="custom_jvp_call")
    moved = eqn.replace(params={k: v for k, v in eqn.params.items() if k != "call_jaxpr"})
    with pytest.raises(_compat.MissingInternal, match="the `call_jaxpr` parameter of"):
        _compat.custom_call_body(moved)


def test_every_private_lookup_resolves_on_this_jax():
    """The private paths named in ``_compat`` all exist here (a JAX that moves one fails here
    first, by name)."""
    paths = set()
    for path in COMPAT.rglob("*.py"):
        paths |= set(re.findall(r'(?:_jax|internal)\(\s*"([\w.]+)"', path.read_text()))
    assert len(paths) >= 20, paths
    for path in sorted(paths):
        assert _lookup.internal(path) is not None, path


# -- primitive tables --------------------------------------------------------------------------


def test_a_table_name_this_jax_lacks_is_skipped_a_users_is_an_error(monkeypatch):
    """A name in the package's own tables that the installed JAX has no primitive for is
    skipped and recorded in ``ABSENT``, never an error at import (a newer JAX may drop a
    primitive; the next test catches a misspelt name). A user's unknown name, in
    ``register_rule``, is an error."""
    name = "no_such_primitive_for_the_test"
    before = dict(_table.RULES)
    monkeypatch.setattr(_lookup, "ABSENT", set())
    try:
        _table.register([name, "sin"], _table.UNKNOWN)
        assert sorted(_lookup.ABSENT) == [name]
        assert _table.RULES[jax.lax.sin_p] is _table.UNKNOWN
        assert len(_table.RULES) == len(before)
        assert _compat.primitives(f"add {name}") == {jax.lax.add_p}
    finally:
        _table.RULES.clear()
        _table.RULES.update(before)
    with pytest.raises(ValueError, match=rf"no primitive named 'nonexistent'.*{jax.__version__}"):
        ja.register_rule("nonexistent", "elementwise")


def test_the_tables_name_only_primitives_of_a_tested_jax():
    """What the installed JAX lacks of the tables' names is exactly what it is too old for: a
    misspelt name in a table fails here, on the tested versions (CI runs this test on 0.9.x
    and 0.10.x), rather than at a user's import."""
    if SERIES == "0.9":
        assert _compat.ABSENT == NEWER_THAN_0_9
    else:
        assert not _compat.ABSENT, _compat.ABSENT
        assert all(_compat.primitive(n) is not None for n in NEWER_THAN_0_9)


def test_primitives_by_name():
    assert _compat.primitive("add") is jax.lax.add_p
    assert _compat.primitive("no_such_primitive") is None
    assert _compat.table_primitive("sin") is jax.lax.sin_p
    everything = _lookup._primitives_by_name()
    assert everything["add"] is jax.lax.add_p and len(everything) > 150
    # the private fallback: ``tile`` is not exported by jax.extend.core.primitives
    assert _compat.primitive("optimization_barrier") is not None


# -- the helpers, one by one -------------------------------------------------------------------


def test_drop_var_is_the_class_of_dropped_outputs():
    assert _compat.DropVar is getattr(jax.extend.core, "DropVar", _compat.DropVar)
    aval = jax.core.ShapedArray((2,), jnp.float32)
    assert isinstance(_compat.DropVar(aval), _compat.DropVar)
    v = _compat.new_var(aval)
    assert isinstance(v, _compat.Var) and not isinstance(v, _compat.DropVar)
    assert _compat.shape_of(v) == (2,)


def test_source_info_helpers():
    def user_line(x):
        return jnp.sin(x)

    eqn = _eqn(user_line, 1.0, name="sin")
    line = _compat.source_line(eqn)
    assert "test_compat.py" in line and line.endswith("user_line)"), line
    assert _compat.inherit_source(eqn, None) is eqn
    with _compat.user_context(eqn):
        inner = _eqn(lambda x: jnp.cos(x), 1.0, name="cos")
    assert _compat.source_line(inner).endswith("user_line)")
    (out,) = _compat.bind(eqn, [jnp.float32(0.5)])
    assert np.isclose(out, np.sin(0.5))


def test_api_boundary_keeps_the_function():
    def f(x):
        return x + 1

    assert _compat.api_boundary(f)(1) == 2


def test_dce_and_constvars():
    c = jnp.arange(3.0)
    closed = jax.make_jaxpr(lambda x: (jnp.cos(x), x * c)[1])(jnp.ones(3))
    pruned = _compat.dce(closed)
    assert [e.primitive.name for e in pruned.jaxpr.eqns] == ["mul"]
    jaxpr, consts = _compat.constvars_to_invars(pruned)
    assert len(jaxpr.invars) == len(pruned.jaxpr.constvars) + 1 and not jaxpr.constvars
    assert len(consts) == len(pruned.consts)


def test_custom_jvp_parts():
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    f.defjvp(lambda p, t: (jnp.sin(p[0]), 2.0 * t[0]))
    eqn = _eqn(f, jnp.float32(1.0), name="custom_jvp_call")
    body, n_consts = _compat.custom_call_body(eqn)
    assert isinstance(body, _compat.ClosedJaxpr) and n_consts == 0
    name, _ = _compat.custom_call_identity(eqn)
    assert name == "f"
    jvp, out_zeros = _compat.custom_jvp_rule_jaxpr(eqn, [False])
    assert out_zeros == [False]
    primal, tangent = jax.extend.core.jaxpr_as_fun(jvp)(jnp.float32(1.0), jnp.float32(3.0))
    assert np.isclose(primal, np.sin(1.0)) and np.isclose(tangent, 6.0)


def test_custom_vjp_parts():
    @jax.custom_vjp
    def f(x, y):
        return x * y

    f.defvjp(lambda x, y: (x * y, (x, y)), lambda res, ct: (res[1] * ct, 3.0 * ct))
    eqn = _eqn(f, jnp.float32(2.0), jnp.float32(5.0), name="custom_vjp_call")
    assert _compat.custom_call_identity(eqn)[0] == "f"
    fwd_jaxpr_of, bwd = _compat.custom_vjp_parts(eqn)
    fwd, (n_res, input_fwds) = fwd_jaxpr_of([True, True])
    # both residuals are the operands themselves, so the jaxpr outputs only the primal result
    assert n_res == 2 and input_fwds == [0, 1]
    (out,) = jax.extend.core.jaxpr_as_fun(fwd)(jnp.float32(2.0), jnp.float32(5.0))
    assert np.isclose(out, 10.0)
    gx, gy = bwd(jnp.float32(2.0), jnp.float32(5.0), jnp.float32(1.0))
    assert np.isclose(gx, 5.0) and np.isclose(gy, 3.0)
    jaxpr, returned = _compat.trace_custom_vjp_bwd(
        lambda *a: (a[1] * a[2], None), [jnp.float32(0)] * 3
    )
    assert returned == [True, False] and len(jaxpr.jaxpr.outvars) == 1


def test_calls_and_sub_jaxprs():
    eqn = _eqn(jax.jit(jnp.sin), 1.0, name="jit")
    assert _compat.is_inlined_call(eqn)
    assert isinstance(_compat.called_jaxpr(eqn), _compat.ClosedJaxpr)
    assert [path for path, _ in _compat.sub_jaxprs(eqn.params)] == [("jaxpr",)]
    assert not _compat.is_pure(eqn)
    assert _compat.is_pure(_eqn(jnp.sin, 1.0, name="sin"))


def test_prng_keys():
    key = jax.random.key(0)
    assert _compat.key_impl_name(key.dtype) == "threefry2x32"
    assert _compat.key_impl(key.dtype) is not None
    assert _compat.counter_draw_refusal(key.dtype) is None
    assert "rbg" in (_compat.counter_draw_refusal(jax.random.key(0, impl="rbg").dtype) or "")


def test_gradients_and_zeros():
    ct = _compat.cotangent_aval(jax.ShapeDtypeStruct((2,), jnp.int32))
    assert ct.dtype == jax.dtypes.float0
    assert _compat.zeros_float0((2, 1)).shape == (2, 1)
    aval = jax.core.ShapedArray((2,), jnp.float32)
    zero = _compat.zero_tangent(aval)
    assert _compat.is_zero(zero) and not _compat.is_zero(jnp.zeros(2))
    assert _compat.instantiate(zero).shape == (2,)
    assert _compat.aval_of(jnp.zeros(2)).shape == (2,)
    assert _compat.trace_aval(jnp.zeros(2)) == jax.ShapeDtypeStruct((2,), jnp.float32)


def test_the_leaf_predicates_each_have_one_meaning():
    """``_base._dtypes``: what a leaf is (an array, a tracer of one included) apart from what
    its dtype is (which abstract values and dtypes have too)."""
    spec, key = jax.ShapeDtypeStruct((2,), jnp.float32), jax.random.key(0)
    assert _dtypes.is_array(jnp.zeros(2)) and _dtypes.is_array(np.float32(1))
    assert not any(map(_dtypes.is_array, (None, 1.0, spec)))
    assert _dtypes.has_float_dtype(spec) and _dtypes.has_float_dtype(jnp.dtype("complex64"))
    assert not _dtypes.has_float_dtype(jnp.dtype("int32")) and not _dtypes.is_float_array(spec)
    assert _dtypes.is_float_array(np.ones(2)) and not _dtypes.is_float_array(key)
    assert _dtypes.has_key_dtype(key) and not _dtypes.has_key_dtype(np.ones(2))
    seen = []
    jax.jit(lambda x: seen.append((_dtypes.is_array(x), _dtypes.is_array_or_tracer(x))))(key)
    assert seen == [(True, True)] and _dtypes.real_dtype(jnp.complex64) == jnp.float32


def test_in_axes_flattening():
    args = ((jnp.ones(2), jnp.ones(3)), jnp.ones(4))
    assert _compat.flatten_in_axes([0, None], args) == [0, 0, None]
    with pytest.raises(ValueError, match="serialize_axis in_axes"):
        _compat.flatten_in_axes((0, 0, 0), args)


def test_meshes_and_shardings():
    assert len(_compat.context_mesh_key()) == 3
    assert _compat.varying_axes(jnp.ones(2)) == frozenset()
    assert _compat.union_varying([jnp.ones(2)]) == frozenset()
    assert _compat.vary(jnp.ones(2), frozenset()).shape == (2,)
    assert _compat.named_sharding(jnp.ones(2)) is None and _compat.placement_key(1.0) == ()
    mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Explicit,))
    assert _compat.explicit_axes(mesh, ["d"])
    x = jax.device_put(jnp.ones(2), jax.sharding.NamedSharding(mesh, jax.P("d")))
    assert _compat.named_sharding(x) is not None and _compat.placement_key(x)


def test_gather_fill_value():
    eqn = _eqn(lambda x, i: x.at[i].get(mode="fill"), jnp.ones(3), jnp.array([0]), name="gather")
    assert np.isnan(_compat.gather_fill_value(eqn))


def test_varying_axes_inside_shard_map():
    """Where an aval records the manual axes a value varies over: ``vma`` (JAX 0.9),
    ``manual_axis_type.varying`` (0.10)."""
    mesh = jax.make_mesh((1,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    seen = []

    def body(x, c):
        seen.append((_compat.varying_axes(x), _compat.varying_axes(c)))
        seen.append(_compat.varying_axes(_compat.vary(c, frozenset({"d"}))))
        return x

    jax.shard_map(body, mesh=mesh, in_specs=(jax.P("d"), jax.P()), out_specs=jax.P("d"))(
        jnp.ones(2), jnp.ones(())
    )
    assert seen == [(frozenset({"d"}), frozenset()), frozenset({"d"})]


def test_a_primitive_of_our_own():
    """``define_primitive``: JAX's impl, abstract-eval, lowering, JVP, batching (JAX's own
    table: the rule is called only with a batched argument), transpose and dead-code tables
    filled through the private lookups."""
    batched, pruned = [], []

    def dce(used, eqn):
        pruned.append(list(used))
        return [any(used)], eqn if any(used) else None

    twice = _compat.define_primitive(
        "jaxpr_accum_test_twice",
        abstract_eval=lambda a: ([a], set()),
        impl=lambda x: [2 * x],
        jvp=lambda primals, tangents: (
            twice.bind(*primals),
            [_compat.zero_tangent(jax.typeof(primals[0]))]
            if _compat.is_zero(tangents[0])
            else twice.bind(*tangents),
        ),
        batch=lambda axis, args, dims: batched.append(dims) or (twice.bind(*args), list(dims)),
        transpose=lambda cts, x: (
            [None if _compat.is_zero(cts[0]) else 2 * cts[0]]
            if _compat.is_undefined_primal(x)
            else [None]
        ),
        dce=dce,
    )
    x = jnp.arange(3.0)
    (y,) = twice.bind(x)
    np.testing.assert_allclose(y, 2 * x)
    np.testing.assert_allclose(jax.jit(lambda v: twice.bind(v)[0])(x), 2 * x)
    np.testing.assert_allclose(jax.vmap(lambda v: twice.bind(v)[0])(x[:, None]), 2 * x[:, None])
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(twice.bind(v)[0]))(x), [2.0] * 3)
    np.testing.assert_allclose(jax.vmap(lambda v: twice.bind(x)[0] + v)(x), 2 * x + x[:, None])
    assert [list(d) for d in batched] == [
        [0]
    ]  # the unbatched bind (under the second vmap) is not the rule's
    unused = _compat.dce(jax.make_jaxpr(lambda v: (twice.bind(v), v)[1])(x))
    assert pruned[-1] == [False] and not unused.eqns
