"""The original's own rounding noise: how far a result moves under one rounding error.

``with_rounding_noise(call, seed)`` is ``call`` with every floating value computed from the
floating inputs multiplied by ``1 +- eps`` (signs a hash of position, seed and equation);
values that do not depend on them (random draws, constants, integer arithmetic) stay exact,
as they are in a serialized function. Nested calls are inlined first, so every equation of
the program is perturbed, through the package's one interpreter.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._analysis import _trace
from jaxpr_accum._base._dtypes import is_float_array, real_dtype
from jaxpr_accum._engine import _interpret


def _jitter(x: _compat.Array, seed: _compat.Array, site: int) -> _compat.Array:
    """``x`` times ``1 +- eps`` elementwise, the signs a hash of the position, ``seed`` and
    ``site``: one rounding error, as a different order of operations would make."""
    if not is_float_array(x) or not np.size(x):
        return x
    real = real_dtype(x.dtype)
    h = jax.lax.iota(jnp.uint32, int(np.size(x))).reshape(jnp.shape(x))
    h = h * jnp.uint32(2654435761) + (seed.astype(jnp.uint32) * jnp.uint32(40503))
    h = h + jnp.uint32((site * 2246822519) % 2**32)
    h = (h ^ (h >> 15)) * jnp.uint32(2246822519)
    h = h ^ (h >> 13)
    sign = jnp.where((h & 1) == 1, 1.0, -1.0).astype(real)
    return x * (1 + jnp.asarray(jnp.finfo(real).eps, real) * sign)


def with_rounding_noise(call: Callable, seed: _compat.Array) -> Callable:
    def noisy(diff: list, dyn: list) -> object:
        closed, shapes = jax.make_jaxpr(call, return_shape=True)(diff, dyn)
        closed = _trace.inline_calls(closed)
        jaxpr = closed.jaxpr
        n_diff = len(jax.tree.leaves(diff))
        dependent = set(jaxpr.invars[:n_diff])
        for eqn in jaxpr.eqns:
            if any(v in dependent for v in eqn.invars if not isinstance(v, _compat.Literal)):
                dependent.update(eqn.outvars)
        sites = itertools.count(1)

        def emit(idx: int, eqn: _compat.Eqn, invals: list) -> list:
            outs = _interpret.bind(idx, eqn, invals)
            if any(v in dependent for v in eqn.outvars):
                return [_jitter(o, seed, next(sites)) for o in outs]
            return outs

        flat = jax.tree.leaves((diff, dyn))
        inputs = [_jitter(x, seed, next(sites)) if i < n_diff else x for i, x in enumerate(flat)]
        outs = _interpret.eval_jaxpr(closed, inputs, emit)
        return jax.tree.unflatten(jax.tree.structure(shapes), outs)

    return noisy
