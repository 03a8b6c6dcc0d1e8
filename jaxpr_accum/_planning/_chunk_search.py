"""The chunk search of a memory budget (``_budget``), for one gradient mode: the largest
per-device chunk ``c`` on ``[1, n]`` whose measured memory ``m(c)`` fits the limit, in few
measurements (each one is a compilation).

1. ``m(n)``: one chunk. Within the budget: done, one compile.
2. ``m(1)``. Over the budget: no chunk fits (``run`` returns None).
3. Between ``lo`` (measured to fit) and ``hi`` (measured not to), predict the boundary from
   the affine model through the two (memory is close to affine in the chunk), measure the
   prediction, and move ``lo`` or ``hi`` to it. When the previous prediction missed by more
   than ``FIT_TOLERANCE`` of the bracket's span, the next step is a bisection instead. Stop
   when the model puts the boundary at ``lo``, when ``hi - lo`` is within ``1/16`` of ``lo``
   (or 1), or after ``MAX_COMPILES``. The steps run over the divisors of ``n`` first (a
   remainder chunk costs a second body and a concatenation of the stacked values: memory jumps
   off the affine line), then, where the next divisor is more than twice the result, over the
   chunks in between, in the order an affine model in the *extent* (the chunk plus the
   remainder's own body, ``chunk + N mod chunk``) ranks them, largest first.

Invariants: the chunk returned was itself measured within the limit (never only predicted);
every chunk measured over the limit is larger than it. The result would be wrong only if
memory were not monotone in the chunk between ``lo`` and ``hi`` (a larger chunk that fits
could be missed; the one returned still fits).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence

import numpy as np

MAX_COMPILES = 6  # per gradient mode, over the divisors of the axis
BETWEEN_COMPILES = 4  # more, for chunks between divisors (a remainder chunk)
FIT_TOLERANCE = 0.1


class ChunkSearch:
    """The measurements of one gradient mode, by per-device chunk."""

    def __init__(self, measure: Callable[[int], int], limit: int, n: int):
        self.measure, self.limit, self.n = measure, limit, n
        self.points: dict[int, int] = {}

    def at(self, c: int) -> int:
        if c not in self.points:
            self.points[c] = self.measure(c)
        return self.points[c]

    def run(self) -> int | None:
        """The largest per-device chunk measured to fit, or None if chunk 1 does not.

        Divisors of ``n`` first: a remainder chunk adds a second copy of the body and a
        concatenation of the stacked values, so memory is monotone over divisors but jumps
        between them. Where the next divisor above the result is more than twice as large
        (few divisors), the chunks in between are searched too."""
        divisors = [d for d in range(1, self.n + 1) if self.n % d == 0]
        c = self.bracket(divisors)
        if c is None:
            return None
        above = min((d for d in divisors if d > c), default=c)
        if above > 2 * c:
            c = self.between(c, above)
        return c

    def extent(self, c: int) -> int:
        """Positions one pass of chunk ``c`` holds: the chunk, and the remainder's own body
        after the scan (memory goes about as ``a + b * extent``, not ``a + b * c``)."""
        return c + self.n % c

    def between(self, lo: int, hi: int) -> int:
        """The largest chunk in ``(lo, hi)`` that fits, where ``lo`` fits and ``hi`` does
        not: candidates in decreasing order of the chunk among those the affine model in
        ``extent`` (fitted to every measurement) puts within the budget, each measured, for
        ``BETWEEN_COMPILES`` more compiles at most."""
        best, failed = lo, set()
        for _ in range(BETWEEN_COMPILES):
            a, b = self.fit_extent()
            fits = [
                c
                for c in range(best + 1, hi)
                if c not in failed and a + b * self.extent(c) <= self.limit
            ]
            if not fits:
                break
            c = max(fits)
            if self.at(c) <= self.limit:
                best = c
            else:
                failed.add(c)
        return best

    def fit_extent(self) -> tuple[float, float]:
        """``(a, b)`` of ``bytes ~ a + b * extent`` over the measurements."""
        ks = sorted(self.points)
        xs = np.asarray([self.extent(k) for k in ks], float)
        ms = np.asarray([self.points[k] for k in ks], float)
        if len(set(xs)) < 2:
            return float(ms[0]), 0.0
        b, a = np.polyfit(xs, ms, 1)
        return float(a), float(b)

    def bracket(self, chunks: Sequence[int]) -> int | None:
        """Secant steps (bisection where the fit missed) between ``lo`` (fits) and ``hi``
        (does not) over the ascending ``chunks``; the largest measured to fit."""
        limit = self.limit
        if self.at(chunks[-1]) <= limit:
            return chunks[-1]
        if self.at(chunks[0]) > limit:
            return None
        lo, hi, bisect = 0, len(chunks) - 1, False
        while hi - lo > 1 and len(self.points) < MAX_COMPILES:
            k_lo, k_hi = chunks[lo], chunks[hi]
            if k_hi - k_lo <= k_lo // 16:
                break
            m_lo, m_hi = self.points[k_lo], self.points[k_hi]
            predicted = k_lo + (limit - m_lo) * (k_hi - k_lo) / max(m_hi - m_lo, 1)
            guess = (lo + hi) // 2 if bisect else bisect_right(chunks, predicted) - 1
            if guess <= lo and not bisect:
                break  # the model puts the boundary at lo
            guess = min(max(guess, lo + 1), hi - 1)
            k = chunks[guess]
            expected = m_lo + (m_hi - m_lo) * (k - k_lo) / (k_hi - k_lo)
            m = self.at(k)
            bisect = abs(m - expected) > FIT_TOLERANCE * max(m_hi - m_lo, 1)
            lo, hi = (guess, hi) if m <= limit else (lo, guess)
        return chunks[lo]

    def fit(self) -> tuple[float, float] | None:
        if len(self.points) < 2:
            return None
        ks, ms = zip(*sorted(self.points.items()), strict=True)
        b, a = np.polyfit(np.asarray(ks, float), np.asarray(ms, float), 1)
        return float(a), float(b)
