"""Tests of ``jaxpr_accum.testing``: the comparison, the strategies, ``check``, seeded defects.

The two seeded defects of the testing issue:

* a custom primitive that is the identity in the original, with a registered rule whose
  chunk-size version scales the gradient by 0.999 (the value is unchanged): the check must
  fail and name the one leaf whose gradient is scaled;
* a ``custom_vjp`` whose backward centres the cotangent over the batch (``g - g.mean(0)``):
  the library keeps such a call unchunked, so the check must pass in every mode;
* a rule that is exact as called and scales a gradient only under ``jax.vmap`` (r13's kind):
  the check must fail in that vmap context and pass with ``vmap=False``.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

import jaxpr_accum as ja
from jaxpr_accum import testing

from .oracle import modes

MODES = testing.MODES  # what ``check`` tries: every mode but "auto", which is one of them


def _mlp_loss(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"]) ** 2)


def _mlp_args(n=10, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    params = {
        "w1": jax.random.normal(k[0], (4, 8)) * 0.5,
        "b1": jax.random.normal(k[1], (8,)) * 0.1,
        "w2": jax.random.normal(k[2], (8, 3)) * 0.5,
    }
    return params, jax.random.normal(k[3], (n, 4))


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------


def test_small_leaf_is_compared_at_its_own_magnitude():
    """The old oracle's scale, max(1, max|ref|), let a 1e-4 leaf come back as zeros."""
    ref = {"big": jnp.full(3, 3.0), "small": jnp.full(3, 1e-2)}
    with pytest.raises(AssertionError, match=r"output\['small'\].*\n.*\n.*the leaf's own"):
        testing.assert_tree_close({"big": ref["big"], "small": jnp.zeros(3)}, ref)
    nudged = {"big": ref["big"], "small": ref["small"] * (1 + 1e-5)}
    testing.assert_tree_close(nudged, ref)


def test_scale_is_floored_at_a_thousandth_of_the_largest_leaf():
    """A leaf that is zero in exact arithmetic is compared at the scale of its tree."""
    ref = {"w": jnp.ones(3), "zero": jnp.zeros(3)}
    testing.assert_tree_close({"w": ref["w"], "zero": jnp.full(3, 1e-8)}, ref)
    with pytest.raises(AssertionError, match=r"0\.001 of the largest leaf"):
        testing.assert_tree_close({"w": ref["w"], "zero": jnp.full(3, 1e-5)}, ref)


def test_all_zero_tree_must_stay_zero():
    testing.assert_tree_close(jnp.zeros(3), jnp.zeros(3))
    with pytest.raises(AssertionError, match="absolute floor"):
        testing.assert_tree_close(jnp.full(3, 1e-20), jnp.zeros(3))


@pytest.mark.parametrize(
    "dtype, ok, bad",
    [(np.float64, 1e-12, 1e-8), (np.float32, 1e-5, 1e-3), (jnp.bfloat16, 1e-2, 5e-2)],
)
def test_default_tolerance_by_dtype(dtype, ok, bad):
    ref = np.linspace(1.0, 2.0, 5).astype(dtype)
    close = (np.linspace(1.0, 2.0, 5) * (1 + ok)).astype(dtype)
    far = (np.linspace(1.0, 2.0, 5) * (1 + bad)).astype(dtype)
    testing.assert_tree_close(close, ref)
    with pytest.raises(AssertionError, match="tolerance"):
        testing.assert_tree_close(far, ref)


def test_rtol_overrides_as_float_and_mapping():
    ref, got = jnp.ones(3), jnp.full(3, 1.001)
    with pytest.raises(AssertionError):
        testing.assert_tree_close(got, ref)
    testing.assert_tree_close(got, ref, rtol=1e-2)
    testing.assert_tree_close(got, ref, rtol={jnp.float32: 1e-2})
    with pytest.raises(AssertionError):
        testing.assert_tree_close(got, ref, rtol={jnp.float64: 1e-2})


def test_integer_bool_and_key_leaves_must_be_identical():
    ref = {"i": jnp.arange(4), "b": jnp.array([True, False]), "k": jax.random.key(0)}
    testing.assert_tree_close(dict(ref), ref)
    for name, value in [
        ("i", jnp.array([0, 1, 2, 4])),
        ("b", jnp.array([True, True])),
        ("k", jax.random.key(1)),
    ]:
        with pytest.raises(AssertionError, match=rf"(?s)output\['{name}'\] differs.*bit-identical"):
            testing.assert_tree_close({**ref, name: value}, ref)


def test_structure_shape_dtype_and_non_finite_mismatches():
    with pytest.raises(AssertionError, match="pytree structure"):
        testing.assert_tree_close({"a": jnp.ones(2)}, {"b": jnp.ones(2)})
    with pytest.raises(AssertionError, match=r"float32\[3\], original float32\[2\]"):
        testing.assert_tree_close(jnp.ones(3), jnp.ones(2))
    with pytest.raises(AssertionError, match="float16"):
        testing.assert_tree_close(jnp.ones(2, jnp.float16), jnp.ones(2))
    with pytest.raises(AssertionError, match=r"non-finite entries differ, first at index \(1\)"):
        testing.assert_tree_close(jnp.array([1.0, 2.0]), jnp.array([1.0, jnp.nan]))
    special = jnp.array([1.0, jnp.nan, -jnp.inf])
    testing.assert_tree_close(special, jnp.array(special))


def test_tree_difference_reports_the_worst_leaf():
    ref = {"a": jnp.ones(3), "b": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
    got = {"a": ref["a"], "b": ref["b"].at[1, 0].add(0.03)}
    diff = testing.tree_difference(got, ref)
    assert diff.path == "['b']" and diff.index == (1, 0)
    np.testing.assert_allclose(diff.max_abs, 0.03, rtol=1e-5)
    np.testing.assert_allclose(diff.max_rel, 0.03 / 4, rtol=1e-5)
    assert testing.tree_difference(ref, ref) == testing.Difference(0.0, 0.0, "", ())


# --------------------------------------------------------------------------------------------
# assert_matches_original
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_assert_matches_original_in_every_mode_and_chunk():
    params, x = _mlp_args()
    sf = ja.serialize_axis(_mlp_loss, chunk=3, argnums=1)
    testing.assert_matches_original(sf, params, x)
    testing.assert_matches_original(sf, params, x, modes=MODES, chunks=[1, 4, 10, 13])


@pytest.mark.slow
def test_integer_and_key_inputs_and_outputs():
    """Keys and labels pass through undifferentiated; integer outputs are compared exactly."""

    def f(w, x, labels, key):
        noise = jax.random.normal(key, x.shape)
        logits = (x + 0.1 * noise) @ w
        ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)
        return ce.sum(), logits.argmax(-1)

    k = jax.random.split(jax.random.key(0), 3)
    w, x = jax.random.normal(k[0], (4, 5)), jax.random.normal(k[1], (12, 4))
    labels = jax.random.randint(k[2], (12,), 0, 5)
    sf = ja.serialize_axis(f, chunk=5, argnums=(1, 2))
    testing.assert_matches_original(sf, w, x, labels, jax.random.key(3), modes=MODES)


@pytest.mark.slow
def test_keyword_arguments_are_differentiated():
    def f(x, *, w):
        return jnp.sum(jnp.sin(x @ w))

    sf = ja.serialize_axis(f, chunk=3, argnums=0)
    testing.assert_matches_original(sf, jnp.ones((7, 2)), w=jnp.ones((2, 3)) * 0.3)


def test_rejects_a_plain_function():
    with pytest.raises(TypeError, match="SerializedFunction"):
        testing.assert_matches_original(_mlp_loss, *_mlp_args())


def test_nothing_to_differentiate_is_a_clear_error():
    sf = ja.serialize_axis(lambda i: (i * 2).sum(), chunk=2, argnums=0)
    with pytest.raises(ValueError, match="nothing to differentiate"):
        testing.assert_matches_original(sf, jnp.arange(6))


@pytest.mark.slow
def test_automatic_axis_is_kept_at_chunks_as_long_as_the_axis():
    """Automatic selection only looks at axes longer than ``chunk``; the copies at other
    chunk sizes keep the axis that ``sf`` serializes."""

    def f(w, key):
        z = jax.random.normal(key, (6, 5))
        return jnp.mean(jnp.tanh(z @ w) ** 2)

    sf = ja.serialize_axis(f, chunk=2)
    w = jnp.ones((5, 9)) * 0.2
    testing.assert_matches_original(sf, w, jax.random.key(0), chunks=[6, 9], modes=MODES)


# --------------------------------------------------------------------------------------------
# Seeded defect 1: the chunked gradient of one leaf scaled by 0.999
# --------------------------------------------------------------------------------------------

seeded_p = Primitive("jaxpr_accum_test_testing_seeded_identity")
seeded_p.def_impl(lambda x: x)
seeded_p.def_abstract_eval(lambda x: x)
ad.defjvp(seeded_p, lambda g, x: g)
mlir.register_lowering(seeded_p, mlir.lower_fun(lambda x: x, multiple_results=False))


class _ScalesGradientAtChunkSize:
    """The identity at full size; at chunk size, the same value with its gradient x0.999."""

    def propagate(self, eqn, view):
        if view.in_loc(0) is not None:
            view.set_out(0, view.in_loc(0))
        if view.out_loc(0) is not None:
            view.set_in(0, view.out_loc(0))

    def resize(self, eqn, r, invals):
        (x,) = invals
        return [0.999 * x + jax.lax.stop_gradient(0.001 * x)]


ja.register_rule(seeded_p, _ScalesGradientAtChunkSize())


def _seeded_loss(params, x):
    """Only the bias passes through the seeded primitive (broadcast along the batch)."""
    b = jnp.broadcast_to(params["b1"], (x.shape[0], params["b1"].shape[0]))
    h = jnp.tanh(x @ params["w1"] + seeded_p.bind(b))
    return jnp.mean((h @ params["w2"]) ** 2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.slow
def test_seeded_scaled_gradient_is_caught_and_named(mode):
    params, x = _mlp_args()
    sf = ja.serialize_axis(_seeded_loss, chunk=3, argnums=1, grad=mode)
    assert not sf.explain(params, x).stops  # the seeded primitive is chunked
    with pytest.raises(AssertionError) as info:
        testing.assert_matches_original(sf, params, x)
    msg = str(info.value)
    print(msg)
    assert "gradient at args[0]['b1'] differs from the original's" in msg, msg
    assert "relative error 9.99" in msg or "relative error 1.00" in msg, msg
    assert "worst |serialized - original|" in msg and "at index (" in msg, msg
    assert f"plan: grad mode '{mode}', chunk 3 of an axis of size 10" in msg, msg
    assert "w1" not in msg and "w2" not in msg, msg


@pytest.mark.slow
def test_check_finds_the_seeded_defect():
    params, x = _mlp_args()
    sf = ja.serialize_axis(_seeded_loss, chunk=3, argnums=1)
    with pytest.raises(AssertionError, match=r"gradient at args\[0\]\['b1'\]") as info:
        testing.check(sf, params, x, max_examples=4)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "chunk=1" in notes, notes  # shrunk to the smallest chunk
    assert "every float leaf at its own size" in notes, notes  # and the simplest inputs


# --------------------------------------------------------------------------------------------
# Seeded defect 3: exact when called, a gradient scaled by 0.999 only under jax.vmap (r13's kind)
# --------------------------------------------------------------------------------------------

vmap_seeded_p = Primitive("jaxpr_accum_test_testing_vmap_seeded_identity")
chunk_vmap_seeded_p = Primitive("jaxpr_accum_test_testing_vmap_seeded_identity_chunk")
#: the chunk twin's tangent: the identity, linear, whose batching rule scales it by 0.999
chunk_tangent_seeded_p = Primitive("jaxpr_accum_test_testing_vmap_seeded_tangent_chunk")
for _p in (vmap_seeded_p, chunk_vmap_seeded_p, chunk_tangent_seeded_p):
    _p.def_impl(lambda x: x)
    _p.def_abstract_eval(lambda x: x)
    mlir.register_lowering(_p, mlir.lower_fun(lambda x: x, multiple_results=False))
    batching.primitive_batchers[_p] = lambda xs, dims, p=_p: (p.bind(*xs), dims[0])
ad.defjvp(vmap_seeded_p, lambda g, x: g)
ad.defjvp(chunk_vmap_seeded_p, lambda g, x: chunk_tangent_seeded_p.bind(g))
ad.deflinear(chunk_tangent_seeded_p, lambda ct: [chunk_tangent_seeded_p.bind(ct)])
batching.primitive_batchers[chunk_tangent_seeded_p] = lambda xs, dims: (0.999 * xs[0], dims[0])


class _ScalesGradientWhenBatched(_ScalesGradientAtChunkSize):
    """The chunked program binds a twin primitive: the identity, exact as called, whose
    tangent's batching rule scales it by 0.999 (a chunked program wrong only under vmap)."""

    def resize(self, eqn, r, invals):
        (x,) = invals
        return [chunk_vmap_seeded_p.bind(x)]


ja.register_rule(vmap_seeded_p, _ScalesGradientWhenBatched())


def _vmap_seeded_loss(params, x):
    b = jnp.broadcast_to(params["b1"], (x.shape[0], params["b1"].shape[0]))
    h = jnp.tanh(x @ params["w1"] + vmap_seeded_p.bind(b))
    return jnp.mean((h @ params["w2"]) ** 2)


@pytest.mark.parametrize("mode", modes("remat", slow=MODES))
@pytest.mark.slow
def test_a_defect_only_under_vmap_is_caught_in_its_context(mode):
    """The vmap contexts are what fails (item 8 of issue 19: they would have caught r13)."""
    params, x = _mlp_args()
    sf = ja.serialize_axis(_vmap_seeded_loss, chunk=3, argnums=1, grad=mode)
    testing.assert_matches_original(sf, params, x, vmap=False)  # exact as called
    with pytest.raises(AssertionError) as info:
        testing.assert_matches_original(sf, params, x, chunks=[3, 4])
    msg = str(info.value)
    assert "gradient under jax.vmap over argument 0 at args[0]['b1']" in msg, msg
    assert "w1" not in msg and "w2" not in msg, msg


@pytest.mark.slow
def test_check_finds_the_defect_only_under_vmap():
    params, x = _mlp_args()
    sf = ja.serialize_axis(_vmap_seeded_loss, chunk=3, argnums=1)
    with pytest.raises(AssertionError, match=r"under jax\.vmap over argument 0"):
        testing.check(sf, params, x, max_examples=4)
    testing.check(sf, params, x, max_examples=2, vmap=False)  # the same, as called: passes


# --------------------------------------------------------------------------------------------
# Seeded defect 2: a custom_vjp whose backward takes a statistic over the batch
# --------------------------------------------------------------------------------------------


@jax.custom_vjp
def _centre_cotangent(h):
    return h


def _centre_fwd(h):
    return h, None


def _centre_bwd(_, g):
    return (g - g.mean(0),)


_centre_cotangent.defvjp(_centre_fwd, _centre_bwd)


def _batch_statistic_loss(params, x):
    h = _centre_cotangent(jnp.tanh(x @ params["w1"] + params["b1"]))
    return jnp.sum((h @ params["w2"]) ** 2)


@pytest.mark.slow
def test_batch_statistic_custom_vjp_matches_the_original():
    """Chunking this call would centre each chunk's cotangent on the chunk's own mean; the
    library must keep it unchunked (exact) in every mode, at every chunk size."""
    params, x = _mlp_args()
    sf = ja.serialize_axis(_batch_statistic_loss, chunk=3, argnums=1)
    testing.assert_matches_original(sf, params, x, modes=MODES, chunks=[1, 3, 4, 10])


@pytest.mark.slow
def test_batch_statistic_custom_vjp_passes_check():
    params, x = _mlp_args()
    sf = ja.serialize_axis(_batch_statistic_loss, chunk=3, argnums=1)
    testing.check(sf, params, x, max_examples=4)


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------


@given(st.integers(0, 40), st.data())
def test_chunk_sizes_are_the_edge_cases(n, data):
    c = data.draw(testing.chunk_sizes(n))
    assert c >= 1
    assert c in (1, n, n + 3) or (1 < c < n), (n, c)


@pytest.mark.parametrize(
    "name, predicate",
    [
        ("one", lambda c: c == 1),
        ("divisor", lambda c: 1 < c < 12 and 12 % c == 0),
        ("non-divisor", lambda c: 1 < c < 12 and 12 % c != 0),
        ("the axis", lambda c: c == 12),
        ("more than the axis", lambda c: c == 15),
    ],
)
def test_chunk_sizes_reach_every_case(name, predicate):
    assert predicate(find(testing.chunk_sizes(12), predicate)), name


def test_chunk_sizes_of_short_axes():
    assert {find(testing.chunk_sizes(1), lambda c, v=v: c == v) for v in (1, 4)} == {1, 4}
    with pytest.raises(ValueError):
        testing.chunk_sizes(-1)


_EXAMPLE = (
    {"w": jnp.ones((3, 2)), "scale": jnp.full((2,), 0.5), "half": jnp.ones(4, jnp.bfloat16)},
    jnp.array([3, 7, 5], jnp.int32),
    jnp.array([True, False]),
    jax.random.key(0),
    np.zeros((2, 2), np.float32),
    "static",
)


@given(testing.arrays_like(_EXAMPLE))
def test_arrays_like_keeps_structure_shapes_and_dtypes(drawn):
    assert jax.tree.structure(drawn) == jax.tree.structure(_EXAMPLE)
    for got, like in zip(jax.tree.leaves(drawn), jax.tree.leaves(_EXAMPLE), strict=True):
        if isinstance(like, str):
            assert got == like
            continue
        assert got.shape == like.shape and got.dtype == like.dtype
        assert isinstance(got, np.ndarray) == isinstance(like, np.ndarray)
    params, ints = drawn[0], np.asarray(drawn[1])
    assert np.all(np.asarray(params["scale"]) >= 0)  # non-negative like the example
    assert ints.min() >= 3 and ints.max() <= 7  # within the example's range
    assert jax.random.key_impl(drawn[3]) == jax.random.key_impl(_EXAMPLE[3])


def test_arrays_like_draws_tiny_and_large_magnitudes():
    def size(tree):
        return float(jnp.max(jnp.abs(tree["w"])))

    strategy = testing.arrays_like({"w": jnp.ones((4, 4))})
    assert size(find(strategy, lambda t: size(t) > 100)) > 100
    assert size(find(strategy, lambda t: size(t) < 0.01)) < 0.01


def test_arrays_like_nnx_module_is_a_new_module():
    nnx = pytest.importorskip("flax.nnx")
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    drawn = find(testing.arrays_like((model,)), lambda _: True)[0]
    assert type(drawn) is nnx.Linear and drawn is not model
    assert drawn.kernel[...].shape == (3, 2)


# --------------------------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_check_passes_on_a_small_model():
    params, x = _mlp_args(n=9)
    testing.check(ja.serialize_axis(_mlp_loss, chunk=4, argnums=1), params, x, max_examples=6)


@pytest.mark.slow
def test_check_on_an_nnx_model_with_dropout():
    """Dropout draws and the Rngs counter after the call are the original's."""
    nnx = pytest.importorskip("flax.nnx")

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(4, 6, rngs=rngs)
            self.dropout = nnx.Dropout(0.2, rngs=rngs)

        def __call__(self, x):
            return self.dropout(jnp.sin(self.linear(x)))

    def loss(model, x):
        return jnp.mean(model(x) ** 2)

    model = Net(nnx.Rngs(0, dropout=1))
    x = jax.random.normal(jax.random.key(1), (10, 4))
    sf = ja.serialize_axis(loss, chunk=3, argnums=1)
    testing.assert_matches_original(sf, model, x)
    testing.check(sf, model, x, max_examples=3, modes=["remat"])
    assert int(model.dropout.rngs.count[...]) == 0  # the caller's model is left alone


@pytest.mark.slow
def test_missing_hypothesis_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    monkeypatch.setitem(sys.modules, "hypothesis.strategies", None)
    sf = ja.serialize_axis(_mlp_loss, chunk=4, argnums=1)
    for call in (
        lambda: testing.check(sf, *_mlp_args()),
        lambda: testing.chunk_sizes(4),
        lambda: testing.arrays_like(_mlp_args()),
    ):
        hint = r"need Hypothesis: pip install -e '\.\[testing\]'"  # from this clone
        with pytest.raises(ImportError, match=hint):
            call()
    testing.assert_matches_original(sf, *_mlp_args())  # needs no Hypothesis
