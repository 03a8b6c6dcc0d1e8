"""``jax.experimental.checkify`` through the region: the checks inside it are kept.

``checkify`` traces a function to a jaxpr and interprets it equation by equation, each through
its rule in JAX's table ``error_checks`` (the default rule binds the equation unchanged, so a
primitive of our own without a rule would lose every check inside it). Four rules:

- **the region** (``checks_through``): where the enabled error set has a check that can fire
  inside the region's chunk loop (JAX's own checkify of the loop's jaxpr reports an error
  effect), the equation is replaced by that loop, checkified. The loop is the one with
  checkpointed bodies (``loop_of(params)``), so a derivative taken of the checkified
  function still recomputes each chunk instead of holding the whole axis. Where no check can
  fire, the equation is bound as it is. The loop's equations are those of a chunk loop's name
  scope, which ``_loops`` interprets with one error slot per check site, so the report
  is the original's (as for every chunk loop JAX derives from the region's passes). The
  forward pass of a linearization (``linearizing``) is the loop as JAX's linearization
  computes it (``_linearized_forward``: JAX hoists a loop's invariant lookups there).
- **the region's ``shard_map``** (a sharded layout: each device loops over its shard): JAX's
  rule hands each device's error out along a new leading axis (reported "at mapped index
  0: ..."), and drops the constants of the checked body (a lookup's bounds: "foreach()
  argument 2 is shorter than argument 1"). For the region's own ``shard_map`` (traced in a
  chunk loop's scope), the body is checkified inside a ``shard_map`` of the same mesh and
  specs, and the devices' errors are made one there (``made_one``), slot by slot:
  the body is interpreted inside the loop's ``per_site`` (``_loops``), so each check
  site's slot takes its soonest firing among the devices, from the first such device (its
  rows come first), and the sites are then merged as one device's are, as the unsharded
  original reports them. A ``shard_map`` of yours keeps JAX's rule.
- **the chunk loop's equation** (``_loop_call``): unbatched, the loop as JAX checks it;
  batched, the loop checkified under a ``jax.vmap`` of the same axis (a collective of the
  user's inside keeps its name), each element's loop a batch of one, the elements' error
  slots made one as they leave it (``made_one``: per slot, its soonest firing, then the
  check first in the program, from the first element).
- **checkpoint** (``remat_p``): JAX's rule requires the checkified body to close over no
  constant, which fails on the ``dynamic_slice`` that takes a chunk from the whole input
  inside each checkpointed body (its check's bounds are array constants): "too many values
  to unpack". Where the checked body has constants they are passed as leading inputs of
  the checkpoint instead; everywhere else JAX's rule runs unchanged.

Invariants: the values are the loop's, which are the original's; outside ``checkify``
nothing here runs (the unchecked program is unchanged).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxpr_accum._compat._checks._loops import loop_serial
from jaxpr_accum._compat._checks._places import checked_eqn
from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._loop_call import loop_p
from jaxpr_accum._compat._region import batch_jaxpr, dce
from jaxpr_accum._compat._sharding import named_sharding
from jaxpr_accum._compat._types import ClosedJaxpr, Jaxpr, Params, Primitive

_CHECKIFY = "jax._src.checkify."
#: the name of a vmapped axis that has none, while its elements' errors are made one
_ELEMENTS = "jaxpr_accum_elements"
#: the name of the batch of one that each element's loop is checked in
_ONE = "jaxpr_accum_one_element"


def checks_through(p: Primitive, loop_of: Callable[[Params], ClosedJaxpr]) -> None:
    """Register ``p``'s checkify rule: its ``loop_of(params)`` (a ``ClosedJaxpr`` of the same
    inputs and outputs as the equation) checkified, where a check can fire inside it."""
    checkify_jaxpr = internal(_CHECKIFY + "checkify_jaxpr")

    def rule(error: object, enabled_errors: object, *args: object, **params: object) -> tuple:
        loop = loop_of(params)
        if not error_effects(loop, enabled_errors, [jax.typeof(x) for x in args]):
            return error, p.bind(*args, **params)
        if params.get("linearizing"):  # the forward pass of a linearization, as JAX's
            loop = _linearized_forward(loop)
        return checkify_jaxpr(loop, enabled_errors, error, *args)

    internal(_CHECKIFY + "error_checks")[p] = rule


def _linearized_forward(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed``'s outputs as the forward pass of JAX's linearization of it computes them:
    the known part of its JVP (every inexact input perturbed), where JAX hoists out of a loop
    what reads only the loop's constants (``_scan_known_hoisting``), so their checks come
    before the loop's, as in the original under ``jax.grad``."""
    pe, ad = "jax._src.interpreters.partial_eval.", "jax._src.interpreters.ad."
    nonzeros = [jax.numpy.issubdtype(a.dtype, jax.numpy.inexact) for a in closed.in_avals]
    jvp, _ = internal(ad + "jvp_jaxpr")(closed, nonzeros, False)
    unknowns = [False] * len(nonzeros) + [True] * sum(nonzeros)
    known, *_ = internal(pe + "partial_eval_jaxpr_nounits")(jvp, unknowns, False)
    n = len(closed.out_avals)
    return dce(known, [i < n for i in range(len(known.out_avals))])


def _checkpoint_keeping_constants() -> None:
    """Wrap JAX's checkify rule of ``remat_p`` so that a checked body with constants takes
    them as inputs (see the module's docstring)."""
    table = internal(_CHECKIFY + "error_checks")
    remat_p = internal("jax._src.ad_checkpoint.remat_p")
    jax_rule = table[remat_p]
    pe = "jax._src.interpreters.partial_eval."
    close_jaxpr, constvars_as_inputs = (
        internal(pe + "close_jaxpr"),
        internal(pe + "convert_constvars_jaxpr"),
    )

    def rule(
        error: object, enabled_errors: object, *args: object, jaxpr: Jaxpr, **params: object
    ) -> object:
        err_vals, err_tree = jax.tree_util.tree_flatten(error)
        avals = [jax.typeof(x) for x in (*err_vals, *args)]
        to_checked = internal(_CHECKIFY + "jaxpr_to_checkify_jaxpr")
        checked, out_tree, _ = to_checked(close_jaxpr(jaxpr), enabled_errors, err_tree, *avals)
        if not checked.consts:
            return jax_rule(error, enabled_errors, *args, jaxpr=jaxpr, **params)
        body = constvars_as_inputs(checked.jaxpr)
        outs = remat_p.bind(*checked.consts, *err_vals, *args, jaxpr=body, **params)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    table[remat_p] = rule


_checkpoint_keeping_constants()


def _region_shard_map_as_one() -> None:
    """Wrap JAX's checkify rule of ``shard_map`` so that the region's own reports as one
    device would (see the module's docstring)."""
    table = internal(_CHECKIFY + "error_checks")
    shard_map_p = internal("jax._src.shard_map.shard_map_p")
    jax_rule = table[shard_map_p]
    spec = jax.sharding.PartitionSpec

    def rule(
        error: object,
        enabled_errors: object,
        *vals_in: object,
        jaxpr: Jaxpr,
        in_specs: tuple,
        out_specs: tuple,
        **params: Any,
    ) -> object:
        eqn = checked_eqn()
        if eqn is None or loop_serial(eqn) is None:  # not the region's
            return jax_rule(
                error, enabled_errors, *vals_in, jaxpr=jaxpr, in_specs=in_specs,
                out_specs=out_specs, **params,
            )  # fmt: skip
        axes: tuple = tuple(params.get("newly_manual_axes", params.get("manual_axes")) or ())
        err_vals, err_tree = jax.tree_util.tree_flatten(error)
        checkify_flat = importlib.import_module(_CHECKIFY[:-1]).checkify_jaxpr_flat
        trees = []

        def body(err_vals: list, vals: tuple) -> tuple:
            out_error, outs = checkify_flat(jaxpr, [], enabled_errors, err_tree, *err_vals, *vals)
            leaves, tree = jax.tree_util.tree_flatten(made_one(out_error, axes))
            trees.append(tree)
            return leaves, tuple(outs)

        mapped = jax.shard_map(
            body,
            mesh=params["mesh"],
            in_specs=(spec(), tuple(in_specs)),
            out_specs=(spec(), tuple(out_specs)),
            axis_names=frozenset(axes),
            check_vma=bool(params.get("check_vma", True)),
        )
        vals = tuple(_as_specified(v, s) for v, s in zip(vals_in, in_specs, strict=True))
        leaves, outs = mapped(err_vals, vals)
        return jax.tree_util.tree_unflatten(trees[-1], leaves), list(outs)

    table[shard_map_p] = rule


def _as_specified(x: Any, spec: Any) -> Any:
    """``x`` laid out as ``spec`` says where its mesh has explicit axes (the equation's
    operand may carry another layout, as a tangent made by ``jnp.ones_like`` does: JAX's
    ``shard_map`` refuses it, and its equation did not check)."""
    sharding = named_sharding(x)
    if sharding is None or jax.sharding.AxisType.Explicit not in sharding.mesh.axis_types:
        return x
    ndim, pad = jax.numpy.ndim(x), (None,) * jax.numpy.ndim(x)
    if (*sharding.spec, *pad)[:ndim] == (*spec, *pad)[:ndim]:
        return x
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(sharding.mesh, spec))


_region_shard_map_as_one()


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
    time, ``_sites``; a kind's slot has none), then with the smallest code (the check
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


internal(_CHECKIFY + "error_checks")[loop_p()] = functools.partial(_checked, loop_p())
