"""``jax.experimental.checkify`` through the region: the checks inside it are kept.

``checkify`` traces a function to a jaxpr and interprets it equation by equation, each through
its rule in JAX's table ``error_checks`` (the default rule binds the equation unchanged, so a
primitive of our own without a rule would lose every check inside it). Two rules:

- **the region** (``checks_through``): where the enabled error set has a check that can fire
  inside the region's chunk loop (JAX's own checkify of the loop's jaxpr reports an error
  effect), the equation is replaced by that loop, checkified by JAX's rules (``scan``'s
  carries the error through the chunks in order, then the remainder). The loop is the one
  with checkpointed bodies (``loop_of(params)``), so a derivative taken of the checkified
  function still recomputes each chunk instead of holding the whole axis. Where no check can
  fire, the equation is bound as it is. Two repairs make the report the original's: inside
  the loop every check site has an error slot of its own, the full chunks' and the
  remainder's copies one slot, merged after the loop in program order (``_check_sites``:
  of two checks of one kind, and of two kinds, the one first in the program is reported,
  with its first erroring row, as in the original); an out-of-bounds error names the
  operand's shape as written, not the chunk's (``_shapes_as_written``).
- **checkpoint** (``remat_p``): JAX's rule requires the checkified body to close over no
  constant, which fails on the ``dynamic_slice`` that takes a chunk from the whole input
  inside each checkpointed body (its check's bounds are array constants): "too many values
  to unpack". Where the checked body has constants they are passed as leading inputs of
  the checkpoint instead; everywhere else JAX's rule runs unchanged.

Invariants: the values are the loop's, which are the original's; the error the region adds
is, per kind, that of the first check in program order that fired, with the payload of its
first erroring row along the axis; outside ``checkify`` nothing here runs (the unchecked
program is unchanged). Not reached: loops emitted as plain JAX (``native``'s, ``jax.jvp``'s,
``jax.vmap``'s, the backward pass, fused's linearization), whose checks JAX checkifies as
they are (the same errors; docs/errors.md lists the differences, all where two checks fire
or an operand is chunked, in those loops). Under a sharded layout (the loop inside the
layout's ``shard_map``) the loop is checkified as it is, with no slots per site: of two checks
of one kind that both fire, the earlier chunk's is reported, and of two kinds, a later kind
where the earlier check fires only in the remainder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax

from jaxpr_accum._compat._check_sites import in_program_order, per_site
from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._types import ClosedJaxpr, Jaxpr, Params, Primitive

_CHECKIFY = "jax._src.checkify."
#: the package's own files: where the loop is emitted from, which differs between the full
#: chunks' copy of an equation and the remainder's
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_JAX = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep


class Frame(Protocol):
    """A frame of a traceback as JAX records it (``jaxlib``'s ``Frame``)."""

    @property
    def file_name(self) -> str: ...

    @property
    def line_num(self) -> int: ...


class Traceback(Protocol):
    """A traceback as JAX records it (``jaxlib``'s ``Traceback``)."""

    @property
    def frames(self) -> Sequence[Frame]: ...


def checks_through(
    p: Primitive,
    loop_of: Callable[[Params], ClosedJaxpr],
    written_of: Callable[[Params], list],
) -> None:
    """Register ``p``'s checkify rule: its ``loop_of(params)`` (a ``ClosedJaxpr`` of the same
    inputs and outputs as the equation) checkified, where a check can fire inside it; an
    out-of-bounds error names the shape of the operand as written, found among the
    equations ``written_of(params)``."""
    checkify_jaxpr = internal(_CHECKIFY + "checkify_jaxpr")

    def rule(error: object, enabled_errors: object, *args: object, **params: object) -> tuple:
        loop = loop_of(params)
        if _over_devices(loop):  # JAX's shard_map rule, with an error per device
            if not _error_effects(loop, enabled_errors, error, args):
                return error, p.bind(*args, **params)
            checked, outs = checkify_jaxpr(loop, enabled_errors, error, *args)
            return _shapes_as_written(checked, written_of(params)), outs
        with per_site(_site_of) as sites:
            if not _error_effects(loop, enabled_errors, sites.error, args) - {sites.marker}:
                return error, p.bind(*args, **params)
            checked, outs = checkify_jaxpr(loop, enabled_errors, sites.error, *args)
        checked = _shapes_as_written(checked, written_of(params))
        return in_program_order(error, checked, sites), outs

    internal(_CHECKIFY + "error_checks")[p] = rule


def _over_devices(loop: ClosedJaxpr) -> bool:
    """Whether the loop runs under the layout's ``shard_map`` (a sharded layout): there each
    device carries its own error, which JAX's rule for ``shard_map`` combines, and the slots
    of ``_check_sites`` do not pass through it."""
    return any(e.primitive.name == "shard_map" for e in loop.jaxpr.eqns)


def _site_of(new_error: Any) -> tuple[bool, tuple]:
    """A check's site: its kind, primitive, message and the instructions of the frames
    outside the package (the copies' frames differ only there; two operations of one line
    differ in their instruction); first, whether those frames are all JAX's (an operation of
    the package's own, not of the user's program: ranked after the program's)."""
    tb = new_error.traceback_info
    frames = [] if tb is None else list(zip(*tb.raw_frames(), strict=True))
    at = [(code.co_filename, lasti) for code, lasti in frames]
    at = [(file, lasti) for file, lasti in at if not file.startswith(_PACKAGE)]
    own = all(file.startswith(_JAX) for file, _ in at)
    kind = (type(new_error), getattr(new_error, "prim", None))
    return own, (*kind, getattr(new_error, "fmt_string", None), at)


def _shapes_as_written(checked: Any, written: list) -> object:
    """``checked`` with each out-of-bounds error raised inside the loop naming the operand's
    shape as written (``(12, 3)``), not the chunk's (``(4, 3)``): the equation of ``written``
    with the same primitive and source whose operand's shape is the chunk's but for longer
    dimensions (the axis)."""
    oob_error = internal(_CHECKIFY + "OOBError")
    metadata = dict(checked._metadata)
    for code, tree in checked._metadata.items():
        exc = jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves)
        if not isinstance(exc, oob_error):
            continue
        source = _frames(exc.traceback_info, _PACKAGE)
        shapes = {
            tuple(e.invars[0].aval.shape)
            for e in written
            if e.primitive.name == exc.prim
            and _frames(e.source_info.traceback, _PACKAGE) == source
            and _chunk_of(tuple(exc.operand_shape), tuple(e.invars[0].aval.shape))
        }
        if len(shapes) == 1:
            (shape,) = shapes
            renamed = oob_error(exc.traceback_info, exc.prim, shape, 0)
            metadata[code] = jax.tree_util.tree_structure(renamed)
    return checked._replace(_metadata=metadata)


def _chunk_of(chunked: tuple, written: tuple) -> bool:
    """Whether ``chunked`` is ``written`` with some dimensions shorter (a chunk of them)."""
    return (
        len(chunked) == len(written)
        and chunked != written
        and all(c <= w for c, w in zip(chunked, written, strict=True))
    )


def _frames(traceback: Traceback | None, skipped: str = "") -> list | None:
    """The traceback's frames (file, line), those of files under ``skipped`` left out."""
    if traceback is None:
        return None
    frames = [(f.file_name, f.line_num) for f in traceback.frames]
    return [fr for fr in frames if not (skipped and fr[0].startswith(skipped))]


def _error_effects(closed: ClosedJaxpr, enabled_errors: object, error: object, args: tuple) -> set:
    """The kinds of error that ``closed``, checkified with ``enabled_errors``, can report."""
    err_vals, err_tree = jax.tree_util.tree_flatten(error)
    avals = [jax.typeof(x) for x in (*err_vals, *args)]
    to_checked = internal(_CHECKIFY + "jaxpr_to_checkify_jaxpr")
    return to_checked(closed, enabled_errors, err_tree, *avals)[2]


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
