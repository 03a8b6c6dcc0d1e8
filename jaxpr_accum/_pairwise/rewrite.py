"""The two programs of a two-pass plan, cut from the traced one.

- **Pass 1** (``first_pass``): the same inputs, the *stacked values* as outputs: the roots of
  the pairings that the program computes (the embeddings) and any other result of the
  equations that define them that is read later. Everything else is dead and dropped.
- **Pass 2** (``second_pass``): inputs ``[the original inputs, the stacked values, one column
  copy per column root]``. The equations that define the stacked values are gone (their
  results are inputs now), so what only they needed (the encoder) is dropped too. Each
  pairing reads its column side from the column copy, through a copy of the layout chain from
  the root (``z.T`` becomes ``z_col.T``; ``z[::-1].T``, ``rev`` then ``transpose`` of
  ``z_col``; a roll's slices and ``concatenate``), and so does each *read* of a per-row value
  at the pairs' columns (``k @ z`` reads ``z_col``: ``reads``); every other reader of a root,
  the row side included, reads the root itself.

Two kinds of equation run in exactly one pass (``cut``), where any other equation that both
passes need (the encoder's hidden layer, read by the pairs and by another term) is computed
in each:

- *effects* (``eqn.effects``: a ``jax.debug.callback``, an ``io_callback``, a print): pass 1
  runs those that the stacked values need and, in program order, those it can run (every
  input computed without a pairing: a callback on the embeddings or on the encoder's values)
  until the first that it cannot (a callback on the loss); pass 2 runs every other one. All
  of pass 1's effects precede all of pass 2's, as in the program; where the stacked values
  need an effect that comes after one that pass 2 must run, there is no two-pass plan.
- *custom VJP calls* (at any depth) that the stacked values need run in pass 1. A backward
  rule may be nonlinear in its cotangent (``g / mean(|g|)``): JAX calls it once, with the
  sum of every use's cotangent, and two copies of the call would each get a part.

Pass 1 stacks any result of these equations that pass 2 reads, so pass 2 never runs them
again.

Pass 2 is an ordinary program: its analysis, seeded where the pairing's axis sits in its
inputs, finds the axis on the rows of every pair (the column copies carry no axis: they are
loop-invariant inputs, the full stacked value), so the planner chunks the pairs by rows.

Why this is exact: every equation of pass 2 is an equation of the original (or a copy of a
layout equation) reading the same values, since the column copy is fed the same array as the
root; pass 1 computes the stacked values with the original's own equations. Every effect and
every custom VJP call of the original is in one pass's program, once. A pure equation
computed in both passes gets its uses' cotangents in two parts, and its pullback, linear in
the cotangent, adds them up as the original's does.
"""

from __future__ import annotations

from jaxpr_accum import _compat
from jaxpr_accum._analysis._stages import variables
from jaxpr_accum._compat import ClosedJaxpr, Jaxpr, Literal, Var
from jaxpr_accum._pairwise.detect import Pairing, Read


def _dce(jaxpr: Jaxpr) -> Jaxpr:
    return _compat.dce(ClosedJaxpr(jaxpr, [])).jaxpr


def stacked_values(pairing: Pairing) -> tuple[Var, ...]:
    """The computed roots, and every other result of their defining equations that another
    equation or the program's outputs read: what pass 1 returns."""
    jaxpr = pairing.jaxpr
    roots = set(pairing.roots)
    cut = [i for i, e in enumerate(jaxpr.eqns) if roots & set(e.outvars)]
    read: set = set(variables(jaxpr.outvars))
    for idx, eqn in enumerate(jaxpr.eqns):
        if idx not in cut:
            read.update(variables(eqn.invars))
    out: list[Var] = []
    for idx in cut:
        out.extend(
            v
            for v in jaxpr.eqns[idx].outvars
            if not isinstance(v, _compat.DropVar) and (v in roots or v in read)
        )
    return tuple(out)


def cut(pairing: Pairing) -> tuple[tuple[Var, ...], frozenset[int]] | None:
    """``(what pass 1 returns, the indices of the equations that pass 1 runs and pass 2 does
    not)``, or None when the effects cannot keep their order in two passes (see the module
    docstring)."""
    stacked = stacked_values(pairing)
    if not stacked:  # no pass 1: pass 2 runs every effect
        return stacked, frozenset()
    first = _only_in_pass_1(pairing, stacked)
    if first is None:
        return None
    eqns = pairing.jaxpr.eqns
    dropped = first | {i for i, e in enumerate(eqns) if set(stacked) & set(e.outvars)}
    live = set(variables(pairing.jaxpr.outvars))
    for idx in reversed(range(len(eqns))):
        eqn = eqns[idx]
        if idx not in dropped and (eqn.effects or live & set(eqn.outvars)):
            live.update(variables(eqn.invars))
    read = [v for i in sorted(first) for v in eqns[i].outvars if v in live and v not in stacked]
    return (*stacked, *read), first


def _only_in_pass_1(pairing: Pairing, stacked: tuple[Var, ...]) -> frozenset[int] | None:
    """The equations that pass 1 runs and pass 2 does not: the custom VJP calls upstream of
    ``stacked``, and the equations with effects upstream of ``stacked`` and, in program order,
    those whose inputs pass 1 can compute, until the first it cannot."""
    eqns = pairing.jaxpr.eqns
    upstream: set[int] = set()
    needed = set(stacked)
    for idx in reversed(range(len(eqns))):
        if needed & set(eqns[idx].outvars):
            upstream.add(idx)
            needed.update(variables(eqns[idx].invars))
    pairings = {u.index for u in pairing.uses}
    computable = set(pairing.jaxpr.invars)
    first: set[int] = set()
    late = False  # an effect already left to pass 2
    for idx, eqn in enumerate(eqns):
        ready = idx not in pairings and all(v in computable for v in variables(eqn.invars))
        if ready:
            computable.update(eqn.outvars)
        if not eqn.effects:
            if idx in upstream and _compat.first_eqn([eqn], _compat.is_custom_vjp_call):
                first.add(idx)
            continue
        if idx in upstream and late:
            return None
        if idx in upstream or (ready and not late):
            first.add(idx)
        else:
            late = True
    return frozenset(first)


def first_pass(jaxpr: Jaxpr, stacked: tuple[Var, ...], once: frozenset[int]) -> Jaxpr:
    """The program from its inputs to ``stacked`` (the same inputs), with the equations with
    effects of ``once`` only."""
    eqns = [e for i, e in enumerate(jaxpr.eqns) if not e.effects or i in once]
    return _dce(jaxpr.replace(eqns=eqns, outvars=list(stacked)))


def second_pass(
    pairing: Pairing, stacked: tuple[Var, ...], once: frozenset[int]
) -> tuple[Jaxpr, dict[Var, Var]]:
    """``(pass 2, {column copy: its root})``, without the equations that pass 1 ran
    (``once``): see the module docstring."""
    jaxpr = pairing.jaxpr
    columns = {root: _compat.new_var(root.aval) for root in pairing.column_roots}
    defined_here = set(stacked)
    reads: dict[int, list[Read]] = {}
    for read in pairing.rewired:
        reads.setdefault(read.index, []).append(read)
    eqns = []
    for idx, eqn in enumerate(jaxpr.eqns):
        if defined_here & set(eqn.outvars) or idx in once:
            continue
        invars: list = list(eqn.invars)
        for read in reads.get(idx, ()):
            env: dict = {read.col_root: columns[read.col_root]}
            for c in read.chain:
                link = jaxpr.eqns[c]
                outs = [_compat.new_var(x.aval) for x in link.outvars]
                ins = [x if isinstance(x, Literal) else env.get(x, x) for x in link.invars]
                eqns.append(link.replace(invars=ins, outvars=outs))
                env.update(zip(link.outvars, outs, strict=True))
            invars[read.col] = env.get(invars[read.col], invars[read.col])
        eqns.append(eqn.replace(invars=invars) if idx in reads else eqn)
    computed = [v for v in stacked if v not in set(jaxpr.invars)]
    program = jaxpr.replace(invars=[*jaxpr.invars, *computed, *columns.values()], eqns=eqns)
    return _dce(program), {col: root for root, col in columns.items()}
