"""Building the chunked program from a plan.

``build(plan, grad, accum_dtype, layout)`` returns ``run(*flat_inputs) -> flat_outputs``:
the prologue, then the *region*, then the epilogue, all evaluated under the caller's trace.

The region maps ``(invariants, chunked)`` to ``(sums, partials, stacked)``. On one device
(``Region``), chunk ``c`` covers axis positions ``[c*k, (c+1)*k)``: ``n // k`` full chunks
in a ``lax.scan`` and one more call of the same body at the remainder length (no padding),
every chunked input sliced with ``dynamic_slice`` at its axis position. Sums are carried
(16-bit floats in float32); other monoid partials are stacked per chunk and combined after
the region (so JAX differentiates the combination); axis-carrying outputs are stacked and put
back in order.

Gradient modes:

- ``remat``: a ``jax.custom_vjp``. Its forward is the scan above and keeps nothing but its
  inputs. Its backward scans the chunks again: each chunk is recomputed under ``jax.vjp``
  and pulled back with its slice of the output cotangents; cotangents of invariant inputs
  are accumulated in the scan carry (in ``accum_dtype``), those of chunked inputs stacked.
- ``fused``: when every output is a sum of a few entries, the forward pass computes each
  chunk's value *and* its Jacobian rows (one forward and one backward per chunk), adding
  them up; the backward only contracts them with the incoming cotangent. A primal call
  without differentiation runs the plain forward.
- ``native``: the same scan with a ``jax.checkpoint``-ed body (slicing inside it, so only
  the chunk index is saved per step), differentiated by JAX itself: supports ``jvp`` and
  higher order.

The ``layout`` says where the axis lives. ``Layout`` (one device) runs the region as is.
``ShardedLayout`` runs it under ``jax.shard_map`` over the mesh axes the serialized axis is
sharded on: each device scans its own shard in chunks of ``k / D`` with the global offset of
its rows (so iotas and random counters are those of the unchunked program); sums, invariant
cotangents and Jacobians are ``psum``-ed once, after the loop; nothing crosses devices
inside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from jaxpr_accum import _compat
from jaxpr_accum._compat import Literal
from jaxpr_accum._conv import canonicalize
from jaxpr_accum._plan import BODY, EPILOGUE, PROLOGUE, RegionPlan
from jaxpr_accum._resize import Resizer
from jaxpr_accum._rules import AxisLoc
from jaxpr_accum._rules.custom_derivatives import function_name

COMBINE: dict[str, Callable] = {
    "sum": lambda x: lax.reduce_sum(x, (0,)),
    "max": lambda x: lax.reduce_max(x, (0,)),
    "min": lambda x: lax.reduce_min(x, (0,)),
    "prod": lambda x: lax.reduce_prod(x, (0,)),
    "and": lambda x: lax.reduce_and(x, (0,)),
    "or": lambda x: lax.reduce_or(x, (0,)),
    "xor": lambda x: lax.reduce_xor(x, (0,)),
}

FUSED_MAX_WIDTH = 8


def is_float(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def accumulator_dtype(dtype: Any, accum_dtype: Any) -> Any:
    if accum_dtype is not None:
        return jnp.dtype(accum_dtype)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        return jnp.dtype(jnp.float32)
    return jnp.dtype(dtype)


def take_chunk(x: Any, loc: AxisLoc, start: Any, k: int) -> Any:
    return lax.dynamic_slice_in_dim(x, start * loc.inner, k * loc.inner, axis=loc.dim)


def unstack(ys: Any, loc: AxisLoc) -> Any:
    """``[n, ..., k*m at loc.dim, ...]`` -> ``[..., n*k*m, ...]`` in chunk order."""
    moved = jnp.moveaxis(ys, 0, loc.dim)
    shape = list(moved.shape)
    shape[loc.dim : loc.dim + 2] = [shape[loc.dim] * shape[loc.dim + 1]]
    return moved.reshape(shape)


def join(full: Any, rest: Any, loc: AxisLoc) -> Any:
    """Put the scanned chunks (``full``: stacked ys, or None) and the remainder back in order."""
    parts = ([] if full is None else [unstack(full, loc)]) + ([] if rest is None else [rest])
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=loc.dim)


def shifted(loc: AxisLoc) -> AxisLoc:
    """The axis position once a leading (Jacobian row) dimension is added."""
    return AxisLoc(loc.dim + 1, loc.inner)


def add_into(acc: list, xs: Sequence) -> list:
    return [a + x.astype(a.dtype) for a, x in zip(acc, xs, strict=True)]


def float_outputs(plan: RegionPlan) -> tuple[list[bool], list[bool], list[bool]]:
    def flags(vs: Any) -> list[bool]:
        return [jnp.issubdtype(v.aval.dtype, jnp.inexact) for v in vs]

    return (
        flags(plan.sums),
        flags(v for v, _ in plan.partials),
        flags(v for v, _ in plan.stacked),
    )


def pick(groups: Sequence, flags: Sequence) -> list:
    """The entries of ``groups`` (lists) whose flag in ``flags`` (parallel lists) is set."""
    return [
        x
        for group, group_flags in zip(groups, flags, strict=True)
        for x, flag in zip(group, group_flags, strict=True)
        if flag
    ]


def jacobian_row_dtype(plan: RegionPlan) -> Any:
    """The dtype of the fused Jacobian rows: the float sums' own, at least float32."""
    flags = float_outputs(plan)[0]
    dtypes = [v.aval.dtype for v, f in zip(plan.sums, flags, strict=True) if f]
    return jnp.result_type(jnp.float32, *dtypes)


def _custom_vjp_in_body(plan: RegionPlan) -> str | None:
    """The name of a custom VJP called (at any depth) by the region's body, or None."""

    def search(eqns: Sequence) -> str | None:
        for eqn in eqns:
            if eqn.primitive.name == "custom_vjp_call":
                return function_name(eqn)
            for _, sub in _compat.sub_jaxprs(eqn.params):
                found = search(_compat.open_jaxpr(sub).eqns)
                if found is not None:
                    return found
        return None

    return search([plan.jaxpr.eqns[i] for i in plan.indices(BODY)])


def fused_refusal(plan: RegionPlan, max_width: int = FUSED_MAX_WIDTH) -> str | None:
    """Why the fused mode does not apply to ``plan``, or None if it does.

    The fused forward keeps one parameter-sized accumulator per output entry, so ``auto``
    only takes it for a single scalar (``max_width=1``); asked for explicitly, up to
    ``FUSED_MAX_WIDTH`` entries.
    """
    if plan.stacked or plan.partials:
        return "the region has outputs that are not sums (stacked values or max/min partials)"
    custom = _custom_vjp_in_body(plan)
    if custom is not None:
        return (
            f"the region calls the custom VJP `{custom}`, whose backward rule need not be "
            "linear in the cotangent (gradient clipping is not): Jacobian rows taken with unit "
            "cotangents would change it"
        )
    flags = float_outputs(plan)[0]
    width = sum(math.prod(v.aval.shape) for v, f in zip(plan.sums, flags, strict=True) if f)
    if width == 0:
        return "the region has no floating-point sum to differentiate"
    if any(
        jnp.issubdtype(v.aval.dtype, jnp.complexfloating)
        for v, f in zip(plan.sums, flags, strict=True)
        if f
    ):
        return (
            "a sum is complex: its gradient is not complex-linear in the cotangent, so "
            "Jacobian rows for real cotangents would drop the imaginary direction"
        )
    if width > max_width:
        return (
            f"its sums have {width} entries and the fused mode would keep one parameter-sized "
            f"gradient per entry (it takes at most {max_width} here)"
        )
    return None


Needed = tuple[Sequence[bool], Sequence[bool]] | None


class Region:
    """The chunked region on one device: ``size`` positions from global position ``offset``."""

    def __init__(
        self,
        plan: RegionPlan,
        accum_dtype: Any,
        size: int,
        chunk: int,
        offset: Any,
        needed: Needed = None,
    ):
        self.plan, self.accum_dtype, self.needed = plan, accum_dtype, needed
        self.size, self.chunk, self.offset = size, chunk, offset
        self.body_indices = plan.indices(BODY)
        self.chunk_locs = [loc for _, loc in plan.chunked]
        self.stacked_locs = [loc for _, loc in plan.stacked]
        self.n_full, self.rem = divmod(size, chunk)
        self.out_float = float_outputs(plan)

    # -- one chunk ------------------------------------------------------------------------
    def body(self, k: int, start: Any, invariants: Sequence, chunks: Sequence) -> tuple:
        plan = self.plan
        env: dict = dict(zip(plan.invariants, invariants, strict=True))
        env.update(zip((v for v, _ in plan.chunked), chunks, strict=True))
        resizer = Resizer(plan.analysis, k, start + self.offset)
        resizer.eval_eqns((), plan.jaxpr.eqns, self.body_indices, env)
        return (
            [env[v] for v in plan.sums],
            [env[v] for v, _ in plan.partials],
            [env[v] for v, _ in plan.stacked],
        )

    def slices(self, chunked: Sequence, start: Any, k: int) -> list:
        return [
            take_chunk(x, loc, start, k) for x, loc in zip(chunked, self.chunk_locs, strict=True)
        ]

    def over_chunks(self, step: Callable, carry: Any, per_chunk: Any = ()) -> tuple:
        """Run ``step(carry, k, start, x) -> (carry, y)`` over every chunk of this shard.

        The full chunks run in a ``lax.scan`` (``x``: ``per_chunk``'s leaves indexed by the
        chunk), the remainder once more at its own length. Returns ``(carry, ys of the full
        chunks or None, y of the remainder or None)``.
        """
        k, n = self.chunk, self.n_full
        scanned = rest = None
        if n:

            def scan_step(c: Any, index_and_x: tuple) -> tuple:
                index, x = index_and_x
                return step(c, k, index * k, x)

            head = jax.tree_util.tree_map(lambda a: a[:n], per_chunk)
            carry, scanned = lax.scan(scan_step, carry, (jnp.arange(n), head))
        if self.rem:
            x = jax.tree_util.tree_map(lambda a: a[n], per_chunk)
            carry, rest = step(carry, self.rem, n * k, x)
        return carry, scanned, rest

    def wanted(self, values: Sequence, group: int) -> list[int]:
        """Indices of the inputs (``group`` 0: invariant, 1: chunked) to differentiate:
        floats that the caller perturbs (all floats when that is not known)."""
        return [
            i
            for i, x in enumerate(values)
            if is_float(x) and (self.needed is None or self.needed[group][i])
        ]

    def differentiable(self, invariants: Sequence, chunk: Sequence, k: int, start: Any) -> tuple:
        """``(f, primals, diff_inv, diff_ch)``: the chunk as a function of its wanted inputs."""
        diff_inv, diff_ch = self.wanted(invariants, 0), self.wanted(chunk, 1)

        def f(d_inv: list, d_ch: list) -> tuple:
            inv, ch = list(invariants), list(chunk)
            for i, x in zip(diff_inv, d_inv, strict=True):
                inv[i] = x
            for i, x in zip(diff_ch, d_ch, strict=True):
                ch[i] = x
            return self.body(k, start, inv, ch)

        primals = ([invariants[i] for i in diff_inv], [chunk[i] for i in diff_ch])
        return f, primals, diff_inv, diff_ch

    def zero_sums(self) -> list:
        return [
            jnp.zeros(v.aval.shape, accumulator_dtype(v.aval.dtype, None)) for v in self.plan.sums
        ]

    # -- forward -------------------------------------------------------------------------
    def forward(self, invariants: Sequence, chunked: Sequence, checkpoint: bool = False) -> tuple:
        def one(kk: int, start: Any, inv: Sequence, ch: Sequence) -> tuple:
            return self.body(kk, start, inv, self.slices(ch, start, kk))

        if checkpoint:
            one = jax.checkpoint(one, static_argnums=(0,))

        def step(acc: list, kk: int, start: Any, _: Any) -> tuple:
            s, p, st = one(kk, start, invariants, chunked)
            return add_into(acc, s), (p, st)

        return self.assemble(*self.over_chunks(step, self.zero_sums()))

    def assemble(self, sums: list, scanned: Any, rest: Any) -> tuple:
        plan = self.plan
        partials = []  # per chunk, stacked: combined outside the region so JAX differentiates it
        for i in range(len(plan.partials)):
            parts = ([] if scanned is None else [scanned[0][i]]) + (
                [] if rest is None else [rest[0][i][None]]
            )
            partials.append(jnp.concatenate(parts, axis=0))
        stacked = [
            join(
                None if scanned is None else scanned[1][i],
                None if rest is None else rest[1][i],
                loc,
            )
            for i, loc in enumerate(self.stacked_locs)
        ]
        return sums, partials, stacked

    # -- remat backward ------------------------------------------------------------------
    def backward(self, invariants: Sequence, chunked: Sequence, cts: tuple) -> tuple:
        """Cotangents ``(invariants [accum dtype or None], chunked [or None])`` of this shard.

        ``cts`` holds the cotangents of the float outputs (None for the others); partials'
        cotangents are per chunk of this shard.
        """
        ct_sums, ct_partials, ct_stacked = cts

        def pull(kk: int, start: Any, ct_p: list) -> tuple:
            chunk = self.slices(chunked, start, kk)
            f, primals, _, _ = self.differentiable(invariants, chunk, kk, start)
            _, pullback = jax.vjp(lambda a, b: pick(f(a, b), self.out_float), *primals)
            pullback = canonicalize(pullback)
            ct_st = [
                None if ct is None else take_chunk(ct, loc, start, kk)
                for ct, loc in zip(ct_stacked, self.stacked_locs, strict=True)
            ]
            return pullback(pick((ct_sums, ct_p, ct_st), self.out_float))

        diff_inv, diff_ch = self.wanted(invariants, 0), self.wanted(chunked, 1)
        acc = [
            jnp.zeros(invariants[i].shape, accumulator_dtype(invariants[i].dtype, self.accum_dtype))
            for i in diff_inv
        ]

        def step(acc: list, kk: int, start: Any, ct_p: list) -> tuple:
            d_inv, d_ch = pull(kk, start, ct_p)
            return add_into(acc, d_inv), d_ch

        acc, scanned, rest = self.over_chunks(step, acc, list(ct_partials))

        ct_inv: list = [None] * len(invariants)
        for i, a in zip(diff_inv, acc, strict=True):
            ct_inv[i] = a
        ct_ch: list = [None] * len(chunked)
        for j, i in enumerate(diff_ch):
            ct_ch[i] = join(
                None if scanned is None else scanned[j],
                None if rest is None else rest[j],
                self.chunk_locs[i],
            )
        return ct_inv, ct_ch

    # -- fused forward -------------------------------------------------------------------
    def jacobians(self, invariants: Sequence, chunked: Sequence) -> tuple:
        """This shard's sums and the Jacobian rows of the float sums w.r.t. its inputs."""
        float_sums = [i for i, f in enumerate(self.out_float[0]) if f]
        width = sum(math.prod(self.plan.sums[i].aval.shape) for i in float_sums)
        row_dtype = jacobian_row_dtype(self.plan)
        eye = jnp.eye(width, dtype=row_dtype)

        def rows(kk: int, start: Any) -> tuple:
            chunk = self.slices(chunked, start, kk)
            f, primals, _, _ = self.differentiable(invariants, chunk, kk, start)

            def flat(a: list, b: list) -> tuple:
                sums = f(a, b)[0]
                return jnp.concatenate(
                    [jnp.ravel(sums[i]).astype(row_dtype) for i in float_sums]
                ), sums

            _, pullback, sums = jax.vjp(flat, *primals, has_aux=True)
            if width == 1:  # no vmap: batching would make the convolutions non-canonical
                d_inv, d_ch = canonicalize(pullback)(eye[0])
                return sums, [x[None] for x in d_inv], [x[None] for x in d_ch]
            return (sums, *canonicalize(jax.vmap(pullback))(eye))

        diff_inv = self.wanted(invariants, 0)
        jac = [
            jnp.zeros(
                (width, *invariants[i].shape),
                accumulator_dtype(invariants[i].dtype, self.accum_dtype),
            )
            for i in diff_inv
        ]

        def step(carry: tuple, kk: int, start: Any, _: Any) -> tuple:
            s, d_inv, d_ch = rows(kk, start)
            return (add_into(carry[0], s), add_into(carry[1], d_inv)), d_ch

        (sums, jac), scanned, rest = self.over_chunks(step, (self.zero_sums(), jac))
        diff_ch = self.wanted(chunked, 1)
        jac_ch = [
            join(
                None if scanned is None else scanned[j],
                None if rest is None else rest[j],
                shifted(self.chunk_locs[i]),
            )
            for j, i in enumerate(diff_ch)
        ]
        return sums, jac, jac_ch


class Layout:
    """The axis on one device: the region runs as is."""

    devices = 1

    def region(self, plan: RegionPlan, accum_dtype: Any, needed: Needed = None) -> Region:
        return Region(plan, accum_dtype, plan.size, plan.chunk, 0, needed)

    def map(self, fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
        return fn

    def reduce(self, x: Any) -> Any:
        return x

    def spec(self, loc: AxisLoc | None) -> Any:
        return None


class ShardedLayout(Layout):
    """The axis sharded over ``axes`` of ``mesh``: ``shard_map``, one device per shard."""

    def __init__(self, mesh: Any, axes: tuple[str, ...]):
        self.mesh, self.axes = mesh, axes
        self.devices = math.prod(mesh.shape[a] for a in axes)

    def region(self, plan: RegionPlan, accum_dtype: Any, needed: Needed = None) -> Region:
        local = plan.size // self.devices
        offset = lax.axis_index(self.axes) * local
        return Region(plan, accum_dtype, local, plan.chunk // self.devices, offset, needed)

    def map(self, fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
        return jax.shard_map(
            fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )

    def reduce(self, x: Any) -> Any:
        return None if x is None else lax.psum(x, self.axes)

    def spec(self, loc: AxisLoc | None) -> Any:
        if loc is None:
            return PartitionSpec()
        return PartitionSpec(*([None] * loc.dim), self.axes)


def _aligned(values: Sequence, indices: Sequence[int], n: int) -> list:
    """``values`` placed at ``indices`` of a length-``n`` list, empty placeholders elsewhere."""
    out: list = [jnp.zeros((0,), jnp.bool_)] * n
    for i, x in zip(indices, values, strict=True):
        out[i] = x
    return out


def _unwrap(primals: list) -> tuple[list, list[bool]]:
    """Values and perturbed flags of ``custom_vjp`` primals (``symbolic_zeros=True``)."""
    return [p.value for p in primals], [bool(p.perturbed) for p in primals]


def _mask(flags: Sequence[bool]) -> list:
    """Perturbed flags as residual *shapes*: one empty array per flag, of length 1 if set.

    JAX memoises a ``custom_vjp``'s forward per perturbation pattern but keeps only the
    latest call's residual *pytree structure*; a structure that depended on the flags would
    be paired with another pattern's forward (a stale mask: zero or misplaced gradients).
    Shapes live in the memoised forward jaxpr itself, so they always match it.
    """
    return [jnp.zeros((1 if f else 0,), jnp.bool_) for f in flags]


def _flags(mask: Sequence) -> list[bool]:
    return [m.shape[0] == 1 for m in mask]


def make_region(plan: RegionPlan, grad: str, accum_dtype: Any, layout: Layout) -> Callable:
    """``region(invariants, chunked) -> (sums, stacked partials, stacked)``.

    The custom VJPs use symbolic zeros: only inputs the caller differentiates are
    differentiated (a ``while_loop`` on an input nobody differentiates stays legal), and
    outputs nobody differentiates get zero cotangents.
    """
    spec = layout.spec
    inv_specs = [spec(None) for _ in plan.invariants]
    ch_specs = [spec(loc) for _, loc in plan.chunked]
    out_specs = (
        [spec(None) for _ in plan.sums],
        [spec(AxisLoc(0)) for _ in plan.partials],
        [spec(loc) for _, loc in plan.stacked],
    )
    out_float = float_outputs(plan)

    def reduce_sums(sums: list) -> list:
        return [layout.reduce(s).astype(v.aval.dtype) for s, v in zip(sums, plan.sums, strict=True)]

    def forward_local(checkpoint: bool) -> Callable:
        def fn(invariants: list, chunked: list) -> tuple:
            region = layout.region(plan, accum_dtype)
            sums, partials, stacked = region.forward(invariants, chunked, checkpoint)
            return reduce_sums(sums), partials, stacked

        return layout.map(fn, (inv_specs, ch_specs), out_specs)

    if grad == "native":
        return forward_local(checkpoint=True)

    forward = forward_local(checkpoint=False)

    @jax.custom_vjp
    def region(invariants: list, chunked: list) -> tuple:
        return forward(invariants, chunked)

    def cast_back(cts: list, like: list) -> list:
        return [None if c is None else c.astype(x.dtype) for c, x in zip(cts, like, strict=True)]

    if grad == "remat":

        def fwd(invariants: list, chunked: list) -> tuple:
            (inv, need_inv), (ch, need_ch) = _unwrap(invariants), _unwrap(chunked)
            return forward(inv, ch), (inv, ch, _mask(need_inv), _mask(need_ch))

        def bwd(res: tuple, cts: tuple) -> tuple:
            inv, ch, need_inv, need_ch = res
            needed = (_flags(need_inv), _flags(need_ch))
            cts = tuple(
                [_compat.instantiate(c) if f else None for c, f in zip(group, flags, strict=True)]
                for group, flags in zip(cts, out_float, strict=True)
            )

            def backward_local(invariants: list, chunked: list, cts: tuple) -> tuple:
                local = layout.region(plan, accum_dtype, needed)
                ct_inv, ct_ch = local.backward(invariants, chunked, cts)
                return [layout.reduce(c) for c in ct_inv], ct_ch

            backward = layout.map(
                backward_local, (inv_specs, ch_specs, out_specs), (inv_specs, ch_specs)
            )
            ct_inv, ct_ch = backward(inv, ch, cts)
            return cast_back(ct_inv, inv), cast_back(ct_ch, ch)

    else:  # fused

        def fwd(invariants: list, chunked: list) -> tuple:
            (inv, need_inv), (ch, need_ch) = _unwrap(invariants), _unwrap(chunked)
            needed = (need_inv, need_ch)

            def jacobians_local(invariants: list, chunked: list) -> tuple:
                local = layout.region(plan, accum_dtype, needed)
                sums, jac, jac_ch = local.jacobians(invariants, chunked)
                return reduce_sums(sums), [layout.reduce(j) for j in jac], jac_ch

            wanted_ch = Region(plan, None, 1, 1, 0, needed).wanted(ch, 1)
            jac_ch_specs = [spec(shifted(plan.chunked[i][1])) for i in wanted_ch]
            jacobians = layout.map(
                jacobians_local,
                (inv_specs, ch_specs),
                ([spec(None) for _ in plan.sums], spec(None), jac_ch_specs),
            )
            sums, jac, jac_ch = jacobians(inv, ch)
            # One residual per input (an empty placeholder where not differentiated), so the
            # residual structure does not depend on what is perturbed (see ``_mask``).
            jac_all = _aligned(jac, Region(plan, None, 1, 1, 0, needed).wanted(inv, 0), len(inv))
            jac_ch_all = _aligned(jac_ch, wanted_ch, len(ch))
            return (sums, [], []), (inv, ch, jac_all, jac_ch_all, _mask(need_inv), _mask(need_ch))

        def bwd(res: tuple, cts: tuple) -> tuple:
            inv, ch, jac, jac_ch, need_inv, need_ch = res
            wanted = Region(plan, None, 1, 1, 0, (_flags(need_inv), _flags(need_ch))).wanted
            weights = jnp.concatenate(
                [
                    jnp.ravel(_compat.instantiate(c)).astype(jacobian_row_dtype(plan))
                    for c, f in zip(cts[0], out_float[0], strict=True)
                    if f
                ]
            )

            def contract(values: list, jacs: list, group: int) -> list:
                out: list = [None] * len(values)
                for i in wanted(values, group):
                    out[i] = jnp.tensordot(weights.astype(jacs[i].dtype), jacs[i], axes=1)
                return out

            return cast_back(contract(inv, jac, 0), inv), cast_back(contract(ch, jac_ch, 1), ch)

    region.defvjp(fwd, bwd, symbolic_zeros=True)
    return region


def build(plan: RegionPlan, grad: str, accum_dtype: Any, layout: Layout) -> Callable:
    """``run(*flat_inputs) -> flat outputs`` for the whole program."""
    jaxpr = plan.jaxpr
    if not plan.has_body:  # an empty axis: the program as written

        def as_written(*flat_inputs: Any) -> list:
            env: dict = dict(zip(jaxpr.invars, flat_inputs, strict=True))
            _eval(jaxpr.eqns, range(len(jaxpr.eqns)), env)
            return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

        return as_written
    region = make_region(plan, grad, accum_dtype, layout)
    prologue, epilogue = plan.indices(PROLOGUE), plan.indices(EPILOGUE)

    def run(*flat_inputs: Any) -> list:
        env: dict = dict(zip(jaxpr.invars, flat_inputs, strict=True))
        _eval(jaxpr.eqns, prologue, env)
        inv = [env[v] for v in plan.invariants]
        ch = [env[v] for v, _ in plan.chunked]
        sums, partials, stacked = region(inv, ch)
        env.update(zip(plan.sums, sums, strict=True))
        for (v, kind), stacked_partials in zip(plan.partials, partials, strict=True):
            env[v] = COMBINE[kind](stacked_partials)
        env.update(zip((v for v, _ in plan.stacked), stacked, strict=True))
        _eval(jaxpr.eqns, epilogue, env)
        return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]

    return run


def _eval(eqns: Sequence, indices: Sequence[int], env: dict) -> None:
    for idx in indices:
        eqn = eqns[idx]
        invals = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
        for v, x in zip(eqn.outvars, _compat.bind(eqn, invals), strict=True):
            env[v] = x
