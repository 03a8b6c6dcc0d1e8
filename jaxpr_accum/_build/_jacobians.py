"""The fused mode's forward loop on one device: per chunk, the value and the Jacobian rows of
the region's gradient-carrying sums with respect to its inputs (one forward and one backward
per chunk), added up across chunks (``_fused`` contracts them with the cotangent).

Inside ``shard_map``, the differentiated inputs (invariant or chunked) are taken as varying
over every manual axis an input varies over, so that each device's rows are its own Jacobian.
A replicated input would be ``pvary``-ed inside the chunk, and the pullback of each basis
vector (the transpose of that ``pvary``) summed over the mesh: the Jacobian of every device's
sums, which the contraction with the cotangent sums again (gradients 8x on 8 devices).
``_fused`` takes this mode only where every sum varies over those axes. The rows of a sharded
invariant input (gathered per chunk or once before the loop) are brought back to the device's
shard in each step (``ChunkLoop.scatter``), into shard-sized accumulators (``_shards.held``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxpr_accum import _compat
from jaxpr_accum._analysis._split import Split
from jaxpr_accum._base._dtypes import accumulator_dtype
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._build import _shards
from jaxpr_accum._build._loop import ChunkLoop, add_into, wanted
from jaxpr_accum._build._signature import Inputs
from jaxpr_accum._build._stack import join
from jaxpr_accum._compat import Array
from jaxpr_accum._engine._conv import canonicalize


def jacobian_row_dtype(split: Split) -> np.dtype:
    """The dtype of the fused Jacobian rows: the gradient-carrying sums' own, at least f32."""
    flags = split.gradient_sums
    dtypes = [_compat.dtype_of(v) for v, f in zip(split.sums, flags, strict=True) if f]
    return jnp.result_type(jnp.float32, *dtypes)


def with_row_dim(loc: AxisLoc) -> AxisLoc:
    """The axis position once a leading (Jacobian row) dimension is added."""
    return loc._replace(dim=loc.dim + 1)


def jacobians(loop: ChunkLoop, inputs: Inputs, perturbed: Inputs) -> tuple[list, Inputs]:
    """This shard's sums (accumulator dtypes) and the Jacobian rows of the gradient-carrying
    sums with respect to the perturbed floating inputs (``Inputs`` of arrays, None where not
    differentiated): ``[width, *input.shape]`` (an invariant input's single row, where the
    width is 1, in the input's own shape), invariant ones summed over chunks; per device
    inside ``shard_map`` (module docstring)."""
    float_sums = [i for i, g in enumerate(loop.split.gradient_sums) if g]
    width = loop.split.gradient_width
    row_dtype = jacobian_row_dtype(loop.split)
    eye = jnp.eye(width, dtype=row_dtype)
    diff = Inputs(
        wanted(inputs.invariants, perturbed.invariants), wanted(inputs.chunked, perturbed.chunked)
    )

    per_device = _compat.union_varying(inputs.invariants, inputs.chunked)

    def rows(kk: int, start: Array | int) -> tuple:
        f, (d_inv, d_ch) = loop.differentiable(
            loop.chunk_inputs(inputs, start, kk), kk, start, diff
        )
        primals = (_compat.vary(d_inv, per_device), _compat.vary(d_ch, per_device))

        def flat(a: list, b: list) -> tuple:
            sums = f(a, b).sums
            return jnp.concatenate([jnp.ravel(sums[i]).astype(row_dtype) for i in float_sums]), sums

        rows_out, pullback, sums = jax.vjp(flat, *primals, has_aux=True)  # type: ignore[var-annotated]
        basis = _compat.vary(eye, _compat.varying_axes(rows_out))  # the rows' type (shard_map)
        if width == 1:  # no vmap: batching would make the convolutions non-canonical
            d_inv, d_ch = canonicalize(pullback, loop.split.may_convolve)(basis[0])
            # rows of invariants: no row dim
            return sums, loop.scatter(d_inv, diff.invariants), [x[None] for x in d_ch]
        d_inv, d_ch = canonicalize(jax.vmap(pullback), loop.split.may_convolve)(basis)
        return sums, loop.scatter(d_inv, diff.invariants, lead=1), d_ch

    jac = [
        jnp.zeros(
            ((width,) if width > 1 else ())
            + _shards.held(inputs.invariants[i], loop.shards[i], loop.gathered),
            accumulator_dtype(inputs.invariants[i].dtype, loop.accum_dtype),
        )
        for i in diff.invariants
    ]

    # The accumulators are carried in reverse order. Measured on XLA:CPU (a 6-layer MLP,
    # 64 to 512 rows per chunk): in input order, XLA keeps two of them in temporary memory
    # instead of scaling them in place into the gradients' output buffers after the loop
    # (+0.6 to 1.1 MiB, up to 1.36x the hand-written scan); reversed, all are in place.
    def step(carry: tuple, kk: int, start: Array | int, _: object) -> tuple:
        s, d_inv, d_ch = rows(kk, start)
        return (add_into(carry[0], s), add_into(carry[1], d_inv[::-1])), d_ch

    (sums, backwards), scanned, rest = loop.over_chunks(
        step, (loop.zero_sums(), jac[::-1]), reads=inputs
    )
    jac = backwards[::-1]
    jac_ch = [
        join(
            None if scanned is None else scanned[j],
            None if rest is None else rest[j],
            with_row_dim(loop.chunk_locs[i]),
        )
        for j, i in enumerate(diff.chunked)
    ]
    return sums, inputs.placed(diff, jac, jac_ch)
