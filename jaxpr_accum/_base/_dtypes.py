"""Leaves and dtypes: what is an array, a key, a floating value; which values carry
gradients, and what sums of them accumulate in.

Every such predicate of the package lives here, each with one meaning: ``is_array`` and
``is_array_or_tracer`` ask what a leaf *is* (``jax.Array`` counts a tracer of an array);
``has_float_dtype`` and ``has_key_dtype`` ask only for its dtype, so they take abstract
values, jaxpr variables and dtypes too; ``is_float_array`` asks both.
"""

from __future__ import annotations

from typing import Protocol, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike


class HasDType(Protocol):
    """A value with a ``dtype``: an array, a tracer, an abstract value."""

    @property
    def dtype(self) -> DTypeLike: ...


_ARRAYS = (jax.Array, np.ndarray, np.generic)


def is_array(x: object) -> bool:
    """An array leaf: a JAX array (a tracer of one included), a NumPy array or scalar."""
    return isinstance(x, _ARRAYS)


def is_array_or_tracer(x: object) -> bool:
    """An array leaf (``is_array``) or a tracer of any abstract value."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.core.Tracer))


def has_key_dtype(x: HasDType) -> bool:
    """Whether ``x`` (anything with a ``dtype``) holds typed PRNG keys."""
    return bool(jnp.issubdtype(x.dtype, jax.dtypes.prng_key))


def has_float_dtype(x: object) -> bool:
    """Whether ``x`` is floating or complex: an array, a tracer, an abstract value, a jaxpr
    variable (its aval) or a dtype. Only such values carry gradients."""
    aval = getattr(x, "aval", x)
    dtype = cast(DTypeLike, getattr(aval, "dtype", aval))  # a dtype, or one itself
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def is_float_array(x: object) -> bool:
    """An array leaf (``is_array``) of floating or complex values."""
    return isinstance(x, _ARRAYS) and not has_key_dtype(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def real_dtype(dtype: DTypeLike) -> np.dtype:
    """``dtype``, or the dtype of a complex ``dtype``'s real part."""
    found = jnp.dtype(dtype)
    if jnp.issubdtype(found, jnp.complexfloating):
        return jnp.dtype(jnp.finfo(found).dtype)
    return found


def accumulator_dtype(dtype: DTypeLike, accum_dtype: DTypeLike | None) -> np.dtype:
    """What a sum of ``dtype`` values accumulates in: ``accum_dtype`` when given, float32 for
    16-bit floats, else ``dtype`` itself."""
    if accum_dtype is not None:
        return jnp.dtype(accum_dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)
