"""Hypothesis: inputs like the example arguments, chunk sizes, and ``check``, the property.

Hypothesis is imported when first used (``pip install hypothesis``; from a clone, the
``testing`` extra)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from jaxpr_accum._base._compare import Tolerance, as_64_bit
from jaxpr_accum._base._dtypes import has_float_dtype, has_key_dtype, is_array, real_dtype
from jaxpr_accum._base._install import install_hint
from jaxpr_accum._base._settings import GRAD_MODES
from jaxpr_accum.testing._oracle import assert_as_called, assert_in_contexts, check_is_serialized
from jaxpr_accum.testing._runner import Reference, argument_label
from jaxpr_accum.testing._variants import Serialized, variant_of

if TYPE_CHECKING:  # imported when first used
    from hypothesis.strategies import SearchStrategy
T = TypeVar("T")  # a pytree: the example's

MODES = tuple(m for m in GRAD_MODES if m != "auto")
"""Every gradient mode that ``check`` tries by default: those that run, ``("remat",
"fused", "native")`` (``auto`` runs one of them)."""

# -- Hypothesis ------------------------------------------------------------------------------------


def _hypothesis() -> ModuleType:
    try:
        import hypothesis
        import hypothesis.strategies  # noqa: F401
    except ImportError as e:
        need = "jaxpr_accum.testing's strategies and `check` need Hypothesis"
        raise ImportError(f"{need}: {install_hint('testing')}") from e
    return hypothesis


#: Multipliers of a floating leaf's typical size that the strategies draw (the first: shrunk to)
MAGNITUDES = (1.0, 1e-3, 1e3, 1e-1, 10.0)
_MAGNITUDES_16BIT = (1.0, 1e-2, 1e2, 1e-1, 10.0)


@dataclasses.dataclass(frozen=True)
class _LeafSpec:
    kind: str  # "float", "int", "bool", "key", "static"
    shape: tuple = ()
    dtype: Any = None
    lo: Any = 0
    hi: Any = 0
    rms: float = 1.0
    nonneg: bool = False
    like: Any = None  # the example leaf (its sharding and array type are kept)

    @classmethod
    def of(cls, x: Any) -> _LeafSpec:  # a leaf: its array attributes read where it is one
        if not is_array(x):
            return cls("static", like=x)
        shape, dtype = tuple(x.shape), x.dtype
        if has_key_dtype(x):
            return cls("key", shape, dtype, like=x)
        if has_float_dtype(dtype):
            a = as_64_bit(x)
            finite = a[np.isfinite(a)] if a.size else a
            rms = float(np.sqrt(np.mean(np.abs(finite) ** 2))) if finite.size else 0.0
            nonneg = bool(
                not jnp.issubdtype(dtype, jnp.complexfloating)
                and finite.size
                and np.all(finite >= 0)
                and np.any(finite > 0)
            )
            return cls("float", shape, dtype, rms=rms if rms > 0 else 1.0, nonneg=nonneg, like=x)
        if dtype == np.bool_:
            return cls("bool", shape, dtype, like=x)
        a = np.asarray(x)
        lo, hi = (a.min(), a.max()) if a.size else (0, 0)
        return cls("int", shape, dtype, lo=lo, hi=hi, like=x)

    def build(self, rng: np.random.RandomState, magnitude: float) -> object:
        if self.kind == "static":
            return self.like
        if self.kind == "float":
            value: Any = rng.standard_normal(self.shape)
            if jnp.issubdtype(self.dtype, jnp.complexfloating):
                value = value + 1j * rng.standard_normal(self.shape)
            elif self.nonneg:
                value = np.abs(value)
            value = jnp.asarray(value * self.rms * magnitude, dtype=self.dtype)
        elif self.kind == "bool":
            value = jnp.asarray(rng.randint(0, 2, self.shape).astype(bool))
        elif self.kind == "int":
            lo, hi = int(self.lo), int(self.hi)
            ints = lo + (rng.randint(0, 2**31 - 1, self.shape) % (hi - lo + 1))
            value = jnp.asarray(ints.astype(np.dtype(self.dtype)))
        else:
            impl = jax.random.key_impl(self.like)
            data_shape = jax.random.key_data(self.like).shape
            data = rng.randint(0, 2**31 - 1, data_shape).astype(np.uint32)
            value = jax.random.wrap_key_data(jnp.asarray(data), impl=impl)
        if isinstance(self.like, (np.ndarray, np.generic)) and self.kind != "key":
            return np.asarray(value)
        sharding = getattr(self.like, "sharding", None)
        if sharding is not None and not isinstance(self.like, jax.core.Tracer):
            with contextlib.suppress(Exception):
                value = jax.device_put(value, sharding)
        return value


class _Recipe(Generic[T]):
    """A drawn input: a seed and one magnitude per floating leaf. Small, so that a
    counterexample prints in a line; ``build()`` makes the arrays."""

    def __init__(self, specs: list, treedef: PyTreeDef, labels: list, seed: int, mags: tuple):
        self.specs, self.treedef, self.labels = specs, treedef, labels
        self.seed, self.magnitudes = seed, mags

    def build(self) -> T:  # a pytree like the example's
        it = iter(self.magnitudes)
        leaves = []
        for i, spec in enumerate(self.specs):
            rng = np.random.RandomState((self.seed * 1_000_003 + i) % 2**32)
            leaves.append(spec.build(rng, next(it) if spec.kind == "float" else 1.0))
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def __repr__(self) -> str:
        scaled = [
            f"{label} x{m:g}"
            for label, m in zip(self.labels, self.magnitudes, strict=True)
            if m != 1.0
        ]
        return f"<inputs: seed {self.seed}; " + (
            f"scaled: {', '.join(scaled)}>" if scaled else "every float leaf at its own size>"
        )


def _recipes(args: T, label: Callable[[tuple], str] | None = None) -> SearchStrategy[_Recipe[T]]:
    st = _hypothesis().strategies
    label = label or (lambda path: jax.tree_util.keystr(path) or "<root>")
    items, treedef = jax.tree_util.tree_flatten_with_path(args)
    specs = [_LeafSpec.of(x) for _, x in items]
    floats = [
        (path, spec) for (path, _), spec in zip(items, specs, strict=True) if spec.kind == "float"
    ]
    labels = [label(tuple(p)) for p, _ in floats]
    mags = [
        st.sampled_from(MAGNITUDES if real_dtype(s.dtype).itemsize > 2 else _MAGNITUDES_16BIT)
        for _, s in floats
    ]

    @st.composite
    def recipes(draw: Callable) -> _Recipe[T]:  # composite: a counterexample prints its repr
        seed = draw(st.integers(0, 2**31 - 1))
        return _Recipe(specs, treedef, labels, seed, draw(st.tuples(*mags)))

    return recipes()


def arrays_like(args: T) -> SearchStrategy[T]:
    """A Hypothesis strategy of pytrees with the structure, shapes and dtypes of ``args``.

    Floats: normal, at the example leaf's root mean square times ``1e-3`` to ``1e3``
    (``1e-2`` to ``1e2`` in 16 bits), non-negative where the example is; integers within the
    example's range; keys of its implementation. Non-array leaves and shardings are kept; NNX
    modules come back with drawn state. Shrinks towards magnitude 1.

    Args:
        args: An example pytree, typically the tuple of a call's arguments.

    Returns:
        A Hypothesis strategy. Raises ``ImportError`` without Hypothesis.

    Examples:
        >>> strategy = testing.arrays_like((w, x))
    """
    return _recipes(args).map(lambda r: r.build())


def chunk_sizes(n: int) -> SearchStrategy[int]:
    """A Hypothesis strategy of chunk sizes for an axis of length ``n``, shrinking towards 1.

    Args:
        n: The axis length. Draws 1, a divisor, a non-divisor, ``n`` and ``n + 3``.

    Returns:
        A strategy of ints. Raises ``ValueError`` for a bad ``n``.

    Examples:
        >>> strategy = testing.chunk_sizes(10)
    """
    st = _hypothesis().strategies
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"`n` must be a non-negative int (the axis length), got {n!r}")
    n = int(n)
    options = [st.just(1)]
    divisors = [d for d in range(2, n) if n % d == 0]
    others = [d for d in range(2, n) if n % d]
    if divisors:
        options.append(st.sampled_from(divisors))
    if others:
        options.append(st.sampled_from(others))
    if n > 1:
        options.append(st.just(n))
    options.append(st.just(n + 3))
    return st.one_of(*options)


def _shards(sf: Serialized, args: object) -> int:
    """How many devices the serialized axis is split over (chunks are multiples of it)."""
    axes = getattr(sf, "mesh_axis", None)
    if not axes:
        return 1
    meshes = [jax.sharding.get_abstract_mesh()]
    meshes += [
        x.sharding.mesh
        for x in jax.tree.leaves(args)
        if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
    ]
    for mesh in meshes:
        names = tuple(getattr(mesh, "axis_names", ()))
        if names and all(a in names for a in axes):
            shape = dict(mesh.shape)
            return math.prod(int(shape[a]) for a in axes)
    return 1


def check(
    sf: Serialized,
    *args: object,
    max_examples: int = 8,
    modes: Iterable[str] = MODES,
    rtol: Tolerance = None,
    vmap: bool = True,
    **kwargs: Any,  # the function's, passed to ``explain`` too (whose own is ``grad_argnums``)
) -> None:
    """Check ``sf`` against ``sf.original`` on inputs and chunk sizes drawn by Hypothesis.

    Each example draws arguments and a chunk, then runs ``assert_matches_original`` per mode.

    Args:
        sf: A ``SerializedFunction``.
        *args: Example arguments (and ``**kwargs``): drawn ones have their shapes and dtypes.
        max_examples: How many examples Hypothesis draws (no deadline; the active profile).
        modes: The gradient modes; one that falls back is skipped if its fallback is checked.
        rtol: The tolerance, as in ``assert_matches_original``.
        vmap: Also compare under ``jax.vmap``, in each mode at the first chunk drawn.

    Raises:
        AssertionError: The smallest counterexample found, the drawn example in its notes.

    Examples:
        >>> testing.check(sf, w, x, max_examples=4)
    """
    hypothesis = _hypothesis()
    check_is_serialized(sf)
    modes = tuple(modes)
    n = int(sf.explain(*args, **kwargs).axis_size)
    d = _shards(sf, (args, kwargs))
    chunks = chunk_sizes(n // d).map(lambda c: c * d) if d > 1 else chunk_sizes(n)
    done: dict[tuple[int, str], str] = {}  # (chunk, requested mode) -> the mode it ran in
    vmap_chunk: dict[str, int] = {}  # mode -> the chunk of its vmap contexts: the first drawn

    def run(drawn_args: tuple, drawn_kwargs: dict, chunk: int) -> None:
        ref = Reference(sf.original, drawn_args, drawn_kwargs)
        checked: set[str] = set()
        for mode in modes:
            variant = variant_of(sf, mode, chunk, n)
            effective = done.get((chunk, mode))
            if effective is None:
                effective = variant.explain(*drawn_args, **drawn_kwargs).grad
                done[(chunk, mode)] = effective
            if effective in checked:
                continue  # e.g. fused fell back to remat, which is checked already
            checked.add(effective)
            in_contexts = vmap and vmap_chunk.setdefault(effective, chunk) == chunk
            (assert_in_contexts if in_contexts else assert_as_called)(
                variant, drawn_args, drawn_kwargs, rtol, ref
            )

    slow = [hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large]
    phases = [p for p in hypothesis.Phase if p.name != "explain"]

    @hypothesis.settings(
        max_examples=max_examples, deadline=None, phases=phases, suppress_health_check=slow
    )
    @hypothesis.given(inputs=_recipes((args, kwargs), argument_label), chunk=chunks)
    def jaxpr_accum_check(inputs: _Recipe[tuple[tuple, dict]], chunk: int) -> None:
        drawn_args, drawn_kwargs = inputs.build()
        run(tuple(drawn_args), dict(drawn_kwargs), chunk)

    jaxpr_accum_check()
