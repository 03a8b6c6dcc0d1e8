"""Running a function and its original on the same arguments: the arguments split into
differentiated, passed-through and static leaves, the cotangent fed to ``jax.vjp``, a bounded
cache of the compiled runners (per function and argument structure), and the original's
results on one set of arguments with, when needed, its own rounding noise."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum._base import _nnx
from jaxpr_accum._base._compare import as_64_bit, path_label
from jaxpr_accum._base._dtypes import is_array, is_float_array
from jaxpr_accum.testing._noise import with_rounding_noise


def argument_label(path: Sequence[Any]) -> str:
    """``args[0]['w']`` or ``kwargs['x']`` for a path into ``(args, kwargs)``."""
    head, rest = path[0], path[1:]
    return path_label("args" if getattr(head, "idx", 0) == 0 else "kwargs", rest)


class _Split(NamedTuple):
    """The arguments ``(args, kwargs)`` as differentiated, passed-through and static leaves."""

    treedef: jax.tree_util.PyTreeDef
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
        if is_float_array(leaf):
            kinds.append("diff")
            diff.append(leaf)
            labels.append(argument_label(path))
        elif is_array(leaf):
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


def _cotangent(out: object, seed: int) -> object:
    """1 for a single scalar float output (the gradient), else a random normal cotangent per
    float leaf; float0 zeros for the other leaves. Only shapes and dtypes of ``out`` are read,
    so this runs on tracers: the cotangent is a constant of the compiled program."""
    leaves = jax.tree.leaves(out)
    single = len(leaves) == 1 and jnp.shape(leaves[0]) == () and is_float_array(leaves[0])
    rng = np.random.RandomState(seed)

    def make(leaf: jax.Array) -> jax.Array | np.ndarray:
        shape = jnp.shape(leaf)
        if not is_float_array(leaf):
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


def _arrays_only(tree: object) -> object:
    return jax.tree.map(lambda x: x if is_array(x) else None, tree)


# Compiled runners, per function and argument structure; bounded, so that the executables
# of one-off functions do not pile up.
_RUNNERS: OrderedDict[Any, Callable[..., Any]] = OrderedDict()
_RUNNERS_SIZE = 32


def compiled_runner(
    fun: Callable, s: _Split, primal: bool, seed: int, noisy: bool = False
) -> Callable:
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

    def call(diff: list, dyn: list) -> tuple[object, object]:
        args, kwargs = _rebuild(s, diff, dyn)
        out = fun(*args, **kwargs)
        return out, (_arrays_only((args, kwargs)) if s.stateful else None)

    def run(diff: list, dyn: list, noise_seed: jax.Array | None = None) -> tuple:
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


class Reference:
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
        _, self.out, self.state, self.ct = compiled_runner(original, s, False, seed)(s.diff, s.dyn)
        self._noise: tuple | None = None

    def noise(self) -> tuple[list[float], list[float], list[float]]:
        """``(outputs, state, cotangents)``: per leaf, the largest move over two noisy runs."""
        if self._noise is None:
            s = self.split
            noisy = compiled_runner(self.original, s, False, self.seed, noisy=True)
            moved = [noisy(s.diff, s.dyn, np.uint32(k))[1:] for k in (1, 2)]
            self._noise = (
                _noise(self.out, [m[0] for m in moved]),
                _noise(self.state, [m[1] for m in moved]),
                _noise(self.ct, [m[2] for m in moved]),
            )
        return self._noise


def _noise(ref: object, moved: list) -> list[float]:
    """Per leaf of ``ref``: the largest ``|moved - ref|`` over the runs in ``moved``."""
    leaves = jax.tree.leaves(ref)
    noise = [0.0] * len(leaves)
    for other in moved:
        other_leaves = jax.tree.leaves(other)
        if len(other_leaves) != len(leaves):
            continue
        for i, (r, m) in enumerate(zip(leaves, other_leaves, strict=True)):
            if not is_float_array(r) or jnp.shape(r) != jnp.shape(m) or not np.size(r):
                continue
            r64, m64 = as_64_bit(r), as_64_bit(m)
            both = np.isfinite(r64) & np.isfinite(m64)
            d = float(np.max(np.abs(r64 - m64), where=both, initial=0.0))
            noise[i] = max(noise[i], d)
    return noise
