"""What the tests share beyond ``jaxpr_accum.testing`` (which does every comparison of a
serialized function with its original: ``assert_matches_original``, one runner and one table
of tolerances by dtype, and ``assert_tree_close``):

* :data:`GRAD_MODES`, every gradient mode (the library's list), and :func:`modes`, a choice
  of them as ``pytest`` parameters split between the default and the slow tier;
* :func:`covering`, the rows of a parameter matrix too large to run whole in the slow tier
  (every value of one factor with every value of each other factor), or the whole product
  with ``JAXPR_ACCUM_FULL_MATRIX=1``;
* :func:`assert_matches_original`, the library's, with the suite's choice of ``jax.vmap``
  contexts: compared in the modes whose custom VJP ``vmap`` must batch (remat and fused, the
  class of r13), and in every mode with ``JAXPR_ACCUM_FULL_MATRIX=1``. Each context is a
  program of its own (about 2-3x a test's cost); ``auto`` runs one of those two modes, and
  ``native`` under ``vmap`` has its own tests (``test_vmap.py``) and the fuzzer's;
* :data:`NOT_WORTH_IT`, the warning filter for toy programs that the cost model expects to
  save no memory;
* :func:`iter_eqns` and its helpers walk a (Closed)Jaxpr recursively into every sub-jaxpr,
  found generically by scanning each equation's parameters (tuples, lists and dicts
  included), so that the structural tests do not depend on parameter names that change
  between JAX versions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from jaxpr_accum import testing
from jaxpr_accum._base import _settings

#: ``pytest.mark.filterwarnings(NOT_WORTH_IT)``: for a test whose toy program the cost model
#: expects to save no memory, where the first call's ``PlanWarning`` is incidental to what the
#: test checks (the default tier makes any other ``PlanWarning`` an error: ``conftest.py``).
NOT_WORTH_IT = "ignore:.*not expected to save memory:jaxpr_accum.PlanWarning"

#: Every gradient mode of ``serialize_axis(grad=...)``: the library's one list of their names.
GRAD_MODES = _settings.GRAD_MODES


def modes(*fast: str, slow: Iterable[str] = ()) -> list:
    """Gradient modes as ``pytest.mark.parametrize`` values, in the order of :data:`GRAD_MODES`:
    those named in ``fast`` in the default tier, the other ones in ``slow`` marked ``slow``.
    ``modes("remat", slow=GRAD_MODES)``: remat by default, the three others in the slow tier;
    ``modes(*GRAD_MODES)``: all four by default."""
    fast, slow = set(fast), set(slow) - set(fast)
    assert fast | slow <= set(GRAD_MODES), (fast, slow)
    return [
        m if m in fast else pytest.param(m, marks=pytest.mark.slow)
        for m in GRAD_MODES
        if m in fast | slow
    ]


#: ``JAXPR_ACCUM_FULL_MATRIX=1``: :func:`covering` gives the whole product (a long run).
FULL_MATRIX = os.environ.get("JAXPR_ACCUM_FULL_MATRIX", "") not in ("", "0")

#: The modes whose checks include the ``jax.vmap`` contexts (every mode with FULL_MATRIX).
VMAP_CONTEXT_MODES = ("remat", "fused")


def assert_matches_original(sf: Any, *args: Any, vmap: bool | None = None, **kwargs: Any) -> None:
    """``jaxpr_accum.testing.assert_matches_original``; ``vmap=None``: the ``jax.vmap``
    contexts in :data:`VMAP_CONTEXT_MODES` (``sf``'s mode, or one of ``modes=``)."""
    if vmap is None:
        wanted = kwargs.get("modes") or [getattr(sf, "grad", None)]
        vmap = FULL_MATRIX or any(m in VMAP_CONTEXT_MODES for m in wanted)
    testing.assert_matches_original(sf, *args, vmap=vmap, **kwargs)


def covering(
    primary: Sequence, *others: Sequence, ids: Sequence[str] | None = None, per: int = 0
) -> list:
    """``pytest.param`` rows over ``primary`` and ``others`` that pair every value of
    ``primary`` with every value of each other factor at least once: row ``j`` of value
    ``i`` takes ``other[(i + j) % len(other)]`` of each, for ``j`` up to the longest other
    factor, so the others' values meet each other in varying pairs too. A ``primary`` value
    that is a tuple is spread into its row (as ``pytest.mark.parametrize`` takes it). With
    ``JAXPR_ACCUM_FULL_MATRIX=1``, the whole product. ``ids``: one per ``primary`` value;
    ``per``: rows per ``primary`` value, fewer than the longest factor (each other value
    then meets only some primary values, in rotation)."""
    width = per or max(len(o) for o in others)
    rows = []
    for i, value in enumerate(primary):
        head = value if isinstance(value, tuple) else (value,)
        combos = (
            itertools.product(*others)
            if FULL_MATRIX
            else (tuple(o[(i + j) % len(o)] for o in others) for j in range(width))
        )
        for combo in combos:
            name = "-".join(map(str, (ids[i] if ids else i, *combo)))
            rows.append(pytest.param(*head, *combo, id=name))
    return rows


def tiered(rows: list, fast: Sequence[tuple]) -> list:
    """``rows`` (``pytest.param``s, from :func:`covering`) in the slow tier, except those whose
    values are one of ``fast`` (added where ``rows`` lacks them), which stay in the default
    tier."""
    fast = [tuple(f) for f in fast]
    kept = [tuple(r.values) for r in rows]
    rows = rows + [pytest.param(*f, id="-".join(map(str, f))) for f in fast if f not in kept]
    return [
        r if tuple(r.values) in fast else pytest.param(*r.values, id=r.id, marks=pytest.mark.slow)
        for r in rows
    ]


# --------------------------------------------------------------------------------------
# Walking jaxprs
# --------------------------------------------------------------------------------------


def sub_jaxprs(value: Any) -> Iterator[Jaxpr]:
    """Every Jaxpr inside a parameter value (ClosedJaxpr, Jaxpr, or containers of them)."""
    if isinstance(value, ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from sub_jaxprs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from sub_jaxprs(v)


def eqn_sub_jaxprs(eqn: Any) -> list[Jaxpr]:
    """The sub-jaxprs of one equation, found by scanning all of its parameters."""
    return [j for v in eqn.params.values() for j in sub_jaxprs(v)]


def iter_eqns(jaxpr: Jaxpr | ClosedJaxpr) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and, recursively, of all of its sub-jaxprs (pre-order)."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in eqn_sub_jaxprs(eqn):
            yield from iter_eqns(sub)


def find_eqns(jaxpr: Jaxpr | ClosedJaxpr, *names: str) -> list[Any]:
    """All equations (recursively) whose primitive name is one of ``names``."""
    return [e for e in iter_eqns(jaxpr) if e.primitive.name in names]


def primitive_names(jaxpr: Jaxpr | ClosedJaxpr) -> set[str]:
    return {e.primitive.name for e in iter_eqns(jaxpr)}
