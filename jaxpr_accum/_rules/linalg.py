"""Batched linear algebra and transforms: leading batch dimensions, trailing core dimensions.

``cholesky``, ``triangular_solve``, ``lu``, ``qr``, ``eigh``, ``svd``, ... act on the trailing
*core* dimensions of their operands (a matrix, a vector of pivots) and map every leading
*batch* dimension positionwise; ``fft`` transforms its trailing ``len(fft_lengths)``
dimensions. Every operand and result shares the batch dimensions, so the axis may sit at any
batch dimension, at the same place in all of them; at a core dimension the primitive mixes
positions (a factorisation couples the rows of its matrix): a barrier. Nothing changes shape
on resize except the batch dimension, which the primitive infers from its operands.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxpr_accum import _compat
from jaxpr_accum._compat import JaxprEqn
from jaxpr_accum._engine._table import Rule, register, shared_loc
from jaxpr_accum._engine._view import View


class BatchedCore(Rule):
    """``core(eqn)``: how many trailing dimensions of operand 0 are core (not batch)."""

    def __init__(self, core: Callable[[JaxprEqn], int]):
        self.core = core

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        batch_rank = len(_compat.shape_of(eqn.invars[0])) - self.core(eqn)
        loc = shared_loc(eqn, view, range(len(eqn.invars)))
        if loc is None:
            return
        if loc.dim >= batch_rank:
            view.barrier(f"`{eqn.primitive.name}` acts along the axis (a core dimension)")
            return
        for i in range(len(eqn.invars)):
            view.set_in(i, loc)
        for j in range(len(eqn.outvars)):
            view.set_out(j, loc)


class TriangularSolve(BatchedCore):
    """``triangular_solve(a, b)``: besides the batch dimensions, the right-hand sides (the
    columns of ``b``, or its rows with ``left_side=False``) are solved independently, so the
    axis may also sit there when the matrix ``a`` does not carry it."""

    def __init__(self) -> None:
        super().__init__(_matrix)

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        rank = len(_compat.shape_of(eqn.invars[1]))
        free = rank - 1 if eqn.params["left_side"] else rank - 2
        loc = view.in_loc(1) or view.out_loc(0)
        if loc is not None and loc.dim == free:
            if view.in_loc(0) is not None:
                view.barrier("`triangular_solve`'s matrix and right-hand sides both carry the axis")
                return
            view.set_in(1, loc)
            view.set_out(0, loc)
            return
        super().propagate(eqn, view)


def _matrix(eqn: JaxprEqn) -> int:
    return 2


def _vector(eqn: JaxprEqn) -> int:
    return 1


def _fft(eqn: JaxprEqn) -> int:
    return len(eqn.params["fft_lengths"])


register(
    "cholesky lu qr eigh eig svd schur hessenberg tridiagonal "
    "householder_product geqrf geqp3 ormqr cholesky_update symmetric_product".split(),
    BatchedCore(_matrix),
)
register(["tridiagonal_solve", "lu_pivots_to_permutation"], BatchedCore(_vector))
register("fft", BatchedCore(_fft))
register("triangular_solve", TriangularSolve())
