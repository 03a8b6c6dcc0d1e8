"""The real-model tier: public example models (``benchmarks/zoo/``, shared with the
benchmarks), serialized at ``chunk = N // 8`` the way a user would, each with three checks:

(a) ``chunked``: the rewritten program has more loops (scan / while equations, recursively)
    than the original, the plan's chunked body is not empty, and the region stops nowhere
    but at the case's expected primitives (none by default);
(b) ``exact``: values and reverse-mode derivatives equal the original's
    (``jaxpr_accum.testing.assert_matches_original``);
(c) ``memory``: XLA's temp bytes of ``jit(value_and_grad(f, argnums=<float arguments>))``
    serialized are at most ``0.6`` times the original's.

A check that the library cannot pass yet is a strict ``xfail`` with its reason (the primitive,
the measured figure) in ``Case.xfail``: it fails as XPASS once fixed. ``python
benchmarks/real_models.py`` prints the table of ``docs/real-models.md``.
"""

from __future__ import annotations

import functools

import pytest

from benchmarks import zoo as rm

from .oracle import assert_matches_original

pytestmark = pytest.mark.integration


def _params():
    for c in rm.CASES:
        for check in rm.CHECKS:
            marks = []
            if check in c.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=c.xfail[check]))
            yield pytest.param(c.name, check, id=f"{c.name}-{check}", marks=marks)


@functools.lru_cache(maxsize=4)
def _built(name: str):
    c = rm.case(name)
    if not rm.available(c):
        pytest.skip(f"{c.library} is not installed (pip install -e '.[models]')")
    loss, args = c.make()
    return c, loss, args


@functools.lru_cache(maxsize=4)
def _measured(name: str) -> rm.Measured:
    c, loss, args = _built(name)
    return rm.measure(c, loss, args)


@pytest.mark.parametrize(("name", "check"), list(_params()))
def test_real_model(name: str, check: str) -> None:
    c, loss, args = _built(name)
    if check == "exact":
        assert_matches_original(rm.serialized(c, loss), *args)
        return
    m = _measured(name)
    if check == "chunked":
        assert m.loops_serialized > m.loops_original, (
            f"{name}: no loop added ({m.loops_original} -> {m.loops_serialized})"
        )
        assert m.body > 0, f"{name}: empty chunked body"
        unexpected = m.unexpected_stops(c.expected_stops)
        assert not unexpected, f"{name}: unexpected stops:\n" + "\n".join(unexpected)
    else:
        assert m.ratio <= rm.MEMORY_LIMIT, (
            f"{name}: temp bytes {m.temp_original} -> {m.temp_serialized} "
            f"({m.ratio:.3f}x > {rm.MEMORY_LIMIT}x) at chunk {c.chunk} of {c.n}"
        )


def test_automatic_axis_at_position_0_of_a_time_major_model_points_at_the_batch() -> None:
    """Issue 13, item 3: at the default ``axis=0`` the candidates of the time-major Haiku LSTM
    are the time, a layer's width, the vocabulary and the embedding: none is expected to
    save memory, and the cost model says so (it used to pick the vocabulary, estimated to
    save 642 KiB, measured at 1.07x the original). The plan is the least costly of them, it
    warns, and it names the batch, born at dimension 1 of the inputs."""
    import warnings

    import jaxpr_accum as ja

    c, loss, args = _built("hk-lstm-auto")
    sf = ja.serialize_axis(loss, chunk=c.chunk)
    plan = sf.explain(*args)
    assert plan.warning is not None and "not expected to save memory" in plan.warning, str(plan)
    assert "dimension 1 of inputs" in plan.warning and "`axis=None`" in plan.warning, str(plan)
    assert all(c.saved_bytes <= 0 for c in plan.candidates), str(plan)
    diff = rm.float_argnums(args)
    with warnings.catch_warnings():  # the plan's warning, asserted above through plan.warning
        warnings.simplefilter("ignore", ja.PlanWarning)
        ratio = rm.temp_bytes(sf, args, diff) / rm.temp_bytes(loss, args, diff)
    assert ratio <= 1.01, f"{ratio:.3f}x: the least costly candidate should cost about nothing"
