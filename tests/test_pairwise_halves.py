"""Parts of one batch paired with each other (issue 45, item 3;
``jaxpr_accum._pairwise.detect``): the two halves of the chunked batch in an MMD or
a contrastive loss between halves (sliced, split, or unpacked from ``z.reshape(2, N // 2, d)``),
the pairs built by broadcasting or by a matrix product.

The one-pass plan stops at the halves' slices; the halves are an axis born again there, ``N /
2`` long, and both are seeded at once, so pass 2 runs a block of rows of each half against
both halves whole; ``chunk`` counts rows of the batch, so a block holds ``chunk // 2`` rows of
each half. Every program is checked against the original (values and gradients) at
chunks that divide the halves and that do not, at 1 and past them, in every gradient mode;
below the halves' length no ``N/2 x N/2`` value is anywhere in the rewritten program; the
memory ratio falls as the batch grows.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum import testing as ja_testing
from jaxpr_accum._planning._budget import temp_bytes

from .oracle import GRAD_MODES
from .test_pairwise import _full_pairs, _normal, encode, normalise


def _rbf(u, v):
    return jnp.exp(-jnp.sum((u[:, None] - v[None]) ** 2, -1))


def mmd_of_halves(w, x):
    """An RBF MMD^2 between the two halves of one batch, the pairs by broadcasting."""
    z = encode(w, x)
    a, b = z[: z.shape[0] // 2], z[z.shape[0] // 2 :]
    return jnp.mean(_rbf(a, a)) + jnp.mean(_rbf(b, b)) - 2 * jnp.mean(_rbf(a, b))


def mmd_of_reshaped_halves(w, x):
    """The same MMD^2, its halves unpacked from ``z.reshape(2, N // 2, d)``."""
    z = encode(w, x)
    a, b = z.reshape(2, -1, z.shape[1])
    return jnp.mean(_rbf(a, a)) + jnp.mean(_rbf(b, b)) - 2 * jnp.mean(_rbf(a, b))


def contrast_halves(w, x):
    """InfoNCE between the halves (row ``i`` of one half is the positive of row ``i`` of the
    other), by ``jnp.split`` and a matrix product, the labels built inside."""
    a, b = jnp.split(normalise(encode(w, x)), 2)
    logits = a @ b.T / 0.5
    labels = jnp.arange(a.shape[0])
    return jnp.mean(jax.nn.logsumexp(logits, 1) - logits[labels, labels])


PROGRAMS = {"mmd": mmd_of_halves, "reshaped": mmd_of_reshaped_halves, "contrast": contrast_halves}


def _args(n: int) -> tuple:
    rs = np.random.RandomState(n)
    w = (
        jnp.asarray(rs.normal(size=(5, 8)) / 2, jnp.float32),
        jnp.asarray(rs.normal(size=(8, 4)) / 3, jnp.float32),
    )
    return w, _normal(rs, n, 5)


def _plan(f, n: int, chunk: int, grad: str = "auto") -> ja.Plan:
    args = _args(n)
    sf = ja.serialize_axis(f, chunk=chunk, argnums=1, grad=grad)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*(not expected to save|less than)", ja.PlanWarning)
        ja_testing.assert_matches_original(sf, *args, vmap=False)
        return sf.explain(*args)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_halves_are_paired_in_two_passes_per_block(name):
    n, chunk = 24, 5  # halves of 12 in chunks of 5: full chunks and a remainder
    plan = _plan(PROGRAMS[name], n, chunk, grad="remat")
    assert plan.second is not None and not plan.second.stops, str(plan)
    assert len(plan.between) == 2, str(plan)  # both halves, each read as rows and columns
    sf = ja.serialize_axis(PROGRAMS[name], chunk=chunk, argnums=1, grad="remat")
    assert _full_pairs(sf.jaxpr(*_args(n)), n // 2) == [], name


@pytest.mark.parametrize("chunk, block", [(5, 2), (4, 2), (1, 1), (13, 6)])
def test_a_block_of_the_halves_holds_chunk_rows_of_the_batch(chunk, block):
    """Pass 2's block is ``chunk // 2`` positions of the halves (at least 1): as many rows of
    the batch as a chunk of pass 1, where it was ``chunk`` rows of each half (twice the rows
    per block, and twice the memory at the same ``chunk``, of a pairing of the whole batch)."""
    plan = _plan(mmd_of_halves, 24, chunk, grad="remat")
    assert plan.chunk == chunk and plan.second is not None, str(plan)
    assert plan.second.chunk == block and plan.second.axis_size == 12, str(plan)


CHUNKS = [1, 4, 7, 12, 30]  # halves of 12: 1, dividing, not dividing, the halves, past them
#: every program in every mode at two chunks, rotating through ``CHUNKS``
CASES = [
    (name, grad, CHUNKS[(i + j) % len(CHUNKS)])
    for i, (name, grad) in enumerate((n, g) for n in sorted(PROGRAMS) for g in GRAD_MODES)
    for j in (0, 2)
]


@pytest.mark.slow
@pytest.mark.parametrize("name, grad, chunk", CASES)
def test_every_mode_and_chunk_matches_the_oracle(name, grad, chunk):
    _plan(PROGRAMS[name], 24, chunk, grad=grad)


def _ratio(f, n: int, chunk: int) -> tuple[float, int]:
    w, x = _args(n)
    sf = ja.serialize_axis(f, chunk=chunk, argnums=1)
    flat = [*w, x]
    got = [temp_bytes(lambda w0, w1, x, g=g: [g((w0, w1), x)], flat, [0, 1, 2]) for g in (f, sf)]
    return got[1] / got[0], got[1]


@pytest.mark.slow
def test_memory_of_the_halves_is_linear_in_the_batch():
    """At a fixed chunk the serialized MMD grows about 2x per doubling (a block of rows of each
    half against both halves), the original 4x."""
    small_ratio, small = _ratio(mmd_of_halves, 256, 16)
    ratio, large = _ratio(mmd_of_halves, 512, 16)
    assert ratio < 0.2 and ratio < 0.6 * small_ratio and large < 2.4 * small, (ratio, large / small)
