"""``serialize_axis`` and ``SerializedFunction``: argument checks, the trace cache, dispatch.

Arguments are checked at decoration (``chunk``, ``axis``, ``argnums``, ``size``, ``grad``,
``accum_dtype``) and at the first call with given shapes (``argnums`` / ``axis`` against the
actual arguments, equal sizes across leaves), so a mistake is reported in the user's terms
and never as a traceback from inside the rewriter. Each distinct call signature (avals and
static leaves) is traced, analysed and planned once, like ``jax.jit``; a function that closes
over tracers of an enclosing transformation is re-traced on each call (its constants are
those tracers).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxpr_accum import _compat, _nnx, _plan, _trace
from jaxpr_accum._axes import Analysis
from jaxpr_accum._build import FUSED_MAX_WIDTH, Layout, ShardedLayout, build, fused_refusal
from jaxpr_accum._compat import ClosedJaxpr
from jaxpr_accum._errors import SerializeError
from jaxpr_accum._plan import RegionPlan
from jaxpr_accum._report import Plan
from jaxpr_accum._rules import AxisLoc

GRAD_MODES = ("auto", "remat", "fused", "native")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"`{name}` must be an integer, got {value!r} ({type(value).__name__})")
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}, got {value}")
    return value


class _Prepared:
    """One call signature's trace, plan and runnable program."""

    def __init__(self, traced: _trace.Traced, region: RegionPlan, plan: Plan, run: Callable):
        self.traced, self.region, self.plan = traced, region, plan
        self.run = run
        self.jitted = jax.jit(run)
        self.warned = False


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated arguments of ``serialize_axis`` (immutable: a new setting is a new
    ``SerializedFunction``, never a stale plan)."""

    chunk: int
    axis: int | None = 0
    argnums: tuple[int, ...] | None = None
    size: int | None = None
    grad: str = "auto"
    accum_dtype: Any = None
    mesh_axis: tuple[str, ...] | None = None

    @classmethod
    def validated(
        cls,
        *,
        chunk: Any,
        axis: Any = 0,
        argnums: Any = None,
        size: Any = None,
        grad: Any = "auto",
        accum_dtype: Any = None,
        mesh_axis: Any = None,
    ) -> Settings:
        chunk = _check_int("chunk", chunk, 1)
        if axis is not None:
            axis = _check_int("axis", axis, -(2**31))
        if argnums is not None:
            nums = (argnums,) if not isinstance(argnums, (tuple, list)) else tuple(argnums)
            if not nums:
                raise ValueError("`argnums` must name at least one argument")
            argnums = tuple(_check_int("argnums", a, -(2**31)) for a in nums)
            if axis is None:
                raise ValueError(
                    "`axis=None` needs automatic selection; with `argnums` pass an int"
                )
        size = None if size is None else _check_int("size", size, 1)
        if argnums is not None and size is not None:
            raise ValueError("pass either `argnums` or `size`, not both")
        if grad not in GRAD_MODES:
            raise ValueError(
                f"`grad` must be one of {', '.join(map(repr, GRAD_MODES))}; got {grad!r}"
            )
        if accum_dtype is not None:
            accum_dtype = _check_accum_dtype(accum_dtype)
        if mesh_axis is not None:
            axes = (mesh_axis,) if isinstance(mesh_axis, str) else mesh_axis
            if not (
                isinstance(axes, (tuple, list)) and axes and all(isinstance(a, str) for a in axes)
            ):
                raise TypeError(
                    f"`mesh_axis` must be a mesh axis name or a tuple of names, got {mesh_axis!r}"
                )
            mesh_axis = tuple(axes)
        return cls(chunk, axis, argnums, size, grad, accum_dtype, mesh_axis)


def _check_accum_dtype(accum_dtype: Any) -> Any:
    try:
        dtype = jnp.dtype(accum_dtype)
    except TypeError as e:
        raise TypeError(f"`accum_dtype` must be a dtype, got {accum_dtype!r}") from e
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"`accum_dtype` must be a floating dtype, got {dtype}")
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:  # 64-bit types without x64
        raise ValueError(
            f"`accum_dtype` {dtype} needs 64-bit floats, which are disabled: enable them "
            "with `jax.config.update('jax_enable_x64', True)` before creating the function, "
            "or pass `accum_dtype=jnp.float32`"
        )
    return dtype


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"The `{name}` setting.")


class SerializedFunction:
    """``fun`` with one axis run in chunks. See ``serialize_axis``.

    The settings (``chunk``, ``axis``, ...) are read-only; ``serialize_axis(sf.original,
    ...)`` makes a function with other settings.
    """

    settings: Settings
    original: Callable
    _cache: dict
    _pure: SerializedFunction | None

    chunk = _setting("chunk")
    axis = _setting("axis")
    argnums = _setting("argnums")
    size = _setting("size")
    grad = _setting("grad")
    accum_dtype = _setting("accum_dtype")
    mesh_axis = _setting("mesh_axis")

    def __init__(self, fun: Callable, settings: Settings):
        if not callable(fun):
            raise TypeError(f"`fun` must be callable, got {fun!r}")
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "original", fun)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_pure", None)
        functools.update_wrapper(self, fun)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SETTING_NAMES or name in ("settings", "original"):
            raise AttributeError(
                f"`{name}` of a SerializedFunction is read-only (its plans are cached); make "
                f"a new one instead: `serialize_axis(sf.original, {name}=...)`"
            )
        object.__setattr__(self, name, value)

    # -- public --------------------------------------------------------------------------
    @_compat.api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._pure is not self and _nnx.has_graph_nodes(args, kwargs):
            states, kw_states = _nnx.pure_arguments(args, kwargs)
            out, new_states, new_kw = self._pure_version()(*states, **kw_states)
            _nnx.write_back(args, kwargs, new_states, new_kw)
            return out
        prepared, inputs = self._prepare(args, kwargs)
        if prepared.plan.warning and not prepared.warned and prepared.region.size:
            prepared.warned = True
            warnings.warn(f"{self!r}: {prepared.plan.warning}", UserWarning, stacklevel=2)
        outs = prepared.jitted(*inputs)
        return jax.tree_util.tree_unflatten(prepared.traced.out_tree, outs)

    @_compat.api_boundary
    def explain(self, *args: Any, **kwargs: Any) -> Plan:
        if self._pure is not self and _nnx.has_graph_nodes(args, kwargs):
            states, kw_states = _nnx.pure_arguments(args, kwargs)
            return self._pure_version().explain(*states, **kw_states)
        return self._prepare(args, kwargs)[0].plan

    @_compat.api_boundary
    def jaxpr(self, *args: Any, **kwargs: Any) -> ClosedJaxpr:
        if self._pure is not self and _nnx.has_graph_nodes(args, kwargs):
            states, kw_states = _nnx.pure_arguments(args, kwargs)
            return self._pure_version().jaxpr(*states, **kw_states)
        prepared, inputs = self._prepare(args, kwargs)
        return jax.make_jaxpr(prepared.run)(*inputs)

    def __repr__(self) -> str:
        name = getattr(self.original, "__name__", self.original)
        return f"serialize_axis({name!r}, chunk={self.chunk})"

    # -- internals -----------------------------------------------------------------------
    def _pure_version(self) -> SerializedFunction:
        """The same serialization of ``fun`` as a pure function of NNX state (see ``_nnx``)."""
        pure = self._pure
        if pure is None:
            pure = SerializedFunction(_nnx.purify(self.original), self.settings)
            object.__setattr__(pure, "_pure", pure)  # its arguments are already pure state
            object.__setattr__(self, "_pure", pure)
        return pure

    def _prepare(self, args: tuple, kwargs: dict) -> tuple[_Prepared, list]:
        leaves, treedef, dynamic, ranges = _trace.split_arguments(args, kwargs)
        dyn = [x for x, d in zip(leaves, dynamic, strict=True) if d]
        key = _trace.cache_key(leaves, treedef, dynamic)
        prepared = self._cache.get(key) if key is not None else None
        if prepared is None:
            _check_concrete_shapes(args, kwargs)
            if self.argnums is not None:
                self._check_argnums(args, dyn, ranges)
            traced = _trace.trace(self.original, leaves, treedef, dynamic, ranges)
            prepared = self._plan(traced, [*traced.consts, *dyn])
            if key is not None and not traced.has_tracer_consts:
                self._cache[key] = prepared
            inputs = [*traced.consts, *dyn]
        else:
            inputs = [*prepared.traced.consts, *dyn]
        return prepared, inputs

    def _check_argnums(self, args: tuple, dyn: list, ranges: list) -> None:
        assert self.argnums is not None and self.axis is not None  # checked at decoration
        argnums, axis = self.argnums, self.axis
        n = len(args)
        for a in argnums:
            if not -n <= a < n:
                raise ValueError(
                    f"`argnums` {a} is out of range for a call with {n} positional argument(s)"
                )
        sizes: dict[int, list[str]] = {}
        for a in argnums:
            leaf_ids = ranges[a % n]
            if not leaf_ids:
                raise ValueError(f"`argnums` {a}: argument {a} has no array leaves to serialize")
            for i in leaf_ids:
                shape = jnp.shape(dyn[i])
                if not -len(shape) <= axis < len(shape):
                    raise ValueError(
                        f"`axis` {axis} is out of range for a leaf of argument {a} "
                        f"with shape {shape}"
                    )
                sizes.setdefault(shape[axis], []).append(f"argument {a} leaf {shape}")
        if len(sizes) > 1:
            detail = "; ".join(f"size {n}: {', '.join(w)}" for n, w in sizes.items())
            raise ValueError(
                f"the leaves named by `argnums` differ in size at `axis` {self.axis}: {detail}"
            )

    def _plan(self, traced: _trace.Traced, inputs: list) -> _Prepared:
        jaxpr = traced.jaxpr
        nc = traced.n_consts
        names = {v: f"closed-over value {i}" for i, v in enumerate(jaxpr.invars[:nc])}
        for a, r in enumerate(traced.arg_leaf_ranges):
            for j, i in enumerate(r):
                names[jaxpr.invars[nc + i]] = f"argument {a}" + (f" leaf {j}" if len(r) > 1 else "")
        for i, v in enumerate(jaxpr.invars[nc:]):
            names.setdefault(v, f"keyword argument leaf {i}")

        if self.argnums is not None:
            assert self.axis is not None  # checked at decoration
            n_args = len(traced.arg_leaf_ranges)
            seeds = []
            for a in self.argnums:
                for i in traced.arg_leaf_ranges[a % n_args]:
                    v = jaxpr.invars[nc + i]
                    seeds.append((v, AxisLoc(self.axis % len(_compat.shape_of(v)))))
            size = _compat.shape_of(seeds[0][0])[seeds[0][1].dim]
            analysis = Analysis(jaxpr, size).run(seeds)
            born = ", ".join(sorted({names[v] for v, _ in seeds})) + f" at axis {self.axis}"
            candidates = [_plan.make_plan(jaxpr, analysis, self.chunk, born)]
            what = f"`argnums` {self.argnums}"
        else:
            candidates = _plan.find_candidates(jaxpr, self.chunk, self.axis, self.size, names)
            if self.size is not None:
                what = f"an axis of size {self.size}"
            else:
                what = f"an axis longer than `chunk` {self.chunk}"
            if not candidates:
                where = "at any position" if self.axis is None else f"born at position {self.axis}"
                hint = (
                    "check `size` and `axis`, or pass `argnums=`"
                    if self.size is not None
                    else "pass `argnums=` or `size=` to name it"
                )
                raise SerializeError(f"found no {what[3:]} {where}; {hint}")
        usable = [c for c in candidates if c.usable]
        if not usable:
            raise _plan.nothing_chunkable(candidates, what)
        region = _plan.choose(usable)  # several axes of the asked size: the cost model picks
        grad, reason = self._grad_mode(region)
        layout = self._layout(traced, region, inputs)
        plan = Plan.from_region(region, usable, grad, reason, layout)
        return _Prepared(traced, region, plan, build(region, grad, self.accum_dtype, layout))

    def _layout(self, traced: _trace.Traced, region: RegionPlan, inputs: list) -> Layout:
        """Where the axis lives: one device, or sharded over mesh axes (see ``_build``)."""
        carrying = [
            (x, loc)
            for v, x in zip(traced.jaxpr.invars, inputs, strict=True)
            if (loc := region.analysis.loc((), v)) is not None
        ]
        axes, mesh = self.mesh_axis, None
        for x, loc in carrying:
            sharding = _compat.named_sharding(x)
            if sharding is None:
                continue
            entry = sharding.spec[loc.dim] if loc.dim < len(sharding.spec) else None
            names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            if axes is None and names and _compat.explicit_axes(sharding.mesh, names):
                axes = names  # only explicit axes are seen alike eagerly and under jit
            mesh = mesh or sharding.mesh
        if axes is None:
            return Layout()
        context = jax.sharding.get_abstract_mesh()
        if context.axis_names:
            mesh = context
        if mesh is None:
            raise ValueError(
                f"`mesh_axis` {axes} needs a mesh: call under `jax.set_mesh(mesh)` or pass "
                "inputs sharded with a `NamedSharding`"
            )
        missing = [a for a in axes if a not in mesh.axis_names]
        if missing:
            raise ValueError(
                f"`mesh_axis` names {missing}, which the mesh does not have "
                f"(its axes: {tuple(mesh.axis_names)})"
            )
        layout = ShardedLayout(mesh, axes)
        d = layout.devices
        if d == 1:
            return Layout()
        if region.size % d:
            raise ValueError(
                f"the serialized axis has size {region.size}, which {d} shards over {axes} "
                "do not divide"
            )
        if self.chunk % d:
            lower, upper = self.chunk // d * d, (self.chunk // d + 1) * d
            nearest = f"{lower} and {upper}" if lower else f"{upper} (the smallest)"
            raise ValueError(
                f"`chunk` {self.chunk} must be a multiple of the {d} shards of mesh axis "
                f"{axes}; the nearest valid chunk sizes are {nearest}"
            )
        return layout

    def _grad_mode(self, region: RegionPlan) -> tuple[str, str]:
        if self.grad in ("remat", "native"):
            return self.grad, "requested"
        refusal = fused_refusal(region, 1 if self.grad == "auto" else FUSED_MAX_WIDTH)
        if refusal is None:
            why = "every output of the region is a small sum: value and gradient in one pass"
            return "fused", ("auto: " if self.grad == "auto" else "requested: ") + why
        return "remat", f"fused does not apply: {refusal}"


def serialize_axis(
    fun: Callable | None = None,
    *,
    chunk: int,
    axis: int | None = 0,
    argnums: int | tuple[int, ...] | None = None,
    size: int | None = None,
    grad: str = "auto",
    accum_dtype: Any = None,
    mesh_axis: Any = None,
) -> Any:
    """Run one axis of ``fun`` in chunks of ``chunk``, with the same values and gradients.

    Use as ``@serialize_axis(chunk=4)`` or ``serialize_axis(f, chunk=4)``. The axis is the
    one named by ``argnums`` (position ``axis`` of those arguments' array leaves), the one of
    size ``size``, or else found automatically. See DESIGN.md for the full contract.
    """
    settings = Settings.validated(
        chunk=chunk,
        axis=axis,
        argnums=argnums,
        size=size,
        grad=grad,
        accum_dtype=accum_dtype,
        mesh_axis=mesh_axis,
    )
    if fun is None:
        return lambda f: SerializedFunction(f, settings)
    return SerializedFunction(fun, settings)


_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))


def _check_concrete_shapes(args: tuple, kwargs: dict) -> None:
    """Symbolic dimensions (``jax.export`` shape polymorphism) cannot be chunked."""
    paths = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    for path, leaf in paths:
        shape = getattr(leaf, "shape", ())
        if _trace.is_dynamic(leaf) and not all(isinstance(d, int) for d in shape):
            raise SerializeError(
                f"{_trace.describe_argument(path)} has the symbolic shape {shape}; "
                "serialize_axis plans chunks for concrete sizes. Export the function at a "
                "concrete batch size, or export the original (unserialized) function."
            )
