"""Which check is which while ``checkify`` interprets a chunk loop: the site of each check.

``_sites`` keeps one error slot per check site; this module names the sites. A check's
site is what stays the same across its copies (the full chunks' and the remainder's, the
forward pass's and a backward pass's recomputation) and differs between two checks:

- its kind, primitive and message, and the types of the operation checked (``_types``);
- where the user's code makes it: the user's frames of the innermost enclosing function call
  of the user's program (a ``jit``: JAX traces a function once, and the operations inside
  keep the frames of that trace, maybe another call's), else the check's own frames;
- how many checks of that place the jaxpr being checkified met before it, counted anew for
  each loop's run (``counting``, ``recount``): two operations can carry one traceback;
- whether it is met in a backward pass (JAX names transposed equations ``transpose(...)``),
  and there, whether in a forward computation the backward pass recomputes (the package's
  ``recomputed`` scope, or ``jax.checkpoint``'s ``rematted_computation``).

The sum a loop accumulates over the chunks (the package's ``add``, traced in the scope
``accumulated``) stands for the original's one reduction over the axis: where the add makes
a NaN (``+inf`` in one chunk, ``-inf`` in another), the check is the reduction's, as the
original makes it there (``checked_as``: its primitive, ``reduce_sum`` or ``dot_general``,
and its source line).

The interpreter enters each equation (``entering``) so that a check knows the equations it
is inside; an inner jaxpr's equations are named relative to the one holding it.
Invariants: outside ``checkify`` nothing here runs; every copy of a check has one site.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import jax

from jaxpr_accum._compat._checks._between import segment_of
from jaxpr_accum._compat._checks._sites import Site
from jaxpr_accum._compat._lookup import internal
from jaxpr_accum._compat._types import Eqn, shaped
from jaxpr_accum._compat._walk import open_jaxpr, sub_jaxprs

_CHECKIFY = "jax._src.checkify"
#: the package's own files, and JAX's
_PACKAGE = str(pathlib.Path(os.path.abspath(__file__)).parents[2]) + os.sep  # jaxpr_accum/
_JAX = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
#: the scope of a forward computation that a backward pass recomputes: the package's own
#: (``recomputed``), or JAX's (``jax.checkpoint``'s, in a loop that JAX transposes)
_RECOMPUTED = "jaxpr_accum_recomputed"
_JAX_RECOMPUTED = "rematted_computation"
#: the scope of the sums a chunk loop accumulates over the chunks
_ACCUMULATED = "jaxpr_accum_accumulated"
#: operations that only reshape or retype a chunk's part on its way into the sum
_RESHAPING = frozenset(
    {"reshape", "transpose", "convert_element_type", "squeeze", "expand_dims", "copy"}
)
#: primitives whose inner jaxpr does not map outputs to results one to one
_LOOPS = frozenset({"scan", "while", "cond"})


class Frame(Protocol):
    """A frame of a traceback as JAX records it (``jaxlib``'s ``Frame``)."""

    @property
    def file_name(self) -> str: ...

    @property
    def line_num(self) -> int: ...


class Traceback(Protocol):
    """A traceback as JAX records it (``jaxlib``'s ``Traceback``)."""

    @property
    def frames(self) -> list[Frame]: ...


#: per equation being checkified (innermost last): whether it, or one it is inside, is of a
#: backward pass; whether it recomputes a forward computation there; itself
_context: list[tuple[bool, bool, Eqn | None]] = [(False, False, None)]
#: per jaxpr being checkified (innermost last): how many checks of each place it has met
_met: list[collections.Counter] = []


def recomputed() -> contextlib.AbstractContextManager:
    """The name scope of a forward computation that a backward pass recomputes."""
    return jax.named_scope(_RECOMPUTED)


def traced_in(scope: str, fn: Callable) -> Callable:
    """``fn``, its equations traced in the name scope ``scope``."""

    def scoped(*args: object) -> object:
        with jax.named_scope(scope):
            return fn(*args)

    return scoped


def accumulated() -> contextlib.AbstractContextManager:
    """The name scope of the sums a chunk loop accumulates over the chunks."""
    return jax.named_scope(_ACCUMULATED)


def checked_as(eqn: Eqn, made_by: dict) -> tuple[Callable, Eqn]:
    """``(rule, eqn)`` to checkify ``eqn`` with: JAX's rule of its primitive and itself,
    except where it adds a chunk's part into a sum accumulated over the chunks: there the
    NaN check of the reduction the sum stands for, at the reduction's source
    (``reduction_of``; ``made_by``: each variable's equation in ``eqn``'s jaxpr)."""
    reduction = reduction_of(eqn, made_by)
    if reduction is not None:
        return functools.partial(_nans_as, reduction.primitive.name), reduction
    default = functools.partial(internal(_CHECKIFY + ".default_checkify_rule"), eqn.primitive)
    return internal(_CHECKIFY + ".error_checks").get(eqn.primitive, default), eqn


def reduction_of(eqn: Eqn, made_by: dict) -> Eqn | None:
    """Where ``eqn`` adds a chunk's part into a sum accumulated over the chunks, the
    reduction that made the part (found back through reshapes, and into the function calls
    that return it); else None."""
    if eqn.primitive.name != "add" or _ACCUMULATED not in str(eqn.source_info.name_stack):
        return None
    var = eqn.invars[1]
    while (made := made_by.get(var)) is not None:
        if made.primitive.name in _RESHAPING:
            var = made.invars[0]
            continue
        inner = [open_jaxpr(j) for _, j in sub_jaxprs(made.params)]
        if made.primitive.name in _LOOPS or len(inner) != 1:
            return made
        (body,) = inner
        if len(body.outvars) != len(made.outvars):
            return made
        var = body.outvars[made.outvars.index(var)]
        made_by = {v: e for e in body.eqns for v in e.outvars}
    return None


class _Named(NamedTuple):
    """A primitive as JAX's NaN check reads it: its name, one result."""

    name: str
    multiple_results: bool = False


def _nans_as(name: str, error: object, enabled_errors: object, acc: Any, part: Any) -> tuple:
    """The sum of a chunk's part into its accumulator, checked for a NaN as the reduction
    ``name`` that it stands for (``reduction_of``)."""
    out = jax.lax.add(acc, part)
    return internal(_CHECKIFY + ".check_nans")(_Named(name), error, enabled_errors, out), out


@contextlib.contextmanager
def entering(eqn: Eqn) -> Iterator[None]:
    """While ``eqn`` is checkified: the checks made know it, and those it is inside."""
    backward, recomputes, _ = _context[-1]
    backward, recomputes = backward or _transposed(eqn), recomputes or _recomputes(eqn)
    _context.append((backward, recomputes, eqn))
    try:
        yield
    finally:
        _context.pop()


def checked_eqn() -> Eqn | None:
    """The equation being checkified (the innermost one entered), if any."""
    return _context[-1][2]


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """While a jaxpr is checkified: its checks of one place are counted."""
    _met.append(collections.Counter())
    try:
        yield
    finally:
        _met.pop()


def recount() -> None:
    """Count the checks of the jaxpr being checkified anew (a loop's run starts)."""
    _met[-1].clear()


def in_backward_pass() -> bool:
    """Whether the equation being checkified is, or is inside, one of a backward pass."""
    return _context[-1][0]


def _transposed(eqn: Eqn) -> bool:
    """Whether ``eqn`` is of a backward pass (JAX's transposition names it so)."""
    return "transpose(" in str(eqn.source_info.name_stack)


def _recomputes(eqn: Eqn) -> bool:
    """Whether ``eqn`` recomputes a forward computation in a backward pass (not transposed
    after the recomputation's scope: the transpose of what the scope computed)."""
    name = str(eqn.source_info.name_stack)
    before, found, _ = name.partition(_RECOMPUTED)
    return bool(found and "transpose(" not in before) or _JAX_RECOMPUTED in name


def _types(eqn: Eqn) -> tuple:
    """The dtypes and ranks of ``eqn``'s operands and results: part of a check's place, so
    that two operations of one traceback stay apart (a custom VJP's backward rule runs under
    its call's, as JAX runs it), while every copy of one operation (on a chunk or on the
    remainder, in the forward pass or recomputed) has the same."""
    avals = [getattr(v, "aval", None) for v in (*eqn.invars, *eqn.outvars)]
    return tuple((str(getattr(a, "dtype", None)), getattr(a, "ndim", None)) for a in avals)


def site_of(new_error: Any) -> Site:
    """A check's site: its place is its kind, primitive, message, the types of the operation
    checked (``_types``), how many checks of that place its jaxpr met before it (``_met``)
    and where the user's code makes it: inside a function call of the user's program
    (``jnp.take``'s ``jit``, a ``jax.jit`` of the user's), the frames of the innermost such
    call (JAX traces a function once, and the operations inside keep the frames of that
    trace); else the check's own frames (``_users_frames``). Then whether it is met in a
    backward pass (whose copy of an operation has the forward's frames), there in a
    recomputation; the package's own where no frame is the user's; its segment (``_between``)."""
    calls = [_call_frames(e) for *_, e in _context[1:-1] if e is not None]
    at = next((f for f in reversed(calls) if f), ()) or _users_frames(new_error.traceback_info)
    backward, recomputes, checked = _context[-1]
    types = () if checked is None else _types(checked)
    kind = (type(new_error), getattr(new_error, "prim", None))
    key = (*kind, getattr(new_error, "fmt_string", None), at, types)
    met = _met[-1]  # inside a loop's run: ``counting`` holds one per jaxpr
    nth = met[(key, backward, recomputes)]
    met[(key, backward, recomputes)] += 1
    place = repr((*key, nth))
    named = "/".join(str(e.source_info.name_stack) for *_, e in _context[1:] if e is not None)
    return Site(place, not at, backward, backward and recomputes, segment_of(named))


def _call_frames(eqn: Eqn) -> tuple:
    """The user's frames of ``eqn`` where its innermost frame outside JAX is not the
    package's (an equation of the user's program, not one the package emits)."""
    tb = eqn.source_info.traceback
    codes: list = [] if tb is None else list(tb.raw_frames()[0])
    files: list[str] = [code.co_filename for code in codes]
    first = next((f for f in files if not f.startswith(_JAX)), _PACKAGE)
    return () if first.startswith(_PACKAGE) else _users_frames(tb)


def _users_frames(traceback: Any) -> tuple:
    """The frames (file, instruction) of ``traceback`` in neither the package nor JAX."""
    frames = [] if traceback is None else list(zip(*traceback.raw_frames(), strict=True))
    at = [(code.co_filename, lasti) for code, lasti in frames]
    return tuple((f, i) for f, i in at if not f.startswith((_PACKAGE, _JAX)))


def shapes_as_written(checked: Any, written: list[Eqn], vmapped: int | None = None) -> object:
    """``checked`` with each out-of-bounds error raised inside the loop naming the operand's
    shape as written (``(12, 3)``), not the chunk's (``(4, 3)``): the equation of ``written``
    with the same primitive and source whose operand's shape is the chunk's but for longer
    dimensions (the axis; ``_as_written``). ``vmapped``: the size of the ``jax.vmap`` whose
    elements the loop was checked in one by one, each as a batch of one (``_loop_call``)."""
    oob_error = internal(_CHECKIFY + ".OOBError")
    metadata = dict(checked._metadata)
    for code, tree in checked._metadata.items():
        exc = jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves)
        if not isinstance(exc, oob_error):
            continue
        source = _frames(exc.traceback_info, _PACKAGE)
        chunked = tuple(exc.operand_shape)
        shapes = {
            _as_written(chunked, tuple(shaped(e.invars[0]).shape), vmapped)
            for e in written
            if e.primitive.name == exc.prim and _frames(e.source_info.traceback, _PACKAGE) == source
        } - {None}
        if len(shapes) == 1:
            (shape,) = shapes
            renamed = oob_error(exc.traceback_info, exc.prim, shape, 0)
            metadata[code] = jax.tree_util.tree_structure(renamed)
    return checked._replace(_metadata=metadata)


def _as_written(chunked: tuple, written: tuple, vmapped: int | None) -> tuple | None:
    """The shape as written of an operand whose chunk is ``chunked``, where ``written`` is its
    shape in the program as written: ``chunked`` is ``written`` with some dimensions shorter
    (a chunk of them), after any leading dimensions (those ``jax.vmap`` adds, kept; a batch of
    one made for an element of a ``jax.vmap`` of size ``vmapped``, that size)."""
    lead = len(chunked) - len(written)
    chunk = chunked[lead:]
    if lead < 0 or any(c > w for c, w in zip(chunk, written, strict=True)):
        return None
    if vmapped is not None and lead == 1:
        return (vmapped, *written)
    return None if chunk == written else chunked[:lead] + written


def _frames(traceback: Traceback | None, skipped: str = "") -> list | None:
    """The traceback's frames (file, line), those of files under ``skipped`` left out."""
    if traceback is None:
        return None
    frames = [(f.file_name, f.line_num) for f in traceback.frames]
    return [fr for fr in frames if not (skipped and fr[0].startswith(skipped))]
