"""Values that depend on no data in pass 2: labels, masks and positives built from ``iota``.

A *constant* is a value computed by pure equations from literals alone (``jnp.arange(n) % k``,
``jnp.eye(n)``, ``jnp.roll(jnp.arange(n), s)``, ``y[:, None] == y[None]`` of such labels).
Inside a block of rows such a value is an index map of the block's rows and columns, so it
can be computed per block rather than whole:

- ``private(jaxpr)``: every equation that reads a constant and is not itself constant gets
  its own copy of the equations that compute it, and so does every layout equation inside
  such a copy (``broadcast_in_dim``, ``transpose``, ...: where the axis may move to another
  dimension), so each copy is free to carry the axis where its reader needs it. In
  ``y[:, None] == y[None]`` the row copy of ``y`` then carries the axis (its ``iota`` counts
  from the block's first row) and the column copy does not (a whole vector,
  loop-invariant), where one shared ``y`` would have to sit at both places and stop the
  region. Other sharing within a copy is kept (``select_n(p < 0, p, p + n)`` reads one
  ``p``: the lookups' proof that an index is the row's own position needs it). Copies are
  given up past ``MAX_COPIES`` equations (the program is returned unchanged); XLA merges
  what is computed twice outside the loop.
- ``materialise(jaxpr, analysis)``: a constant computed by an equation that mixes positions
  along the axis (the ``concatenate`` of ``jnp.roll``, a ``rev``) cannot be computed per
  block from the block's rows. Its value becomes an input of pass 2, computed once whole
  before it (``Constants``), which the loop slices per block like any chunked input.

Both are exact by construction: a copy computes what the original computes, and an input is
fed the value the equations it replaces compute.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from jaxpr_accum import _compat
from jaxpr_accum._compat import Atom, ClosedJaxpr, Jaxpr, Literal, Var
from jaxpr_accum._engine import _interpret
from jaxpr_accum._engine._axes import Analysis

MAX_COPIES = 4096  # equations emitted by ``private`` before it gives up


def constants(jaxpr: Jaxpr) -> set:
    """The values of ``jaxpr`` computed by pure equations from literals alone."""
    found: set = set()
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        if all(v in found for v in ins) and _compat.is_pure(eqn):
            found.update(eqn.outvars)
    return found


def private(jaxpr: Jaxpr) -> Jaxpr:
    """The same program, each reader of a constant with its own copy of its equations (see
    the module docstring); unchanged when copies would pass ``MAX_COPIES``."""
    const = constants(jaxpr)
    defining = {v: e for e in jaxpr.eqns for v in e.outvars if v in const}
    moving = _moving()
    eqns: list = []

    def copy(v: Atom, memo: dict) -> Atom:
        if isinstance(v, Literal) or v not in defining:
            return v
        if v not in memo:
            if len(eqns) > MAX_COPIES:
                raise OverflowError
            eqn = defining[v]
            inner = {} if eqn.primitive in moving else memo
            outvars = [_compat.new_var(x.aval) for x in eqn.outvars]
            ins = [copy(x, inner) for x in eqn.invars]
            eqns.append(eqn.replace(invars=ins, outvars=outvars))
            memo.update(zip(eqn.outvars, outvars, strict=True))
        return memo[v]

    try:
        for eqn in jaxpr.eqns:
            if not set(eqn.outvars) & const:
                eqns.append(eqn.replace(invars=[copy(v, {}) for v in eqn.invars]))
        outvars = [copy(v, {}) for v in jaxpr.outvars]
    except OverflowError:
        return jaxpr
    return jaxpr.replace(eqns=eqns, outvars=outvars)


@functools.cache
def _moving() -> frozenset:
    """Equations that may move the axis to another dimension of their result."""
    names = ("broadcast_in_dim", "transpose", "reshape", "squeeze", "expand_dims")
    return frozenset(p for p in map(_compat.primitive, names) if p is not None)


@dataclasses.dataclass(frozen=True, eq=False)
class Constants:
    """Constants computed whole before pass 2 (``program``: no inputs, one output per
    value of ``values``, the inputs of pass 2 they feed)."""

    values: tuple[Var, ...] = ()
    program: ClosedJaxpr | None = None

    def compute(self) -> list:
        return [] if self.program is None else _interpret.eval_jaxpr(self.program, [])


def materialise(jaxpr: Jaxpr, analysis: Analysis) -> tuple[Jaxpr, Sequence[Var]] | None:
    """``(the program with each constant that a barrier computes turned into an input (the
    last inputs), those inputs)``, or None when no barrier computes a constant."""
    const = constants(jaxpr)
    made: list[Var] = []
    for idx, eqn in enumerate(jaxpr.eqns):
        if ((), idx) in analysis.barriers and set(eqn.outvars) <= const:
            made.extend(v for v in eqn.outvars if not isinstance(v, _compat.DropVar))
    if not made:
        return None
    outs = set(made)
    eqns = [e for e in jaxpr.eqns if not set(e.outvars) & outs]
    program = jaxpr.replace(invars=[*jaxpr.invars, *made], eqns=eqns)
    return _compat.dce(ClosedJaxpr(program, [])).jaxpr, made


def program_of(jaxpr: Jaxpr, values: Sequence[Var]) -> ClosedJaxpr:
    """The equations of ``jaxpr`` that compute the constants ``values``, with no inputs: the
    backward slice from ``values`` (pure equations all, by ``constants``), never an effect of
    the program that dead-code elimination would keep, nor the data that effect reads."""
    needed, kept = set(values), []
    for eqn in reversed(jaxpr.eqns):
        if needed.intersection(eqn.outvars):
            kept.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, Literal))
    program = jaxpr.replace(invars=[], outvars=list(values), eqns=kept[::-1], effects=set())
    return ClosedJaxpr(program, [])
