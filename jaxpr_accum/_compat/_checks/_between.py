"""The checks of a part of the program that runs after the chunk loop though the program
has it between the body's equations (``_analysis._order``), ordered as the program has them.

Such a part (a penalty on the parameters between two layers, a sort of a column that the
loop takes per chunk) is traced in a name scope of its own (``between_scope``: its loop and
its ordinal ``n`` among such parts), and the body's equations after ``n`` of them in one of
theirs (``segment_scope``: the segment ``n``, part of each check site, ``segment_of``). The
original runs each check on every row before the next, so such a part's check comes after
the body's checks before it and before those after it. Where ``checkify`` meets the part,
after the loop's forward pass (``checks_in_place``):

- an error of its kind that a forward check of the body of segment ``n`` or later found
  gives way to it, unless that error was there when the loop's forward pass began (the
  loop's note, ``_entry``: an earlier step's, where a ``lax.scan`` of yours calls the
  function at each step); an error there before, or found by the body before it, stays;
- an automatic check takes a code before the codes of the body's checks after it (the
  middle band of that gap in ``_merges``' codes), so that ``err.get()``, which reports the
  lowest code of the kinds that fired, orders it with them as the program does; your
  ``checkify.check`` keeps the code it was traced with, as the original's does.

Where the loop's forward pass meets copies of the body in turn (whose checks differ in
their types: a batched copy and one of an element under ``jax.vmap``), ``_merges`` orders
the checks by segment first, so that a code lies between those before the part and those
after it.

Invariants: outside ``checkify`` a scope is metadata; a part of no such scope, or one that
nothing of the body follows, is checked as JAX checks it; JAX's ``update_error`` is
restored on exit.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxpr_accum._compat._checks import _merges
from jaxpr_accum._compat._checks._entry import held_at_entry, updated_where
from jaxpr_accum._compat._types import Eqn

_CHECKIFY = "jax._src.checkify"
_BETWEEN = "jaxpr_accum_between"
_BETWEEN_OF = re.compile(_BETWEEN + r"(\d+)_(\d+)\b")
_SEGMENT = "jaxpr_accum_segment"
_SEGMENT_OF = re.compile(_SEGMENT + r"(\d+)\b")
_SERIAL = re.compile(r"(\d+)$")


def between_scope(scope: str, ordinal: int) -> contextlib.AbstractContextManager:
    """The name scope of the ``ordinal``-th part that runs after the loop of ``scope`` (its
    ``loop_scope``) though the program has it before the body's last equation."""
    serial = _SERIAL.search(scope)
    assert serial is not None, scope
    return jax.named_scope(f"{_BETWEEN}{serial.group(1)}_{ordinal}")


def segment_scope(segment: int) -> contextlib.AbstractContextManager:
    """The name scope of the body's equations after ``segment`` such parts (none: none)."""
    return jax.named_scope(f"{_SEGMENT}{segment}") if segment else contextlib.nullcontext()


def between_of(eqn: Eqn) -> tuple[int, int] | None:
    """``(loop, ordinal)`` of ``eqn``'s ``between_scope``, if it is of one and not
    transposed (its forward computation)."""
    name = str(eqn.source_info.name_stack)
    found = _BETWEEN_OF.search(name)
    if found is None or "transpose(" in name.partition(_BETWEEN)[0]:
        return None
    return int(found.group(1)), int(found.group(2))


def segment_of(name_stack: str) -> int:
    """The segment of a check whose equations are named ``name_stack`` (the outermost:
    the loop's body's equation; 0 where none)."""
    found = _SEGMENT_OF.search(name_stack)
    return 0 if found is None else int(found.group(1))


@contextlib.contextmanager
def checks_in_place(loop: int, ordinal: int) -> Iterator[None]:
    """JAX's ``update_error`` for the checks of the ``ordinal``-th part that runs after
    ``loop`` though the program has it before the body's last (the module's docstring)."""
    module: Any = importlib.import_module(_CHECKIFY)
    jnp, jax_update = jax.numpy, module.update_error
    later = [code for code, segment in _merges.segments(loop) if segment >= ordinal]
    given = _merges.between_codes(loop)

    def update(error: Any, pred: Any, code: Any, metadata: dict, payload: Any, kind: Any) -> Any:
        if not later:  # nothing of the body after it: JAX's order
            return jax_update(error, pred, code, metadata, payload, kind)
        before_it = held_at_entry(error, loop, kind)  # None: the body checks no such kind
        band = range(min(later) - 2 * _merges.HALF, min(later) - _merges.HALF)
        free = [c for c in band if c not in given]
        if metadata and free:  # an automatic check: a code just before the body's after it
            given.add(free[0])
            code, metadata = free[0], {free[0]: metadata[code]}
        had, replaced = error._pred.get(kind, False), jnp.bool_(False)
        if before_it is not None:  # an error the body found after it, not one there before
            found_later = jnp.isin(error._code.get(kind, -1), np.asarray(later))
            replaced = jnp.logical_and(had, jnp.logical_and(found_later, ~before_it))
        take = jnp.logical_and(pred, jnp.logical_or(jnp.logical_not(had), replaced))
        return updated_where(take, error, pred, code, metadata, payload, kind)

    module.update_error = update
    try:
        yield
    finally:
        module.update_error = jax_update
