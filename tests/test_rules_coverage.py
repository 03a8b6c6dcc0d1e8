"""Rules for the batched linear algebra, transforms, splits and stacks, variadic and windowed
reductions, and the coverage check: every primitive of the installed JAX has a rule or a
documented reason to be a barrier (``docs/limitations.md``).

Each family is serialized over its batch axis and compared with the unchunked original,
values and reverse-mode derivatives (``jaxpr_accum.testing.assert_matches_original``); where
the primitive acts *along* the axis the region must stop there, name it, and still match.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxpr_accum as ja
from jaxpr_accum import _compat
from jaxpr_accum._engine._table import RULES

from .oracle import NOT_WORTH_IT
from .test_rules import _rand, cases, check

N = 10


def _spd(n: int, seed: int) -> jax.Array:
    a = _rand((N, n, n), seed, scale=0.5)
    return a @ jnp.swapaxes(a, -1, -2) + 2.0 * jnp.eye(n)


# -- batched linear algebra ----------------------------------------------------------------


def f_cholesky_solve(a, b):
    chol = jnp.linalg.cholesky(a)
    x = jax.scipy.linalg.solve_triangular(chol, b, lower=True)
    return jnp.sum(x**2) + jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)))


@cases
@pytest.mark.slow
def test_linalg_cholesky_triangular_solve(grad, chunk):
    """NumPyro's multivariate normal: a batch of Cholesky factors and triangular solves."""
    check(f_cholesky_solve, _spd(3, 0), _rand((N, 3, 2), 1), chunk=chunk, grad=grad, argnums=(0, 1))


def f_decompositions(a):
    w, v = jnp.linalg.eigh(a)
    q, r = jnp.linalg.qr(a)
    s = jnp.linalg.svd(a, compute_uv=False)
    lu, _, _ = lax.linalg.lu(a)
    return jnp.sum(w**2) + jnp.sum(jnp.abs(v[..., 0])) + jnp.sum(r**2) + jnp.sum(s) + jnp.sum(lu)


@cases
@pytest.mark.slow
def test_linalg_decompositions(grad, chunk):
    check(f_decompositions, _spd(3, 2), chunk=chunk, grad=grad, argnums=0, rtol={jnp.float32: 2e-3})


def f_tridiagonal(dl, d, du, b):
    return jnp.sum(lax.linalg.tridiagonal_solve(dl, d, du, b) ** 2)


@cases
@pytest.mark.slow
def test_linalg_tridiagonal_solve(grad, chunk):
    m = 4
    dl = _rand((N, m), 3, scale=0.1).at[:, 0].set(0.0)
    du = _rand((N, m), 4, scale=0.1).at[:, -1].set(0.0)
    d = 2.0 + jnp.abs(_rand((N, m), 5))
    check(
        f_tridiagonal, dl, d, du, _rand((N, m, 2), 6), chunk=chunk, grad=grad, argnums=(0, 1, 2, 3)
    )


@pytest.mark.slow
def test_linalg_along_the_axis_is_a_barrier():
    """A factorisation whose matrix rows are the axis couples them: the region stops."""

    def f(x):
        h = 0.1 * jnp.tanh(x) + N * jnp.eye(N)  # [N, N]: the axis is a row dimension
        return jnp.sum(lax.linalg.cholesky(h, symmetrize_input=False))

    sf = ja.serialize_axis(f, chunk=3, argnums=0)
    plan = sf.explain(_rand((N, N), 7))
    assert any("cholesky" in s for s in plan.stops), str(plan)
    check(
        f,
        _rand((N, N), 7),
        chunk=3,
        grad="remat",
        argnums=0,
        expect_chunked=False,
        expect_whole=False,
    )


def f_fft(x):
    y = jnp.fft.rfft(x, axis=-1)
    return jnp.sum(jnp.abs(jnp.fft.ifft(jnp.fft.fft(y, axis=-1), axis=-1)) ** 2)


@cases
@pytest.mark.slow
def test_fft_along_other_axes(grad, chunk):
    check(f_fft, _rand((N, 8), 8), chunk=chunk, grad=grad, argnums=0)


# -- splits, stacks, variadic and windowed reductions --------------------------------------


def f_split_stack(x):
    a, b = jnp.split(x, 2, axis=1)
    s = jnp.stack([jnp.tanh(a), b * 2.0], axis=0)  # a new leading dim: the axis shifts
    u = jnp.unstack(s, axis=0)
    return jnp.sum(u[0] * u[1]) + jnp.sum(jnp.stack([a, b], axis=-1) ** 2)


@cases
def test_split_stack_unstack(grad, chunk):
    """The LSTM/GRU cell pattern: gates split from one matmul, stacked, unstacked."""
    check(f_split_stack, _rand((N, 6), 9), chunk=chunk, grad=grad, argnums=0)


def f_lstm_cell(w, x):
    h = jnp.zeros((x.shape[0], 3))
    c = jnp.zeros_like(h)
    for t in range(x.shape[1]):
        gates = jnp.concatenate([x[:, t], h], axis=1) @ w
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return jnp.sum(h**2)


@cases
@pytest.mark.slow
def test_lstm_cell_chunks_whole(grad, chunk):
    check(
        f_lstm_cell,
        _rand((5, 12), 10, scale=0.3),
        _rand((N, 4, 2), 11),
        chunk=chunk,
        grad=grad,
        argnums=1,
    )


def f_variadic_reduce(x):
    total, biggest = lax.reduce(  # two float operands (JAX cannot differentiate an int one)
        (x, jnp.sin(x)),
        (0.0, -jnp.inf),
        lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])),
        (1,),
    )
    return jnp.sum(total**2) + jnp.sum(biggest)


@cases
@pytest.mark.slow
def test_variadic_reduce_over_other_axes(grad, chunk):
    check(f_variadic_reduce, _rand((N, 5), 12), chunk=chunk, grad=grad, argnums=0)


def f_maxpool(x):
    def pool(img):  # [H, W, C] per example: its gradient is select_and_scatter_add
        return lax.reduce_window(img, -jnp.inf, lax.max, (2, 2, 1), (2, 2, 1), "VALID")

    return jnp.sum(jax.vmap(pool)(jnp.tanh(x)) ** 2)


@cases
@pytest.mark.slow
def test_max_pool_and_its_gradient(grad, chunk):
    check(f_maxpool, _rand((N, 4, 4, 2), 13), chunk=chunk, grad=grad, argnums=0)


def f_approx_top_k(x):
    values, _ = lax.approx_max_k(jnp.tanh(x), 3)
    return jnp.sum(values**2)


@cases
@pytest.mark.slow
def test_approx_top_k_along_other_axes(grad, chunk):
    check(f_approx_top_k, _rand((N, 8), 14), chunk=chunk, grad=grad, argnums=0)


def f_gamma(alpha, key):
    samples = jax.random.gamma(key, alpha, (N, 3))
    return jnp.sum(samples * alpha)


@cases
@pytest.mark.slow
def test_random_gamma_per_sample(grad, chunk):
    alpha = 1.0 + jnp.abs(_rand((3,), 15))
    plan = check(
        f_gamma, alpha, jax.random.key(0), chunk=chunk, grad=grad, size=N, expect_whole=False
    )
    assert plan.counts["body"] > 0


# -- coverage -------------------------------------------------------------------------------


def _documented_barriers() -> dict[str, str]:
    """``primitive -> reason`` from the table in docs/limitations.md."""
    text = (Path(__file__).parents[1] / "docs" / "limitations.md").read_text()
    section = text.split("## Primitives that are barriers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`[^|]+`) \| (.+?) \|$", section, re.M)
    return {name: reason for cell, reason in rows for name in re.findall(r"`([^`]+)`", cell)}


def _primitives_of_jax() -> dict[str, object]:
    """``jax.extend.core.primitives`` and the ``*_p`` objects of the lax modules."""
    from jax.extend.core import primitives

    found = {}
    for module in (primitives, jax.lax, jax.lax.linalg):
        for name, value in vars(module).items():
            if isinstance(value, jax.extend.core.Primitive) and (
                module is primitives or name.endswith("_p")
            ):
                found.setdefault(value.name, value)
    return found


def test_every_primitive_has_a_rule_or_a_documented_reason():
    barriers = _documented_barriers()
    neither = [
        n for n, p in sorted(_primitives_of_jax().items()) if p not in RULES and n not in barriers
    ]
    assert not neither, f"primitives with neither a rule nor a documented reason: {neither}"
    both = [n for n in barriers if _compat.primitive(n) in RULES]
    assert not both, f"documented as barriers but they have a rule: {both}"
    stale = [
        n for n in barriers if _compat.primitive(n) is None and "JAX 0.9 only" not in barriers[n]
    ]
    assert not stale, f"documented primitives this JAX does not have: {stale}"


@pytest.mark.filterwarnings(NOT_WORTH_IT)  # the region stops at the barrier: saves nothing
def test_a_documented_barrier_is_reported_with_its_name():
    def f(x):
        return jnp.sum(jnp.tanh(x) * lax.rng_uniform(0.0, 1.0, x.shape))

    sf = ja.serialize_axis(f, chunk=3, argnums=0)
    plan = sf.explain(jnp.ones((N, 2)))
    assert any("`rng_uniform`" in s and "register_rule" in s for s in plan.stops), str(plan)
    assert np.isfinite(sf(jnp.ones((N, 2))))


def f_named(w, x):
    from jax.ad_checkpoint import checkpoint_name

    h = checkpoint_name(jnp.tanh(x @ w), "hidden")  # remat-policy names stay positionwise
    policy = jax.checkpoint_policies.save_only_these_names("hidden")
    return jnp.sum(jax.checkpoint(lambda h: jnp.sin(h) ** 2, policy=policy)(h))


@cases
@pytest.mark.slow
def test_checkpoint_name_and_policy(grad, chunk):
    check(f_named, _rand((3, 4), 16), _rand((N, 3), 17), chunk=chunk, grad=grad, argnums=1)


# -- per-row indexing ---------------------------------------------------------------------


def f_per_row(w, h, y):
    logp = jax.nn.log_softmax(h @ w)
    return -jnp.mean(logp[jnp.arange(h.shape[0]), y]) + jnp.sum(logp[jnp.arange(N), -1])


@cases
def test_per_row_lookup_with_the_rows_own_position(grad, chunk):
    """``logp[jnp.arange(N), y]``: each row looks itself up, so the lookup is chunked."""
    w, h = _rand((6, 5), 18), _rand((N, 6), 19)
    y = jnp.asarray(np.random.RandomState(20).randint(-5, 5, size=N), jnp.int32)
    plan = check(f_per_row, w, h, y, chunk=chunk, grad=grad, argnums=(1, 2))
    assert plan.counts["epilogue"] <= 3 and not plan.stacked, str(plan)  # only the scalar tail


@pytest.mark.slow
def test_per_row_lookup_saves_memory():
    rs = np.random.RandomState(0)
    w = jnp.asarray(rs.normal(size=(64, 512)), jnp.float32)
    h = jnp.asarray(rs.normal(size=(1024, 64)), jnp.float32)
    y = jnp.asarray(rs.randint(0, 512, size=1024), jnp.int32)

    def loss(w, h, y):
        return -jnp.mean(jax.nn.log_softmax(h @ w)[jnp.arange(h.shape[0]), y])

    sf = ja.serialize_axis(loss, chunk=128, argnums=(1, 2))

    def temp(f):
        return jax.jit(jax.value_and_grad(f)).lower(w, h, y).compile().memory_analysis()

    ratio = temp(sf).temp_size_in_bytes / temp(loss).temp_size_in_bytes
    assert ratio < 0.35, ratio


def test_lookup_of_other_rows_is_a_barrier():
    """A permutation of the rows is not per-row: the region stops there, exactly."""
    perm = jnp.asarray(np.random.RandomState(21).permutation(N), jnp.int32)

    def f(h, y):
        return jnp.sum(jnp.tanh(h)[perm, y] ** 2)

    h = _rand((N, 5), 22)
    y = jnp.asarray(np.random.RandomState(23).randint(0, 5, size=N), jnp.int32)
    plan = check(f, h, y, chunk=3, grad="remat", argnums=(0, 1), expect_whole=False)
    assert any("gather" in s for s in plan.stops), str(plan)


def f_solve_columns(chol, x):
    """NumPyro's ``_batch_mahalanobis``: the axis folded into the right-hand side's columns."""
    left = jax.scipy.linalg.solve_triangular(chol, jnp.tanh(x).T, lower=True)
    right = lax.linalg.triangular_solve(chol, x, left_side=False, lower=True)
    return jnp.sum(left**2) + jnp.sum(right**2)


@cases
def test_triangular_solve_columns_are_independent(grad, chunk):
    chol = jnp.linalg.cholesky(_spd(4, 24)[0])
    check(f_solve_columns, chol, _rand((N, 4), 25), chunk=chunk, grad=grad, argnums=1)
