"""Streamed normalisers: values that need a whole-axis reduction only through factors that
are constant along the axis, computed chunk by chunk.

``softmax(s) @ v`` over the chunked axis needs ``m = max(s)`` and ``z = sum(exp(s - m))``
before any chunk's weights are known; without this module everything from the first use of
``m`` on runs after the loop, on stacked values.

**The algebra.** Inside the loop a *streamed value* is a list of terms ``sum_j C_j * F_j``:
the *coefficient* ``C_j`` is computed from the chunk (a float where it is the same constant
everywhere), and ``F_j`` is a product of factors constant along the axis whose values are
only known after the loop. They are built from *deferred* values ``D``, the reductions over
the axis and what the program computes from them:

- ``D ** p`` (``Power``), from ``x * D``, ``x / D`` and ``x - D`` (a term of its own);
- ``exp(s + sum_i c_i D_i)`` (``Exp``), from ``exp(A + sum_i c_i D_i)`` with float ``c_i``:
  the chunk holds ``C = exp(A - s)``, where the *stabiliser* ``s`` is the chunk's own max of
  ``A`` over every dimension the ``D_i`` do not vary along, so ``C <= 1``.

Linear equations map terms to terms (``STREAM_RULES``): negation, casts, sums and
differences, products and quotients by chunk values or deferred values, products of two
streamed values (squares and small powers too), and the
structural equations, each factor following the dimensions it varies along (``where``: one
value dimension per dimension of its compact form). ``exp`` turns additive ``c * D`` terms into
an ``Exp`` factor. A ``reduce_sum`` or contraction over the axis is a *sink*: it adds up the
chunks' coefficients, term by term. A term without ``Exp`` is an ordinary carried sum; an
``Exp`` term carries ``(acc, s)`` and rescales ``acc`` by ``exp(s_old - s_new)`` as the running
stabiliser grows (the online softmax). After the loop the deferred values are known and
``sum_j acc_j * F_j`` (``combine``) is the sum the original computes.

**Exactness.** Every rule is an identity of real arithmetic. ``C * exp(s)`` does not depend on
``s``, so stabilisers are constants (``stop_gradient``): JAX differentiates the after-loop
combination (through the deferred values exactly as the original does), and per chunk the
cotangent of a coefficient is its accumulator's, rescaled by ``exp(s_chunk - s_final)``.
**Numerics.** ``exp`` is only taken of ``A - s <= 0`` and of ``s_chunk - s_final <= 0``; a
stabiliser that is ``-inf`` (a chunk that is masked out entirely) contributes exactly zero.
Where a program is outside the table (``log`` of a streamed value, a ``select``, a factor
varying along a dimension that is summed), ``_split`` keeps it after the loop, as before.
"""

from jaxpr_accum._stream.emit import DEFERRED, apply, emitter, operands
from jaxpr_accum._stream.layout import StreamLayout
from jaxpr_accum._stream.online import (
    Sink,
    accumulate,
    chunk_cotangent,
    combine,
    describe,
    merge_devices,
    origin,
)
from jaxpr_accum._stream.terms import (
    Deferred,
    Emitter,
    Exp,
    NotStreamable,
    Operand,
    Plain,
    Streamed,
)

__all__ = [
    "DEFERRED",
    "Deferred",
    "Emitter",
    "Exp",
    "NotStreamable",
    "Operand",
    "Plain",
    "Sink",
    "StreamLayout",
    "Streamed",
    "accumulate",
    "apply",
    "chunk_cotangent",
    "combine",
    "describe",
    "emitter",
    "merge_devices",
    "operands",
    "origin",
]
