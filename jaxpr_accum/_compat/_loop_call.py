"""The chunk loop as one equation that ``jax.vmap`` keeps one, so that ``checkify`` checks
it per element, as the original's checks of the whole batch report.

JAX batches a loop traced inline op by op: under ``checkify(jax.vmap(f))`` each check then
covers one chunk of every element at once, so of a check that fires in two elements the one
whose row comes in the earlier chunk is reported, where the original, which checks the whole
batch at once, reports the first element's. So the loop is bound as one equation of the
primitive ``serialized_region_loop`` (``loop_call``), whose parameters keep it unbatched:
``jaxpr`` (what the equation computes: the loop, or the loop batched by JAX), ``scope`` (the
name scope the loop was traced in) and ``batched`` (``Batched``: the loop unbatched and where
it was batched; None where ``jaxpr`` is the loop). Its rules:

- evaluation and lowering run ``jaxpr``; the JVP is ``jaxpr``'s, inline (JAX differentiates
  the plain loop, as it would the loop traced inline);
- batching binds it again with the loop batched (``batched_loop_call``, also the region
  primitive's batching rule); batched a second time, ``jaxpr`` batched again, inline;
- dead-code elimination prunes ``jaxpr`` and the unbatched loop to the used outputs;
- ``checkify``: unbatched, the loop as JAX checks it; batched, the loop checkified under a
  ``jax.vmap`` of the same axis (a collective of the user's inside keeps its name), the
  elements' error slots made one as they leave it (``made_one``: per slot, its soonest
  firing, then the check first in the program, from the first element).

``made_one`` makes a sharded layout's devices one too (``_checkify``).

Invariant: the values are ``jaxpr``'s, the loop's, under every transformation.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._region import (
    batch_jaxpr,
    dce,
    define_primitive,
    has_effects,
    run_batched,
    zero_tangent,
)
from jaxpr_accum._compat._types import ClosedJaxpr, Eqn, Primitive

_CHECKIFY = "jax._src.checkify."
#: the primitive's name
LOOP_CALL = "serialized_region_loop"
#: the name of a vmapped axis that has none, while its elements' errors are made one
_ELEMENTS = "jaxpr_accum_elements"
#: the name of the batch of one that each element's loop is checked in
_ONE = "jaxpr_accum_one_element"


@dataclasses.dataclass(frozen=True, eq=False)
class Batched:
    """Where the equation's ``jaxpr`` is a loop batched by JAX: the ``loop`` unbatched, the
    vmapped ``axis`` (JAX's ``AxisData``), the inputs' ``in_dims`` and which outputs are
    batched (``out_batched``, at 0). A parameter that JAX's walkers of inner jaxprs and its
    printer do not open: the loop is listed once."""

    loop: ClosedJaxpr
    axis: Any
    in_dims: tuple[int | None, ...]
    out_batched: tuple[bool, ...]

    def __repr__(self) -> str:
        return f"Batched(in_dims={self.in_dims}, out_batched={self.out_batched})"


def loop_call(loop: ClosedJaxpr, args: Sequence[object], scope: str) -> list:
    """``loop`` (traced in the name scope ``scope``) applied to ``args``, as one equation
    (the module's docstring)."""
    return loop_p().bind(*args, jaxpr=loop, scope=scope, batched=None)


def batched_loop_call(
    loop: ClosedJaxpr, args: Sequence[object], scope: str, axis: Any, dims: Sequence[int | None]
) -> tuple[list, list[bool]]:
    """``(outputs, which are batched)``: ``loop`` (traced in the name scope ``scope``)
    batched by JAX over ``axis`` (JAX's ``AxisData``) at the inputs' ``dims`` and applied to
    ``args``, as one equation in ``scope`` (``checkify`` takes it for the loop's run, which
    it checks per element); an output no batched input reaches stays unbatched."""
    jaxpr, out_batched = batch_jaxpr(loop, axis, dims)
    batched = Batched(loop, axis, tuple(dims), tuple(out_batched))
    with jax.named_scope(scope):
        outs = loop_p().bind(*args, jaxpr=jaxpr, scope=scope, batched=batched)
    return outs, out_batched


@functools.cache
def loop_p() -> Primitive:
    def impl(*args: object, jaxpr: ClosedJaxpr, **_: object) -> list:
        return jax.extend.core.jaxpr_as_fun(jaxpr)(*args)

    def batch(
        axis: Any, args: list, dims: list, *, jaxpr: ClosedJaxpr, scope: str, batched: Any
    ) -> tuple:
        if batched is not None:  # batched a second time: inline
            return run_batched(jaxpr, axis, dims, args)
        outs, out_batched = batched_loop_call(jaxpr, args, scope, axis, dims)
        return outs, [0 if b else None for b in out_batched]

    p = define_primitive(
        LOOP_CALL,
        abstract_eval=lambda *_, jaxpr, **__: (list(jaxpr.out_avals), jaxpr.effects),
        impl=impl,
        jvp=_jvp,
        batch=batch,
        dce=_dce,
    )
    internal(_CHECKIFY + "error_checks")[p] = functools.partial(_checked, p)
    return p


def _jvp(primals: list, tangents: list, *, jaxpr: ClosedJaxpr, **_: object) -> tuple:
    """JAX's JVP of ``jaxpr``, inline: symbolic zeros in, and out where no perturbed input
    reaches, as for the loop traced inline."""
    zero = internal("jax._src.interpreters.ad.Zero")
    nonzeros = [type(t) is not zero for t in tangents]
    jvp_jaxpr, out_nonzeros = internal("jax._src.interpreters.ad.jvp_jaxpr")(jaxpr, nonzeros, False)
    dots = [t for t, nz in zip(tangents, nonzeros, strict=True) if nz]
    outs = jax.extend.core.jaxpr_as_fun(jvp_jaxpr)(*primals, *dots)
    n = len(jaxpr.out_avals)
    out_dots = iter(outs[n:])
    return outs[:n], [
        next(out_dots) if nz else zero_tangent(aval)
        for aval, nz in zip(jaxpr.out_avals, out_nonzeros, strict=True)
    ]


def _dce(used: list[bool], eqn: Eqn) -> tuple[list[bool], Eqn | None]:
    """The equation with its used outputs only (its inputs all stay)."""
    if not any(used) and not has_effects(eqn):
        return [False] * len(eqn.invars), None
    if all(used):
        return [True] * len(eqn.invars), eqn
    batched = eqn.params["batched"]
    if batched is not None:
        out_batched = tuple(b for b, u in zip(batched.out_batched, used, strict=True) if u)
        batched = dataclasses.replace(
            batched, loop=dce(batched.loop, used), out_batched=out_batched
        )
    params = {**eqn.params, "jaxpr": dce(eqn.params["jaxpr"], used), "batched": batched}
    outvars = [v for v, u in zip(eqn.outvars, used, strict=True) if u]
    return [True] * len(eqn.invars), eqn.replace(outvars=outvars, params=params)


def _checked(
    p: Primitive, error: object, enabled_errors: object, *args: object, **params: Any
) -> tuple:
    """``checkify``'s rule of the equation (the module's docstring); where no check of
    ``enabled_errors`` can fire in the loop, the equation itself."""
    batched = params["batched"]
    loop = params["jaxpr"] if batched is None else batched.loop
    if not error_effects(loop, enabled_errors, loop.in_avals):
        return error, p.bind(*args, **params)
    if batched is None:
        return internal(_CHECKIFY + "checkify_jaxpr")(loop, enabled_errors, error, *args)
    err_vals, err_tree = jax.tree_util.tree_flatten(error)
    checkify_flat = importlib.import_module(_CHECKIFY[:-1]).checkify_jaxpr_flat
    axis, dims, jnp = batched.axis, batched.in_dims, jax.numpy
    unnamed = axis.name is internal("jax._src.core.no_axis_name")
    name = _ELEMENTS if unnamed else axis.name
    trees = []

    def element(err_vals: list, vals: tuple) -> tuple:
        # the loop batched over a batch of one, of an axis of its own (the user's
        # collectives over ``name`` stay, for the ``jax.vmap`` below): its checks' operands
        # have the shapes of the batched loop's but for the batch (``shapes_as_written``)
        one = internal("jax._src.interpreters.batching.AxisData")(_ONE, 1, None, None)
        one_loop, out_batched = batch_jaxpr(loop, one, dims)
        ones = [v if d is None else jnp.expand_dims(v, d) for v, d in zip(vals, dims, strict=True)]
        out_error, outs = checkify_flat(
            one_loop.jaxpr, one_loop.consts, enabled_errors, err_tree, *err_vals, *ones
        )
        outs = [o[0] if b else o for o, b in zip(outs, out_batched, strict=True)]
        leaves, tree = jax.tree_util.tree_flatten(made_one(out_error, name))
        trees.append(tree)
        return leaves, tuple(outs)

    mapped = jax.vmap(
        element,
        in_axes=(None, batched.in_dims),
        out_axes=(None, tuple(0 if b else None for b in batched.out_batched)),
        axis_name=name,
        axis_size=axis.size,
        spmd_axis_name=axis.spmd_name,
    )
    leaves, outs = mapped(err_vals, tuple(args))
    return jax.tree_util.tree_unflatten(trees[-1], leaves), list(outs)


def error_effects(closed: ClosedJaxpr, enabled_errors: object, avals: Sequence) -> set:
    """The kinds of error that ``closed``, checkified with ``enabled_errors`` on inputs of
    types ``avals``, can report."""
    err_vals, err_tree = jax.tree_util.tree_flatten(internal(_CHECKIFY + "init_error"))
    avals = [*(jax.typeof(x) for x in err_vals), *avals]
    to_checked = internal(_CHECKIFY + "jaxpr_to_checkify_jaxpr")
    return to_checked(closed, enabled_errors, err_tree, *avals)[2]


def made_one(error: Any, axes: object) -> object:
    """``error`` of this device (or element) made the same on every one of ``axes``, slot by
    slot: of the devices where a slot fired, those where it fired soonest (a check site's
    time, ``_check_sites``; a kind's slot has none), then with the smallest code (the check
    first in the program), and of them the first device (its rows come first) gives the
    payload. A slot that fired nowhere (the clock, the same on every device) keeps the first
    device's."""
    jnp, lax = jax.numpy, jax.lax
    never = np.iinfo(np.int32).max
    device = lax.axis_index(axes)

    def varying(x: Any) -> Any:  # a collective's operand varies across the devices
        return jnp.where(device < 0, x, x)

    times = {
        getattr(slot, "rank", None): varying(jnp.where(error._pred[slot], payload[0], never))
        for slot, payload in error._payload.items()
        if getattr(slot, "timed", False)
    }
    for slot in list(error._pred):
        pred, code = varying(error._pred[slot]), varying(error._code[slot])
        time = times.get(getattr(slot, "rank", None), varying(jnp.int32(never)))
        soonest = lax.pmin(jnp.where(pred, time, never), axes)
        best = lax.pmin(jnp.where(pred & (time == soonest), code, never), axes)
        chosen = pred & (time == soonest) & (code == best)
        fired = soonest != never
        first = jnp.where(fired, lax.pmin(jnp.where(chosen, device, never), axes), 0)
        if getattr(slot, "timed", False):  # the site's soonest time
            payload = [jnp.where(fired, soonest, never)]
        else:
            payload = [_from(first == device, varying(p), axes) for p in error._payload[slot]]
        code = jnp.where(fired, best, lax.pmin(code, axes))
        error = error._update(slot, fired, code, {}, payload)
    return error


def _from(mine: Any, x: Any, axes: object) -> Any:
    """``x`` of the one device where ``mine``, on every device."""
    jnp, lax = jax.numpy, jax.lax
    if x.dtype == jnp.bool_:
        return lax.pmax(jnp.where(mine, x, False).astype(jnp.int32), axes).astype(jnp.bool_)
    return lax.psum(jnp.where(mine, x, jnp.zeros_like(x)), axes)
