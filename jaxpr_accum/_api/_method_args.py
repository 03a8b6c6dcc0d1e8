"""The checks of the methods' own arguments: ``sweep``'s ``chunks`` and ``grads``, and the
``grad_argnums`` of ``sweep`` and ``explain`` (``jax.grad``'s ``argnums``, named apart from
``serialize_axis``'s ``argnums``). Each raises a ``TypeError`` or ``ValueError`` naming the
argument and what it takes."""

from __future__ import annotations

from collections.abc import Iterable

from jaxpr_accum._base._settings import GRAD_MODES, as_index


def check_chunks(chunks: object, axis_size: int) -> list[int]:
    """The chunks to measure, ascending: ``chunks``, or powers of two up to the axis size and
    the axis size itself."""
    if chunks is None:
        n = max(axis_size, 1)
        return sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
    items = [chunks] if hasattr(chunks, "__index__") else chunks
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise TypeError(f"`chunks` must be None, an int or a sequence of ints, got {chunks!r}")
    out = []
    for c in items:
        k = None if isinstance(c, bool) else as_index(c)
        if k is None:
            raise TypeError(f"`chunks` must hold positive ints, got {c!r} in {chunks!r}")
        if k < 1:
            raise ValueError(f"`chunks` must hold positive ints, got {c!r} in {chunks!r}")
        out.append(k)
    if not out:
        raise ValueError("`chunks` is empty: pass at least one chunk size, or None")
    return sorted(set(out))


def check_grads(grads: object) -> list[str]:
    items = [grads] if isinstance(grads, str) else grads
    if not isinstance(items, Iterable):
        raise TypeError(f"`grads` must be a sequence of gradient modes, got {grads!r}")
    out = list(dict.fromkeys(items))
    bad = [g for g in out if g not in GRAD_MODES]
    if bad:
        raise ValueError(
            f"`grads` must hold gradient modes among {', '.join(map(repr, GRAD_MODES))}; got "
            f"{bad[0]!r}"
        )
    if not out:
        raise ValueError(f"`grads` is empty: pass at least one of {GRAD_MODES}")
    return out


def check_grad_argnums(grad_argnums: object, args: tuple) -> tuple[int, ...]:
    """``grad_argnums`` (``jax.grad``'s ``argnums``) checked against ``args``, as a tuple of
    non-negative indices."""
    nums = grad_argnums if isinstance(grad_argnums, (tuple, list)) else (grad_argnums,)
    if not nums:
        raise ValueError("`grad_argnums` must name at least one argument")
    out = []
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(
                f"`grad_argnums` must be an int or a tuple of ints, got {grad_argnums!r}"
            )
        if not -len(args) <= a < len(args):
            raise ValueError(
                f"`grad_argnums` {a} is out of range for a call with {len(args)} positional "
                "argument(s)"
            )
        out.append(a % len(args))
    return tuple(out)
