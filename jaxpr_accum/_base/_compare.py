"""The comparison: per-leaf tolerances keyed by dtype, relative to each leaf's own magnitude
(floored at a share of the largest leaf); integer, boolean and key leaves bit-identical.
A base module (JAX, NumPy and ``_dtypes`` only): ``testing`` re-exports it, ``sweep``
measures by it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxpr_accum._base._dtypes import has_float_dtype, has_key_dtype, is_array, real_dtype

_F64_RTOL, _F32_RTOL, _F16_RTOL = 1e-10, 2e-4, 2e-2
_FLOOR = 1e-3  # a leaf's scale is at least this share of the largest leaf's
_ABS_FLOOR = 1e-30  # and at least this (a tree of zeros)
_NOISE_FACTOR = 4.0  # a leaf may also differ by this many times the original's own noise

Tolerance = float | Mapping[Any, float] | None
"""The ``rtol=`` of the comparisons: ``None`` (by dtype: float64 ``1e-10``, float32 ``2e-4``,
16-bit ``2e-2``), one float for every leaf, or a mapping from dtypes to floats."""


# -- Leaves ----------------------------------------------------------------------------------------


def _default_rtol(dtype: DTypeLike) -> float:
    real = real_dtype(dtype)
    if real == jnp.dtype(jnp.float64):
        return _F64_RTOL
    if real == jnp.dtype(jnp.float32):
        return _F32_RTOL
    return _F16_RTOL  # bfloat16, float16 and narrower


def _rtol_for(dtype: DTypeLike, rtol: Tolerance) -> float:
    """``rtol`` for a leaf of ``dtype``: a float applies to every dtype; a mapping from
    dtypes to floats overrides the defaults for the dtypes it names."""
    if rtol is None:
        return _default_rtol(dtype)
    if isinstance(rtol, Mapping):
        found = jnp.dtype(dtype)
        for key, value in rtol.items():
            if jnp.dtype(key) == found:
                return float(value)
        return _default_rtol(found)
    return float(rtol)


def path_label(prefix: str, path: Sequence[Any]) -> str:
    """A leaf's name in messages: ``prefix`` and its pytree path (``output['w']``)."""
    return prefix + jax.tree_util.keystr(tuple(path))


def _fmt_index(index: tuple) -> str:
    return "()" if not index else "(" + ", ".join(str(int(i)) for i in index) + ")"


# -- The comparison --------------------------------------------------------------------------------


class Difference(NamedTuple):
    """The result of ``tree_difference``.

    Attributes:
        max_abs: The largest ``|got - ref|`` over the floating leaves.
        max_rel: The largest difference over its leaf's scale (see the module docstring).
        path: The pytree path of that leaf (``""`` when every leaf is equal).
        index: The entry's index in that leaf (``()`` when every leaf is equal).
    """

    max_abs: float
    max_rel: float
    path: str
    index: tuple  # type: ignore[assignment]  # a field named like tuple.index


@dataclasses.dataclass
class Mismatch:
    """The first leaf that differs (``where``) and the lines that say how."""

    where: str
    lines: list[str]

    def message(self, what: str, extra: Sequence[str] = ()) -> str:
        where = self.where if self.where.startswith(what) else f"{what} at {self.where}"
        head = f"jaxpr_accum.testing: {where} differs from the original's"
        return "\n  ".join([head, *self.lines, *extra])


def as_64_bit(x: jax.typing.ArrayLike) -> np.ndarray:
    """``x`` as a NumPy array of float64 (complex128 when complex), to compare exactly."""
    a = np.asarray(x)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return a.astype(np.complex128)
    return a.astype(np.float64)


class _Compared(NamedTuple):
    mismatch: Mismatch | None
    diff: Difference


def compare_trees(
    got: object,
    ref: object,
    rtol: Tolerance,
    label: Callable[[tuple], str],
    noise: Sequence[float] | None = None,
) -> _Compared:
    """Compare two pytrees leaf by leaf: the first leaf that fails, and the worst difference.

    ``label(path)`` names a leaf in messages; ``noise``: see ``compare_leaves``."""
    ref_items, ref_tree = jax.tree_util.tree_flatten_with_path(ref)
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    if got_tree != ref_tree:  # type: ignore[operator]
        lines = [f"pytree structure: serialized {got_tree}", f"original {ref_tree}"]
        return _Compared(Mismatch(label(()) or "<root>", lines), Difference(0.0, 0.0, "", ()))
    pairs = [
        (label(tuple(path)) or "<root>", g, r)
        for g, (path, r) in zip(got_leaves, ref_items, strict=True)
    ]
    return compare_leaves(pairs, rtol, noise)


class _Float(NamedTuple):
    """A floating leaf, checked for shape, dtype and non-finite entries, ready to compare."""

    where: str
    dtype: Any
    got: np.ndarray  # float64 (complex128)
    ref: np.ndarray
    finite: np.ndarray  # where ``ref`` is finite
    own: float  # ``max|ref|`` over its finite entries
    noise: float


def compare_leaves(
    pairs: Sequence[tuple[str, object, object]],
    rtol: Tolerance,
    noise: Sequence[float] | None = None,
) -> _Compared:
    """``pairs``: ``(name, got, ref)`` for each leaf of one tree (the scale floor is shared).

    ``noise``: per leaf, how far the original itself moves when its inputs move by one
    rounding error (absolute); a leaf may differ by ``_NOISE_FACTOR`` times that."""
    none = Difference(0.0, 0.0, "", ())
    floats = []
    noise = [0.0] * len(pairs) if noise is None else list(noise)
    for (where, g, r), leaf_noise in zip(pairs, noise, strict=True):
        checked = _check_leaf(where, g, r, leaf_noise)
        if isinstance(checked, Mismatch):
            return _Compared(checked, none)
        if checked is not None:
            floats.append(checked)
    top = max((leaf.own for leaf in floats), default=0.0)
    worst = none
    first: Mismatch | None = None
    for leaf in floats:
        if leaf.ref.size == 0:
            continue
        scale = max(leaf.own, _FLOOR * top, _ABS_FLOOR)
        err_all = np.zeros(leaf.ref.shape)
        err_all[leaf.finite] = np.abs(leaf.got[leaf.finite] - leaf.ref[leaf.finite])
        flat = int(np.argmax(err_all))
        index = tuple(int(i) for i in np.unravel_index(flat, err_all.shape))
        err = float(err_all.reshape(-1)[flat])
        rel = err / scale
        if rel > worst.max_rel:
            worst = Difference(max(worst.max_abs, err), rel, leaf.where, index)
        else:
            worst = worst._replace(max_abs=max(worst.max_abs, err))
        tol = _rtol_for(leaf.dtype, rtol)
        allowed = max(tol * scale, _NOISE_FACTOR * leaf.noise)
        if first is None and not err <= allowed:
            first = _float_mismatch(leaf, index, err, tol, scale, top)
    return _Compared(first, worst)


def _check_leaf(where: str, g: Any, r: Any, leaf_noise: float) -> Mismatch | _Float | None:
    """One leaf's checks that need no tolerance: a non-array equal, the same shape and dtype,
    integer, boolean and key leaves bit-identical, non-finite entries alike. A mismatch, the
    floating leaf to compare, or None (nothing more to compare)."""
    if not is_array(r):
        if not (g is r or g == r):
            return Mismatch(where, [f"serialized {g!r}, original {r!r}"])
        return None
    if not is_array(g):
        return Mismatch(where, [f"serialized is a {type(g).__name__}, original an array"])
    if g.shape != r.shape or g.dtype != r.dtype:
        lines = [f"serialized {g.dtype}{list(g.shape)}, original {r.dtype}{list(r.shape)}"]
        return Mismatch(where, lines)
    if r.dtype == jax.dtypes.float0:
        return None
    if has_key_dtype(r):
        g, r = jax.random.key_data(g), jax.random.key_data(r)
    if not has_float_dtype(r):
        g_np, r_np = np.asarray(g), np.asarray(r)
        if not np.array_equal(g_np, r_np):
            bad = tuple(np.argwhere(g_np != r_np)[0]) if g_np.ndim else ()
            n = int(np.sum(g_np != r_np))
            line = (
                f"{r.dtype} values must be bit-identical; {n} of {r_np.size} differ, first "
                f"at index {_fmt_index(bad)}: serialized {g_np[bad]}, original {r_np[bad]}"
            )
            return Mismatch(where, [line])
        return None
    g64, r64 = as_64_bit(g), as_64_bit(r)
    finite = np.isfinite(r64)
    same = (g64 == r64) | (np.isnan(g64) & np.isnan(r64))
    bad_mask = (np.isfinite(g64) != finite) | (~finite & ~same)
    if np.any(bad_mask):
        bad = tuple(np.argwhere(bad_mask)[0]) if r64.ndim else ()
        line = (
            f"non-finite entries differ, first at index {_fmt_index(bad)}: "
            f"serialized {g64[bad]}, original {r64[bad]}"
        )
        return Mismatch(where, [line])
    own = float(np.max(np.abs(r64[finite]), initial=0.0))
    return _Float(where, r.dtype, g64, r64, finite, own, leaf_noise)


def _float_mismatch(
    leaf: _Float, index: tuple, err: float, tol: float, scale: float, top: float
) -> Mismatch:
    """The message of a floating leaf outside its tolerance."""
    if scale == leaf.own:
        basis = "the leaf's own magnitude"
    elif scale > _ABS_FLOOR:
        basis = f"{_FLOOR:g} of the largest leaf's magnitude {top:.4g}"
    else:
        basis = "the absolute floor: the original is zero everywhere"
    lines = [
        f"worst |serialized - original| = {err:.3e} at index {_fmt_index(index)}: "
        f"serialized {leaf.got[index]:.8g}, original {leaf.ref[index]:.8g}",
        f"relative error {err / scale:.3e} > tolerance {tol:.1e} ({leaf.dtype}), at scale "
        f"{scale:.4g} ({basis})",
    ]
    if leaf.noise > 0:
        lines.append(
            f"and > {_NOISE_FACTOR:g} x {leaf.noise:.3e}, what the original itself moves by "
            "when its values move by one rounding error"
        )
    return Mismatch(leaf.where, lines)


def tree_difference(got: object, ref: object) -> Difference:
    """The largest difference between two pytrees of arrays, by the per-leaf rule.

    Args:
        got: The pytree to measure.
        ref: The reference pytree.

    Returns:
        A ``Difference``; its ``max_rel`` is what ``assert_tree_close`` checks.

    Raises:
        AssertionError: Structures, shapes, dtypes or non-floating leaves differ.
    """
    compared = compare_trees(got, ref, float("inf"), lambda p: path_label("", p))
    if compared.mismatch is not None:
        raise AssertionError(compared.mismatch.message("the tree"))
    return compared.diff


def assert_tree_close(
    got: object, ref: object, *, rtol: Tolerance = None, what: str = "output"
) -> None:
    """Assert that ``got`` matches ``ref`` by the per-leaf rule (see the module docstring).

    Args:
        got: The pytree to check.
        ref: The reference pytree.
        rtol: ``None``: the defaults by dtype; a float; or a mapping from dtypes to floats.
        what: The tree's name in the message.

    Raises:
        AssertionError: A leaf differs (named by its path), or the trees differ in structure.

    Examples:
        >>> testing.assert_tree_close(jax.grad(sf)(w, x), jax.grad(loss)(w, x))
    """
    compared = compare_trees(got, ref, rtol, lambda p: path_label(what, p))
    if compared.mismatch is not None:
        raise AssertionError(compared.mismatch.message(what))
