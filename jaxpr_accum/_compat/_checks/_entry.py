"""What a loop's forward pass was entered with, noted in the ``checkify`` error for its
backward pass, so that a derivative's check replaces only an error the forward pass found.

A check that only a derivative makes (the ``sub`` of ``tanh``'s ``1 - t ** 2``, the
``integer_pow`` of ``h ** 3``'s ``3 * h ** 2``) runs where remat and native recompute a
chunk: in the loop's backward pass. The original makes it while it linearizes, in its
forward pass, so it must replace an error of its kind that the loop's forward pass found
after it in the program (``replacing_later``: the one whose code is later). It must not
replace an error that was there when the loop's forward pass began: an earlier step's,
where the serialized function is called at each step of a ``lax.scan`` of yours, which JAX
traces once (the steps share their codes).

JAX traces the forward and the backward pass apart (its ``jvp`` and ``transpose`` calls),
so what the forward pass was entered with travels in the error itself: per loop and kind,
a slot that never fires (``note_entry``), whose payload says whether the error held one of
that kind (``HELD``), held none (``EMPTY``), or is not known (``UNKNOWN``; JAX's placeholder
for a slot that a loop of yours carries fills it with ones). The backward pass takes the
note (``take_entry``), which leaves it unknown: a second backward pass of the loop (under
``jax.grad`` of a ``lax.scan`` of yours, every step's backward pass runs after all of
their forward passes) finds none, and replaces by code alone, as where no note was taken.

Invariant: the slots never fire, and the error that ``checkify`` returns holds none
(``without_entries``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from jaxpr_accum._compat._checks._sites import ErrorKind, site_effect
from jaxpr_accum._compat._lookup import internal

EMPTY, UNKNOWN, HELD = 0, 1, 2
#: the ranks of the notes' slots: far below those of the loops' markers, above the clock's
_RANKS = itertools.count(-(1 << 29), -1)
_STATE = (jax.ShapeDtypeStruct((), np.int32),)


@functools.cache
def _entry_type() -> type:
    """The exception type of a note's slot (never raised: the slot never fires)."""
    return type("LoopEntry", (internal("jax._src.checkify.JaxException"),), {})


@functools.cache
def _slot(loop: int, kind: ErrorKind) -> Any:
    return site_effect()(_entry_type(), _STATE, next(_RANKS))


def _kinds(error: Any) -> list[ErrorKind]:
    return [kind for kind in error._pred if kind.error_type is not _entry_type()]


def note_entry(error: Any, loop: int, per_site_error: Any, entered: Any) -> Any:
    """``error`` noting, for each kind of the loop's checks (``per_site_error``'s sites: the
    same in every trace of a loop of yours, whose carried error must keep its slots),
    whether the error the loop's forward pass was ``entered`` with holds one of that kind."""
    jnp = jax.numpy
    error_effect: Any = internal("jax._src.checkify.ErrorEffect")
    sites = [s for s in per_site_error._pred if s.rank >= 0 and not s.timed]
    for kind in sorted({error_effect(s.error_type, s.shape_dtypes) for s in sites}):
        state = jnp.where(entered._pred.get(kind, False), HELD, EMPTY).astype(jnp.int32)
        error = error._update(_slot(loop, kind), np.bool_(False), np.int32(-1), {}, [state])
    return error


def take_entry(error: Any, loop: int) -> tuple[Any, dict[ErrorKind, Any]]:
    """``(error, kind -> whether it held one of that kind)``: the loop's notes, read and left
    unknown (a kind without a note: not held)."""
    held = {}
    for kind in _kinds(error):
        slot = _slot(loop, kind)
        if (noted := held_at_entry(error, loop, kind)) is not None:
            held[kind] = noted
            unknown = [jax.numpy.int32(UNKNOWN)]
            error = error._update(slot, error._pred[slot], error._code[slot], {}, unknown)
    return error, held


def held_at_entry(error: Any, loop: int, kind: ErrorKind) -> Any | None:
    """Whether the error held one of ``kind`` when ``loop``'s forward pass began, as its
    note says (unknown: no), or None where the error has no such note."""
    slot = _slot(loop, kind)
    return error._payload[slot][0] == HELD if slot in error._payload else None


def replacing_later(held: Mapping[ErrorKind, Any]) -> Callable:
    """JAX's ``update_error``, except that the new error replaces one of its kind whose code
    is later (found first, but after it in the program), unless ``held`` says the error was
    there when the loop's forward pass began."""
    jnp = jax.numpy

    def update(error: Any, pred: Any, code: int, metadata: dict, payload: Any, kind: Any) -> Any:
        had = error._pred.get(kind, False)
        later = jnp.logical_and(error._code.get(kind, code) > code, ~held.get(kind, False))
        replace = jnp.logical_and(pred, jnp.logical_or(jnp.logical_not(had), later))
        return updated_where(replace, error, pred, code, metadata, payload, kind)

    return update


def updated_where(
    replace: Any, error: Any, pred: Any, code: Any, metadata: dict, payload: Any, kind: Any
) -> Any:
    """``error`` holding the new error of ``kind`` (``pred``, ``code``, ``payload``) where
    ``replace``, else the one it holds (``update_error``'s arguments after ``replace``)."""
    jnp = jax.numpy
    old_payload = error._payload.get(kind)
    if old_payload is not None:
        where = functools.partial(jnp.where, replace)
        payload = jax.tree_util.tree_map(where, payload, old_payload)
    out_code = jnp.where(replace, code, error._code.get(kind, code))
    had = error._pred.get(kind, False)
    return error._update(kind, jnp.logical_or(had, pred), out_code, metadata, payload)


def without_entries(error: Any) -> Any:
    """``error`` without the notes (what ``checkify`` returns)."""
    noted = [kind for kind in error._pred if kind.error_type is _entry_type()]
    pred, code, payload = (
        {k: v for k, v in d.items() if k not in noted}
        for d in (error._pred, error._code, error._payload)
    )
    return error._replace(_pred=pred, _code=code, _payload=payload)
