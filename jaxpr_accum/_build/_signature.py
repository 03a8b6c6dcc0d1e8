"""The chunked region's interface: named groups of inputs and outputs, built once from a split.

Every module past the plan (the chunk loop, the gradient passes, the region primitive, the
assembly) speaks these names, never positions in a tuple:

- ``Inputs``: ``invariants`` (no axis: parameters, values computed before the loop; the same
  for every chunk) and ``chunked`` (sliced per chunk at their axis position);
- ``Outputs``: ``sums`` (accumulated in the loop's carry), ``partials`` (the other monoid
  reductions, one partial per chunk, combined after the region so that JAX differentiates the
  combination), ``stacked`` (still carry the axis: chunks put back in order), ``streams`` (the
  streamed sums' accumulators, one per term) and ``finals`` (their final stabilisers, one per
  ``Exp`` term: constants, never differentiated).

``Signature`` holds the variables of each group and which outputs can carry a gradient
(floating, and not a stabiliser). ``flat`` / ``unflat`` convert to and from the flat lists that
a primitive binds. Invariant: the order of every group is fixed when the signature is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from jaxpr_accum import _compat
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Var
from jaxpr_accum._stream.layout import StreamLayout


class Inputs(NamedTuple):
    invariants: list
    chunked: list

    def flat(self) -> list:
        return [*self.invariants, *self.chunked]

    def placed(self, where: Inputs, invariants: Sequence, chunked: Sequence) -> Inputs:
        """``invariants`` and ``chunked`` put at the indices ``where`` names, in an ``Inputs``
        shaped like this one; None elsewhere."""
        out = Inputs([None] * len(self.invariants), [None] * len(self.chunked))
        for i, x in zip(where.invariants, invariants, strict=True):
            out.invariants[i] = x
        for i, x in zip(where.chunked, chunked, strict=True):
            out.chunked[i] = x
        return out


class Outputs(NamedTuple):
    sums: list
    partials: list
    stacked: list
    streams: list
    finals: list

    def flat(self) -> list:
        return [x for group in self for x in group]


@dataclasses.dataclass(frozen=True)
class Signature:
    """The variables of the region's input and output groups (see the module docstring)."""

    invariants: tuple[Var, ...]
    chunked: tuple[tuple[Var, AxisLoc], ...]
    sums: tuple[Var, ...]
    partials: tuple[tuple[Var, str], ...]
    stacked: tuple[tuple[Var, AxisLoc], ...]
    streams: StreamLayout

    @classmethod
    def of(cls, split: Split) -> Signature:
        return cls(
            tuple(split.invariants),
            tuple(split.chunked),
            tuple(split.sums),
            tuple(split.partials),
            tuple(split.stacked),
            StreamLayout.of(split.sinks),
        )

    # -- inputs --------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.invariants) + len(self.chunked)

    @property
    def chunk_locs(self) -> list[AxisLoc]:
        return [loc for _, loc in self.chunked]

    @property
    def input_vars(self) -> list[Var]:
        """The variables of the flat inputs, in the order of ``Inputs.flat``."""
        return [*self.invariants, *(v for v, _ in self.chunked)]

    def inputs(self, flat: Sequence) -> Inputs:
        n = len(self.invariants)
        assert len(flat) == self.n_inputs, (len(flat), self.n_inputs)
        return Inputs(list(flat[:n]), list(flat[n:]))

    # -- outputs -------------------------------------------------------------------------
    def sizes(self) -> tuple[int, int, int, int, int]:
        """The length of every output group, in the order of ``Outputs``."""
        return (
            len(self.sums),
            len(self.partials),
            len(self.stacked),
            self.streams.n_terms,
            self.streams.n_finals,
        )

    @property
    def written_outputs(self) -> list[Var]:
        """The variables of the outputs the region's equations compute as written, where it
        streams nothing: the sums, the partials and the stacked outputs."""
        return [*self.sums, *(v for v, _ in self.partials), *(v for v, _ in self.stacked)]

    def outputs(self, flat: Sequence) -> Outputs:
        groups: list[list] = []
        start = 0
        for n in self.sizes():
            groups.append(list(flat[start : start + n]))
            start += n
        assert start == len(flat), (start, len(flat))
        return Outputs(*groups)

    def differentiable(self) -> Outputs:
        """Per output, whether it can carry a gradient: floating, and not a stabiliser."""
        return Outputs(
            [has_float_dtype(v) for v in self.sums],
            [has_float_dtype(v) for v, _ in self.partials],
            [has_float_dtype(v) for v, _ in self.stacked],
            [True] * self.streams.n_terms,
            [False] * self.streams.n_finals,
        )

    def sum_dtypes(self) -> list:
        return [_compat.dtype_of(v) for v in self.sums]
