"""``assert_matches_original``: values and reverse-mode derivatives of a serialized function
against its original, each compiled once per argument structure; copies in other modes and
chunk sizes."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _nnx
from jaxpr_accum._errors import PlanWarning
from jaxpr_accum.testing._compare import (
    Tolerance,
    _argument_label,
    _as_f64,
    _compare,
    _compare_leaves,
    _is_array,
    _is_float,
    _is_key,
    _label,
    _Mismatch,
)
from jaxpr_accum.testing._noise import with_rounding_noise
from jaxpr_accum.testing._vmap import contexts

# --------------------------------------------------------------------------------------------
# Running a function and its original on the same arguments
# --------------------------------------------------------------------------------------------


class _Split(NamedTuple):
    """The arguments ``(args, kwargs)`` as differentiated, passed-through and static leaves."""

    treedef: Any
    kinds: tuple[str, ...]  # "diff" (floating array), "dyn" (other array), "static"
    diff: list
    dyn: list
    static: tuple
    diff_labels: list[str]
    stateful: bool  # some argument is a Flax NNX object, whose state a call may change


def _split(args: tuple, kwargs: dict) -> _Split:
    items, treedef = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)))
    kinds, diff, dyn, static, labels = [], [], [], [], []
    for path, leaf in items:
        if _is_float(leaf):
            kinds.append("diff")
            diff.append(leaf)
            labels.append(_argument_label(path))
        elif _is_array(leaf):
            kinds.append("dyn")
            dyn.append(leaf)
        else:
            kinds.append("static")
            static.append(leaf)
    stateful = _nnx.has_graph_nodes(tuple(args), dict(kwargs))
    return _Split(treedef, tuple(kinds), diff, dyn, tuple(static), labels, stateful)


def _rebuild(s: _Split, diff: list, dyn: list) -> tuple[tuple, dict]:
    it = {"diff": iter(diff), "dyn": iter(dyn), "static": iter(s.static)}
    return jax.tree_util.tree_unflatten(s.treedef, [next(it[k]) for k in s.kinds])


def _cotangent(out: Any, seed: int) -> Any:
    """1 for a single scalar float output (the gradient), else a random normal cotangent per
    float leaf; float0 zeros for the other leaves. Only shapes and dtypes of ``out`` are read,
    so this runs on tracers: the cotangent is a constant of the compiled program."""
    leaves = jax.tree.leaves(out)
    single = (
        len(leaves) == 1
        and jnp.shape(leaves[0]) == ()
        and not _is_key(leaves[0])
        and jnp.issubdtype(leaves[0].dtype, jnp.inexact)
    )
    rng = np.random.RandomState(seed)

    def make(leaf: Any) -> Any:
        shape = jnp.shape(leaf)
        if _is_key(leaf) or not jnp.issubdtype(leaf.dtype, jnp.inexact):
            return np.zeros(shape, dtype=jax.dtypes.float0)
        if single:
            return jnp.ones((), leaf.dtype)
        value = rng.standard_normal(shape)
        if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
            value = value + 1j * rng.standard_normal(shape)
        return jnp.asarray(value, dtype=leaf.dtype)

    return jax.tree.map(make, out)


def _compiler_options() -> dict | None:
    """On CPU, XLA's backend (LLVM) optimisation off: about 3x faster to compile, the same
    HLO and the same floating-point semantics; these programs run once or a few times."""
    if jax.default_backend() == "cpu":
        return {"xla_backend_optimization_level": 0}
    return None


def _arrays_only(tree: Any) -> Any:
    return jax.tree.map(lambda x: x if _is_array(x) else None, tree)


# Compiled runners, per function and argument structure; bounded, so that the executables
# of one-off functions do not pile up.
_RUNNERS: OrderedDict[Any, Callable[..., Any]] = OrderedDict()
_RUNNERS_SIZE = 32


def _runner(fun: Callable, s: _Split, primal: bool, seed: int, noisy: bool = False) -> Callable:
    """``run(diff, dyn[, noise_seed]) -> (plain, out, state, cotangents)``, jitted, cached.

    ``out`` and the input cotangents come from ``jax.vjp`` with the cotangent of
    ``_cotangent(out, seed)``; ``plain`` is the output of a plain call (no differentiation,
    which takes another path through a serialized function; ``None`` unless ``primal``);
    ``state`` the arguments' array leaves after the call (Flax NNX objects change their
    state; ``None`` unless ``s.stateful``). ``noisy``: ``fun`` runs with a rounding error
    added to every value computed from the floating inputs (see ``_noise``).
    """
    key = (fun, s.treedef, s.kinds, s.static, primal, seed, noisy)
    try:
        cached = _RUNNERS[key]
    except (KeyError, TypeError):
        pass
    else:
        _RUNNERS.move_to_end(key)
        return cached

    def call(diff: list, dyn: list) -> tuple[Any, Any]:
        args, kwargs = _rebuild(s, diff, dyn)
        out = fun(*args, **kwargs)
        return out, (_arrays_only((args, kwargs)) if s.stateful else None)

    def run(diff: list, dyn: list, noise_seed: Any = None) -> tuple:
        f = call if noise_seed is None else with_rounding_noise(call, noise_seed)
        plain = f(diff, dyn)[0] if primal else None
        out, pullback, state = jax.vjp(lambda d: f(d, dyn), diff, has_aux=True)
        return plain, out, state, pullback(_cotangent(out, seed))[0]

    run = jax.jit(run, compiler_options=_compiler_options())
    with contextlib.suppress(TypeError):  # an unhashable static leaf: no caching
        _RUNNERS[key] = run
        while len(_RUNNERS) > _RUNNERS_SIZE:
            _RUNNERS.popitem(last=False)
    return run


def _plan_line(sf: Any, args: tuple, kwargs: dict) -> str:
    try:
        plan = sf.explain(*args, **kwargs)
    except Exception as e:  # the comparison failed; say so even if the plan cannot be shown
        return f"plan: unavailable ({type(e).__name__}: {e})"
    return (
        f"plan: grad mode {plan.grad!r}, chunk {plan.chunk} of an axis of size "
        f"{plan.axis_size} ({plan.n_chunks} chunk{'s' if plan.n_chunks != 1 else ''}), "
        f"born at {plan.born}"
    )


def _settings(sf: Any, axis_size: int) -> dict:
    """The settings of ``sf`` that a copy with another mode or chunk keeps.

    An axis found automatically is pinned by its size: automatic selection only considers
    axes longer than ``chunk``, so at a chunk of the axis's length or more it would choose
    another axis (or none).
    """
    names = ("axis", "argnums", "size", "accum_dtype", "mesh_axis")
    settings = {n: getattr(sf, n) for n in names}
    in_axes = getattr(sf, "in_axes", None)
    if in_axes is not None:
        settings["in_axes"] = in_axes
    elif settings["argnums"] is None and settings["size"] is None:
        settings["size"] = axis_size
    return settings


# Copies of a SerializedFunction in other modes and at other chunk sizes, kept as long as
# the function itself, so that repeated checks reuse their traces and compiled runners.
_VARIANTS: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def _is_variant(sf: Any) -> bool:
    return any(sf is v for cache in list(_VARIANTS.values()) for v in cache.values())


def _variant(sf: Any, grad: str, chunk: int, axis_size: int) -> Any:
    """``sf`` in gradient mode ``grad`` at ``chunk`` (``sf`` itself if it is that)."""
    import jaxpr_accum

    if sf.grad == grad and sf.chunk == chunk:
        return sf
    try:
        cache = _VARIANTS.setdefault(sf, {})
    except TypeError:
        cache = {}
    key = (grad, chunk, axis_size)
    if key not in cache:
        cache[key] = jaxpr_accum.serialize_axis(
            sf.original, chunk=chunk, grad=grad, **_settings(sf, axis_size)
        )
    return cache[key]


def _check_serialized(sf: Any) -> None:
    if not (hasattr(sf, "original") and hasattr(sf, "explain") and callable(sf)):
        raise TypeError(
            "expected a SerializedFunction (the result of `jaxpr_accum.serialize_axis`), got "
            f"{sf!r}; to compare two trees, use `jaxpr_accum.testing.assert_tree_close`"
        )


class _Reference:
    """The original's results on one set of arguments and, computed when first needed, how
    far each leaf moves when every value computed from the floating inputs moves by one
    rounding error (the noise that any reordering of the arithmetic makes)."""

    def __init__(self, original: Callable, args: tuple, kwargs: dict, seed: int = 0):
        s = _split(args, kwargs)
        if not s.diff:
            raise ValueError(
                "nothing to differentiate: the arguments have no floating-point array leaf"
            )
        self.original, self.split, self.seed = original, s, seed
        _, self.out, self.state, self.ct = _runner(original, s, False, seed)(s.diff, s.dyn)
        self._noise: tuple | None = None

    def noise(self) -> tuple[list[float], list[float], list[float]]:
        """``(outputs, state, cotangents)``: per leaf, the largest move over two noisy runs."""
        if self._noise is None:
            s = self.split
            noisy = _runner(self.original, s, False, self.seed, noisy=True)
            moved = [noisy(s.diff, s.dyn, np.uint32(k))[1:] for k in (1, 2)]
            self._noise = (
                _noise(self.out, [m[0] for m in moved]),
                _noise(self.state, [m[1] for m in moved]),
                _noise(self.ct, [m[2] for m in moved]),
            )
        return self._noise


def _noise(ref: Any, moved: list) -> list[float]:
    """Per leaf of ``ref``: the largest ``|moved - ref|`` over the runs in ``moved``."""
    leaves = jax.tree.leaves(ref)
    noise = [0.0] * len(leaves)
    for other in moved:
        other_leaves = jax.tree.leaves(other)
        if len(other_leaves) != len(leaves):
            continue
        for i, (r, m) in enumerate(zip(leaves, other_leaves, strict=True)):
            if not _is_float(r) or jnp.shape(r) != jnp.shape(m) or not np.size(r):
                continue
            r64, m64 = _as_f64(r), _as_f64(m)
            both = np.isfinite(r64) & np.isfinite(m64)
            d = float(np.max(np.abs(r64 - m64), where=both, initial=0.0))
            noise[i] = max(noise[i], d)
    return noise


def _assert_one(
    sf: Any,
    args: tuple,
    kwargs: dict,
    rtol: Tolerance,
    ref: _Reference | None = None,
    seed: int = 0,
    where: str = "",
) -> None:
    ref = ref or _Reference(sf.original, args, kwargs, seed)
    s = ref.split
    with warnings.catch_warnings():
        if _is_variant(getattr(sf, "sf", sf)):  # the user's function warns; copies do not
            warnings.simplefilter("ignore", PlanWarning)
        plain, out, state, got_ct = _runner(sf, s, True, seed)(s.diff, s.dyn)

    def output(path: tuple) -> str:
        return _label("output", path)

    def argument(path: tuple) -> str:
        return _argument_label(path) if path else "the arguments"

    gradients = list(zip(s.diff_labels, got_ct, ref.ct, strict=True))

    def compare(noise: tuple | None) -> tuple[str, _Mismatch] | None:
        n_out, n_state, n_ct = noise or (None, None, None)
        results = [
            ("output", _compare(plain, ref.out, rtol, output, n_out)),
            ("output under jax.vjp", _compare(out, ref.out, rtol, output, n_out)),
            ("gradient", _compare_leaves(gradients, rtol, n_ct)),
        ]
        if s.stateful:
            results.append(
                ("state after the call", _compare(state, ref.state, rtol, argument, n_state))
            )
        return next(((w, c.mismatch) for w, c in results if c.mismatch is not None), None)

    # The original's own rounding noise costs one more compilation: only when needed.
    failed = compare(None) and compare(ref.noise())
    if failed:
        what, mismatch = failed
        raise AssertionError(mismatch.message(what + where, [_plan_line(sf, args, kwargs)]))


def assert_in_contexts(
    sf: Any, args: tuple, kwargs: dict, rtol: Tolerance, ref: _Reference | None = None
) -> None:
    """``_assert_one`` as called, then under each ``jax.vmap`` context (``_vmap``)."""
    _assert_one(sf, args, kwargs, rtol, ref)
    if _nnx.has_graph_nodes(tuple(args), dict(kwargs)):
        return  # Flax NNX objects are not arrays to batch
    for context in contexts(sf, tuple(args)):
        batched = context.batch(tuple(args))
        try:
            reference = _Reference(context.original, batched, kwargs)
        except Exception:  # the original itself does not run under this vmap: nothing to compare
            continue
        _assert_one(context, batched, kwargs, rtol, reference, where=f" {context.what}")


def assert_matches_original(
    sf: Any,
    *args: Any,
    rtol: Tolerance = None,
    modes: Iterable[str] | None = None,
    chunks: Iterable[int] | None = None,
    vmap: bool = True,
    **kwargs: Any,
) -> None:
    """Assert that ``sf(*args, **kwargs)`` and its derivatives equal ``sf.original``'s.

    Compared: the outputs of a plain call, the outputs under ``jax.vjp``, and the
    cotangents of every floating-point array leaf of the arguments (keyword arguments
    included) for a random cotangent on the outputs (for a single scalar output, the
    gradient). Integer, boolean and PRNG-key leaves are passed through undifferentiated, and
    outputs of those kinds must be bit-identical. Flax NNX objects among the arguments are
    compared after the call as well (their random-number counters, say). Both functions run
    under ``jax.jit``, each compiled once per argument structure.

    ``rtol``: ``None`` for the defaults by dtype (float64 ``1e-10``, float32 ``2e-4``,
    bfloat16 and float16 ``2e-2``), a float for every dtype, or a mapping from dtypes to
    floats. Each leaf is compared relative to its own magnitude, floored at ``1e-3`` of the
    largest leaf's; a leaf outside that may still pass within 4x the original's own rounding
    noise (see the module docstring).

    ``modes``: gradient modes (``"remat"``, ``"fused"``, ``"native"``, ``"auto"``) and
    ``chunks``: chunk sizes; the check then runs on a copy of ``sf`` for each combination
    (``sf``'s own mode or chunk where one of them is not given).

    ``vmap``: also compare both under ``jax.vmap``, over an extra leading axis of the chunked
    arguments and over each unchunked argument with a floating leaf (the parameters, a
    temperature), each batched with a second, different copy of itself.

    Raises ``AssertionError`` naming the first leaf that differs by its pytree path (for
    example ``gradient at args[0]['params']['Dense_0']['kernel']``), its worst error and
    where it is, and the plan's gradient mode and chunk.
    """
    _check_serialized(sf)
    check = assert_in_contexts if vmap else _assert_one
    if modes is None and chunks is None:
        check(sf, args, kwargs, rtol)
        return
    plan = sf.explain(*args, **kwargs)
    modes = [sf.grad] if modes is None else list(modes)
    chunks = [plan.chunk] if chunks is None else list(chunks)
    ref = _Reference(sf.original, args, kwargs)
    for chunk in chunks:
        for mode in modes:
            variant = _variant(sf, mode, int(chunk), plan.axis_size)
            check(variant, args, kwargs, rtol, ref)
