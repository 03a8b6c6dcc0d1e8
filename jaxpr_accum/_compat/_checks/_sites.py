"""One error slot per check site while a chunk loop is checkified, merged in program order.

JAX's ``checkify`` keeps one error per kind (``Error``'s ``ErrorEffect``: the exception's
type and its payload's shapes): the first to fire in execution order. The original runs each
check on every row before the next, so of two checks of one kind that both fire it keeps the
one first in the program; a chunk loop runs both per chunk and would keep the one that fires
in the earlier chunk. So while the loop is checkified (``per_site``), every check updates a
slot of its own (``SiteEffect``: the kind and the site's rank), the full chunks' and the
remainder's copies of one check the same slot with the same code; the loop carries these
slots through the chunks in order, each keeping its earliest row. ``in_program_order`` then
merges them into the error the loop was entered with by JAX's own ``update_error``, each
site with a fresh code in rank order: per kind, the site that fired soonest wins, with its
earliest row, and across kinds the codes order the region's sites after the checks before
it and before those after it, as the original's do.

Soonest is by a clock (a slot of its own, never firing) that counts the steps of the user's
loops that a chunk has begun (``set_clock``, where ``_loops`` interprets a loop's body): it
restarts where a chunk's computation begins, so a check in a loop of the user's at step 3
is later than one at step 0 in any chunk, and one after a loop later than one in it, as in
the original, which runs every row's step 0 first. Steps, not checks, are counted: JAX may
linearize the full chunks' body and the remainder apart (a custom JVP's rule inlined in
one), with different checks before a site. Each site of the program (not the package's own)
keeps the time of its soonest firing in a slot of its own (``timed``), and that firing's
payload; sites that fired as soon are ordered by rank (the program's order). A backward
pass's checks continue their chunk's clock (a transposed loop of the user's runs its steps
from the last). The package's own operations keep no time (later than any).

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
from collections.abc import Callable, Iterator, Mapping, Sequence
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

    def __hash__(self) -> int: ...


class CheckException(Protocol):
    """JAX's ``JaxException``, as read here: a check's exception and its kind."""

    def get_effect_type(self) -> ErrorKind: ...


#: a serial number per loop checkified: the key of its error's empty marker slot
_LOOPS = itertools.count(1)
#: the first rank of the package's own operations' sites
_LAST = 1 << 30
#: the rank of the clock's slot, and its payload: how many steps of the user's loops a chunk
#: has begun so far
CLOCK = -1 << 30
_TICK = (jax.ShapeDtypeStruct((), np.int32),)
#: the time of a check that never fired (later than any)
NEVER = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class Site:
    """A check site: ``place`` names the check (the same for every copy of it: the full
    chunks' and the remainder's, the forward pass's and a backward pass's recomputation);
    ``own``: an operation of the package's own (ranked after the program's); ``backward``:
    met in a backward pass, ``recomputed``: there, in a forward computation it recomputes
    (a checkpointed chunk's), not in a transposed one; ``segment``: how many equations
    that run after the loop come before its own in the program (``_analysis._order``).
    The flags are part of the site."""

    place: str
    own: bool = False
    backward: bool = False
    recomputed: bool = False
    segment: int = 0


class Sites:
    """The sites met while one loop is checkified: ``ranks`` (site -> rank, in the order
    met), ``codes`` (rank -> the code of its copies, under which its exception is in the
    error's metadata) and ``error``: the empty error the loop starts from, with a marker slot
    of its own that never fires (``Error``'s slots are part of the key under which JAX caches
    checkified jaxprs: every loop body is then checkified anew, its sites met in order)."""

    def __init__(self) -> None:
        module: Any = importlib.import_module(_CHECKIFY)
        effect = site_effect()
        self.marker = effect(module.FailedCheckError, (), -next(_LOOPS))
        self.clock = effect(module.FailedCheckError, _TICK, CLOCK)
        never, no_code = np.bool_(False), np.int32(-1)
        error = module.init_error._update(self.marker, never, no_code, {}, [])
        self.error = error._update(self.clock, never, no_code, {}, [np.int32(0)])
        self.ranks: dict[Site, int] = {}
        self.codes: dict[int, int] = {}
        self.sites: dict[int, Site] = {}  # rank -> site

    def site(self, site: Site, code: Callable[[], int]) -> tuple[int, int]:
        """The site's (rank, code): new ones where it is met first, ranked after every site
        of the program where it is the package's own."""
        if site not in self.ranks:
            rank = self.ranks[site] = len(self.ranks) + (_LAST if site.own else 0)
            self.codes[rank], self.sites[rank] = code(), site
        rank = self.ranks[site]
        return rank, self.codes[rank]

    def ranks_where(self, keep: Callable[[Site], bool]) -> list[int]:
        """The ranks, in order, of the sites that ``keep`` keeps."""
        return sorted(r for r, site in self.sites.items() if keep(site))


@functools.cache
def site_effect() -> type:
    """``ErrorEffect`` with the site's ``rank``: a slot of its own in ``Error``'s dicts."""
    error_effect: Any = internal(_CHECKIFY + ".ErrorEffect")

    @dataclasses.dataclass(frozen=True)
    class SiteEffect(error_effect):  # type: ignore[misc]
        rank: int = 0
        timed: bool = False  # the slot of the time at which the site first fired

        def __lt__(self, other: ErrorKind) -> bool:  # ``Error``'s dicts are flattened sorted
            return _sort_key(self) < _sort_key(other)

    return SiteEffect


def _sort_key(effect: ErrorKind) -> tuple:
    shapes = tuple((sd.shape, str(sd.dtype)) for sd in effect.shape_dtypes)
    rank, timed = getattr(effect, "rank", -1), getattr(effect, "timed", False)
    return str(effect.error_type), shapes, rank, timed


@contextlib.contextmanager
def per_site(
    site_of: Callable[[CheckException], Site], reversed_backward: bool = False
) -> Iterator[Sites]:
    """JAX's ``assert_func`` and ``update_error`` keeping one slot per check site (the
    module's docstring), met in one loop: ``site_of(exception)`` is the site of a check made
    by ``assert_func``. ``reversed_backward``: the loop's backward pass visits the chunks
    from the last to the first (JAX's transpose of a scan), so a backward site's slot keeps
    the error of its latest firing, the earliest row, not its first."""
    module: Any = importlib.import_module(_CHECKIFY)
    jax_assert, jax_update, effect_type = module.assert_func, module.update_error, site_effect()
    sites = Sites()

    def update_slot(error: Any, pred: Any, code: object, *rest: Any) -> object:
        slot = rest[-1]
        site = sites.sites[slot.rank]
        latest = reversed_backward and site.backward
        timed = sites.clock in error._payload and not site.own
        if timed:  # this firing replaces the site's where it is sooner (``_when``)
            error, replace = _when(error, pred, sites.clock, slot.rank, ties=latest)
        else:  # where the visit is in reverse, this firing replaces the site's earlier one
            replace = pred if latest else None
        if replace is not None and slot in error._pred:
            jnp = jax.numpy
            kept = jnp.logical_and(error._pred[slot], jnp.logical_not(replace))
            error = error._replace(_pred={**error._pred, slot: kept})
        return jax_update(error, pred, code, *rest)

    def assert_func(error: object, pred: object, new_error: CheckException) -> object:
        rank, code = sites.site(site_of(new_error), module.next_code)
        payload, tree = jax.tree_util.tree_flatten(new_error)
        kind = new_error.get_effect_type()
        effect = effect_type(kind.error_type, kind.shape_dtypes, rank)
        return update_slot(error, pred, code, {code: tree}, payload, effect)

    def update_error(  # JAX's signature, positional as JAX calls it
        error: object,
        pred: object,
        code: SupportsInt,
        metadata: object,
        payload: object,
        kind: ErrorKind,
    ) -> object:
        if not isinstance(kind, effect_type):  # a user's check: its code names the site
            rank, _ = sites.site(Site(f"check {int(code)}"), lambda: int(code))
            kind = effect_type(kind.error_type, kind.shape_dtypes, rank)
        return update_slot(error, pred, code, metadata, payload, kind)

    module.assert_func, module.update_error = assert_func, update_error
    try:
        yield sites
    finally:
        module.assert_func, module.update_error = jax_assert, jax_update


def set_clock(error: Any, time: Callable[[Any], Any]) -> Any:
    """``error`` with its clock (if it has one: inside ``per_site``) at ``time(its time)``
    (the slot never fires)."""
    clock = next((s for s in error._payload if getattr(s, "rank", None) == CLOCK), None)
    if clock is None:
        return error
    now = time(error._payload[clock][0])
    return error._update(clock, error._pred[clock], error._code[clock], {}, [now])


def _when(error: Any, pred: Any, clock: Any, rank: int, ties: bool) -> tuple[Any, Any]:
    """``(error, sooner)``: ``error`` with the site's time of its soonest firing, and whether
    this firing, at the clock's time, is sooner than any before it (``ties``: or as soon; a
    loop that visits the chunks in reverse keeps the earliest row's)."""
    jnp = jax.numpy
    tick = error._payload[clock][0]
    when = site_effect()(clock.error_type, _TICK, rank, timed=True)
    had, before = error._pred.get(when, False), error._payload.get(when, [NEVER])[0]
    earlier = tick <= before if ties else tick < before
    sooner = jnp.logical_and(pred, jnp.logical_or(jnp.logical_not(had), earlier))
    time = jnp.where(sooner, tick, before)
    return error._update(when, jnp.logical_or(had, pred), np.int32(-1), {}, [time]), sooner


def in_program_order(
    error: object,
    per_site_error: Any,
    sites: Sites,
    ranks: Sequence[int] | None = None,
    codes: Mapping[int, int] | None = None,
    update: Callable | None = None,
) -> object:
    """``error`` updated with the slots of ``per_site_error`` (those of ``ranks``, default
    all) in rank order, each under a fresh code (the module's docstring) or its ``codes``,
    by ``update`` (default JAX's ``update_error``: the error there stays)."""
    module: Any = importlib.import_module(_CHECKIFY)
    jnp = jax.numpy
    slots, times = {}, {}
    for slot in per_site_error._pred:  # times: of the sites that fired (``_when``)
        if slot.rank >= 0 and slot.timed:
            times[slot.rank] = jnp.where(
                per_site_error._pred[slot], per_site_error._payload[slot][0], NEVER
            )
        elif slot.rank >= 0:  # not the marker, nor the clock
            slots[slot.rank] = slot
    by_kind: dict[Any, list] = {}
    for rank in sorted(slots) if ranks is None else [r for r in ranks if r in slots]:
        slot = slots[rank]
        code = module.next_code() if codes is None else codes[rank]
        kind = module.ErrorEffect(slot.error_type, slot.shape_dtypes)
        by_kind.setdefault(kind, []).append((rank, slot, code))
    update = update or module.update_error
    for kind, candidates in by_kind.items():
        metadata = {code: per_site_error._metadata[sites.codes[r]] for r, _, code in candidates}
        fired = [
            ((per_site_error._pred[slot], code, per_site_error._payload[slot]), times.get(rank))
            for rank, slot, code in candidates
        ]
        pred, code, payload = _soonest(fired)
        error = update(error, pred, code, metadata, payload, kind)
    return error


def _soonest(fired: list[tuple[tuple, Any]]) -> tuple:
    """Of the sites of one kind (``(pred, code, payload), time``, in program order; time
    None: untimed, later than any), the one that fired soonest, the first in the program
    of those that fired as soon."""
    jnp = jax.numpy
    (soonest, when), *rest = fired
    when = NEVER if when is None else when
    for slot, time in rest:
        time = NEVER if time is None else time
        sooner = jnp.logical_or(jnp.logical_not(soonest[0]), time < when)
        take = jnp.logical_and(slot[0], sooner)
        soonest = jax.tree_util.tree_map(functools.partial(jnp.where, take), slot, soonest)
        when = jnp.where(take, time, when)
    return soonest
