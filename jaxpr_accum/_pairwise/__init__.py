"""A value that pairs the axis with itself (``z @ z.T``, ``z[:, None] - z[None]``), in two
passes: pass 1 chunks the per-example part and stacks the paired values (the embeddings);
pass 2 chunks the pairs by rows, with the full stacked value as a loop-invariant column side.

- ``detect``: the pairing equations, their row and column sides and the values they pair;
- ``reborn``: axes born again at a stop (two views joined, the halves of one batch), which
  ``detect`` looks for pairings of;
- ``permute``: rearranged rows of a root (``z[::-1]``, a roll, a gather) as a column layout;
- ``reads``: per-row values read at the pairs' columns (``k @ z``, SVGD's ``k * g[None]``),
  which pass 2 reads whole too;
- ``rewrite``: the two programs, cut from the traced one;
- ``constants``: labels, masks and positives built from ``iota`` in pass 2, per block;
- ``plan``: ``TwoPass``, both passes planned as ordinary splits, and their estimate;
- ``build``: the two passes as one program (JAX's own AD composes them);
- ``modes``: each pass's gradient mode (by the estimate, for what the caller differentiates),
  built;
- ``report``: what ``explain`` shows of them.
"""

from jaxpr_accum._pairwise.build import build
from jaxpr_accum._pairwise.modes import choose_and_build
from jaxpr_accum._pairwise.plan import TwoPass, plan
from jaxpr_accum._pairwise.report import plan_of

__all__ = ["TwoPass", "build", "choose_and_build", "plan", "plan_of"]
