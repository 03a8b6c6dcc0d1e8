"""The oracle: the original, unchunked function.

Every test in this suite checks a serialized function against the function it wraps, as JAX's
own tests check ``vmap`` against a stack of per-slice calls. Two helpers live here:

* :func:`assert_matches_original` compares outputs (pytree structure, shapes, dtypes, values)
  by the per-leaf rule of ``jaxpr_accum.testing`` (each leaf relative to its own magnitude,
  floored at 1e-3 of the largest leaf's) and reverse-mode derivatives (``jax.vjp`` with a
  random cotangent, and ``jax.grad`` for scalar outputs) with respect to every
  floating-point array leaf of the differentiated arguments.
* :func:`iter_eqns` walks a (Closed)Jaxpr recursively into every sub-jaxpr, found generically
  by scanning each equation's parameters (tuples, lists and dicts included), so that the
  structural tests do not depend on parameter names that change between JAX versions.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

from jaxpr_accum import testing as ja_testing

#: ``pytest.mark.filterwarnings(NOT_WORTH_IT)``: for a test whose toy program the cost model
#: expects to save no memory, where the first call's ``PlanWarning`` is incidental to what the
#: test checks (the default tier makes any other ``PlanWarning`` an error: ``conftest.py``).
NOT_WORTH_IT = "ignore:.*not expected to save memory:jaxpr_accum.PlanWarning"

# Tolerances keyed by dtype, per leaf, relative to the leaf's own magnitude floored at 1e-3 of
# the largest leaf's (the rule of ``jaxpr_accum.testing``, which does the comparing).
_TOL_16BIT = 2e-2
_TOL_F64 = 1e-10


def tolerance(dtype: Any, rtol: float = 2e-4) -> float:
    """The tolerance for a leaf of ``dtype``; ``rtol`` is the float32 tolerance."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        dtype = jnp.dtype(jnp.finfo(dtype).dtype)
    if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return max(rtol, _TOL_16BIT)
    if dtype == jnp.dtype(jnp.float64):
        return min(rtol, _TOL_F64)
    return rtol


_FLOAT_DTYPES = (
    jnp.bfloat16,
    jnp.float16,
    jnp.float32,
    jnp.float64,
    jnp.complex64,
    jnp.complex128,
)


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _is_float_array(x: Any) -> bool:
    return _is_array(x) and jnp.issubdtype(x.dtype, jnp.inexact)


def assert_tree_close(got: Any, ref: Any, *, rtol: float = 2e-4, what: str = "output") -> None:
    """Same pytree, shapes and dtypes; floats within the dtype-keyed tolerance, each leaf
    relative to its own magnitude (floored at 1e-3 of the largest leaf's); the rest exact.

    Delegates to ``jaxpr_accum.testing.assert_tree_close``; ``rtol`` is the float32
    tolerance (16-bit floats get at least 2e-2, float64 at most 1e-10).
    """
    rtols = {dtype: tolerance(dtype, rtol) for dtype in _FLOAT_DTYPES}
    ja_testing.assert_tree_close(got, ref, rtol=rtols, what=what)


def _normalize_argnums(argnums: int | Sequence[int] | None, nargs: int) -> tuple[int, ...]:
    if argnums is None:
        return tuple(range(nargs))
    if isinstance(argnums, int):
        argnums = (argnums,)
    return tuple(a % nargs for a in argnums)


def _cotangent_like(out: Any, seed: int) -> Any:
    """A random cotangent for a float leaf, a float0 zero for any other leaf."""
    rng = np.random.RandomState(seed)

    def make(leaf: Any) -> Any:
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            return jnp.asarray(rng.normal(size=leaf.shape), dtype=leaf.dtype)
        return np.zeros(leaf.shape, dtype=jax.dtypes.float0)

    return jax.tree.map(make, out)


def _classify(args: Sequence[Any], argnums: int | Sequence[int] | None) -> tuple[Any, list[str]]:
    """Flatten ``args``; label each leaf 'diff' (float array at ``argnums``), 'dyn' (any
    other array: passed through, not differentiated) or 'static' (a Python value)."""
    positions = _normalize_argnums(argnums, len(args))
    leaves, treedef = jax.tree.flatten(tuple(args))
    owner: list[int] = []
    for i, a in enumerate(args):
        owner.extend([i] * len(jax.tree.leaves(a)))
    assert len(owner) == len(leaves)
    kinds = []
    for k, leaf in enumerate(leaves):
        if _is_float_array(leaf) and owner[k] in positions:
            kinds.append("diff")
        elif _is_array(leaf):
            kinds.append("dyn")
        else:
            kinds.append("static")
    assert "diff" in kinds, "nothing to differentiate: no floating array leaf in the arguments"
    return treedef, kinds


# A small LRU cache: the reference functions recur across tests (the seed model, the MLP);
# bounded so that compiled executables of one-off functions do not pile up.
_PULLBACK_CACHE: OrderedDict[Any, Callable[..., Any]] = OrderedDict()
_PULLBACK_CACHE_SIZE = 16


def _pullback(
    fun: Callable[..., Any],
    treedef: Any,
    kinds: list[str],
    static: tuple[Any, ...],
    scalar_grad: bool,
    jit: bool,
) -> Callable[..., Any]:
    """``run(diff, dyn, ct) -> (out, vjp(ct), grad-of-sum or None)``, cached per signature so
    that the reference function compiles once per set of shapes across tests."""
    key = (fun, treedef, tuple(kinds), static, scalar_grad, jit)
    try:
        runner = _PULLBACK_CACHE[key]
    except (KeyError, TypeError):
        pass
    else:
        _PULLBACK_CACHE.move_to_end(key)
        return runner

    def rebuild(diff: list[Any], dyn: list[Any]) -> tuple[Any, ...]:
        it = {"diff": iter(diff), "dyn": iter(dyn), "static": iter(static)}
        return jax.tree.unflatten(treedef, [next(it[k]) for k in kinds])

    def run(diff: list[Any], dyn: list[Any], cotangent: Any) -> Any:
        out, vjp = jax.vjp(lambda d: fun(*rebuild(d, dyn)), diff)
        grads = None
        if scalar_grad:

            def total(d: list[Any]) -> jax.Array:
                return sum(o.astype(jnp.float32) for o in jax.tree.leaves(fun(*rebuild(d, dyn))))

            grads = jax.grad(total)(diff)
        return out, vjp(cotangent)[0], grads

    runner = jax.jit(run) if jit else run
    with contextlib.suppress(TypeError):  # an unhashable static value: no caching
        _PULLBACK_CACHE[key] = runner
        while len(_PULLBACK_CACHE) > _PULLBACK_CACHE_SIZE:
            _PULLBACK_CACHE.popitem(last=False)
    return runner


def assert_matches_original(
    f: Callable[..., Any],
    sf: Callable[..., Any],
    *args: Any,
    argnums: int | Sequence[int] | None = None,
    rtol: float = 2e-4,
    check_grad: bool = True,
    jit_grad: bool = True,
) -> None:
    """``sf(*args)`` equals ``f(*args)``, and so do their derivatives.

    Outputs are compared eagerly (``sf`` called directly). Derivatives are taken with
    ``jax.vjp`` (a random cotangent on every float output, float0 on the others) with respect
    to every floating array leaf of the arguments at ``argnums`` (default: all arguments);
    other array leaves (integers, PRNG keys, floats outside ``argnums``) are passed through
    undifferentiated and Python values stay static. When every output is a float scalar,
    ``jax.grad`` of their sum is compared as well. With ``jit_grad`` the derivatives are
    computed under ``jax.jit`` (faster; ``jax.jit`` of a serialized function is part of the
    contract).
    """
    ref = f(*args)
    got = sf(*args)
    assert_tree_close(got, ref, rtol=rtol, what="output")
    if not check_grad:
        return

    treedef, kinds = _classify(args, argnums)
    leaves = jax.tree.leaves(tuple(args))
    diff = [x for x, k in zip(leaves, kinds, strict=True) if k == "diff"]
    dyn = [x for x, k in zip(leaves, kinds, strict=True) if k == "dyn"]
    static = tuple(x for x, k in zip(leaves, kinds, strict=True) if k == "static")
    ct = _cotangent_like(ref, seed=0)
    scalar_grad = all(_is_float_array(o) and jnp.ndim(o) == 0 for o in jax.tree.leaves(ref))

    ref_out, ref_ct, ref_grad = _pullback(f, treedef, kinds, static, scalar_grad, jit_grad)(
        diff, dyn, ct
    )
    got_out, got_ct, got_grad = _pullback(sf, treedef, kinds, static, scalar_grad, jit_grad)(
        diff, dyn, ct
    )
    assert_tree_close(got_out, ref_out, rtol=rtol, what="output under vjp")
    assert_tree_close(got_ct, ref_ct, rtol=rtol, what="vjp cotangent")
    if scalar_grad:
        assert_tree_close(got_grad, ref_grad, rtol=rtol, what="jax.grad")


# --------------------------------------------------------------------------------------
# Walking jaxprs
# --------------------------------------------------------------------------------------


def sub_jaxprs(value: Any) -> Iterator[Jaxpr]:
    """Every Jaxpr inside a parameter value (ClosedJaxpr, Jaxpr, or containers of them)."""
    if isinstance(value, ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from sub_jaxprs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from sub_jaxprs(v)


def eqn_sub_jaxprs(eqn: Any) -> list[Jaxpr]:
    """The sub-jaxprs of one equation, found by scanning all of its parameters."""
    return [j for v in eqn.params.values() for j in sub_jaxprs(v)]


def iter_eqns(jaxpr: Jaxpr | ClosedJaxpr) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and, recursively, of all of its sub-jaxprs (pre-order)."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in eqn_sub_jaxprs(eqn):
            yield from iter_eqns(sub)


def find_eqns(jaxpr: Jaxpr | ClosedJaxpr, *names: str) -> list[Any]:
    """All equations (recursively) whose primitive name is one of ``names``."""
    return [e for e in iter_eqns(jaxpr) if e.primitive.name in names]


def primitive_names(jaxpr: Jaxpr | ClosedJaxpr) -> set[str]:
    return {e.primitive.name for e in iter_eqns(jaxpr)}
