"""Dtypes: which values carry gradients, and what sums of them accumulate in."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp


def is_float(x: Any) -> bool:
    """Whether ``x`` is floating or complex: an array, a tracer, an abstract value, a jaxpr
    variable (its aval) or a dtype. Only such values carry gradients."""
    aval = getattr(x, "aval", x)
    return bool(jnp.issubdtype(getattr(aval, "dtype", aval), jnp.inexact))


def accumulator_dtype(dtype: Any, accum_dtype: Any) -> Any:
    """What a sum of ``dtype`` values accumulates in: ``accum_dtype`` when given, float32 for
    16-bit floats, else ``dtype`` itself."""
    if accum_dtype is not None:
        return jnp.dtype(accum_dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)
