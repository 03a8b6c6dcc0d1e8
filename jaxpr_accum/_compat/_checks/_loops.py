"""Every chunk loop, plain JAX or not, keeps the original's ``checkify`` report.

The chunk loops are plain JAX (scans, slices of the chunks, sums), which JAX differentiates,
batches and checkifies further: native's loop, and what JAX derives from the region's
passes (``jax.jvp``'s and ``jax.vmap``'s loops, the backward pass, fused's linearization).
JAX's ``checkify`` would keep one error per kind, the first to fire in execution order; the
original runs each check on every row before the next, so of two checks that both fire it
reports the one first in the program. So:

- every pass of a region is traced inside a name scope of its own (``loop_scope``), which
  JAX keeps on each equation it derives from them (``jvp(...)``, ``transpose(...)``);
- JAX's interpreter of a jaxpr under ``checkify`` (``checkify_jaxpr_flat``, which every rule
  of a jaxpr-carrying primitive calls again for its inner jaxpr) is replaced by one that
  interprets each run of consecutive equations of one loop's scope under
  ``_sites.per_site`` (one error slot per check site, ``_places`` says which),
  then merges the slots into the error (``_merges``: per kind, the site that fired soonest,
  then the first in the program), an out-of-bounds error naming the operand's shape as
  written, not the chunk's;
- a sum accumulated over the chunks is checked as its reduction (``checked_as``);
- each chunk's computation of the program is traced in a name scope (``chunk_scope``) where
  the interpreter restarts ``per_site``'s clock, so that times in different chunks compare
  as the original's steps do;
- the forward pass's checks come first, in program order; a backward pass's after them
  where it runs, but for the checks the original makes while it linearizes (``_merges``);
  what a loop's first forward run was entered with goes to its backward pass in the error
  (``_entry``); a backward pass that visits the chunks from the last keeps a check's
  earliest row.

Invariants: outside ``checkify`` nothing here runs and a traced program is unchanged (a
name scope is metadata). Equations outside every loop's scope are interpreted as JAX does.
A run inside another run (in an inner jaxpr) is part of the outer run. In a run holding a
``shard_map`` (a sharded layout) or a vmapped loop's call (``_loop_call``), the body each
device or element runs is the loop's run (``made_one`` makes their slots one).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import re
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax

from jaxpr_accum._compat._checks._between import between_of, checks_in_place
from jaxpr_accum._compat._checks._entry import note_entry, take_entry, without_entries
from jaxpr_accum._compat._checks._merges import (
    merge_backward,
    merge_forward,
    merge_found_early,
)
from jaxpr_accum._compat._checks._places import (
    checked_as,
    counting,
    entering,
    in_backward_pass,
    recount,
    shapes_as_written,
    site_of,
)
from jaxpr_accum._compat._checks._sites import (
    Sites,
    per_site,
    set_clock,
)
from jaxpr_accum._compat._emit import user_context
from jaxpr_accum._compat._lookup import internal, param, primitive
from jaxpr_accum._compat._loop_call import LOOP_CALL
from jaxpr_accum._compat._types import Eqn, Jaxpr, Literal
from jaxpr_accum._compat._walk import fingerprint

_CHECKIFY = "jax._src.checkify"
_CLEAN_UP = "jax._src.core.clean_up_dead_vars"
_SCOPE = "jaxpr_accum_chunks"
_SCOPE_OF = re.compile(_SCOPE + r"(\d+)\b")
_ROWS = "jaxpr_accum_rows"  # the scope of one chunk's computation of the program
_ROWS_IN = re.compile(r"\b" + _ROWS + r"\b")
_MAPPED = ("shard_map", LOOP_CALL)  # what maps a loop's run over devices or elements


class Written(Protocol):
    """What owns a loop: its equations as written, on the whole axis (``Region``)."""

    def written_body(self) -> list[Eqn]: ...


_owners: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_serials: dict[str, int] = {}  # per written body (``fingerprint``)
#: how many runs are being interpreted under ``per_site`` (an inner one joins the outer)
_depth = [0]
#: the loop whose mapped run (``_MAPPED``) is being interpreted, innermost last
_mapped_run: list[int | None] = [None]
#: how many equations of a chunk's computation enclose the jaxpr being interpreted
_chunks = [0]
#: how many of the interpreters (``_checkify_jaxpr_flat``) are running, nested
_nesting = [0]
#: the nesting at which a loop's rule interprets its body, innermost last
_steps_at: list[int] = []


def loop_scope(owner: Written) -> str:
    """A name scope of ``owner``'s written body, to trace its chunk loops in (``traced_in``):
    one per body, so that two traces of a program compile to one text (its metadata)."""
    serial = _serials.setdefault(fingerprint(owner.written_body()), len(_serials))
    _owners[serial] = owner
    return f"{_SCOPE}{serial}"


def chunk_scope() -> contextlib.AbstractContextManager:
    """The name scope to trace one chunk's computation of the program in: where the
    interpreter meets it, a chunk begins, and the clock of ``per_site`` restarts."""
    return jax.named_scope(_ROWS)


def _in_chunk(eqn: Eqn) -> bool:
    """Whether ``eqn`` is of a chunk's computation of the program (or what JAX derives from
    it: its tangents, its transpose)."""
    return _ROWS_IN.search(str(eqn.source_info.name_stack)) is not None


def loop_serial(eqn: Eqn) -> int | None:
    """The serial of the loop whose scope ``eqn`` was traced in, if any."""
    found = _SCOPE_OF.search(str(eqn.source_info.name_stack))
    return None if found is None else int(found.group(1))


def _loop_transposed(eqn: Eqn) -> bool:
    """Whether ``eqn`` is of a loop's backward pass: the loop's scope transposed (not an
    equation transposed inside the loop, as fused's forward pass has)."""
    return "transpose(" in str(eqn.source_info.name_stack).partition(_SCOPE)[0]


def _runs(eqns: list[Eqn]) -> Iterator[tuple[int | tuple[int, int] | None, list[Eqn]]]:
    """``eqns`` in runs of one loop's scope (None: of none; in a loop's mapped run, its),
    or of one ``between_scope``."""
    inside = _mapped_run[-1]
    runs = itertools.groupby(eqns, _run_of if inside is None else lambda e: inside)
    return ((loop, list(run)) for loop, run in runs)


def _run_of(eqn: Eqn) -> int | tuple[int, int] | None:
    """The loop whose scope ``eqn`` was traced in, else its ``between_scope``, else None."""
    loop = loop_serial(eqn)
    return between_of(eqn) if loop is None else loop


def _reversed(run: list[Eqn]) -> bool:
    """Whether the run's loop visits the chunks from the last to the first (JAX's transpose
    of a chunk loop: a reverse scan, after the remainder)."""
    return any(
        (e.primitive.name == "scan" and param(e, "reverse"))
        or (e.primitive.name in _MAPPED and _reversed(list(param(e, "jaxpr").eqns)))
        for e in run
    )


def _vmapped(run: list[Eqn]) -> int | None:
    """The size of the ``jax.vmap`` whose elements the run's vmapped loop call checks."""
    calls = [param(e, "batched") for e in run if e.primitive.name == LOOP_CALL]
    return next((c.axis.size for c in calls if c is not None), None)


def _checkify_jaxpr_flat(*args: Any) -> tuple[object, list]:
    """JAX's ``checkify_jaxpr_flat`` (same signature and result), each loop's run of
    equations interpreted with one error slot per check site (the module's docstring); the
    outermost call's error without the notes of ``_entry``."""
    _nesting[0] += 1
    try:
        error, outs = _interpreted(*args)
    finally:
        _nesting[0] -= 1
    return (error if _nesting[0] else without_entries(error)), outs


def _interpreted(
    jaxpr: Jaxpr, consts: list, enabled_errors: object, err_tree: Any, *args: object
) -> tuple[object, list]:
    last_used, clean_up = internal("jax._src.core.last_used"), internal(_CLEAN_UP)
    env: dict = {}
    err_vals, in_args = args[: err_tree.num_leaves], args[err_tree.num_leaves :]
    error = jax.tree_util.tree_unflatten(err_tree, err_vals)
    if _steps_at and _steps_at[-1] == _nesting[0]:  # a loop's body: a step begins
        error = set_clock(error, lambda now: now + 1)
    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, in_args, strict=True))
    last = last_used(jaxpr)
    made_by = {v: e for e in jaxpr.eqns for v in e.outvars}

    def interpret(eqns: list[Eqn], error: object) -> object:
        # whether a chunk's computation has begun in this jaxpr (one before the chunks' scan,
        # JAX's hoisting out of its body, and one after it, the remainder; fused's value,
        # tangents and cotangents of one are apart)
        begun = False
        for eqn in eqns:
            invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
            rule, checked = checked_as(eqn, made_by)
            ctx = getattr(getattr(eqn, "ctx", None), "manager", contextlib.nullcontext())
            chunk = _in_chunk(eqn)
            if chunk and not begun and not _chunks[0]:  # a chunk begins
                error, begun = restart_clock(error), True
            with entering(checked), user_context(checked), ctx, _within(chunk):
                error, outs = rule(error, enabled_errors, *invals, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
            env.update(zip(eqn.outvars, outs, strict=True))
            clean_up(eqn, env, last)
            begun = begun and (chunk or eqn.primitive.name != "scan")  # the remainder's next
        return error

    with counting():
        error = _checkify_runs(list(jaxpr.eqns), error, interpret)
    return error, [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]


def _checkify_runs(eqns: list[Eqn], error: object, interpret: Callable) -> object:
    """``error`` after ``eqns`` are checkified: each loop's run under ``per_site``."""
    # per loop, what its forward runs found of its backward pass (fused computes the
    # gradient with the value): merged where the loop's backward pass runs, as written
    found_early: dict[int, list[tuple[object, Sites]]] = {}
    held: dict[int, dict] = {}  # per loop, what its first backward run here took of its note
    entered: dict[int, object] = {}  # per loop, the error its first forward run here began with
    for loop, run in _runs(eqns):
        if isinstance(loop, tuple) and not _depth[0]:  # between the body's equations
            with checks_in_place(*loop):
                error = interpret(run, error)
            continue
        if not isinstance(loop, int) or _depth[0]:
            error = interpret(run, error)
            continue
        owner = _owners.get(loop)
        written = [] if owner is None else owner.written_body()
        backward = in_backward_pass() or any(_loop_transposed(e) for e in run)
        if backward:  # what the forward passes found of the backward pass, in its place
            error = merge_found_early(error, found_early.pop(loop, []))
        _depth[0] += 1  # a mapped run: the body each device or element runs is the loop's
        _mapped_run.append(loop if any(e.primitive.name in _MAPPED for e in run) else None)
        recount()
        try:
            with per_site(site_of, reversed_backward=_reversed(run)) as sites:
                per_site_error = interpret(run, sites.error)
        finally:
            _depth[0] -= 1
            _mapped_run.pop()
        per_site_error = shapes_as_written(per_site_error, written, _vmapped(run))
        if backward:  # what its first forward run here was entered with (``_entry``)
            if loop not in held:
                error, held[loop] = take_entry(error, loop)
            error = merge_backward(error, loop, per_site_error, sites, held[loop])
        else:
            first = loop not in entered  # its first forward run here (of several parts)
            entered.setdefault(loop, error)
            error = note_entry(error, loop, per_site_error, entered[loop])
            error = merge_forward(error, loop, per_site_error, sites, first)
            found_early.setdefault(loop, []).append((per_site_error, sites))
    return merge_found_early(error, itertools.chain(*found_early.values()))


@contextlib.contextmanager
def _within(chunk: bool) -> Iterator[None]:
    """Inside a chunk's computation (its inner jaxprs begin no chunk) where ``chunk``."""
    _chunks[0] += chunk
    try:
        yield
    finally:
        _chunks[0] -= chunk


def restart_clock(error: Any) -> object:
    """``error`` with its clock (if it has one: inside ``per_site``) at 0: a chunk begins."""
    return set_clock(error, lambda _: jax.numpy.int32(0))


def _counting_steps(rule: Callable) -> Callable:
    """JAX's ``checkify`` rule of a loop (``scan``, ``while``), whose body (and condition),
    interpreted one level down, begins a step (``_steps_at``)."""

    def counted(*args: Any, **params: Any) -> Any:
        _steps_at.append(_nesting[0] + 1)
        try:
            return rule(*args, **params)
        finally:
            _steps_at.pop()

    return counted


def _interpret_loops_per_site() -> None:
    """Install ``_checkify_jaxpr_flat`` as JAX's interpreter under ``checkify`` (every
    caller looks it up in JAX's module when it runs), and count the steps of loops."""
    internal(_CHECKIFY + ".checkify_jaxpr_flat")  # present on this JAX, or MissingInternal
    module: Any = importlib.import_module(_CHECKIFY)
    module.checkify_jaxpr_flat = _checkify_jaxpr_flat
    rules = internal(_CHECKIFY + ".error_checks")
    for loop in (primitive("scan"), primitive("while")):
        rules[loop] = _counting_steps(rules[loop])


_interpret_loops_per_site()
