"""Prove the rewrite on your own program: compare a ``SerializedFunction`` with its original.

``serialize_axis`` promises the original's values and gradients. This module checks that
promise on the user's own function, in the user's own test suite:

- ``assert_matches_original`` runs ``sf`` and ``sf.original`` on the same arguments and
  compares their outputs and their reverse-mode derivatives with respect to every floating
  input leaf (``jax.vjp`` with a random cotangent; the plain gradient for one scalar
  output). ``modes=`` / ``chunks=`` repeat the check on copies of ``sf`` with other gradient
  modes and chunk sizes.
- ``arrays_like`` and ``chunk_sizes`` are Hypothesis strategies: inputs with the
  structure, shapes and dtypes of example arguments, and chunk sizes that exercise the
  loop's edge cases (1, a divisor, a non-divisor, the whole axis, more than the axis).
- ``check`` runs ``assert_matches_original`` as a Hypothesis property over drawn
  inputs and chunk sizes in every gradient mode, and fails with the smallest counterexample.
- ``assert_tree_close`` and ``tree_difference`` are the comparison itself, for
  results computed some other way (a train step, a compiled ``value_and_grad``).

**The comparison.** Pytree structure, shapes and dtypes must be equal. Integer, boolean and
PRNG-key leaves must be bit-identical. A floating leaf passes when
``max|got - ref| <= rtol(dtype) * scale``, where ``scale`` is the leaf's own magnitude,
``max|ref leaf|``, floored at ``1e-3`` of the largest magnitude in the whole tree (and at
``1e-30``, for a tree of zeros). So a small leaf is compared at its own size, not at the
size of the largest one (a leaf of ``1e-4`` returned as zeros fails), while a leaf that is
zero in exact arithmetic (the gradient of a bias that a softmax ignores) is compared at the
scale of its tree, where reassociation noise belongs. Non-finite entries must agree exactly
(``nan`` with ``nan``, ``inf`` with an ``inf`` of the same sign). Default ``rtol`` by dtype:
``1e-10`` for float64 (and complex128), ``2e-4`` for float32 (and complex64), ``2e-2`` for
bfloat16 and float16.

**The original's own noise.** Where a leaf fails that rule, ``assert_matches_original``
measures how far the original's leaf moves when every value it computes from the floating
inputs moves by one rounding error (two runs of the original's jaxpr with each such
equation's result multiplied by ``1 +- eps`` at random; random draws, constants and integer
arithmetic stay exact, as they do in a serialized function). The leaf passes if it is within
``4x`` that: the noise any reordering of the arithmetic makes, which only ill-conditioned
inputs (a saturated softmax) make larger than the tolerance. A rewrite that changes a result
by more than rounding, like a gradient scaled by ``0.999``, stays far outside it.

**When it would be wrong.** The original is the oracle. The noise estimate perturbs the
values each equation produces, not the rounding inside derivative formulas: where a
gradient is itself made of rounding errors (``1 - tanh(x)**2`` for a ``tanh`` saturated at
``|x| > 9`` everywhere) the check can fail although the rewrite is exact; raise ``rtol`` or
draw milder inputs for such a model. A passing check proves the inputs it saw;
``check`` widens them.

Hypothesis is needed only by the strategies and ``check`` (``pip install -e
'.[testing]'`` from a clone, or ``pip install hypothesis``); importing this module does not
need it: without it they raise an ``ImportError`` that says so.

The examples in the docstrings assume ``from jaxpr_accum import testing``, a ``loss(w, x)``,
``sf = jaxpr_accum.serialize_axis(loss, chunk=4, argnums=1)`` and arguments ``w, x``.
"""

from jaxpr_accum._base._compare import Difference, Tolerance, assert_tree_close, tree_difference
from jaxpr_accum.testing._hypothesis import MODES, arrays_like, check, chunk_sizes
from jaxpr_accum.testing._oracle import assert_matches_original

__all__ = [
    "MODES",
    "Difference",
    "Tolerance",
    "arrays_like",
    "assert_matches_original",
    "assert_tree_close",
    "check",
    "chunk_sizes",
    "tree_difference",
]
