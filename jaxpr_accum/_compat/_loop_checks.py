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
  ``_check_sites.per_site`` (one error slot per check site, ``_check_places`` says which),
  then merges the slots into the error (``in_program_order``: per kind, the site that fired
  soonest, then the first in the program), an out-of-bounds error naming the operand's
  shape as written, not the chunk's;
- a sum accumulated over the chunks is checked as its reduction (``checked_as``);
- each chunk's computation of the program is traced in a name scope (``chunk_scope``) where
  the interpreter restarts ``per_site``'s clock, so that times in different chunks compare
  as the original's steps do;
- the forward pass's checks come first, in program order, ``_SPACING`` codes apart; a
  backward pass's after them where it runs (fused finds them in its forward pass, and they
  wait for the loop's backward pass); the checks a backward pass makes in the forward
  computations it recomputes take the codes between, after the check of the forward pass
  before them, where the original makes them (the derivative of ``sqrt`` divides by its
  value in the forward pass); a backward pass that visits the chunks from the last keeps a
  check's earliest row.

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
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import jax

from jaxpr_accum._compat._check_places import (
    checked_as,
    counting,
    entering,
    in_backward_pass,
    recount,
    shapes_as_written,
    site_of,
)
from jaxpr_accum._compat._check_sites import (
    CLOCK,
    Sites,
    in_program_order,
    per_site,
    set_clock,
)
from jaxpr_accum._compat._emit import user_context
from jaxpr_accum._compat._lookup import internal, param
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
#: per loop, where its last forward pass put its checks among the codes: ``(base, place ->
#: code)``, ``_SPACING`` codes apart (the module's docstring)
_forward_codes: dict[int, tuple[int, dict[str, int]]] = {}
_SPACING = 8


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


def _runs(eqns: list[Eqn]) -> Iterator[tuple[int | None, list[Eqn]]]:
    """``eqns`` in runs of one loop's scope (None: of none; in a loop's mapped run, its)."""
    inside = _mapped_run[-1]
    for loop, run in itertools.groupby(
        eqns, lambda e: loop_serial(e) if inside is None else inside
    ):
        yield loop, list(run)


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


def _checkify_jaxpr_flat(
    jaxpr: Jaxpr, consts: list, enabled_errors: object, err_tree: Any, *args: object
) -> tuple[object, list]:
    """JAX's ``checkify_jaxpr_flat`` (same signature and result), each loop's run of
    equations interpreted with one error slot per check site (the module's docstring)."""
    last_used, clean_up = internal("jax._src.core.last_used"), internal(_CLEAN_UP)
    env: dict = {}
    err_vals, in_args = args[: err_tree.num_leaves], args[err_tree.num_leaves :]
    error = jax.tree_util.tree_unflatten(err_tree, err_vals)
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
    for loop, run in _runs(eqns):
        if loop is None or _depth[0]:
            error = interpret(run, error)
            continue
        owner = _owners.get(loop)
        written = [] if owner is None else owner.written_body()
        backward = in_backward_pass() or any(_loop_transposed(e) for e in run)
        if backward:  # what the forward passes found of the backward pass, in its place
            error = _merge_found_early(error, found_early.pop(loop, []))
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
        if backward:
            error = _merge_backward(error, loop, per_site_error, sites)
        else:
            error = _merge_forward(error, loop, per_site_error, sites)
            found_early.setdefault(loop, []).append((per_site_error, sites))
    return _merge_found_early(error, itertools.chain(*found_early.values()))


def _merge_found_early(error: object, found: Iterable[tuple[object, Sites]]) -> object:
    """``error`` with the slots of backward-pass checks that forward passes found early."""
    for early, sites in found:
        error = in_program_order(error, early, sites, sites.ranks_where(lambda s: s.backward))
    return error


def _merge_forward(error: object, loop: int, per_site_error: object, sites: Sites) -> object:
    """``error`` with the slots of a loop's forward pass, in program order, ``_SPACING``
    codes apart (``_forward_codes``); not those of a backward pass it holds (fused's)."""
    module: Any = importlib.import_module(_CHECKIFY)
    ranks = sites.ranks_where(lambda site: not site.backward)
    base = module.next_code()
    for _ in range(_SPACING * (len(ranks) + 1) - 1):
        module.next_code()
    codes = {rank: base + _SPACING * (i + 1) for i, rank in enumerate(ranks)}
    _forward_codes[loop] = base, {sites.sites[r].place: code for r, code in codes.items()}
    return in_program_order(error, per_site_error, sites, ranks, codes)


def _merge_backward(error: object, loop: int, per_site_error: object, sites: Sites) -> object:
    """``error`` with the slots of a loop's backward pass, in program order: first those of
    the forward computations it recomputes, each under a code just after that of the check
    before it in the loop's forward pass, as the original makes them there; then the rest."""
    module: Any = importlib.import_module(_CHECKIFY)
    forward = _forward_codes.get(loop)
    if forward is None:  # no forward pass of the loop met before: all in the order met
        return in_program_order(error, per_site_error, sites)
    base, by_place = forward
    codes, last, step = {}, base, 0
    recomputed = sites.ranks_where(lambda site: site.recomputed)
    for rank in recomputed:
        place = sites.sites[rank].place
        if place in by_place:  # a check of the forward pass: its code
            last, step = by_place[place], 0
            codes[rank] = last
        else:  # a check the forward pass does not make (a derivative's): after the last
            step += 1
            codes[rank] = last + step if step < _SPACING else module.next_code()
    error = in_program_order(error, per_site_error, sites, recomputed, codes)
    rest = sites.ranks_where(lambda site: not site.recomputed)
    return in_program_order(error, per_site_error, sites, rest)


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
    clock = next((s for s in error._payload if getattr(s, "rank", None) == CLOCK), None)
    return error if clock is None else set_clock(error, clock, jax.numpy.int32(0))


def _interpret_loops_per_site() -> None:
    """Install ``_checkify_jaxpr_flat`` as JAX's interpreter under ``checkify`` (every
    caller looks it up in JAX's module when it runs)."""
    internal(_CHECKIFY + ".checkify_jaxpr_flat")  # present on this JAX, or MissingInternal
    module: Any = importlib.import_module(_CHECKIFY)
    module.checkify_jaxpr_flat = _checkify_jaxpr_flat


_interpret_loops_per_site()
