"""The JAX types that rules and streaming rules are annotated with.

``_rules`` and ``_stream`` import JAX types only from ``_compat`` (and type-check without an
explicit ``Any``): the aliases below name what a rule handles, in JAX's own public types.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import jax
import numpy as np
from jax.extend.core import Literal, Primitive, Var

Array: TypeAlias = jax.Array  # a value of an interpreted jaxpr (a tracer under a trace)
Atom: TypeAlias = Var | Literal  # an equation's operand
Params: TypeAlias = dict[str, Any]  # an equation's parameters, as JAX types them
Float0Array: TypeAlias = np.ndarray[
    tuple[int, ...], np.dtype[np.void]
]  # zeros of dtype ``float0``: an integer's tangent

__all__ = ["Array", "Atom", "Float0Array", "Params", "Primitive"]
