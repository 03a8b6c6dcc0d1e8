"""Reductions and scans along dimensions.

A monoid reduction over the axis (``reduce_sum`` / ``max`` / ``min`` / ``prod`` / ``and`` /
``or`` / ``xor``) ends the axis: its output is a per-chunk partial that the loop combines
with the same monoid. Reductions over other dimensions, and cumulative ops, sorts, windows
and ``top_k`` along other dimensions, keep the axis where it is (shifted past the removed
dimensions). Acting *along* the axis in any other way mixes positions: a barrier.
"""

from __future__ import annotations

from jaxpr_accum import _compat
from jaxpr_accum._compat import JaxprEqn
from jaxpr_accum._engine._table import Rule, agreed, register
from jaxpr_accum._engine._view import View
from jaxpr_accum._rules.shape import SameShape, every_operand, first_operand, not_at_param

MONOIDS = {
    "reduce_sum": "sum",
    "reduce_max": "max",
    "reduce_min": "min",
    "reduce_prod": "prod",
    "reduce_and": "and",
    "reduce_or": "or",
    "reduce_xor": "xor",
}


class Reduce(Rule):
    middle_factor_ok = True  # over the merged dimension: a monoid over the axis and the rest

    def __init__(self, kind: str | None):
        self.kind = kind  # None: not a monoid (argmax / argmin): reducing the axis is a barrier

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        axes = tuple(eqn.params["axes"])
        kept = [d for d in range(len(_compat.shape_of(eqn.invars[0]))) if d not in axes]
        loc = view.in_loc(0)
        if loc is not None:
            if loc.dim in axes:
                if self.kind is None:
                    view.barrier(f"`{eqn.primitive.name}` over the axis picks one position")
                else:
                    view.reduce(0, self.kind)
            else:
                view.set_out(0, loc._replace(dim=kept.index(loc.dim)))
        loc = view.out_loc(0)
        if loc is not None:
            view.set_in(0, loc._replace(dim=kept[loc.dim]))


class VariadicReduce(Rule):
    """``lax.reduce`` with a computation of its own: over other dimensions it keeps the axis
    (shifted past the reduced ones); over the axis its monoid is unknown, so a barrier."""

    def propagate(self, eqn: JaxprEqn, view: View) -> None:
        n = len(eqn.outvars)
        dims = tuple(eqn.params["dimensions"])
        kept = [d for d in range(len(_compat.shape_of(eqn.invars[0]))) if d not in dims]
        found = [view.in_loc(i) for i in range(n)]
        found += [
            None if (loc := view.out_loc(j)) is None else loc._replace(dim=kept[loc.dim])
            for j in range(n)
        ]
        loc = agreed(eqn, view, found)
        if loc is None:
            return
        if loc.dim in dims:
            view.barrier("`reduce` with a custom computation reduces over the axis")
            return
        for i in range(n):
            view.set_in(i, loc)
            view.set_out(i, loc._replace(dim=kept.index(loc.dim)))


def _not_topk_axis(eqn: JaxprEqn, d: int) -> bool:
    return eqn.params.get("axis", len(_compat.shape_of(eqn.invars[0])) - 1) != d


def _window_allowed(eqn: JaxprEqn, d: int) -> bool:
    p = eqn.params
    checks = [
        p["window_dimensions"][d] == 1,
        p["window_strides"][d] == 1,
        tuple(p["padding"][d]) == (0, 0),
    ]
    for name in ("base_dilation", "window_dilation"):
        if name in p:
            checks.append(p[name][d] == 1)
    return all(checks)


def _window_operands(eqn: JaxprEqn) -> list[int]:
    # generic reduce_window takes operands then as many init values (scalars)
    n = len(eqn.outvars)
    return list(range(n))


for _name, _kind in MONOIDS.items():
    register(_name, Reduce(_kind))
register(["argmax", "argmin"], Reduce(None))
register(
    ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"],
    SameShape(first_operand, not_at_param("axis"), "accumulates along the axis"),
)
register("sort", SameShape(every_operand, not_at_param("dimension"), "sorts along the axis"))
register("top_k", SameShape(first_operand, _not_topk_axis, "selects along the axis"))
register(
    ["reduce_window_sum", "reduce_window_max", "reduce_window_min"],
    SameShape(first_operand, _window_allowed, "slides a window along the axis"),
)
register(
    "reduce_window", SameShape(_window_operands, _window_allowed, "slides a window along the axis")
)
register(
    ["select_and_scatter_add", "select_and_gather_add", "select_and_scatter"],
    SameShape(lambda e: [0, 1], _window_allowed, "slides a window along the axis"),
)
register(
    "approx_top_k",
    SameShape(first_operand, not_at_param("reduction_dimension"), "selects along the axis"),
)
register("reduce", VariadicReduce())
