"""One error slot per check site while a chunk loop is checkified, merged in program order.

JAX's ``checkify`` keeps one error per kind (``Error``'s ``ErrorEffect``: the exception's
type and its payload's shapes): the first to fire in execution order. The original runs each
check on every row before the next, so of two checks of one kind that both fire it keeps the
one first in the program; a chunk loop runs both per chunk and would keep the one that fires
in the earlier chunk. So while the loop is checkified (``per_site``), every check updates a
slot of its own (``SiteEffect``: the kind and the site's rank), the full chunks' and the
remainder's copies of one check the same slot with the same code; the loop carries these
slots through the chunks in order, each keeping its earliest row. ``in_program_order`` then
merges them into the error the loop was entered with by JAX's own ``update_error``, site by
site in rank order, each with a fresh code: per kind, the first site in the program that
fired wins, with its earliest row, and across kinds the codes order the region's sites after
the checks before it and before those after it, as the original's do.

A site is what ``site_of`` names (the check's kind, primitive, message and place in the
user's program, the same for the full chunks' and the remainder's copies); a
``checkify.check`` traced in the user's function is its own site (its code, fixed when it
was traced, names it). Ranks are the order in which the loop's checkify meets the sites:
the full chunks' body first, in program order; the package's own operations (a chunk's
slicing, the sum accumulated over the chunks) are ranked after the program's sites. The
error the loop starts from (``Sites.error``) has a marker slot of its own, which never
fires: JAX caches checkified jaxprs under their error's slots, so each loop is checkified
anew and meets its sites in order (no rank or code outlives one loop).

Invariant: outside ``per_site`` nothing changes (JAX's functions are restored on exit); the
merged error is a JAX ``Error`` of plain ``ErrorEffect`` kinds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any, Protocol, SupportsInt

import jax
import numpy as np

from jaxpr_accum._compat._lookup import internal

_CHECKIFY = "jax._src.checkify"


class ErrorKind(Protocol):
    """JAX's ``ErrorEffect``, as read here: the kind of a checkify error (its exception's
    type and its payload's shapes)."""

    @property
    def error_type(self) -> type: ...

    @property
    def shape_dtypes(self) -> tuple[jax.ShapeDtypeStruct, ...]: ...


class CheckException(Protocol):
    """JAX's ``JaxException``, as read here: a check's exception and its kind."""

    def get_effect_type(self) -> ErrorKind: ...


#: a serial number per loop checkified: the key of its error's empty marker slot
_LOOPS = itertools.count(1)
#: the first rank of the package's own operations' sites
_LAST = 1 << 30


class Sites:
    """The sites met while one loop is checkified: ``ranks`` (site -> rank, in the order
    met), ``codes`` (rank -> the code of its copies, under which its exception is in the
    error's metadata) and ``error``: the empty error the loop starts from, with a marker slot
    of its own that never fires (``Error``'s slots are part of the key under which JAX caches
    checkified jaxprs: every loop body is then checkified anew, its sites met in order)."""

    def __init__(self) -> None:
        module: Any = importlib.import_module(_CHECKIFY)
        self.marker = site_effect()(module.FailedCheckError, (), -next(_LOOPS))
        never, no_code = np.bool_(False), np.int32(-1)
        self.error = module.init_error._update(self.marker, never, no_code, {}, [])
        self.ranks: dict[str, int] = {}
        self.codes: dict[int, int] = {}

    def site(self, key: str, code: Callable[[], int], last: bool = False) -> tuple[int, int]:
        """The site's (rank, code): new ones where it is met first, ranked after every site
        of the program where ``last``."""
        if key not in self.ranks:
            self.ranks[key] = len(self.ranks) + (_LAST if last else 0)
            self.codes[self.ranks[key]] = code()
        rank = self.ranks[key]
        return rank, self.codes[rank]


@functools.cache
def site_effect() -> type:
    """``ErrorEffect`` with the site's ``rank``: a slot of its own in ``Error``'s dicts."""
    error_effect: Any = internal(_CHECKIFY + ".ErrorEffect")

    @dataclasses.dataclass(frozen=True)
    class SiteEffect(error_effect):  # type: ignore[misc]
        rank: int = 0

        def __lt__(self, other: ErrorKind) -> bool:  # ``Error``'s dicts are flattened sorted
            return _sort_key(self) < _sort_key(other)

    return SiteEffect


def _sort_key(effect: ErrorKind) -> tuple:
    shapes = tuple((sd.shape, str(sd.dtype)) for sd in effect.shape_dtypes)
    return str(effect.error_type), shapes, getattr(effect, "rank", -1)


@contextlib.contextmanager
def per_site(site_of: Callable[[CheckException], tuple[bool, object]]) -> Iterator[Sites]:
    """JAX's ``assert_func`` and ``update_error`` keeping one slot per check site (the
    module's docstring), met in one loop: ``site_of(exception)`` is ``(the package's own
    operation, site)`` of a check made by ``assert_func``."""
    module: Any = importlib.import_module(_CHECKIFY)
    jax_assert, jax_update, effect_type = module.assert_func, module.update_error, site_effect()
    sites = Sites()

    def assert_func(error: object, pred: object, new_error: CheckException) -> object:
        own, site = site_of(new_error)
        rank, code = sites.site(repr(site), module.next_code, last=own)
        payload, tree = jax.tree_util.tree_flatten(new_error)
        kind = new_error.get_effect_type()
        effect = effect_type(kind.error_type, kind.shape_dtypes, rank)
        return jax_update(error, pred, code, {code: tree}, payload, effect)

    def update_error(  # JAX's signature, positional as JAX calls it
        error: object,
        pred: object,
        code: SupportsInt,
        metadata: object,
        payload: object,
        kind: ErrorKind,
    ) -> object:
        if not isinstance(kind, effect_type):  # a user's check: its code names the site
            rank, _ = sites.site(f"check {int(code)}", lambda: int(code))
            kind = effect_type(kind.error_type, kind.shape_dtypes, rank)
        return jax_update(error, pred, code, metadata, payload, kind)

    module.assert_func, module.update_error = assert_func, update_error
    try:
        yield sites
    finally:
        module.assert_func, module.update_error = jax_assert, jax_update


def in_program_order(error: object, per_site_error: Any, sites: Sites) -> object:
    """``error`` updated with the slots of ``per_site_error`` in the order of their ranks,
    each under a fresh code (the module's docstring)."""
    module: Any = importlib.import_module(_CHECKIFY)
    for slot in sorted(per_site_error._pred, key=lambda e: e.rank):
        if slot.rank < 0:  # the marker
            continue
        code = module.next_code()
        tree = per_site_error._metadata[sites.codes[slot.rank]]
        kind = module.ErrorEffect(slot.error_type, slot.shape_dtypes)
        pred, payload = per_site_error._pred[slot], per_site_error._payload[slot]
        error = module.update_error(error, pred, code, {code: tree}, payload, kind)
    return error
