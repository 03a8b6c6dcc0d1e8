"""Per-row values read at the pairs' columns, in two passes (issue 45, item 5,
``jaxpr_accum._pairwise.reads``).

A kernel matrix contracted over its columns with the rows of a per-row value (``k @ z``, the
kernel-weighted mean of the particles; ``k`` an RBF kernel of a broadcast difference or built
by ``z @ z.T``; ``z`` the encoded rows or another value computed from the chunked input) and
SVGD's step (a double ``vmap``: ``k(x_j, x_i) g_j + grad k``, averaged over ``j``, an
``[N, d]`` output) run in two passes: pass 2 reads the value's column copy whole at the
contraction, so each block of rows computes that block's rows of the result.

Every program is compared with the original (values and gradients, ``tests.oracle``) in every
gradient mode at chunks that divide the batch and that do not, 1 and the batch (slow tier;
the default tier runs ``k @ z`` in remat mode at one chunk), and planned in two passes at the
chunks below the batch. A per-row value read at the rows (``w[:, None] * k``) or a
contraction over the rows (``k.T @ z``) is not read whole: its plan is the one without
reads. Memory (slow tier): ``value_and_grad`` of ``sum((k @ v) ** 2)`` holds a fraction of
the original's at ``N = 4096`` and grows linearly with ``N``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum._planning._budget import temp_bytes

from .oracle import GRAD_MODES, assert_matches_original

N, D = 16, 3  # particles, width
CHUNKS = [5, 4, 1, N]  # not dividing, dividing, 1, the batch


def _weights(seed: int, *shapes: tuple[int, ...]) -> tuple:
    rs = np.random.RandomState(seed)
    return tuple(jnp.asarray(rs.normal(size=s) * 0.5, jnp.float32) for s in shapes)


def rbf(z: jax.Array) -> jax.Array:
    return jnp.exp(-jnp.sum((z[:, None] - z[None]) ** 2, -1))


def kern(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.exp(-jnp.sum((a - b) ** 2))


def smooth(w: tuple, x: jax.Array) -> jax.Array:
    """``k @ z``: ``k`` the RBF kernel of the encoded rows ``z`` (a broadcast difference)."""
    z = jnp.tanh(x @ w[0])
    return jnp.sum((rbf(z) @ z) ** 2)


def smooth_other(w: tuple, x: jax.Array) -> jax.Array:
    """``k @ v``: ``v`` another per-row value of the chunked input, which pass 1 stacks too."""
    z = jnp.tanh(x @ w[0])
    return jnp.sum((rbf(z) @ jnp.sin(x @ w[1])) ** 2)


def smooth_matmul(w: tuple, x: jax.Array) -> jax.Array:
    """``k @ z`` with ``k`` built by ``z @ z.T``."""
    z = jnp.tanh(x @ w[0])
    return jnp.sum(jnp.log(jnp.exp(z @ z.T) @ z + 3.0))


def smoothed_rows(w: tuple, x: jax.Array) -> jax.Array:
    """``k @ z`` returned: an ``[N, d]`` output, stacked block by block."""
    z = jnp.tanh(x @ w[0])
    return rbf(z) @ z


def svgd_step(w: tuple, x: jax.Array) -> jax.Array:
    """SVGD's step as blackjax's kernel writes it: a double ``vmap``, an ``[N, d]`` output."""
    g = jnp.tanh(x @ w[0])

    def phi(xi: jax.Array) -> jax.Array:
        terms = jax.vmap(lambda xj, gj: kern(xj, xi) * gj + jax.grad(kern)(xj, xi))(x, g)
        return jnp.mean(terms, 0)

    return x + 0.1 * jax.vmap(phi)(x)


def svgd_loss(w: tuple, x: jax.Array) -> jax.Array:
    return jnp.sum(svgd_step(w, x) ** 2)


PROGRAMS = {
    f.__name__: f
    for f in (smooth, smooth_other, smooth_matmul, smoothed_rows, svgd_step, svgd_loss)
}


def _args() -> tuple:
    w = _weights(0, (D, D), (D, 2))
    return w, _weights(1, (N, D))[0]


def _plan(sf: ja.SerializedFunction, *args: object) -> ja.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        return sf.explain(*args)


def _reads(plan: ja.Plan) -> list[str]:
    return [p for p in plan.pairs if "rows of the pairs chunked" in p]


def test_kernel_weighted_rows_run_in_two_passes():
    """``k @ z`` is planned in two passes, the contraction listed with its source line, and
    is exact (remat, at a chunk that does not divide the batch)."""
    sf = ja.serialize_axis(smooth, chunk=5, argnums=1, grad="remat")
    args = _args()
    plan = _plan(sf, *args)
    assert plan.second is not None and plan.stops == [], str(plan)
    (read,) = _reads(plan)
    assert read.startswith("`dot_general` at ") and "test_pairwise_rows.py" in read, read
    assert_matches_original(sf, *args, vmap=False)


@pytest.mark.slow
@pytest.mark.parametrize("grad", GRAD_MODES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_program_mode_and_chunk_is_exact(name, grad):
    """Every program in every mode, at every chunk of ``CHUNKS``; two passes and no stop
    below the batch."""
    args = _args()
    for chunk in CHUNKS[:2]:
        sf = ja.serialize_axis(PROGRAMS[name], chunk=chunk, argnums=1, grad=grad)
        plan = _plan(sf, *args)
        assert plan.second is not None and plan.stops == [] and _reads(plan), str(plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        assert_matches_original(sf, *args, chunks=CHUNKS, vmap=False)


def rows_weighted(w: tuple, x: jax.Array) -> jax.Array:
    """A per-row value read at the pairs' rows: read per block, as without reads."""
    z = jnp.tanh(x @ w[0])
    return jnp.sum(jnp.sin(x @ w[1])[:, :1] * rbf(z))


def contracted_rows(w: tuple, x: jax.Array) -> jax.Array:
    """A contraction over the pairs' rows (``k.T @ z``): a sum across the blocks."""
    z = jnp.tanh(x @ w[0])
    return jnp.sum(jnp.sin(rbf(z).T @ z))


@pytest.mark.slow
@pytest.mark.parametrize("f", [rows_weighted, contracted_rows], ids=lambda f: f.__name__)
def test_values_read_at_the_rows_are_not_read_whole(f):
    """Where a per-row value meets the pairs at their rows, pass 2 reads it per block: no
    read, two passes all the same, exact in every mode."""
    sf = ja.serialize_axis(f, chunk=5, argnums=1, grad="remat")
    args = _args()
    plan = _plan(sf, *args)
    assert plan.second is not None and plan.stops == [] and not _reads(plan), str(plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        assert_matches_original(sf, *args, modes=GRAD_MODES, chunks=CHUNKS[:2], vmap=False)


def _memory(n: int) -> tuple[int, int]:
    """XLA's temp bytes of ``jit(value_and_grad)`` of ``sum((k @ v) ** 2)`` (every argument),
    original and serialized; ``v`` another per-row value of the input."""
    w = _weights(2, (16, 32), (32, 8), (16, 8))
    x = _weights(3, (n, 16))[0]

    def f(w, x):
        z = jnp.tanh(x @ w[0]) @ w[1]
        return jnp.sum((rbf(z) @ jnp.sin(x @ w[2])) ** 2)

    sf = ja.serialize_axis(f, chunk=256, argnums=1, grad="remat")
    assert _reads(_plan(sf, w, x)), "planned in two passes, reading v whole"
    return tuple(  # type: ignore[return-value]
        temp_bytes(lambda a, b, c, x, g=g: [g((a, b, c), x)], [*w, x], [0, 1, 2, 3])
        for g in (f, sf)
    )


@pytest.mark.slow
def test_memory_is_a_fraction_of_the_original_and_linear_in_the_batch():
    """At N = 4096 the serialized ``value_and_grad`` holds at most 0.15 of the original's
    temp memory, and it grows at most 2.3x per doubling from N = 1024 (the original's 4x)."""
    measured = [_memory(n) for n in (1024, 2048, 4096)]
    (o1, s1), (o2, s2), (o4, s4) = measured
    assert s4 < 0.15 * o4, measured
    assert s2 < 2.3 * s1 and s4 < 2.3 * s2, measured
    assert o4 > 3.5 * o2, measured  # the pairs: quadratic
