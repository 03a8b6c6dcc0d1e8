"""Flax NNX objects as arguments: split to pure state, run, write the new state back.

NNX modules are mutable Python objects (``nnx.Rngs`` counters advance, batch statistics
update), which a traced function cannot mutate across trace levels. So a call whose
arguments hold NNX graph nodes is run as a pure function of their state:

1. every positional or keyword argument that holds a graph node is ``nnx.split`` into a
   static ``GraphDef`` and a pytree ``State``;
2. the pure function ``nnx.merge``-s them back, calls the user's function, and returns its
   outputs together with the arguments' new state (``nnx.split`` after the call);
3. the caller's objects are ``nnx.update``-d with that state, exactly as the original call
   would have left them.

Positional arguments keep their positions, so ``argnums`` still names them. Flax is only
imported when it is already in use (an argument could only be an NNX object if it is). The
call of step 2 is an ``NnxCall``: the pure function and its arguments, by name.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Generic, TypeVar

import jax

F = TypeVar("F")


def _nnx() -> ModuleType:
    """``flax.nnx``, imported already where an argument holds one of its graph nodes."""
    return sys.modules["flax.nnx"]


@dataclasses.dataclass(frozen=True)
class NnxCall(Generic[F]):
    """A call with NNX graph nodes as a call of ``function``, a pure function of their state
    (``purify``), on their state: ``function(*args, **kwargs)`` (``pure_arguments``)."""

    function: F
    args: tuple
    kwargs: dict


def has_graph_nodes(args: tuple, kwargs: dict) -> bool:
    nnx = sys.modules.get("flax.nnx")  # not imported: no argument can be an NNX object
    if nnx is None:
        return False
    is_node = nnx.graph.is_graph_node
    return any(is_node(x) for x in jax.tree_util.tree_leaves((args, kwargs), is_leaf=is_node))


def _split(value: object) -> tuple[object, object]:
    """``(graphdef, state)`` if ``value`` holds a graph node, else ``(None, value)``."""
    if not has_graph_nodes((value,), {}):
        return None, value
    return _nnx().split(value)


def purify(fun: Callable) -> Callable:
    """``pure(*states, _defs=..., **kw_states) -> (out, new_states, new_kw_states)``."""

    def pure(*states: object, _defs: _Static, **kw_states: object) -> tuple:
        nnx = _nnx()
        arg_defs, kw_items = _defs.value
        kw_defs = dict(kw_items)
        # the given leaves, before the call (merged modules may update a state in place)
        given = [jax.tree_util.tree_leaves(s) for s in states]
        kw_given = {k: jax.tree_util.tree_leaves(s) for k, s in kw_states.items()}
        args = [s if d is None else nnx.merge(d, s) for d, s in zip(arg_defs, states, strict=True)]
        kwargs = {
            k: s if kw_defs[k] is None else nnx.merge(kw_defs[k], s) for k, s in kw_states.items()
        }
        out = fun(*args, **kwargs)
        new_states = [
            None if d is None else _changed(nnx.split(a)[1], g)
            for d, a, g in zip(arg_defs, args, given, strict=True)
        ]
        new_kw = {
            k: None if kw_defs[k] is None else _changed(nnx.split(a)[1], kw_given[k])
            for k, a in kwargs.items()
        }
        return out, new_states, new_kw

    pure.__name__ = getattr(fun, "__name__", "pure")
    return pure


def _changed(new: object, old_leaves: list) -> object:
    """The leaves of the state ``new`` that the call changed (None where a leaf is still the
    one it was given, in ``old_leaves``): only those come back to be written, so that a module
    the caller does not differentiate is not written with the caller's tracers (NNX forbids
    mutating a module from another trace level, as an unchanged parameter would under
    ``jax.grad``)."""
    new_leaves = jax.tree_util.tree_leaves(new)
    if len(new_leaves) != len(old_leaves):
        return new  # the call added or removed state: all of it is written
    return _Changed([None if n is o else n for n, o in zip(new_leaves, old_leaves, strict=True)])


class _Changed(list):
    """The changed leaves of a state, in its flattened order (a list: a pytree)."""


jax.tree_util.register_pytree_node(
    _Changed, lambda c: (list(c), None), lambda _, leaves: _Changed(leaves)
)


def _written(node: object, state: object) -> object:
    """The state to write into ``node``: ``state`` itself, or its changed leaves over the
    node's current ones."""
    if not isinstance(state, _Changed):
        return state
    current = _nnx().split(node)[1]
    leaves, treedef = jax.tree_util.tree_flatten(current)
    merged = [c if n is None else n for c, n in zip(leaves, state, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, merged)


def pure_arguments(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The pure function's arguments for a call with ``args`` and ``kwargs``."""
    arg_split = [_split(a) for a in args]
    kw_split = {k: _split(v) for k, v in kwargs.items()}
    defs = (tuple(d for d, _ in arg_split), tuple((k, d) for k, (d, _) in kw_split.items()))
    states = tuple(s for _, s in arg_split)
    kw_states = {k: s for k, (_, s) in kw_split.items()}
    return states, {**kw_states, "_defs": _Static(defs)}


def write_back(args: tuple, kwargs: dict, new_states: list, new_kw: dict) -> None:
    """Leave the caller's graph nodes as the original call would have."""
    nnx = _nnx()
    for a, s in zip(args, new_states, strict=True):
        if _any_change(s):
            nnx.update(a, _written(a, s))
    for k, s in new_kw.items():
        if _any_change(s):
            nnx.update(kwargs[k], _written(kwargs[k], s))


def _any_change(state: object) -> bool:
    """Whether ``state`` (from the pure call) has anything to write back."""
    if isinstance(state, _Changed):
        return any(leaf is not None for leaf in state)
    return state is not None


class _Static:
    """A hashable, leafless holder for the graph definitions (a static argument)."""

    def __init__(self, value: tuple):
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self.value == other.value
