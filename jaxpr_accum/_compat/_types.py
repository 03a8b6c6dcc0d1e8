"""The JAX types the package is annotated with.

Every module imports JAX's types only from ``_compat`` (``_rules`` and ``_stream`` type-check
without an explicit ``Any``): the aliases below name what the package handles, in JAX's own
public types (``jax.extend.core`` and ``jax.core``), so a move of one of them in JAX is
absorbed here.
"""

from __future__ import annotations

from typing import Any, TypeAlias, cast

import jax
import jax.core
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Primitive, Var

Array: TypeAlias = jax.Array  # a value of an interpreted jaxpr (a tracer under a trace)
Atom: TypeAlias = Var | Literal  # an equation's operand
Eqn: TypeAlias = JaxprEqn  # one equation of a jaxpr
Aval: TypeAlias = jax.core.AbstractValue  # a value's abstract type (a ``ShapedArray`` mostly)
ShapedArray: TypeAlias = jax.core.ShapedArray  # an array's shape and dtype, as JAX traces it
Tracer: TypeAlias = jax.core.Tracer  # a value under a JAX transformation
Params: TypeAlias = dict[str, Any]  # an equation's parameters, as JAX types them
Float0Array: TypeAlias = np.ndarray[
    tuple[int, ...], np.dtype[np.void]
]  # zeros of dtype ``float0``: an integer's tangent


def shaped(atom: Var | Literal) -> ShapedArray:
    """``atom``'s abstract value, as an array's: JAX types a variable's ``aval`` as any
    abstract value; the values the package sizes and reads the dtype of are arrays."""
    return cast(ShapedArray, atom.aval)


__all__ = [
    "Array",
    "Atom",
    "Aval",
    "ClosedJaxpr",
    "Eqn",
    "Float0Array",
    "Jaxpr",
    "Params",
    "Primitive",
    "ShapedArray",
    "Tracer",
    "Var",
    "shaped",
]
