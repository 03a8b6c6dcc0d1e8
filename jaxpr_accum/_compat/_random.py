"""The threefry counter layout of ``jax.random.bits`` (partitionable threefry), so that a
chunk draws exactly the unchunked program's bits for its positions; key implementations;
the primitives JAX binds only inside a jitted function of its own (``called_only``)."""

from __future__ import annotations

from typing import Protocol

import jax
import numpy as np

from jaxpr_accum._compat._lookup import MissingInternal
from jaxpr_accum._compat._lookup import internal as _jax
from jaxpr_accum._compat._types import Array, Primitive


class KeyImpl(Protocol):
    """A PRNG implementation (JAX's ``PRNGImpl``), as far as the package reads it."""

    @property
    def name(self) -> str: ...

    def __hash__(self) -> int: ...  # ``wrap_key_data`` takes it as a hashable spec


def counter_draw_refusal(key_dtype: object) -> str | None:
    """Why draws with this key type do not follow the partitionable-threefry counter layout
    (``threefry_counter_bits``), or None if they do."""
    name = key_impl_name(key_dtype)
    if name != "threefry2x32":
        return f"`{name}` keys have no per-chunk counter formula"
    # a JAX without the flag has only the partitionable layout
    if not getattr(jax.config, "jax_threefry_partitionable", True):
        return "the legacy (non-partitionable) threefry has no per-chunk counter formula"
    return None


def threefry_counter_bits(key: Array, counters: tuple[Array, Array]) -> tuple[Array, Array]:
    """The two 32-bit threefry words JAX's partitionable ``random_bits`` computes for the
    elements whose 64-bit row-major counters are ``(hi, lo)``."""
    k1, k2 = (x for x in jax.random.key_data(key))
    hi, lo = _jax("jax.extend.random.threefry2x32_p").bind(k1, k2, *counters)
    return hi, lo


def threefry_finish_bits(bits1: Array, bits2: Array, bit_width: int) -> Array:
    """The draw from the two words, as ``_threefry_random_bits_partitionable`` finishes it."""
    dtype = np.dtype(f"uint{bit_width}")
    if bit_width == 64:
        hi = jax.lax.convert_element_type(bits1, dtype)
        lo = jax.lax.convert_element_type(bits2, dtype)
        return jax.lax.shift_left(hi, np.asarray(32, dtype=dtype)) | lo
    if bit_width == 32:
        return bits1 ^ bits2
    return jax.lax.convert_element_type(bits1 ^ bits2, dtype)


def key_impl(dtype: object) -> KeyImpl:
    """The PRNG implementation behind a key dtype."""
    impl = getattr(dtype, "_impl", None)
    if impl is None:
        raise MissingInternal("the `_impl` attribute of PRNG key dtypes")
    return impl


def key_impl_name(dtype: object) -> str:
    return key_impl(dtype).name


def called_only(prim: Primitive) -> bool:
    """Whether JAX binds ``prim`` only inside a jitted function of its own, whose call
    boundary the original's compiled program keeps: ``random_gamma``, bound by the jitted
    ``jax.random._gamma`` (gamma, beta, dirichlet, t, ball, ...). XLA:CPU compiles its
    rejection sampler differently outside that call (a constant shape parameter folds into
    its arithmetic otherwise: 1-2 ULP on some draws), so a re-emitted one keeps a call."""
    return prim.name == "random_gamma"
