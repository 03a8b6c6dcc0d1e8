"""The analysis's contexts and the rule interface. A context is one (sub-)jaxpr at one path of
enclosing equations (``Ctx``), indexed once (``Context``: who reads or defines each value),
with its parent equation and a program-derived order on equation keys. ``View`` is one
equation's window on an ``Analysis``, what a rule's ``propagate`` reads and writes (the axis
positions of its operands and results, and the marks: barrier, hoist, reduction), and how
rules with sub-jaxprs link and register them; ``EqnResize`` is what a rule's ``resize`` reads
(the chunk, the axis positions, sub-jaxprs evaluated at chunk size)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jaxpr_accum import _compat
from jaxpr_accum._base._lattice import AxisLoc, is_mapped, window
from jaxpr_accum._compat import Array, Atom, ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var, open_jaxpr

if TYPE_CHECKING:  # a cycle of types only: both import this module
    from jaxpr_accum._engine._axes import Analysis
    from jaxpr_accum._engine._resize import Resizer

Ctx = tuple  # path of (equation index, sub-jaxpr path) pairs from the top-level jaxpr
EqnKey = tuple  # (ctx, equation index)
Ref = tuple  # (ctx, Var)


class Context:
    """One (sub-)jaxpr in one context: its equations and who reads or defines each value."""

    __slots__ = ("eqns", "users", "boundary")

    def __init__(self, jaxpr: Jaxpr | ClosedJaxpr):
        inner = open_jaxpr(jaxpr)
        self.eqns = inner.eqns
        users: dict[Var, list[int]] = {}
        for idx, eqn in enumerate(self.eqns):
            for v in (*eqn.invars, *eqn.outvars):
                if isinstance(v, (Literal, _compat.DropVar)):
                    continue
                found = users.setdefault(v, [])
                if not found or found[-1] != idx:
                    found.append(idx)
        self.users = users
        self.boundary = {v for v in (*inner.invars, *inner.outvars) if not isinstance(v, Literal)}


def parent(ctx: Ctx) -> EqnKey:
    """The equation whose sub-jaxpr ``ctx`` is (``ctx`` is not the top level)."""
    return (ctx[:-1], ctx[-1][0])


def order(key: EqnKey) -> tuple:
    """A total, program-derived order on equation keys: by context, then index."""
    ctx, idx = key
    steps = tuple(
        (i, tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in path))
        for i, path in ctx
    )
    return (steps, idx)


class View:
    """One equation's window on an ``Analysis``: what rules read and write."""

    __slots__ = ("analysis", "ctx", "idx", "eqn")

    def __init__(self, analysis: Analysis, ctx: Ctx, idx: int, eqn: JaxprEqn):
        self.analysis, self.ctx, self.idx, self.eqn = analysis, ctx, idx, eqn

    @property
    def key(self) -> EqnKey:
        return (self.ctx, self.idx)

    @property
    def size(self) -> int:
        return self.analysis.size

    def in_loc(self, i: int) -> AxisLoc | None:
        return self.analysis.loc(self.ctx, self.eqn.invars[i])

    def out_loc(self, j: int) -> AxisLoc | None:
        return self.analysis.loc(self.ctx, self.eqn.outvars[j])

    def set_in(self, i: int, loc: AxisLoc | None) -> None:
        self.analysis.set(self.ctx, self.eqn.invars[i], loc, self.key)

    def set_out(self, j: int, loc: AxisLoc | None) -> None:
        self.analysis.set(self.ctx, self.eqn.outvars[j], loc, self.key)

    def barrier(self, reason: str) -> None:
        self.analysis.mark_barrier(self.key, reason)

    def hoist(self, reason: str) -> None:
        self.analysis.mark_hoist(self.key, reason)

    def reduce(self, j: int, kind: str) -> None:
        if any(is_mapped(self.in_loc(i)) for i in range(len(self.eqn.invars))):
            # a mapped value is computed on windows that may overlap: never summed over
            self.barrier("reduces over a concatenated, sliced or reversed axis")
            return
        self.analysis.mark_reduction(self.key, j, kind)

    # -- sub-jaxprs ----------------------------------------------------------------------
    def sub_ctx(self, path: tuple) -> Ctx:
        return self.ctx + ((self.idx, path),)

    def link(self, a: tuple[Ctx, Atom], b: tuple[Ctx, Atom], shift: int = 0) -> None:
        """Values ``a`` and ``b`` are the same up to ``shift``: dim ``d`` of a is ``d+shift`` of b.

        A location that would fall off the front (``dim + shift < 0``) is a barrier. A link
        is re-applied whenever the enclosing equation is re-run, i.e. whenever a fact of a
        sub-jaxpr input or output changes, so either side may be learnt first.
        """
        an = self.analysis
        la, lb = an.loc(*a), an.loc(*b)
        if la is not None:
            if la.dim + shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*b, la._replace(dim=la.dim + shift), self.key)
        if lb is not None:
            if lb.dim - shift < 0:
                self.barrier("a loop iterates over the axis")
                return
            an.set(*a, lb._replace(dim=lb.dim - shift), self.key)

    def walk(self, path: tuple, jaxpr: Jaxpr | ClosedJaxpr) -> None:
        """Register sub-jaxpr ``path`` for analysis (it is analysed by the worklist, not now)."""
        self.analysis.walk(jaxpr, self.sub_ctx(path))


class EqnResize:
    """What a rule's ``resize`` sees: the axis positions, the chunk, and sub-jaxpr evaluation
    (``resizer`` is the ``_resize.Resizer`` re-emitting the equation)."""

    __slots__ = ("resizer", "ctx", "idx", "eqn")

    def __init__(self, resizer: Resizer, ctx: Ctx, idx: int, eqn: JaxprEqn):
        self.resizer, self.ctx, self.idx, self.eqn = resizer, ctx, idx, eqn

    @property
    def analysis(self) -> Analysis:
        return self.resizer.analysis

    @property
    def key(self) -> tuple:
        return (self.ctx, self.idx)

    @property
    def k(self) -> int:
        return self.resizer.k

    @property
    def start(self) -> Array | int:
        return self.resizer.start

    @property
    def in_locs(self) -> list[AxisLoc | None]:
        return [self.analysis.loc(self.ctx, v) for v in self.eqn.invars]

    @property
    def out_locs(self) -> list[AxisLoc | None]:
        return [self.analysis.loc(self.ctx, v) for v in self.eqn.outvars]

    def chunk_shape(self, v: Atom) -> tuple[int, ...]:
        """The shape of ``v`` at chunk size."""
        shape = list(getattr(v.aval, "shape", ()))
        loc = self.analysis.loc(self.ctx, v)
        if loc is not None:
            shape[loc.dim] = self.rows(loc)
        return tuple(shape)

    def rows(self, loc: AxisLoc) -> int:
        """Length at chunk size of the dimension that holds the axis at ``loc`` (a row-mapped
        one: its window's)."""
        return loc.outer * self.window(loc)[1] * loc.inner

    def window(self, loc: AxisLoc) -> tuple[Array | int, int]:
        """``(first row, rows)`` of the axis at ``loc`` in this chunk (``_lattice.window``)."""
        return window(loc, self.analysis.size, self.k, self.start, self.resizer.cell)

    def eval(self, path: tuple, jaxpr: Jaxpr | ClosedJaxpr, args: Sequence[Array]) -> list[Array]:
        return self.resizer.eval_jaxpr(self.ctx + ((self.idx, path),), jaxpr, args)
