"""The cost model: the bytes a split is estimated to save, compared across candidate axes and
shown by ``explain``.

**What chunking saves.** Under ``jit(value_and_grad)``, the original holds the body's
*materialised* axis-carrying intermediates at full size from the forward pass to the
backward; chunked, it holds them for one chunk. Materialised means produced by a primitive
that XLA does not fuse into its readers: contractions, reductions, gathers, scans' stacked
outputs and the costly elementwise ones (``exp``, ``log``, ``tanh``, ``div``, ...). The
cheap elementwise and layout primitives of ``FUSED_INTO_READERS`` are recomputed inside
the kernels that read them, the backward's included, so they are not counted. A scan body's
values count once per iteration (its backward keeps them all).

**What the loop adds.** The outputs stacked back to full size; the accumulators (sums
carried, other monoid partials stacked per chunk, streamed sums per term); and, in the
backward loop, one cotangent accumulator per floating loop-invariant input: the parameters,
but also activations computed before the loop, which is what makes chunking a hidden
dimension (a layer's width) cost memory rather than save it.

``net_saving = held * (1 - chunk / N) - stacked - accumulators - invariant cotangents``
(``_estimate.Candidate``: a split at a chunk size).

The gradient mode's choice (``_modes._choice``) reads the same accounting per value
(``carrying_sizes``: the largest activation) and which equations XLA fuses into their
readers (``fuses_into_readers``, which a ReLU's call is).

The estimate is checked against XLA's own accounting by ``tests/cost_model.py``
(its summary: ``docs/real-models.md#the-cost-model``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator, Sequence

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import has_float_dtype
from jaxpr_accum._compat import Atom, Eqn, Var
from jaxpr_accum._engine._axes import Analysis

FUSED_INTO_READERS = frozenset(
    p
    for p in map(
        _compat.primitive,
        """abs add and broadcast_in_dim clamp convert_element_type copy copy_p eq expand_dims ge
        gt integer_pow iota le lt max min mul ne neg not or reshape select_n sign square
        squeeze stop_gradient sub transpose""".split(),
    )
    if p is not None
)  # primitive objects (names the installed JAX lacks cannot appear in a program)

#: the least fraction of the estimated memory a plan that stops must save (else it is
#: measured: ``_planning/_worth``)
MARGIN = 0.10

_SCAN = _compat.primitive("scan")
CONTRACTIONS = frozenset(
    p for p in map(_compat.primitive, ("dot_general", "conv_general_dilated")) if p is not None
)


def fuses_into_readers(eqn: Eqn) -> bool:
    """Whether XLA fuses ``eqn``'s results into the kernels that read them: a primitive of
    ``FUSED_INTO_READERS``, or a call (``custom_jvp``, ``jit``; not a loop) of only such
    equations, as ``jax.nn.relu`` is."""
    subs = [sub for _, sub in _compat.sub_jaxprs(eqn.params)]
    if not subs:
        return eqn.primitive in FUSED_INTO_READERS
    return eqn.primitive is not _SCAN and all(
        fuses_into_readers(e) for sub in subs for e in _compat.open_jaxpr(sub).eqns
    )


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def nbytes(v: Atom) -> int:
    aval = _compat.shaped(v)
    return math.prod(aval.shape) * getattr(aval.dtype, "itemsize", 4)


def float_bytes(values: Iterable[Atom]) -> int:
    """Bytes of the floating values among ``values``."""
    return sum(nbytes(v) for v in values if has_float_dtype(v))


def materialised_bytes(eqns: Iterable[Eqn]) -> int:
    """Bytes of the results of ``eqns`` that XLA materialises (not ``FUSED_INTO_READERS``)."""
    return sum(nbytes(v) for e in eqns if e.primitive not in FUSED_INTO_READERS for v in e.outvars)


def carrying_sizes(
    analysis: Analysis,
    ctx: tuple,
    eqns: Sequence[Eqn],
    indices: Iterable[int],
    *,
    exclude: Collection[Var] = (),
    materialised_only: bool = False,
) -> Iterator[tuple[int, int]]:
    """``(bytes, times)`` of each axis-carrying result of ``eqns[indices]`` at full size
    (only the materialised ones with ``materialised_only``), those inside their sub-jaxprs
    too, a scan body's ``times`` its number of iterations."""
    for idx in indices:
        eqn = eqns[idx]
        subs = list(_compat.sub_jaxprs(eqn.params))
        if not (materialised_only and (subs or eqn.primitive in FUSED_INTO_READERS)):
            for v in eqn.outvars:
                if v not in exclude and analysis.loc(ctx, v) is not None:
                    yield nbytes(v), 1
        times = eqn.params.get("length", 1) if eqn.primitive is _SCAN else 1
        for path, sub in subs:
            inner = _compat.open_jaxpr(sub).eqns
            for size, repeated in carrying_sizes(
                analysis,
                (*ctx, (idx, path)),
                inner,
                range(len(inner)),
                materialised_only=materialised_only,
            ):
                yield size, times * repeated


def carrying_bytes(
    analysis: Analysis,
    ctx: tuple,
    eqns: Sequence[Eqn],
    indices: Iterable[int],
    *,
    exclude: Collection[Var] = (),
    materialised_only: bool = False,
) -> int:
    """Bytes of the axis-carrying results of ``eqns[indices]`` at full size
    (``carrying_sizes``), a scan body's once per iteration."""
    sizes = carrying_sizes(
        analysis, ctx, eqns, indices, exclude=exclude, materialised_only=materialised_only
    )
    return sum(size * times for size, times in sizes)
