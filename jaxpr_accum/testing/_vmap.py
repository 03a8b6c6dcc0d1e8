"""The serialized function under ``jax.vmap``, against the original under the same ``vmap``.

A serialized function is used inside other transformations; ``jax.vmap`` is the one whose
defects showed last (a gradient 2x too large when one region output depends on the vmapped
argument and another does not). ``contexts(sf, args, kwargs)`` gives the two checks that
``assert_matches_original`` and ``check`` add:

- *an extra leading axis of the chunked arguments* (those named by ``argnums`` / ``in_axes``;
  every argument with an array leaf when the axis is found inside the function): each array
  leaf stacked with a second, different copy of itself;
- *each unchunked argument* with a floating leaf (the parameters, a temperature), one at a
  time, batched the same way while the rest stay unbatched.

Only array leaves are batched; Python values stay static (closed over), as they are for the
serialized function itself. Each context is a ``Vmapped`` object that looks like a serialized
function to the comparison: ``original`` is the original under the same ``vmap``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxpr_accum import Plan
from jaxpr_accum._base._dtypes import has_key_dtype, is_array, is_float_array
from jaxpr_accum.testing._variants import Serialized


def _stack(x: Any) -> object:
    """An array leaf stacked with a different copy of itself (floats moved, the rest
    repeated); any other leaf as it is. ``x``: a leaf, read as an array where it is one."""
    if not is_array(x):
        return x
    moved = is_float_array(x) and not has_key_dtype(x)
    return jnp.stack([x, x * 0.75 + jnp.asarray(0.125, x.dtype) if moved else x])


def _vmapped(fun: Callable, batched: tuple[bool, ...]) -> Callable:
    """``fun`` with ``jax.vmap`` over the positional arguments flagged in ``batched`` (array
    leaves only; other leaves closed over, static)."""

    def call(*args: object, **kwargs: object) -> object:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        owners = [i for i, a in enumerate(args) for _ in jax.tree_util.tree_leaves(a)]
        arrays = [j for j, leaf in enumerate(leaves) if is_array(leaf)]

        def inner(*xs: object) -> object:
            full = list(leaves)
            for j, x in zip(arrays, xs, strict=True):
                full[j] = x
            return fun(*jax.tree_util.tree_unflatten(treedef, full), **kwargs)

        in_axes = tuple(0 if batched[owners[j]] else None for j in arrays)
        return jax.vmap(inner, in_axes=in_axes)(*(leaves[j] for j in arrays))

    return call


class Vmapped:
    """``sf`` under ``jax.vmap`` over the positional arguments flagged in ``batched``."""

    def __init__(self, sf: Serialized, batched: tuple[bool, ...], what: str):
        self.sf, self.batched, self.what = sf, batched, what
        self.original = _vmapped_original(sf.original, batched)
        self._call = _vmapped(sf, batched)
        self.grad, self.chunk = sf.grad, sf.chunk

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._call(*args, **kwargs)

    def explain(self, *args: object, **kwargs: Any) -> Plan:  # ``sf.explain``'s keywords too
        first = [
            jax.tree.map(lambda x: x[0] if is_array(x) else x, a) if b else a
            for a, b in zip(args, self.batched, strict=True)
        ]
        return self.sf.explain(*first, **kwargs)

    def batch(self, args: tuple) -> tuple:
        """``args`` with the batched positions stacked twice (two different copies)."""
        return tuple(
            jax.tree.map(_stack, a) if b else a for a, b in zip(args, self.batched, strict=True)
        )


# Per serialized function and context, so that repeated checks reuse compiled runners; the
# original's per original function, so that copies in other modes and chunks share it.
_CACHE: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()
_ORIGINALS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _entries(cache: weakref.WeakKeyDictionary, owner: object) -> dict:
    """``owner``'s entries in ``cache``; a fresh dict where ``owner`` is not weakly
    referenceable (nothing is then reused)."""
    try:
        return cache.setdefault(owner, {})
    except TypeError:
        return {}


def _vmapped_original(original: Callable, batched: tuple[bool, ...]) -> Callable:
    cache = _entries(_ORIGINALS, original)
    if batched not in cache:
        cache[batched] = _vmapped(original, batched)
    return cache[batched]


def _chunked_positions(sf: Serialized, args: tuple) -> set[int]:
    n = len(args)
    if sf.argnums is not None:
        return {a % n for a in sf.argnums}
    if sf.in_axes is not None:
        axes = sf.in_axes if isinstance(sf.in_axes, (tuple, list)) else (sf.in_axes,) * n
        return {
            i
            for i, ax in enumerate(axes)
            if any(x is not None for x in jax.tree_util.tree_leaves(ax))
        }
    return {i for i, a in enumerate(args) if any(map(is_array, jax.tree.leaves(a)))}


def contexts(sf: Serialized, args: tuple) -> list[Vmapped]:
    """The ``jax.vmap`` contexts to check ``sf`` in, for positional ``args``."""
    chunked = _chunked_positions(sf, args)
    if not chunked:
        return []
    wanted = [(tuple(i in chunked for i in range(len(args))), "an extra leading axis")]
    free = [
        i
        for i, a in enumerate(args)
        if i not in chunked and any(map(is_float_array, jax.tree.leaves(a)))
    ]
    wanted += [(tuple(i == j for i in range(len(args))), f"argument {j}") for j in free]
    cache = _entries(_CACHE, sf)
    out = []
    for batched, what in wanted:
        if batched not in cache:
            cache[batched] = Vmapped(sf, batched, f"under jax.vmap over {what}")
        out.append(cache[batched])
    return out
