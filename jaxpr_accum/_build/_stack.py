"""The chunk loop's per-chunk results put back in order.

``over_chunks`` (``_loop``) returns the full chunks' results stacked by ``lax.scan`` (a
leading dimension of ``n`` chunks) and the remainder's on its own. ``join`` puts a value that
carries the axis back together (the chunks' rows at the axis position, in chunk order, then
the remainder's); ``per_chunk`` keeps one value per chunk (a monoid partial), the remainder's
last.

Invariant: chunk ``c``'s rows land at positions ``[c*k, (c+1)*k)`` of the axis, the
remainder's after the last full chunk's, so the result is the value computed unchunked.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._compat import Array


def unstack(ys: Array, loc: AxisLoc) -> Array:
    """``[n, ..., k*m at loc.dim, ...]`` -> ``[..., n*k*m, ...]`` in chunk order."""
    moved = jnp.moveaxis(ys, 0, loc.dim)
    shape = list(moved.shape)
    shape[loc.dim : loc.dim + 2] = [shape[loc.dim] * shape[loc.dim + 1]]
    return moved.reshape(shape)


def join(full: Array | None, rest: Array | None, loc: AxisLoc) -> Array:
    """Put the scanned chunks (``full``: stacked ys, or None) and the remainder back in order."""
    parts = ([] if full is None else [unstack(full, loc)]) + ([] if rest is None else [rest])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=loc.dim)


def per_chunk(full: Array | None, rest: Array | None) -> Array:
    """One value per chunk: the scanned ones (or None) followed by the remainder's."""
    parts = ([] if full is None else [full]) + ([] if rest is None else [rest[None]])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)


def stacked_outputs(
    scanned: Sequence[list] | None,
    rest: Sequence[list] | None,
    n_partials: int,
    locs: Sequence[AxisLoc],
) -> tuple[list, list]:
    """``(partials, stacked)`` of the per-chunk ones (``scanned``, ``rest``: the scan's ys
    and the remainder's, ``(partials, stacked)`` each), the stacked (at ``locs``) in order."""

    def parts(group: int, j: int) -> tuple:
        return (
            None if scanned is None else scanned[group][j],
            None if rest is None else rest[group][j],
        )

    partials = [per_chunk(*parts(0, j)) for j in range(n_partials)]
    stacked = [join(*parts(1, j), loc) for j, loc in enumerate(locs)]  # type: ignore[call-arg]
    return partials, stacked
