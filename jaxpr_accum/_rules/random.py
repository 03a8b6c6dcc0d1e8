"""Random primitives.

Keys carry the axis like any array (``split(key, N)`` then ``vmap`` over keys): ``random_bits``
and ``random_split`` map key dimensions to the leading dimensions of their outputs, and
``fold_in`` / ``wrap`` / ``unwrap`` are positionwise. A draw that *creates* the axis (its
``shape`` holds it) is computed before the loop on the full axis, which keeps it exact.
"""

from __future__ import annotations

from typing import Any

from jaxpr_accum._rules.base import Rule, register
from jaxpr_accum._rules.elementwise import Elementwise


class KeyPrefix(Rule):
    """Output dims ``< keys.ndim`` are the keys' dims; the rest are born by the draw."""

    def propagate(self, eqn: Any, view: Any) -> None:
        key_rank = len(eqn.invars[0].aval.shape)
        loc = view.in_loc(0)
        if loc is not None:
            view.set_out(0, loc)
        loc = view.out_loc(0)
        if loc is None:
            return
        if loc.dim < key_rank:
            view.set_in(0, loc)
        else:
            view.hoist(
                f"`{eqn.primitive.name}` draws along the axis; computed before the loop (exact)"
            )


class SameLeadingDims(Rule):
    """``random_wrap`` / ``random_unwrap``: the key data's trailing dimension comes or goes."""

    def propagate(self, eqn: Any, view: Any) -> None:
        view.set_out(0, view.in_loc(0))
        view.set_in(0, view.out_loc(0))


register(["random_bits", "random_split"], KeyPrefix())
register(["random_wrap", "random_unwrap"], SameLeadingDims())
register(["random_fold_in", "random_seed", "random_clone", "threefry2x32"], Elementwise())
