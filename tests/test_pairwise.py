"""Values that pair the axis with itself, in two passes (issue 23,
``jaxpr_accum._pairwise``).

Every covered program is checked against the original (values and gradients, ``oracle``)
in every gradient mode, at chunks that divide the batch and that do not, at 1 and at the
batch itself: SimCLR's NT-Xent over 2N views (the matmul form and the
outer-product-then-sum form, the diagonal masked by ``-inf`` or by a large negative constant,
the temperature a differentiated parameter or a constant; two views drawn inside the function
and concatenated), symmetric CLIP with both towers from the chunked batch, kernel MMD^2 with
an RBF kernel (an MMD-VAE's double sums over pairs), a batch-hard triplet loss, and pairwise
distance matrices feeding a sum or per-row reductions. The full matrix is ``slow``; the
default tier runs one representative (SimCLR in remat mode, at a chunk that does not divide).

Structure: the rewritten program has two regions (pass 1 stacks the embeddings, pass 2 runs
the pairs by rows) and no ``N x N`` value at full size; ``explain`` shows both passes, what
is stacked between them and the pairing equation with its source line. A program that pairs
nothing plans exactly as before. Memory: the serialized ``value_and_grad`` at a modest batch
is a fraction of the original's and grows linearly with the batch.
"""

from __future__ import annotations

import re
import warnings
from html import escape

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxpr_accum as ja
from jaxpr_accum import _pairwise
from jaxpr_accum import testing as ja_testing
from jaxpr_accum._planning._budget import temp_bytes
from jaxpr_accum.testing import assert_tree_close

from .oracle import GRAD_MODES, covering, find_eqns, iter_eqns

N, D, H, E = 16, 5, 6, 4  # views (2 x 8), input, hidden and embedding widths


def _normal(rs: np.random.RandomState, *shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray(rs.normal(size=shape) * scale, jnp.float32)


def _params(seed: int, n_in: int = D) -> tuple:
    rs = np.random.RandomState(seed)
    return (_normal(rs, n_in, H, scale=0.5), _normal(rs, H, E, scale=0.5))


def encode(w: tuple, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w[0]) @ w[1]


def normalise(z: jax.Array) -> jax.Array:
    return z / jnp.linalg.norm(z, axis=1, keepdims=True)


# -- the programs ----------------------------------------------------------------------------


def similarities(z: jax.Array, form: str) -> jax.Array:
    if form == "matmul":
        return z @ z.T
    return jnp.sum(z[:, None, :] * z[None, :, :], axis=-1)  # the outer product, then a sum


def nt_xent(z: jax.Array, t: jax.Array | float, form: str, mask: float) -> jax.Array:
    """SimCLR's NT-Xent over ``2n`` views: view ``i``'s positive is view ``(i + n) % 2n``."""
    z = normalise(z)
    sim = similarities(z, form) / t
    n = sim.shape[0]
    sim = jnp.where(jnp.eye(n, dtype=bool), mask, sim)
    positive = (jnp.arange(n) + n // 2) % n
    logp = jax.nn.log_softmax(sim, axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, positive[:, None], axis=1))


def simclr(form: str, mask: float, learnt: bool):
    def loss(w, views, t):
        return nt_xent(encode(w, views), t if learnt else 0.5, form, mask)

    rs = np.random.RandomState(1)
    args = (_params(0), _normal(rs, N, D), jnp.float32(0.4))
    return loss, args, 1


def simclr_views():
    """Two augmented views drawn inside the function (noise per view), concatenated along the
    batch: a batch of ``2n`` rows born at the concatenation, paired by the loss."""

    def loss(w, x, key):
        k1, k2 = jax.random.split(key)
        a = x + 0.1 * jax.random.normal(k1, x.shape)
        b = x * jax.random.uniform(k2, x.shape, minval=0.8, maxval=1.2)
        z = jnp.concatenate([encode(w, a), encode(w, b)])
        return nt_xent(z, 0.5, "matmul", -jnp.inf)

    rs = np.random.RandomState(2)
    return loss, (_params(0), _normal(rs, N // 2, D), jax.random.key(3)), 1


def clip():
    """Symmetric InfoNCE, both towers from the chunked batch: ``(CE(rows) + CE(columns)) / 2``."""

    def loss(w, images, texts, scale):
        za = normalise(encode(w[0], images))
        zb = normalise(encode(w[1], texts))
        logits = za @ zb.T * jnp.exp(scale)
        labels = jnp.arange(logits.shape[0])
        rows = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        columns = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels).mean()
        return (rows + columns) / 2

    rs = np.random.RandomState(4)
    w = (_params(5), _params(6, n_in=3))
    return loss, (w, _normal(rs, N, D), _normal(rs, N, 3), jnp.float32(1.0)), (1, 2)


def rbf(a: jax.Array, b: jax.Array, bandwidth: jax.Array) -> jax.Array:
    return jnp.exp(-jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=-1) / bandwidth)


def mmd():
    """An MMD-VAE's MMD^2 between the encoded batch and prior samples of the same size."""

    def loss(w, x, prior, bandwidth):
        z = encode(w, x)
        zz, pp, zp = rbf(z, z, bandwidth), rbf(prior, prior, bandwidth), rbf(z, prior, bandwidth)
        return jnp.mean(zz) + jnp.mean(pp) - 2 * jnp.mean(zp)

    rs = np.random.RandomState(7)
    return loss, (_params(8), _normal(rs, N, D), _normal(rs, N, E), jnp.float32(2.0)), (1, 2)


def pairwise_distances(z: jax.Array) -> jax.Array:
    """``cdist(z, z)``, expanded: ``|a|^2 + |b|^2 - 2 a.b``."""
    sq = jnp.sum(z**2, axis=1)
    return jnp.sqrt(jnp.maximum(sq[:, None] + sq[None, :] - 2 * z @ z.T, 1e-9))


def triplet():
    """Batch-hard triplets: per anchor the farthest positive and the nearest negative."""

    def loss(w, x, labels, margin):
        d = pairwise_distances(encode(w, x))
        same = labels[:, None] == labels[None, :]
        hardest_positive = jnp.max(jnp.where(same, d, -jnp.inf), axis=1)
        hardest_negative = jnp.min(jnp.where(same, jnp.inf, d), axis=1)
        return jnp.mean(jax.nn.relu(hardest_positive - hardest_negative + margin))

    rs = np.random.RandomState(9)
    labels = jnp.asarray(rs.randint(0, 3, size=N), jnp.int32)
    return loss, (_params(10), _normal(rs, N, D), labels, jnp.float32(0.2)), (1, 2)


def cdist_sum():
    """Pairwise distances (``z[:, None] - z[None]``) feeding a sum."""

    def loss(w, x):
        z = encode(w, x)
        d = jnp.sqrt(jnp.sum((z[:, None, :] - z[None, :, :]) ** 2, axis=-1) + 1e-6)
        return jnp.sum(d) / x.shape[0] ** 2

    rs = np.random.RandomState(11)
    return loss, (_params(12), _normal(rs, N, D)), 1


def cdist_rows():
    """Pairwise distances feeding per-row reductions: each row's nearest other row (an output
    that carries the batch) and the mean distance."""

    def loss(w, x):
        d = pairwise_distances(encode(w, x))
        nearest = jnp.min(jnp.where(jnp.eye(x.shape[0], dtype=bool), jnp.inf, d), axis=1)
        return nearest, jnp.mean(d, axis=1).sum()

    rs = np.random.RandomState(13)
    return loss, (_params(14), _normal(rs, N, D)), 1


PROGRAMS = {
    "simclr_matmul_inf_param": lambda: simclr("matmul", -jnp.inf, True),
    "simclr_matmul_big_const": lambda: simclr("matmul", -9e15, False),
    "simclr_outer_inf_const": lambda: simclr("outer", -jnp.inf, False),
    "simclr_outer_big_param": lambda: simclr("outer", -9e15, True),
    "simclr_views_drawn_inside": simclr_views,
    "clip": clip,
    "mmd": mmd,
    "triplet": triplet,
    "cdist_sum": cdist_sum,
    "cdist_rows": cdist_rows,
}
CHUNKS = (5, 4, 1, N)  # not dividing, dividing, 1, the batch
FAST = {  # the default tier's representative: (grad, chunk); the rest of the matrix is slow
    "simclr_matmul_inf_param": ("remat", 5),
}


def _floating(args: tuple) -> tuple[int, ...]:
    return tuple(
        i for i, a in enumerate(args) if jnp.issubdtype(jax.tree.leaves(a)[0].dtype, jnp.floating)
    )


def _serialized(name: str, grad: str, chunk: int) -> tuple:
    f, args, argnums = PROGRAMS[name]()
    return f, ja.serialize_axis(f, chunk=chunk, argnums=argnums, grad=grad), args


def _quiet(chunk: int) -> warnings.catch_warnings:
    """A chunk that holds a whole axis is warned as not expected to save memory."""
    caught = warnings.catch_warnings()
    caught.__enter__()
    if chunk >= N // 2:
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
    return caught


def _value_and_grad(g, args: tuple, weights: list) -> tuple:
    """``jit(value_and_grad)`` of the outputs weighted by ``weights`` (a random cotangent),
    with respect to every floating argument."""

    def scalar(*a):
        return sum(jnp.sum(o * c) for o, c in zip(jax.tree.leaves(g(*a)), weights, strict=True))

    return jax.jit(jax.value_and_grad(scalar, argnums=_floating(args)))(*args)


def _fast_check(name: str, grad: str, chunk: int) -> ja.Plan:
    """Values and gradients against the original: one compiled ``value_and_grad`` each."""
    f, sf, args = _serialized(name, grad, chunk)
    rs = np.random.RandomState(0)
    weights = [_normal(rs, *jnp.shape(o)) for o in jax.tree.leaves(jax.eval_shape(f, *args))]
    caught = _quiet(chunk)
    try:
        assert_tree_close(_value_and_grad(sf, args, weights), _value_and_grad(f, args, weights))
        return sf.explain(*args)
    finally:
        caught.__exit__(None, None, None)


def _check(name: str, grad: str, chunk: int) -> ja.Plan:
    """The full oracle: outputs, ``jax.vjp`` with a random cotangent, ``jax.grad``."""
    f, sf, args = _serialized(name, grad, chunk)
    caught = _quiet(chunk)
    try:
        ja_testing.assert_matches_original(sf, *args, vmap=False)
        return sf.explain(*args)
    finally:
        caught.__exit__(None, None, None)


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(PROGRAMS)]
)
def test_program_is_exact(name):
    """One compiled ``value_and_grad`` per program (auto mode at a chunk that does not divide
    the batch, or the default tier's choice), and the plan is the two-pass one."""
    grad, chunk = FAST.get(name, ("auto", 5))
    plan = _fast_check(name, grad, chunk)
    assert plan.pairs and plan.second is not None and plan.warning is None, str(plan)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, grad, chunk", covering(sorted(PROGRAMS), GRAD_MODES, CHUNKS, ids=sorted(PROGRAMS), per=1)
)
def test_every_program_mode_and_chunk_is_exact(name, grad, chunk):
    """The full oracle: every program in every mode and at every chunk, as a covering
    (``tests/oracle.covering``; the whole product with ``JAXPR_ACCUM_FULL_MATRIX=1``). At
    ``chunk == N`` one chunk holds the batch and two passes save nothing over one: the
    planner may keep the one-pass plan (or, in auto mode, the function as written); it must
    still be exact."""
    plan = _check(name, grad, chunk)
    if chunk < N:
        assert plan.pairs and plan.second is not None, str(plan)


@pytest.mark.slow
def test_augmentations_drawn_inside_are_bit_identical():
    """The two views drawn inside the function (and the embeddings computed from them) are the
    original's bit for bit: pass 1 draws each chunk's slice of the same random bits."""

    def views(w, x, key):
        k1, k2 = jax.random.split(key)
        a = x + 0.1 * jax.random.normal(k1, x.shape)
        b = x * jax.random.uniform(k2, x.shape, minval=0.8, maxval=1.2)
        z = jnp.concatenate([encode(w, a), encode(w, b)])
        return nt_xent(z, 0.5, "matmul", -jnp.inf), a, b

    _, args, _ = simclr_views()
    sf = ja.serialize_axis(views, chunk=3, argnums=1, grad="remat")
    assert sf.explain(*args).pairs
    got, ref = jax.jit(sf)(*args), jax.jit(views)(*args)
    for g, r in zip(got[1:], ref[1:], strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    assert_tree_close(got[0], ref[0])


# -- structure -------------------------------------------------------------------------------


def _full_pairs(jaxpr, n: int) -> list[str]:
    """Values anywhere in ``jaxpr`` (sub-jaxprs included) with two dimensions of length ``n``."""
    return [
        str(v.aval)
        for eqn in iter_eqns(jaxpr)
        for v in eqn.outvars
        if list(getattr(v.aval, "shape", ())).count(n) >= 2
    ]


def test_two_regions_and_no_full_size_pairs():
    f, args, argnums = simclr("matmul", -jnp.inf, True)
    sf = ja.serialize_axis(f, chunk=3, argnums=argnums, grad="remat")
    program = sf.jaxpr(*args)
    regions = [e for e in program.jaxpr.eqns if e.primitive.name == "serialized_region"]
    assert len(regions) == 2, program
    assert _full_pairs(program, N) == []
    assert _full_pairs(jax.make_jaxpr(jax.grad(sf, argnums=(0, 2)))(*args), N) == []
    reference = jax.make_jaxpr(jax.grad(f, argnums=(0, 2)))(*args)
    assert _full_pairs(reference, N)  # the original holds them whole


def test_explain_shows_both_passes():
    f, args, argnums = simclr("matmul", -jnp.inf, True)
    plan = ja.serialize_axis(f, chunk=3, argnums=argnums, grad="remat").explain(*args)
    text = str(plan)
    assert plan.second is not None and plan.between == [("float32[16,4]", 256)], text
    where = r"`dot_general` at .*test_pairwise.py:\d+ \(similarities\)"
    assert re.search(where, plan.pairs[0]), text
    parts = ["two passes", "pass 1, the per-example part", "pass 2, the pairs by rows"]
    parts += ["stacked by pass 1 for pass 2", "float32[16,4]: 256 B", "estimated saving"]
    for part in parts:
        assert part in text, text
    assert plan.second.axis_size == N and plan.second.counts["body"] > 0
    html = plan._repr_html_()
    assert "pass 2: the pairs by rows" in html and "nt_xent" in html and "float32[16,4]" in html


def gp_negative_log_likelihood(w, x, y, lengthscale):
    """A Gaussian process's marginal likelihood on learnt features: the kernel matrix over
    the batch pairs it with itself, and its ``cholesky`` couples every row (a pass-2 stop)."""
    h = encode(w, x)
    sq = jnp.sum(h * h, axis=-1)
    k = jnp.exp(-(sq[:, None] + sq[None, :] - 2.0 * h @ h.T) / lengthscale)
    low = jnp.linalg.cholesky(k + 0.1 * jnp.eye(x.shape[0]))
    alpha = jax.scipy.linalg.cho_solve((low, True), y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(low)))


def _shown_by_pass(plan) -> tuple[str, str]:
    """The stops listed in the report's and in the HTML's pass-2 section (after its title)."""
    return str(plan).split("pass 2, the pairs by rows")[1], plan._repr_html_().split(
        "pass 2: the pairs by rows"
    )[1]


@pytest.mark.slow
def test_plan_stops_are_every_stop_of_every_pass():
    """Issue 30: a pass-2 stop is in ``plan.stops`` (with ``pass_ == 2``), not only in
    ``plan.second.stops``; the report and the HTML list each stop in its own pass."""
    rs, n = np.random.RandomState(21), 2 * N  # two passes save more than one from here on
    w = (_normal(rs, D, 16, scale=0.5), _normal(rs, 16, E, scale=0.5))
    args = (w, _normal(rs, n, D), _normal(rs, n), jnp.float32(2.0))
    f = gp_negative_log_likelihood
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
        sf = ja.serialize_axis(f, chunk=5, argnums=1, grad="remat")
        plan = sf.explain(*args)
        assert_tree_close(jax.value_and_grad(sf)(*args), jax.value_and_grad(f)(*args))
    assert plan.second is not None and plan.second.stops, str(plan)
    assert [s.pass_ for s in plan.stops] == sorted(s.pass_ for s in plan.stops)
    second = [s for s in plan.stops if s.pass_ == 2]
    assert second == plan.second.stops and all(s.pass_ == 2 for s in plan.second.stops)
    assert [s for s in plan.stops if s.pass_ == 1] == plan.stops[: len(plan.stops) - len(second)]
    text, html = _shown_by_pass(plan)
    for stop in plan.stops:
        assert (stop in text) == (stop.pass_ == 2) and stop in str(plan), (stop, str(plan))
        assert (escape(stop) in html) == (stop.pass_ == 2), (stop, html)
        assert escape(stop) in plan._repr_html_()


@pytest.mark.slow
def test_a_one_pass_plan_has_its_stops_in_pass_1():
    def f(w, x):
        return jnp.sum(jnp.tanh(jnp.cumsum(encode(w, x), axis=0)))  # stops at `cumsum`

    rs = np.random.RandomState(23)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
        plan = ja.serialize_axis(f, chunk=3, argnums=1, grad="remat").explain(
            _params(24), _normal(rs, N, D)
        )
    assert plan.second is None and plan.stops and "cumsum" in plan.stops[0], str(plan)
    assert all(s.pass_ == 1 for s in plan.stops)
    for stop in plan.stops:
        assert stop in str(plan) and escape(stop) in plan._repr_html_()


@pytest.mark.slow
def test_paired_inputs_run_in_one_pass_by_rows():
    """Distances between the rows of an input: no pass 1, the columns are the input whole."""

    def f(x):
        return jnp.sum(jnp.exp(-jnp.sum((x[:, None] - x[None]) ** 2, axis=-1)))

    x = _normal(np.random.RandomState(15), N, 3)
    sf = ja.serialize_axis(f, chunk=3, argnums=0)
    plan = sf.explain(x)
    assert plan.pairs and plan.second is None and not plan.between, str(plan)
    assert "one pass by rows" in str(plan) and "columns of x whole" in plan.pairs[0]
    ja_testing.assert_matches_original(sf, x, vmap=False)


def _mlp(w, x, y):
    return jnp.mean((jnp.tanh(x @ w[0]) @ w[1] - y) ** 2)


def _attention_after_a_barrier(w, x):
    """A cumulative sum along the chunked batch stops the region; the self-attention after it
    pairs the *sequence* with itself, not the batch: no second pass."""
    h = jnp.cumsum(x @ w, axis=0)  # [batch, seq, d]
    s = jnp.einsum("bqd,bkd->bqk", h, h)
    return jnp.sum(jax.nn.softmax(s, axis=-1) @ h)


@pytest.mark.parametrize("case", ["mlp", pytest.param("attention", marks=pytest.mark.slow)])
def test_programs_without_pairs_plan_exactly_as_before(monkeypatch, case):
    rs = np.random.RandomState(16)
    if case == "mlp":
        f, args, argnums = _mlp, (_params(17), _normal(rs, N, D), _normal(rs, N, E)), (1, 2)
    else:
        f, args, argnums = _attention_after_a_barrier, (_normal(rs, 3, 4), _normal(rs, N, 5, 3)), 1
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
        sf = ja.serialize_axis(f, chunk=3, argnums=argnums, grad="remat")
        plan, program = sf.explain(*args), str(sf.jaxpr(*args))
        monkeypatch.setattr(_pairwise, "plan", lambda *a, **k: None)
        before = ja.serialize_axis(f, chunk=3, argnums=argnums, grad="remat")
        assert str(before.explain(*args)) == str(plan) and not plan.pairs
        assert str(before.jaxpr(*args)) == program


@pytest.mark.slow
def test_composes_with_vmap_and_forward_mode():
    f, args, argnums = simclr("outer", -9e15, True)
    sf = ja.serialize_axis(f, chunk=3, argnums=argnums)
    ja_testing.assert_matches_original(sf, *args)
    tangents = jax.tree.map(jnp.ones_like, args)
    assert_tree_close(jax.jvp(sf, args, tangents), jax.jvp(f, args, tangents))


@pytest.mark.slow
def test_a_failing_second_pass_falls_back_to_one_pass(monkeypatch):
    """Fail-safe: an internal error in the two passes runs the one-pass plan (the pairs after
    the loop), not the original unchunked."""

    def broken(*a, **k):
        raise RuntimeError("injected fault")

    monkeypatch.setenv("JAXPR_ACCUM_STRICT", "0")
    monkeypatch.setattr(_pairwise.modes, "build", broken)
    f, args, argnums = simclr("matmul", -jnp.inf, True)
    sf = ja.serialize_axis(f, chunk=3, argnums=argnums)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = sf.explain(*args)
    messages = [str(w.message) for w in caught]
    assert any("running the plan in one pass instead" in m for m in messages), messages
    assert not plan.pairs and plan.counts["body"] > 0
    weights = [jnp.float32(1.0)]
    assert_tree_close(_value_and_grad(sf, args, weights), _value_and_grad(f, args, weights))


@jax.custom_vjp
def _rescaled(z):
    """The identity, whose backward divides the cotangent by its batch mean: a rule that is
    nonlinear in the cotangent and mixes the batch (a barrier: it runs unchunked)."""
    return z


_rescaled.defvjp(lambda z: (z, None), lambda _, g: (g / (jnp.mean(jnp.abs(g), axis=0) + 1.0),))
CALLED = {"as_is": lambda f: f, "jit": jax.jit, "checkpoint": jax.checkpoint}


@pytest.mark.parametrize(
    "called, grad",
    [("as_is", "remat")]
    + [
        pytest.param(c, g, marks=pytest.mark.slow)
        for c in CALLED
        for g in GRAD_MODES
        if (c, g) != ("as_is", "remat")
    ],
)
@pytest.mark.slow
def test_a_custom_vjp_that_both_passes_need_runs_once(called, grad):
    """Fuzz finding: a custom VJP call upstream of the pairs whose result another term also
    reads ran in both passes, so each copy's backward rule got a part of the cotangent; a rule
    nonlinear in it (``g / mean(|g|)``) then gave wrong gradients. The call runs in pass 1,
    which stacks its result for pass 2: one call, as in the original, at any depth of
    ``jit`` or ``checkpoint``, in every mode."""

    def loss(w, x, v):
        h = jnp.tanh(CALLED[called](_rescaled)(x @ w[0]))
        other = jnp.mean(jax.nn.logsumexp(h @ v, axis=1))
        return nt_xent(h @ w[1], 0.5, "matmul", -jnp.inf) + other

    rs = np.random.RandomState(7)
    args = (_params(8), _normal(rs, N, D), _normal(rs, H, 3))
    sf = ja.serialize_axis(loss, chunk=5, argnums=1, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ja.PlanWarning)
        plan = sf.explain(*args)
        ja_testing.assert_matches_original(sf, *args, vmap=False)
    assert plan.pairs or grad == "auto", str(plan)
    calls = [
        find_eqns(j, "custom_vjp_call") for j in (sf.jaxpr(*args), jax.make_jaxpr(loss)(*args))
    ]
    assert len(calls[0]) == len(calls[1]) == 1


# -- memory ----------------------------------------------------------------------------------


def _memory(n: int) -> tuple[int, int]:
    """XLA's temp bytes of ``jit(value_and_grad)`` (every argument), original and serialized."""
    rs = np.random.RandomState(18)
    w, x = (_normal(rs, 8, 16, scale=0.3), _normal(rs, 16, 16, scale=0.3)), _normal(rs, n, 8)

    def f(w, x, t):
        return nt_xent(encode(w, x), t, "matmul", -jnp.inf)

    sf = ja.serialize_axis(f, chunk=16, argnums=1, grad="remat")
    flat = [*w, x, jnp.float32(0.5)]  # value_and_grad with respect to all four
    original, serialized = (
        temp_bytes(lambda w0, w1, x, t, g=g: [g((w0, w1), x, t)], flat, [0, 1, 2, 3])
        for g in (f, sf)
    )
    return original, serialized


def test_memory_is_a_fraction_of_the_original_and_linear_in_the_batch():
    """The two-pass plan is what runs: at N = 256 the compiled step holds a fraction of the
    original's temp memory (the N x N logits and their cotangent are never whole), and
    doubling the batch doubles it, where the original's grows about 4x."""
    original, serialized = _memory(128)
    original2, serialized2 = _memory(256)
    assert serialized2 < 0.15 * original2, (serialized2, original2)
    assert original2 > 3.5 * original, (original2, original)  # the pairs: quadratic
    assert serialized2 < 2.3 * serialized, (serialized2, serialized)
