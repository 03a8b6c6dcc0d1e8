"""Placements: the named shardings of values, meshes (abstract and concrete) and what of
them a plan depends on (its cache key); the manual mesh axes a value varies over inside
``shard_map``, and a loop carry typed as its updates (varying, laid out) are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import jax
import numpy as np

from jaxpr_accum._compat._lookup import internal as _jax
from jaxpr_accum._compat._types import Array

_T = TypeVar("_T")


def _device_ids(mesh: object) -> tuple:
    """A concrete mesh's device ids in mesh order (``()`` for an abstract mesh)."""
    if not isinstance(mesh, jax.sharding.Mesh) or mesh.empty:
        return ()
    return tuple(np.asarray(mesh.device_ids).ravel().tolist())


def placement_key(x: object) -> tuple:
    """What of a value's placement a plan depends on: its ``NamedSharding``'s mesh, with the
    concrete device order (a plan's ``shard_map`` is bound to it), and its spec."""
    sharding = named_sharding(x)
    if sharding is None:
        return ()
    return (str(sharding.mesh.abstract_mesh), _device_ids(sharding.mesh), str(sharding.spec))


def context_mesh_key() -> tuple:
    """The context mesh (``jax.set_mesh``), abstract and concrete, and whether ``shard_map``
    checks varying manual axes there, as part of a cache key."""
    return (
        str(jax.sharding.get_abstract_mesh()),
        _device_ids(_jax("jax._src.mesh.get_concrete_mesh")()),
        bool(_jax("jax._src.config._check_vma").value),
    )


def named_sharding(x: object) -> jax.sharding.NamedSharding | None:
    """The ``NamedSharding`` of a value (concrete, or traced in explicit-sharding mode), or None."""
    traced = isinstance(x, _jax("jax.core.Tracer"))
    sharding = jax.typeof(x).sharding if traced else getattr(x, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and sharding.mesh.axis_names:
        return sharding
    return None


def explicit_axes(
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh, names: Sequence[str]
) -> bool:
    """Whether all of ``names`` are ``Explicit`` axes of ``mesh`` (shardings in the avals)."""
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    return all(types.get(n) == jax.sharding.AxisType.Explicit for n in names)


def _spec_axes(spec: jax.sharding.PartitionSpec) -> tuple[str, ...]:
    return tuple(a for e in spec if e is not None for a in ((e,) if isinstance(e, str) else e))


def explicit_sharding(x: object) -> jax.sharding.NamedSharding | None:
    """A value's ``NamedSharding`` where it shards it over ``Explicit`` mesh axes only (seen
    alike eagerly and under ``jit``), else None."""
    sharding = named_sharding(x)
    if sharding is None or not _spec_axes(sharding.spec):
        return None
    return sharding if explicit_axes(sharding.mesh, _spec_axes(sharding.spec)) else None


def laid_out_as(x: _T, spec: jax.sharding.PartitionSpec) -> _T:
    """``x`` resharded to ``spec`` on its mesh where it is sharded over ``Explicit`` axes
    otherwise (trailing whole dimensions aside); else ``x`` itself."""
    have = explicit_sharding(x)
    ndim = len(jax.typeof(x).shape) if have is not None else 0
    if have is None or _padded(have.spec, ndim) == _padded(spec, ndim):
        return x
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(have.mesh, spec))


def laid_out_as_specs(args: tuple, specs: object) -> tuple:
    """``shard_map``'s arguments, each laid out as its spec (``specs``: one per argument, a
    prefix of its tree, or one for all) where it is sharded otherwise (``laid_out_as``)."""
    specs = specs if isinstance(specs, tuple) else (specs,) * len(args)

    def laid_out(spec: jax.sharding.PartitionSpec, tree: object) -> object:
        return jax.tree_util.tree_map(lambda x: laid_out_as(x, spec), tree)

    is_spec = lambda s: isinstance(s, jax.sharding.PartitionSpec)  # noqa: E731
    return tuple(jax.tree_util.tree_map(laid_out, specs, args, is_leaf=is_spec))


def laid_out_like(x: _T, like: object) -> _T:
    """``x`` (a cotangent) laid out as ``like`` (its primal) where that is sharded over
    ``Explicit`` axes."""
    sharding = explicit_sharding(like)
    return x if sharding is None else laid_out_as(x, sharding.spec)


def _padded(spec: jax.sharding.PartitionSpec, ndim: int) -> tuple:
    return (*spec, *[None] * (ndim - len(spec)))


def explicit_spec(aval: object) -> jax.sharding.PartitionSpec | None:
    """The ``PartitionSpec`` of an aval sharded over ``Explicit`` mesh axes only, else None."""
    sharding = getattr(aval, "sharding", None)
    if not isinstance(sharding, jax.sharding.NamedSharding) or not sharding.mesh.axis_names:
        return None
    names = _spec_axes(sharding.spec)
    return sharding.spec if names and explicit_axes(sharding.mesh, names) else None


def varying_axes(x: object) -> frozenset:
    """The manual mesh axes ``x`` (an array, a tracer or an abstract value) varies over
    inside ``shard_map`` (empty elsewhere)."""
    aval = x if isinstance(x, _jax("jax.core.ShapedArray")) else jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)  # jax 0.10
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))  # jax 0.9


def vary(tree: _T, axes: frozenset) -> _T:
    """``tree``'s arrays made to vary over ``axes`` too (a no-op cast, ``pvary``), so that a
    loop carry initialised with constants has the type its updates will have."""

    def cast(x: Array) -> Array:
        missing = axes - varying_axes(x)
        return _jax("jax._src.core.pvary")(x, tuple(sorted(missing))) if missing else x

    return jax.tree_util.tree_map(cast, tree)


def typed_carry(update: Callable[[_T], object], carry: _T) -> _T:
    """A loop's initial ``carry`` typed as ``update(carry)`` types it: each leaf made to vary
    over the manual axes that the update makes it vary over, and laid out as the update lays
    it out over ``Explicit`` axes (the accumulated gradient of a parameter sharded there).
    The least fixed point, found by tracing ``update`` abstractly (the axes only grow, and
    a leaf laid out as its update stays so: it ends within a round per axis and leaf). Not
    every axis the loop reads: the cotangent of a replicated input is summed over the mesh
    inside the update (the transpose of its implicit ``pvary``) and stays replicated."""

    def fit(c: Array, u: object) -> tuple[Array, bool]:
        missing = varying_axes(u) - varying_axes(c)
        if missing:
            return vary(c, missing), True
        want, have = explicit_sharding(u), explicit_sharding(c)
        if want is not None and (have is None or have.spec != want.spec):
            return jax.sharding.reshard(c, want), True
        return c, False

    leaves, tree = jax.tree_util.tree_flatten(carry)
    while True:
        current = jax.tree_util.tree_unflatten(tree, leaves)
        updated = jax.tree_util.tree_leaves(jax.eval_shape(update, current))
        fitted = [fit(c, u) for c, u in zip(leaves, updated, strict=True)]
        if not any(changed for _, changed in fitted):
            return jax.tree_util.tree_unflatten(tree, leaves)
        leaves = [c for c, _ in fitted]


def typed(*trees: object) -> bool:
    """Whether some array of ``trees`` varies over manual axes or is sharded over
    ``Explicit`` ones: a loop carry that reads them is typed as its updates (``typed_carry``)."""
    leaves = jax.tree_util.tree_leaves(trees)
    return any(varying_axes(x) or explicit_sharding(x) is not None for x in leaves)


def union_varying(*trees: object) -> frozenset:
    """Every manual mesh axis that some array of ``trees`` varies over."""
    leaves = jax.tree_util.tree_leaves(trees)
    return frozenset().union(*(varying_axes(x) for x in leaves)) if leaves else frozenset()
