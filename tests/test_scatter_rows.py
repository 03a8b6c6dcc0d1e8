"""Hypothesis draws scatters that write rows along the chunked axis; the original is the oracle
(``jaxpr_accum._rules.scatter``).

A program encodes the chunked rows (``h = tanh(x @ w)``, ``[N, C]``) and writes into them, or
into a zero matrix of their shape, with one scatter: its combining form (``set``, ``add``,
``multiply``, ``min``, ``max``), its mode (``None``, ``"clip"``, ``"drop"``,
``"promise_in_bounds"``) and its rows, either each row's own (``arange(N)``, the columns from
per-row labels) or whole indices (a permutation, repeats, rows out of bounds on both sides,
negative rows, and columns out of bounds too, which ``"clip"`` clamps; in bounds under
``"promise_in_bounds"``, where an index out of bounds is undefined) with whole updates (a
parameter, so that their gradient is checked). ``set``
with repeated rows is left out: which write wins is XLA's choice in the original too. Chunk
sizes are drawn from 1, a divisor of ``N``, a non-divisor, ``N`` and past it; the gradient
modes from all four. Values and gradients with respect to every float input are compared,
and the plan must not stop at the scatter.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import jaxpr_accum as ja

from .fuzz.driver import derandomized
from .oracle import GRAD_MODES, assert_matches_original

C = 3
FORMS = ("set", "add", "multiply", "min", "max")
MODES = (None, "clip", "drop", "promise_in_bounds")
#: programs in the default tier's run and in the slow tier's
DEFAULT = 3
SLOW = 40 if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci" else 300


@dataclasses.dataclass(frozen=True)
class ScatterProgram:
    n: int
    chunk: int
    grad: str
    form: str
    mode: str | None
    own_rows: bool
    into_zeros: bool
    rows: tuple[int, ...]  # whole indices: the rows written (may repeat or fall outside)
    cols: tuple[int, ...]  # and their columns (may fall outside)
    seed: int

    def loss(self):
        n, rows = self.n, jnp.asarray(self.rows, jnp.int32)

        def f(w, u, x, y):
            h = jnp.tanh(x @ w)
            target = jnp.zeros_like(h) if self.into_zeros else h
            at = (
                target.at[jnp.arange(n), y]
                if self.own_rows
                else target.at[rows, jnp.asarray(self.cols, jnp.int32)]
            )
            value = jnp.sin(h[:, 0]) if self.own_rows else u
            distinct = self.own_rows or len(set(self.rows)) == len(self.rows)
            distinct = distinct and (self.own_rows or self.mode != "clip")  # clip may merge
            if self.form == "multiply" and not distinct:
                value = jax.lax.stop_gradient(value)  # JAX differentiates unique rows only
            written = getattr(at, self.form)(value, mode=self.mode, unique_indices=distinct)
            return jnp.sum(jnp.tanh(written) * h), written

        return f

    def args(self) -> tuple:
        rs = np.random.RandomState(self.seed)
        w = jnp.asarray(rs.normal(size=(4, C)), jnp.float32)
        u = jnp.asarray(rs.normal(size=(len(self.rows),)), jnp.float32)
        x = jnp.asarray(rs.normal(size=(self.n, 4)), jnp.float32)
        y = jnp.asarray(rs.randint(0, C, size=self.n), jnp.int32)
        return w, u, x, y


@st.composite
def scatter_programs(draw) -> ScatterProgram:
    n = draw(st.integers(2, 12))
    divisors = [d for d in range(2, n) if n % d == 0] or [1]
    others = [d for d in range(2, n) if n % d] or [1]
    chunk = draw(st.sampled_from([1, n, n + 3, draw(st.sampled_from(divisors)), *others[:1]]))
    form = draw(st.sampled_from(FORMS))
    own_rows = draw(st.booleans())
    inside = st.integers(0, n - 1)
    outside = st.sampled_from([-n - 2, -1, n, n + 5])  # negative rows count from the end
    rows = draw(st.lists(st.one_of(inside, inside, outside), min_size=1, max_size=2 * n))
    mode = draw(st.sampled_from(MODES))
    if form == "set" or draw(st.booleans()):  # distinct rows, counted from either end
        rows = list(dict.fromkeys(r % n for r in rows))
    if mode == "promise_in_bounds":  # a row out of bounds breaks the promise: undefined
        rows = [r for r in rows if -n <= r < n] or [0]
    # JAX's own gradient of a min or max whose clamped indices collide is wrong: no oracle
    in_bounds = mode == "promise_in_bounds" or (mode == "clip" and form in ("min", "max"))
    if in_bounds and mode == "clip":
        rows = list(dict.fromkeys(r % n for r in rows))
    column = st.integers(0, C - 1) if in_bounds else st.integers(-C - 1, C + 2)
    cols = draw(st.lists(column, min_size=len(rows), max_size=len(rows)))
    if form == "set":  # distinct (row, column) pairs: distinct rows, any columns
        cols = [c % C for c in cols] if mode is None or mode == "drop" else cols
    return ScatterProgram(
        n=n,
        chunk=chunk,
        grad=draw(st.sampled_from(GRAD_MODES)),
        form=form,
        mode=mode,
        own_rows=own_rows,
        into_zeros=draw(st.booleans()),
        rows=tuple(rows),
        cols=tuple(cols),
        seed=draw(st.integers(0, 2**16)),
    )


def check(program: ScatterProgram) -> None:
    f, args = program.loss(), program.args()
    sf = ja.serialize_axis(f, chunk=program.chunk, argnums=(2, 3), grad=program.grad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)  # toy sizes: no saving expected
        plan = sf.explain(*args)
        assert not any("scatter" in str(stop) for stop in plan.stops), str(plan)
        assert_matches_original(sf, *args, vmap=False)


@derandomized(DEFAULT)
@given(scatter_programs())
def test_scatters_into_rows_match_the_original(program):
    check(program)


@pytest.mark.slow
@derandomized(SLOW)
@given(scatter_programs())
def test_scatters_into_rows_match_the_original_more(program):
    check(program)


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.int8, jnp.int16])
def test_narrow_index_dtypes_on_an_axis_longer_than_they_count(dtype):
    """``lax.scatter_add`` and ``lax.gather`` called with 8- and 16-bit indices on 300 rows in
    chunks of 100: the chunk's start (256 wraps in 8 bits) never shifts them into another
    chunk's rows. ``jnp``'s ``.at`` promotes its indices; these do not."""
    scatter_dn = jax.lax.ScatterDimensionNumbers((1,), (0,), (0,))
    gather_dn = jax.lax.GatherDimensionNumbers((1,), (0,), (0,))
    rows = jnp.asarray(np.asarray([[5], [-60], [120]]).astype(dtype))  # -60: 196 in uint8

    def f(x):
        h = jnp.tanh(x)
        written = jax.lax.scatter_add(h, rows, jnp.full((3, 1), 100.0), scatter_dn)
        looked_up = jax.lax.gather(h, rows, gather_dn, (1, 1), mode="fill")
        weights = jnp.arange(x.shape[0], dtype=jnp.float32)[:, None]
        return jnp.sum(written * weights) + jnp.sum(looked_up**2)

    x = jnp.asarray(np.random.RandomState(0).normal(size=(300, 1)), jnp.float32)
    sf = ja.serialize_axis(f, chunk=100, argnums=0, grad="remat")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ja.PlanWarning)
        assert_matches_original(sf, x, vmap=False)
