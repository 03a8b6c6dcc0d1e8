"""A call's arguments: which leaves are arrays, their names, the cache key, and the checks of
``argnums`` / ``axis`` / ``in_axes`` against them.

Array leaves (JAX and NumPy arrays, tracers) are *dynamic*; every other leaf (Python numbers,
strings, ``None``, callables) is *static*, as if named in ``static_argnums``, and is part of
the cache key. Argument paths are decoded here only: ``describe`` names a leaf the way error
messages do (``argument 1['w']``), ``leaf_names`` the way reports do (``params['w']``, from
the function's signature).

Every check raises ``ArgumentError`` (a ``ValueError``) naming the argument and what was
expected, before anything is traced.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._base._dtypes import is_array_or_tracer
from jaxpr_accum._base._errors import ArgumentError, SerializeError
from jaxpr_accum._base._settings import Settings


class Call(NamedTuple):
    """A call's arguments, flattened."""

    args: tuple
    kwargs: dict
    leaves: list
    treedef: jax.tree_util.PyTreeDef
    dynamic: list[bool]
    ranges: list[range]  # positional argument i owns dynamic leaves in this range
    paths: list  # the path of every leaf of ``(args, kwargs)``

    @property
    def dyn(self) -> list:
        return [x for x, d in zip(self.leaves, self.dynamic, strict=True) if d]


def flatten(args: tuple, kwargs: dict) -> Call:
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path((args, kwargs))
    leaves = [leaf for _, leaf in paths_leaves]
    dynamic = [is_array_or_tracer(x) for x in leaves]
    ranges, start = [], 0
    for arg in args:
        n_dyn = sum(is_array_or_tracer(x) for x in jax.tree_util.tree_leaves(arg))
        ranges.append(range(start, start + n_dyn))
        start += n_dyn
    return Call(args, kwargs, leaves, treedef, dynamic, ranges, [p for p, _ in paths_leaves])


def describe(path: tuple) -> str:
    """``argument 1['w']`` / ``keyword argument 'x'`` for a path into ``(args, kwargs)``."""
    where, name, rest = path[0], path[1], jax.tree_util.keystr(tuple(path[2:]))
    if getattr(where, "idx", 0) == 0:
        return f"argument {name.idx}{rest}"
    return f"keyword argument {name.key!r}{rest}"


def leaf_names(fun: Callable, call: Call) -> list[str]:
    """A name per dynamic leaf: the parameter's name (from ``fun``'s signature, else
    ``argument i``) and ``jax.tree_util.keystr`` of the path inside it."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = []
    for path, dyn in zip(call.paths, call.dynamic, strict=True):
        if not dyn:
            continue
        where, first, rest = path[0], path[1], jax.tree_util.keystr(tuple(path[2:]))
        if getattr(where, "idx", 0) == 0:
            i = first.idx
            base = positional[i] if i < len(positional) else f"argument {i}"
        else:
            base = str(first.key)
        names.append(base + rest)
    return names


def cache_key(call: Call) -> Hashable | None:
    """Hashable key of a call's avals (weak types and varying manual axes included),
    placements, context mesh, tracing configuration (``jax.default_matmul_precision``, ...)
    and static leaves; None if a static leaf is unhashable."""
    parts: list = [call.treedef, _compat.context_mesh_key(), _compat.trace_config_key()]
    for leaf, dyn in zip(call.leaves, call.dynamic, strict=True):
        if dyn:
            aval = jax.typeof(leaf) if isinstance(leaf, jax.core.Tracer) else None
            shape, dtype = np.shape(leaf), jax.numpy.result_type(leaf)
            weak = getattr(aval, "weak_type", False)
            varying = _compat.varying_axes(leaf) if aval is not None else frozenset()
            parts.append(("dyn", shape, str(dtype), weak, varying, _compat.placement_key(leaf)))
        else:
            try:
                hash(leaf)
            except TypeError:
                return None
            parts.append(("static", type(leaf), leaf))
    return tuple(parts)


def perturbation(call: Call, argnums: tuple[int, ...] | None = None) -> tuple[bool, ...] | None:
    """Which dynamic leaves the caller differentiates: those of the positional arguments
    ``argnums`` where given (``explain(..., grad_argnums=...)``), else those ``jax.grad`` of
    the serialized function perturbs, or None when no differentiation traces the call
    directly (a plain call, or one inside ``jax.jit`` under ``jax.grad``)."""
    if argnums is not None:
        marked = {i for a in argnums for i in call.ranges[a]}
        return tuple(i in marked for i in range(len(call.dyn)))
    found = [_compat.differentiated(x) for x in call.dyn]
    if not any(f is not None for f in found):
        return None
    return tuple(bool(f) for f in found)


def check_concrete_shapes(call: Call) -> None:
    """Symbolic dimensions (``jax.export`` shape polymorphism) cannot be chunked."""
    for path, leaf, dyn in zip(call.paths, call.leaves, call.dynamic, strict=True):
        shape = getattr(leaf, "shape", ())
        if dyn and not all(isinstance(d, int) for d in shape):
            raise SerializeError(
                f"{describe(path)} has the symbolic shape {shape}; serialize_axis plans chunks "
                "for concrete sizes. Export the function at a concrete batch size, or export "
                "the original (unserialized) function."
            )


def seed_axes(settings: Settings, call: Call, fun: Callable) -> list | None:
    """The serialized axis of each dynamic leaf (None: not serialized) when ``argnums`` or
    ``in_axes`` names it, checked against the call; None for ``size=`` / automatic. Where the
    check fails on a call that ``fun``'s signature does not take either (a missing
    argument), the error is the function's own ``TypeError``, not the setting's."""
    try:
        return _named_axes(settings, call)
    except ValueError:  # an ``ArgumentError``, or ``in_axes`` not a prefix of the arguments
        _check_binds(fun, call)
        raise


def _check_binds(fun: Callable, call: Call) -> None:
    try:
        inspect.signature(fun).bind(*call.args, **call.kwargs)
    except ValueError:  # no signature to read
        return
    except TypeError as error:
        name = getattr(fun, "__name__", type(fun).__name__)
        raise TypeError(f"{name}() {error}") from None


def _named_axes(settings: Settings, call: Call) -> list | None:
    if settings.argnums is not None:
        return _argnums_axes(settings, call)
    if settings.in_axes is None:
        return None
    per_leaf = _compat.flatten_in_axes(settings.in_axes, call.args)  # one per leaf of args
    axes: list = []
    sizes: dict[int, list[str]] = {}
    for path, leaf, dyn, ax in zip(call.paths, call.leaves, call.dynamic, per_leaf, strict=False):
        where = "args" + jax.tree_util.keystr(tuple(path[1:]))  # as jax.vmap names it
        if not dyn:
            if ax is not None:
                raise ArgumentError(
                    f"`in_axes` {ax} names {where}, a {type(leaf).__name__} and not an array; "
                    "as for jax.vmap, pass None for non-array leaves (or pass it as an array)"
                )
            continue
        axes.append(ax)
        if ax is None:
            continue
        shape = np.shape(leaf)
        if not -len(shape) <= ax < len(shape):
            raise ArgumentError(f"`in_axes` {ax} is out of range for {where} with shape {shape}")
        sizes.setdefault(shape[ax], []).append(where)
    axes += [None] * (len(call.dyn) - len(axes))  # keyword arguments are not serialized
    if not sizes:
        raise ArgumentError(f"`in_axes` {settings.in_axes!r} names no array leaf of the arguments")
    _same_size(sizes, "`in_axes`")
    return axes


def param_specs(settings: Settings, call: Call) -> list:
    """The ``PartitionSpec`` ``param_specs`` gives each dynamic leaf (None: not given)."""
    if settings.param_specs is None:
        return [None] * len(call.dyn)
    per_leaf = _compat.flatten_in_axes(settings.param_specs, call.args)  # one per leaf of args
    specs = [s for s, dyn in zip(per_leaf, call.dynamic, strict=False) if dyn]
    return specs + [None] * (len(call.dyn) - len(specs))  # keyword arguments: not given


def _argnums_axes(settings: Settings, call: Call) -> list:
    argnums, axis, n = settings.argnums, settings.axis, len(call.args)
    assert argnums is not None and axis is not None, "called where argnums= names the arguments"
    for a in argnums:
        if not -n <= a < n:
            raise ArgumentError(
                f"`argnums` {a} is out of range for a call with {n} positional argument(s)"
            )
    if len({a % n for a in argnums}) < len(argnums):
        raise ArgumentError(
            f"`argnums` {argnums} names an argument twice in a call with {n} positional "
            "argument(s) (a negative index counts from the end): name each once"
        )
    dyn = call.dyn
    sizes: dict[int, list[str]] = {}
    named = set()
    for a in argnums:
        leaf_ids = call.ranges[a % n]
        if not leaf_ids:
            raise ArgumentError(f"`argnums` {a}: argument {a} has no array leaves to serialize")
        for i in leaf_ids:
            shape = np.shape(dyn[i])
            if not -len(shape) <= axis < len(shape):
                dtype = getattr(dyn[i], "dtype", None)
                if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
                    raise ArgumentError(
                        f"`argnums` {a}: argument {a} is a single PRNG key (shape ()), with no "
                        f"axis {axis} to serialize. For samples drawn from it inside the "
                        "function, drop `argnums` (the axis is found where the draw creates it) "
                        "or pass `size=` the number of samples; for one key per sample, pass "
                        "`jax.random.split(key, n)`"
                    )
                raise ArgumentError(
                    f"`axis` {axis} is out of range for a leaf of argument {a} with shape {shape}"
                )
            sizes.setdefault(shape[axis], []).append(f"argument {a} leaf {shape}")
            named.add(i)
    _same_size(sizes, f"`argnums` at `axis` {axis}")
    return [axis if i in named else None for i in range(len(dyn))]


def _same_size(sizes: dict, what: str) -> None:
    if len(sizes) > 1:
        detail = "; ".join(f"size {n}: {', '.join(w)}" for n, w in sizes.items())
        raise ArgumentError(f"the leaves named by {what} differ in size: {detail}")


def parameters_hint(settings: Settings, call: Call) -> str | None:
    """A hint where ``argnums`` names what looks like parameters, or None.

    It does where every named argument's leaves are floating and have no axis of the size
    that the other positional arguments' array leaves all share at ``axis`` (the batch the
    call passes beside them): a ``jax.grad``-style ``argnums=0`` naming the weights, whose
    gradient every output flows into, instead of the data."""
    argnums, axis, n = settings.argnums, settings.axis, len(call.args)
    if argnums is None or not isinstance(axis, int):
        return None
    dyn = call.dyn
    named = {a % n for a in argnums}
    shapes = [np.shape(dyn[i]) for a in sorted(named) for i in call.ranges[a]]
    if not all(jnp.issubdtype(dyn[i].dtype, jnp.floating) for a in named for i in call.ranges[a]):
        return None
    others = [a for a in range(n) if a not in named and call.ranges[a]]
    sizes = {
        np.shape(dyn[i])[axis]
        for a in others
        for i in call.ranges[a]
        if -len(np.shape(dyn[i])) <= axis < len(np.shape(dyn[i]))
    }
    if len(sizes) != 1 or any(size in shape for shape in shapes for size in sizes):
        return None
    (size,) = sizes
    if size <= 1:
        return None
    names = ", ".join(str(a) for a in sorted(named))
    instead = others[0] if len(others) == 1 else tuple(others)
    return (
        f"argument {names} looks like parameters, not a batch: it has no axis of size {size}, "
        f"which every other argument has at axis {axis}; `argnums` names the arguments that "
        f"carry the batch (not, as in jax.grad, those to differentiate): pass argnums={instead}"
    )
