"""The public surface: decorator forms, attributes, reports, argument checking, errors."""

from __future__ import annotations

import os
import warnings

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import ClosedJaxpr
from jax.sharding import PartitionSpec as P

import jaxpr_accum as ja
from jaxpr_accum.testing import assert_tree_close

from .oracle import assert_matches_original, modes

N = 12
CHUNK = 5

_rs = np.random.RandomState(0)
W = jnp.asarray(_rs.normal(size=(3, 4)), jnp.float32)
X = jnp.asarray(_rs.normal(size=(N, 3)), jnp.float32)


def loss(w, x):
    return jnp.tanh(x @ w).sum()


THIS_FILE = os.path.basename(__file__)


# --------------------------------------------------------------------------------------
# Public names and decorator forms
# --------------------------------------------------------------------------------------


def test_public_names():
    for name in ["serialize_axis", "SerializedFunction", "Plan", "SerializeError", "register_rule"]:
        assert hasattr(ja, name), name
    assert issubclass(ja.SerializeError, ValueError)
    assert callable(ja.register_rule)


def test_decorator_with_chunk_only():
    @ja.serialize_axis(chunk=4)
    def f(w, x):
        return jnp.tanh(x @ w).sum()

    assert isinstance(f, ja.SerializedFunction)
    assert_matches_original(f, W, X, vmap=False)


def test_decorator_with_axis_and_chunk():
    @ja.serialize_axis(axis=0, chunk=4)
    def f(w, x):
        return jnp.tanh(x @ w).sum()

    assert isinstance(f, ja.SerializedFunction)
    assert_matches_original(f, W, X, vmap=False)


def test_direct_call_form():
    sf = ja.serialize_axis(loss, chunk=4)
    assert isinstance(sf, ja.SerializedFunction)
    assert_matches_original(sf, W, X, vmap=False)


def test_original_is_the_wrapped_function():
    sf = ja.serialize_axis(loss, chunk=4, argnums=1)
    assert sf.original is loss

    @ja.serialize_axis(chunk=4)
    def g(w, x):
        return loss(w, x)

    assert g.original(W, X) == loss(W, X)
    assert not isinstance(g.original, ja.SerializedFunction)


@pytest.mark.parametrize("grad", modes("remat", "native", slow=("auto",)))
def test_grad_modes_accepted(grad):
    sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, grad=grad)
    assert_matches_original(sf, W, X, vmap=False)


@pytest.mark.slow
def test_keyword_arguments_at_call():
    sf = ja.serialize_axis(loss, chunk=CHUNK)
    assert jnp.allclose(sf(W, x=X), loss(W, X), rtol=2e-4)
    assert jnp.allclose(sf(w=W, x=X), loss(W, X), rtol=2e-4)


# --------------------------------------------------------------------------------------
# explain / jaxpr
# --------------------------------------------------------------------------------------


def test_explain_returns_plan_with_sizes():
    sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1)
    plan = sf.explain(W, X)
    assert isinstance(plan, ja.Plan)
    assert plan.axis_size == N and plan.chunk == CHUNK, str(plan)
    report = str(plan)  # the readable report shows them too
    assert isinstance(report, str) and report.strip()
    assert str(N) in report, report
    assert str(CHUNK) in report, report


def test_explain_automatic_axis():
    sf = ja.serialize_axis(loss, chunk=CHUNK)
    plan = sf.explain(W, X)
    assert plan.axis_size == N and plan.chunk == CHUNK, str(plan)


def test_explain_reports_barrier_with_primitive():
    """A cumsum along the axis on a side branch cannot be chunked; the rest can. The plan's
    stops (or the error, if the rewriter refuses) name the primitive."""

    def f(w, x):
        h = jnp.tanh(x @ w)
        side = jnp.cumsum(h, axis=0)[-1].sum()
        return h.sum() + side

    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1)
    try:
        plan = sf.explain(W, X)
        stops, shown = plan.stops, str(plan)
    except ja.SerializeError as e:  # refusing outright is allowed, but must say why
        stops = [shown := str(e)]
    assert any("cumsum" in s for s in stops), shown


@pytest.mark.slow
def test_explain_lists_a_stop_repeated_over_the_axis_once_with_its_count(capsys):
    """``jax.debug.print`` in a ``vmap``-ped function is one callback per row, each read
    through a ``slice`` of the axis: ``explain`` lists that stop once, with the count, and
    keeps distinct stops apart; the call's value and gradient are the original's."""
    n = 24

    def per_row(h):
        jax.debug.print("first {}", h[0])
        return jnp.sum(jnp.tanh(h) ** 2)

    def f(w, x):
        h = x @ w
        side = jnp.cumsum(h, axis=0)[-1].sum()  # a stop of its own, once
        return jnp.sum(jax.vmap(per_row)(h)) + side

    rs = np.random.RandomState(3)
    w = jnp.asarray(rs.normal(size=(3, 512)) / 2, jnp.float32)  # activations >> stacked
    x = jnp.asarray(rs.normal(size=(n, 3)), jnp.float32)
    sf = ja.serialize_axis(f, chunk=8, argnums=1)
    plan = sf.explain(w, x)
    repeated = [s for s in plan.stops if s.repeats > 1]
    assert [s.repeats for s in repeated] == [n], plan.stops
    assert f"({n} identical stops)" in repeated[0] and "slice" in repeated[0], repeated
    assert len(plan.stops) == len(set(plan.stops)), plan.stops
    assert any("cumsum" in s and s.repeats == 1 for s in plan.stops), plan.stops
    report = str(plan)
    assert report.count(f"({n} identical stops)") == 1, report
    assert len(report.splitlines()) < 30, report
    assert_tree_close(jax.value_and_grad(sf)(w, x), jax.value_and_grad(f)(w, x))
    assert capsys.readouterr().out.count("first ") == 2 * n  # the original's prints too


def test_jaxpr_is_closed_jaxpr():
    sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1)
    jaxpr = sf.jaxpr(W, X)
    assert isinstance(jaxpr, ClosedJaxpr)
    out = jax.extend.core.jaxpr_as_fun(jaxpr)(*jax.tree.leaves((W, X)))
    np.testing.assert_allclose(np.asarray(out[0]), np.asarray(loss(W, X)), rtol=2e-4)


def test_jaxpr_avals_match_original():
    sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1)
    got = sf.jaxpr(W, X)
    ref = jax.make_jaxpr(loss)(W, X)
    assert [v.aval for v in got.jaxpr.invars] == [v.aval for v in ref.jaxpr.invars]
    assert [v.aval for v in got.jaxpr.outvars] == [v.aval for v in ref.jaxpr.outvars]


# --------------------------------------------------------------------------------------
# Bad arguments: ValueError / TypeError naming the argument, at decoration or first call
# --------------------------------------------------------------------------------------


def _raises_naming(name, make, call=True):
    with pytest.raises((ValueError, TypeError)) as info:
        sf = make()
        if call:
            sf(W, X)
    assert name in str(info.value), f"message does not name {name!r}: {info.value}"
    return info.value


@pytest.mark.parametrize(
    "chunk",
    [0, -1, 2.5, "4", True, None, jnp.array(4.0), np.array([4]), np.array([4, 2]), np.float32(4)],
    ids=lambda c: type(c).__name__ + str(getattr(c, "shape", "")),
)
def test_bad_chunk(chunk):
    _raises_naming("chunk", lambda: ja.serialize_axis(loss, chunk=chunk, argnums=1))


@pytest.mark.parametrize("chunk", [0, -1, 2.5, True])
def test_bad_chunk_decorator_form(chunk):
    def make():
        @ja.serialize_axis(chunk=chunk)
        def f(w, x):
            return loss(w, x)

        return f

    _raises_naming("chunk", make)


def test_chunk_numpy_integer_accepted():
    sf = ja.serialize_axis(loss, chunk=np.int64(4), argnums=1)
    assert_tree_close(sf(W, X), loss(W, X))


@pytest.mark.parametrize("argnums", [2, 5, (1, 3), -3])
def test_argnums_out_of_range(argnums):
    _raises_naming("argnums", lambda: ja.serialize_axis(loss, chunk=4, argnums=argnums))


@pytest.mark.parametrize("settings", [{"argnums": 1}, {"in_axes": (None, 0)}])
def test_a_missing_argument_is_the_functions_error_not_a_settings(settings):
    """Review finding: ``sf(W)`` for ``loss(w, x)`` blamed ``argnums``. The function's
    signature does not take the call either: its own ``TypeError`` names the argument."""
    sf = ja.serialize_axis(loss, chunk=4, **settings)
    with pytest.raises(TypeError, match=r"loss\(\) missing a required argument: 'x'"):
        sf(W)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        sf(W, X, z=1)
    assert_tree_close(sf(W, X), loss(W, X))
    if "argnums" in settings:  # a call the function takes: the setting's own error
        _raises_naming("argnums", lambda: sf(W, x=X), call=False)


@pytest.mark.parametrize("argnums", [(1, 1), (1, -1), (0, 1, -2)])
def test_argnums_naming_an_argument_twice(argnums):
    """At decoration where the indices are equal, at the first call where a negative index
    and a positive one name the same argument."""
    error = _raises_naming("argnums", lambda: ja.serialize_axis(loss, chunk=4, argnums=argnums))
    assert "twice" in str(error)


@pytest.mark.parametrize("axis", [2, 7, -3])
def test_axis_out_of_range(axis):
    _raises_naming("axis", lambda: ja.serialize_axis(loss, chunk=4, argnums=1, axis=axis))


def test_axis_out_of_range_for_one_leaf():
    """axis=1 exists for x [12, 3] but not for the per-example weights v [12]."""

    def f(w, x, v):
        return (jnp.tanh(x @ w).sum(-1) * v).sum()

    v = jnp.ones((N,))
    sf = ja.serialize_axis(f, chunk=4, argnums=(1, 2), axis=1)
    with pytest.raises((ValueError, TypeError)) as info:
        sf(W, X, v)
    assert "axis" in str(info.value), str(info.value)


def test_unequal_sizes_across_leaves():
    def f(w, x, y):
        return jnp.tanh(x @ w).sum() + jnp.sin(y).sum()

    y = jnp.ones((N - 4, 2))
    sf = ja.serialize_axis(f, chunk=4, argnums=(1, 2))
    with pytest.raises((ValueError, TypeError)) as info:
        sf(W, X, y)
    msg = str(info.value)
    assert str(N) in msg and str(N - 4) in msg, msg


def test_unequal_sizes_within_one_argument():
    def f(w, batch):
        x, y = batch
        return jnp.tanh(x @ w).sum() + jnp.sin(y).sum()

    sf = ja.serialize_axis(f, chunk=4, argnums=1)
    with pytest.raises((ValueError, TypeError)) as info:
        sf(W, (X, jnp.ones((N + 1,))))
    msg = str(info.value)
    assert str(N) in msg and str(N + 1) in msg, msg


class _LooksLikeRemat:
    """Not a string, though it compares equal to one."""

    def __eq__(self, other):
        return other == "remat"

    __hash__ = object.__hash__


@pytest.mark.parametrize("grad", ["bogus", "", None, 1, "Remat", _LooksLikeRemat()])
def test_bad_grad_mode(grad):
    _raises_naming("grad", lambda: ja.serialize_axis(loss, chunk=4, argnums=1, grad=grad))


@pytest.mark.parametrize("size", [0, -2, 2.5])
def test_bad_size(size):
    _raises_naming("size", lambda: ja.serialize_axis(loss, chunk=4, size=size))


@pytest.mark.parametrize("gather", ["twice", None])
def test_bad_gather(gather):
    message = _raises_naming("gather", lambda: ja.serialize_axis(loss, chunk=4, gather=gather))
    assert "'auto', 'chunk', 'once'" in str(message), message


@pytest.mark.parametrize("specs", ["data", (P("data"), 0), [None, ("data",)]])
def test_bad_param_specs(specs):
    _raises_naming("param_specs", lambda: ja.serialize_axis(loss, chunk=4, param_specs=specs))


def test_param_specs_naming_an_axis_the_mesh_lacks():
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    sf = ja.serialize_axis(
        loss, chunk=4, argnums=1, mesh_axis="data", param_specs=(P("model"), None)
    )
    with (
        jax.set_mesh(mesh),
        pytest.raises(ValueError, match=r"`param_specs` names mesh axes \['model'\]"),
    ):
        sf(W, X)


def test_not_callable():
    for make in (lambda: ja.serialize_axis(3, chunk=4), lambda: ja.serialize_axis(4)):
        with pytest.raises(TypeError, match="`fun` must be callable, got [34]"):
            make()
    with pytest.raises(TypeError, match="`fun` must be callable"):
        ja.serialize_axis(chunk=4)(5)


def test_a_traced_chunk_is_named():
    """A setting passed in as a traced value (inside ``jax.jit``) says which setting."""
    with pytest.raises(TypeError, match="`chunk` must be a concrete integer"):
        jax.jit(lambda c: ja.serialize_axis(loss, chunk=c, argnums=1)(W, X))(4)


# --------------------------------------------------------------------------------------
# Programs that cannot be serialized
# --------------------------------------------------------------------------------------


def _cumsum_loss(x):
    return jnp.cumsum(x, axis=0).sum()


def _sort_loss(x):
    return (jnp.sort(x, axis=0) * jnp.arange(x.shape[0])[:, None]).sum()


@pytest.mark.parametrize(
    "fn, primitive", [(_cumsum_loss, "cumsum"), (_sort_loss, "sort")], ids=["cumsum", "sort"]
)
def test_nothing_chunkable_raises(fn, primitive):
    sf = ja.serialize_axis(fn, chunk=4, argnums=0)
    with pytest.raises(ja.SerializeError) as info:
        sf(X)
    msg = str(info.value)
    assert primitive in msg, msg
    assert THIS_FILE in msg, f"message should point at the user's source line: {msg}"


def test_nothing_chunkable_explain_also_raises_or_reports():
    sf = ja.serialize_axis(_cumsum_loss, chunk=4, argnums=0)
    try:
        plan = sf.explain(X)
        stops, shown = plan.stops, str(plan)
    except ja.SerializeError as e:
        stops = [shown := str(e)]
    assert any("cumsum" in s for s in stops), shown


def test_two_candidate_axes_of_requested_size():
    """size=n names an axis, and two unrelated independent axes have that size: the cost
    model chooses (the larger region, on ``a``) and ``explain`` lists the other."""
    rs = np.random.RandomState(1)
    a = jnp.asarray(rs.normal(size=(6, 30)), jnp.float32)
    b = jnp.asarray(rs.normal(size=(6, 2)), jnp.float32)

    def f(a, b):
        return jnp.tanh(a).sum() + jnp.sin(b).sum()

    sf = ja.serialize_axis(f, chunk=2, size=6)
    plan = sf.explain(a, b)
    assert plan.born == "dimension 0 of a", str(plan)
    others = [c for c in plan.candidates if not c.chosen]
    assert [c.born for c in others] == ["dimension 0 of b"], str(plan)
    chosen = next(c for c in plan.candidates if c.chosen)
    assert chosen.saved_bytes > others[0].saved_bytes > 0, plan.candidates  # saves more
    assert tuple(chosen) == (chosen.size, chosen.born, chosen.saved_bytes, True)  # a tuple too
    assert_matches_original(sf, a, b, vmap=False)


N_DIM, POP = 16, 128


def _rastrigin(x):
    return jnp.sum(x**2 - 10 * jnp.cos(2 * jnp.pi * x)) + 10 * x.shape[0]


def cma_es_step(mean, sigma, c_sqrt, key):
    """A CMA-ES generation as evosax writes it: the population drawn at dimension 1
    (``(n_dim, pop)``), evaluated with ``vmap`` over that axis, its fitness sorted, and the
    rank-mu update as a weighted sum of outer products of the sorted steps (an ``einsum``,
    which XLA fuses on every JAX tested; stacked ``outer`` products are materialised whole
    after the loop by the XLA of JAX 0.9 and outweigh the population)."""
    z = jax.random.normal(key, (N_DIM, POP))
    y = c_sqrt @ z
    f = jax.vmap(_rastrigin, in_axes=1)(mean[:, None] + sigma * y)
    weights = jnp.log(POP / 2 + 0.5) - jnp.log(jnp.arange(1, POP + 1))
    weights = jnp.where(jnp.arange(POP) < POP // 2, weights, 0.0)
    ys = y[:, jnp.argsort(f)].T
    rank_mu = jnp.einsum("p,pi,pj->ij", weights, ys, ys) / weights.sum()
    return jnp.sum(rank_mu) + 1e-3 * jnp.sum(f)


@pytest.mark.slow
def test_size_at_the_default_axis_names_the_axis_that_saves():
    """``size=pop`` at the default ``axis=0`` finds only the sorted ranks (dimension 0 of an
    ``iota``/``sort``), which save nothing; the population is drawn at dimension 1. The
    one warning names that axis and ``axis=None``, which selects it; with ``axis=None``
    the population is chunked and saves memory, with the original's values and gradients."""
    rs = np.random.RandomState(5)
    args = (
        jnp.asarray(rs.normal(size=N_DIM), jnp.float32),
        jnp.asarray(0.5, jnp.float32),
        jnp.asarray(np.eye(N_DIM) + rs.normal(size=(N_DIM, N_DIM)) / 20, jnp.float32),
        jax.random.key(0),
    )
    sf = ja.serialize_axis(cma_es_step, size=POP, chunk=POP // 8)
    with pytest.warns(ja.PlanWarning) as record:
        np.testing.assert_allclose(sf(*args), cma_es_step(*args), rtol=1e-5)
    (warning,) = [str(w.message) for w in record if issubclass(w.category, ja.PlanWarning)]
    assert "dimension 1 of `random_bits`" in warning and "pass `axis=None`" in warning, warning

    found = ja.serialize_axis(cma_es_step, size=POP, chunk=POP // 8, axis=None)
    assert found.explain(*args).born.startswith("dimension 1 of `random_bits`")

    def temp(f):
        return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes

    assert temp(found) < 0.7 * temp(cma_es_step), (temp(found), temp(cma_es_step))
    vg = jax.value_and_grad
    assert_tree_close(vg(found, (0, 1, 2))(*args), vg(cma_es_step, (0, 1, 2))(*args))


@pytest.mark.slow
def test_cost_model_sign_agrees_with_xla_on_each_axis_of_a_recurrent_model():
    """The estimate ``explain`` shows for an axis (``Plan.candidates``) has the sign of what
    XLA measures, on the axes of a time-major recurrent model: the batch (dimension 1 of
    ``xs``) saves; the widths of ``w``, whose chunking keeps a cotangent of every activation
    computed before the loop, cost. At the default ``axis=0`` automatic mode has no batch
    (the time, dimension 0 of ``xs``, is the scan's own axis): it says so and names the
    batch; ``axis=None`` finds it."""
    rs = np.random.RandomState(0)
    w = jnp.asarray(rs.normal(size=(32, 32)) / 6, jnp.float32)
    xs = jnp.asarray(rs.normal(size=(12, 64, 32)), jnp.float32)

    def recurrent(w, xs):
        def step(h, xt):
            h = jnp.tanh(xt @ w + h @ w)
            return h, h

        _, hs = lax.scan(step, jnp.zeros(xs.shape[1:]), xs)
        return jnp.mean(jnp.tanh(hs @ w) ** 2)

    def temp(f):
        lowered = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(w, xs)
        return lowered.compile().memory_analysis().temp_size_in_bytes

    original = temp(recurrent)
    for kwargs, saves in [
        ({"argnums": 1, "axis": 1}, True),  # the batch
        ({"argnums": 0, "axis": 0}, False),  # the input width
        ({"argnums": 0, "axis": 1}, False),  # the output width
    ]:
        sf = ja.serialize_axis(recurrent, chunk=8, **kwargs)
        (estimate,) = [c.saved_bytes for c in sf.explain(w, xs).candidates]
        with warnings.catch_warnings():  # the plans along the widths warn: none saves memory
            warnings.simplefilter("ignore", ja.PlanWarning)
            measured = original - temp(sf)
        assert (estimate > 0) == saves == (measured > 0), (kwargs, estimate, measured)

    plan = ja.serialize_axis(recurrent, chunk=8).explain(w, xs)
    assert plan.warning is not None and "dimension 1 of xs" in plan.warning, str(plan)
    assert "`axis=None`" in plan.warning, str(plan)
    sf = ja.serialize_axis(recurrent, chunk=8, axis=None)
    plan = sf.explain(w, xs)
    assert plan.born == "dimension 1 of xs" and plan.warning is None, str(plan)
    assert_matches_original(sf, w, xs, vmap=False)


def test_chunk_larger_than_axis_is_one_chunk():
    sf = ja.serialize_axis(loss, chunk=N + 100, argnums=1)
    with pytest.warns(ja.PlanWarning, match=f"one chunk of {N + 100} holds the whole axis of {N}"):
        assert_matches_original(sf, W, X, vmap=False)
