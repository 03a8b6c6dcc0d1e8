"""``assert_matches_original``: values and reverse-mode derivatives of a serialized function
against its original, each compiled once per argument structure; copies in other modes and
chunk sizes."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from jaxpr_accum._base import _nnx
from jaxpr_accum._base._compare import (
    Mismatch,
    Tolerance,
    compare_leaves,
    compare_trees,
    path_label,
)
from jaxpr_accum._base._errors import PlanWarning
from jaxpr_accum.testing._runner import Reference, argument_label, compiled_runner
from jaxpr_accum.testing._variants import Serialized, is_variant_copy, variant_of
from jaxpr_accum.testing._vmap import Vmapped, contexts


def _plan_line(sf: Serialized | Vmapped, args: tuple, kwargs: dict) -> str:
    try:
        plan = sf.explain(*args, **kwargs)
    except Exception as e:  # the comparison failed; say so even if the plan cannot be shown
        return f"plan: unavailable ({type(e).__name__}: {e})"
    return (
        f"plan: grad mode {plan.grad!r}, chunk {plan.chunk} of an axis of size "
        f"{plan.axis_size} ({plan.n_chunks} chunk{'s' if plan.n_chunks != 1 else ''}), "
        f"born at {plan.born}"
    )


def check_is_serialized(sf: object) -> None:
    """Raise a ``TypeError`` unless ``sf`` is a ``SerializedFunction`` (or one alike)."""
    if not (hasattr(sf, "original") and hasattr(sf, "explain") and callable(sf)):
        raise TypeError(
            "expected a SerializedFunction (the result of `jaxpr_accum.serialize_axis`), got "
            f"{sf!r}; to compare two trees, use `jaxpr_accum.testing.assert_tree_close`"
        )


def assert_as_called(
    sf: Serialized | Vmapped,
    args: tuple,
    kwargs: dict,
    rtol: Tolerance,
    ref: Reference | None = None,
    seed: int = 0,
    where: str = "",
) -> None:
    """``sf`` against its original on ``args, kwargs`` as called (no ``jax.vmap`` context):
    outputs, gradients and state; ``ref``: the original's results, when already computed."""
    ref = ref or Reference(sf.original, args, kwargs, seed)
    s = ref.split
    with warnings.catch_warnings():
        if is_variant_copy(getattr(sf, "sf", sf)):  # the user's function warns; copies do not
            warnings.simplefilter("ignore", PlanWarning)
        plain, out, state, got_ct = compiled_runner(sf, s, True, seed)(s.diff, s.dyn)

    def output(path: tuple) -> str:
        return path_label("output", path)

    def argument(path: tuple) -> str:
        return argument_label(path) if path else "the arguments"

    gradients = list(zip(s.diff_labels, got_ct, ref.ct, strict=True))

    def compare(noise: tuple | None) -> tuple[str, Mismatch] | None:
        n_out, n_state, n_ct = noise or (None, None, None)
        results = [
            ("output", compare_trees(plain, ref.out, rtol, output, n_out)),
            ("output under jax.vjp", compare_trees(out, ref.out, rtol, output, n_out)),
            ("gradient", compare_leaves(gradients, rtol, n_ct)),
        ]
        if s.stateful:
            results.append(
                ("state after the call", compare_trees(state, ref.state, rtol, argument, n_state))
            )
        return next(((w, c.mismatch) for w, c in results if c.mismatch is not None), None)

    # The original's own rounding noise costs one more compilation: only when needed.
    failed = compare(None) and compare(ref.noise())
    if failed:
        what, mismatch = failed
        raise AssertionError(mismatch.message(what + where, [_plan_line(sf, args, kwargs)]))


def assert_in_contexts(
    sf: Serialized, args: tuple, kwargs: dict, rtol: Tolerance, ref: Reference | None = None
) -> None:
    """``assert_as_called`` as called, then under each ``jax.vmap`` context (``_vmap``)."""
    assert_as_called(sf, args, kwargs, rtol, ref)
    if _nnx.has_graph_nodes(tuple(args), dict(kwargs)):
        return  # Flax NNX objects are not arrays to batch
    for context in contexts(sf, tuple(args)):
        batched = context.batch(tuple(args))
        try:
            reference = Reference(context.original, batched, kwargs)
        except Exception:  # the original itself does not run under this vmap: nothing to compare
            continue
        assert_as_called(context, batched, kwargs, rtol, reference, where=f" {context.what}")


def assert_matches_original(
    sf: Serialized,
    *args: object,
    rtol: Tolerance = None,
    modes: Iterable[str] | None = None,
    chunks: Iterable[int] | None = None,
    vmap: bool = True,
    **kwargs: Any,  # the function's, passed to ``explain`` too (whose own is ``grad_argnums``)
) -> None:
    """Assert that ``sf(*args, **kwargs)`` and its derivatives equal ``sf.original``'s.

    Compared: the outputs of a plain call and under ``jax.vjp``, and the cotangents of every
    floating array leaf of the arguments for a random output cotangent (the gradient, for one
    scalar output). Integer, boolean and key outputs must be bit-identical; Flax NNX arguments
    are compared after the call too. Both run under ``jax.jit``, compiled once per structure.

    Args:
        sf: A ``SerializedFunction``.
        *args: The call's arguments (and ``**kwargs``).
        rtol: ``None``: by dtype (float64 ``1e-10``, float32 ``2e-4``, 16-bit ``2e-2``); a
            float; or a mapping from dtypes to floats. Each leaf is compared relative to its
            own magnitude, or within 4x the original's own rounding noise (module docstring).
        modes: Gradient modes to check copies of ``sf`` in (``None``: ``sf``'s own).
        chunks: Chunk sizes to check copies at (``None``: ``sf``'s own); every combination.
        vmap: Also compare under ``jax.vmap``: over an extra leading axis of the chunked
            arguments and over each unchunked floating argument (at the first chunk only).

    Raises:
        AssertionError: A leaf differs; the message names its pytree path (``gradient at
            args[0]['params']['Dense_0']['kernel']``), the worst error and where it is, and
            the plan's mode and chunk.

    Examples:
        >>> testing.assert_matches_original(sf, w, x, modes=["remat", "fused"], chunks=[1, 3])
    """
    check_is_serialized(sf)
    if modes is None and chunks is None:
        (assert_in_contexts if vmap else assert_as_called)(sf, args, kwargs, rtol)
        return
    plan = sf.explain(*args, **kwargs)
    modes = [sf.grad] if modes is None else list(modes)
    chunks = [plan.chunk] if chunks is None else list(chunks)
    ref = Reference(sf.original, args, kwargs)
    for j, chunk in enumerate(chunks):
        check = assert_in_contexts if vmap and j == 0 else assert_as_called
        for mode in modes:
            variant = variant_of(sf, mode, int(chunk), plan.axis_size)
            check(variant, args, kwargs, rtol, ref)
