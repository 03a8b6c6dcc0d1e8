"""``Region``: the chunked part of one plan, ready to run, and its passes over the whole axis.

A region is a split (which equations form the body, ``_split``), its signature (the named input
and output groups, ``_signature``), the chunk, the layout (one device, or sharded: each device
loops over its own shard under ``shard_map``, ``_layout``) and the accumulation dtype. Its
passes run the per-device loops and merge what the devices computed, once, after the loop
(sharded invariant inputs enter, and their cotangents leave, as shards, gathered per chunk
or once before the loop: ``Layout.before_loop``, ``_shards``):

- ``forward``: the outputs (sums summed across devices and cast back to their dtypes,
  streamed accumulators rescaled to the devices' common stabiliser);
- ``tangents``: forward mode, the tangents of the differentiable outputs (``_loop``);
- ``cotangents``: the remat backward, the cotangents of the perturbed inputs (``_backward``);
- ``jacobians``: the fused mode's forward, sums and Jacobian rows (``_fused``).

Every pass is plain JAX (scans, ``shard_map``, ``jax.vjp`` / ``jax.jvp`` of a chunk), so JAX
can transform it further: the region primitive (``_region_p``) relies on that for every
composition it does not special-case. A region is hashable by identity: a parameter of the
region primitive."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from jaxpr_accum import _compat, _stream
from jaxpr_accum._analysis._split import BODY, Split
from jaxpr_accum._base._lattice import AxisLoc
from jaxpr_accum._base._lists import pick, select, spread
from jaxpr_accum._build._backward import backward
from jaxpr_accum._build._jacobians import jacobians, with_row_dim
from jaxpr_accum._build._layout import Layout
from jaxpr_accum._build._loop import ChunkLoop, wanted
from jaxpr_accum._build._signature import Inputs, Outputs, Signature
from jaxpr_accum._compat import Array, Aval, ClosedJaxpr
from jaxpr_accum._engine import _interpret
from jaxpr_accum._engine._tangents import reached_outputs

T = TypeVar("T")


class Region:
    """The region of ``split`` at ``chunk`` under ``layout`` (see the module docstring)."""

    def __init__(self, split: Split, chunk: int, layout: Layout, accum_dtype: np.dtype | None):
        self.split, self.chunk, self.layout, self.accum_dtype = split, chunk, layout, accum_dtype
        self.signature = Signature.of(split)
        spec = layout.spec
        sig = self.signature
        self.output_specs = Outputs(
            [spec(None) for _ in sig.sums],
            [spec(AxisLoc(0)) for _ in sig.partials],
            [spec(loc) for _, loc in sig.stacked],
            [spec(None)] * sig.streams.n_terms,
            [spec(None)] * sig.streams.n_finals,
        )
        self._jaxprs: dict[Hashable, tuple[ClosedJaxpr, PyTreeDef]] = {}
        #: every pass's name scope: ``checkify`` keeps an error per check site in its loops
        self.scope = _compat.loop_scope(self)

    def __repr__(self) -> str:
        return f"Region(axis={self.split.size}, chunk={self.chunk})"

    def loop(self, shards: list) -> ChunkLoop:
        """This device's chunk loop (inside the layout's mapped function; ``Layout.enter``)."""
        return self.layout.loop(self.split, self.signature, self.accum_dtype, self.chunk, shards)

    def _mapped(self, local: Callable, in_specs: object, out_specs: object) -> Callable:
        """``local`` mapped over the layout's devices, traced in the region's ``scope``."""
        return _compat.traced_in(self.scope, self.layout.map(local, in_specs, out_specs))

    def _merged(self, out: Outputs) -> Outputs:
        """One device's outputs merged across devices: sums added (and cast back to their
        dtypes), streamed accumulators rescaled to the common stabiliser and added."""
        layout, streams = self.layout, self.signature.streams
        dtypes = self.signature.sum_dtypes()
        sums = [layout.reduce(s).astype(d) for s, d in zip(out.sums, dtypes, strict=True)]
        merged = [
            _stream.merge_devices(acc, s, factor, layout.reduce, layout.maximum)
            for acc, s, (_, factor) in zip(
                out.streams, streams.finals_per_term(out.finals), streams.terms, strict=True
            )
        ]
        finals = streams.exp_only([s for _, s in merged])
        return Outputs(sums, out.partials, out.stacked, [a for a, _ in merged], finals)

    # -- passes --------------------------------------------------------------------------
    def forward(self, inputs: Inputs, checkpoint: bool = False) -> Outputs:
        """The region's outputs (``checkpoint``: each chunk's body under ``jax.checkpoint``,
        so that JAX's own differentiation of the loop recomputes it)."""
        placements, in_specs = self.layout.enter(self.signature, inputs)

        def local(inv: list, ch: list) -> Outputs:
            inv = self.layout.before_loop(inv, placements)
            return self._merged(self.loop(placements).forward(Inputs(inv, ch), checkpoint))

        fn = self._mapped(local, tuple(in_specs), self.output_specs)
        return Outputs(*fn(*inputs))

    def tangents(self, inputs: Inputs, tangents: Inputs, finals: Sequence) -> Outputs:
        """Forward mode: the tangents of the differentiable outputs (no finals) for the
        ``tangents`` of the inputs (None: zero). ``finals``: the forward's final stabilisers."""
        sig, layout, spec = self.signature, self.layout, self.layout.spec
        placements, in_specs = self.layout.enter(self.signature, inputs)
        nz = Inputs(
            [i for i, t in enumerate(tangents.invariants) if t is not None],
            [i for i, t in enumerate(tangents.chunked) if t is not None],
        )
        flags = sig.differentiable()

        def local(inv: list, ch: list, t_inv: list, t_ch: list, finals: list) -> Outputs:
            t_inv = layout.before_loop(spread(t_inv, nz.invariants, len(inv)), placements)
            given = Inputs(t_inv, spread(t_ch, nz.chunked, len(ch)))
            inv = layout.before_loop(inv, placements)
            out = self.loop(placements).tangents(
                Inputs(inv, ch), given, sig.streams.finals_per_term(finals)
            )
            dtypes = [d for d, f in zip(sig.sum_dtypes(), flags.sums, strict=True) if f]
            sums = [layout.reduce(s).astype(d) for s, d in zip(out.sums, dtypes, strict=True)]
            streams = [layout.reduce(a) for a in out.streams]
            return Outputs(sums, out.partials, out.stacked, streams, [])

        out_specs = Outputs(*(select(g, f) for g, f in zip(self.output_specs, flags, strict=True)))
        fn = self._mapped(
            local,
            (
                *in_specs,
                [in_specs.invariants[i] for i in nz.invariants],
                [in_specs.chunked[i] for i in nz.chunked],
                [spec(None)] * sig.streams.n_finals,
            ),
            out_specs,
        )
        t_inv = [tangents.invariants[i] for i in nz.invariants]
        t_ch = [tangents.chunked[i] for i in nz.chunked]
        return Outputs(*fn(*inputs, t_inv, t_ch, list(finals)))

    def cotangents(
        self, inputs: Inputs, cts: Outputs, finals: Sequence, perturbed: Inputs
    ) -> Inputs:
        """The remat backward: cotangents of the perturbed floating inputs (None elsewhere),
        in the inputs' dtypes, for the output cotangents ``cts`` (None: zero)."""
        sig, layout, spec = self.signature, self.layout, self.layout.spec
        placements, in_specs = self.layout.enter(self.signature, inputs)
        present = Outputs(*([i for i, c in enumerate(g) if c is not None] for g in cts))
        diff = Inputs(*map(wanted, inputs, perturbed))

        def local(inv: list, ch: list, given: Outputs, finals: list) -> tuple:
            full = Outputs(
                *(spread(g, p, n) for g, p, n in zip(given, present, sig.sizes(), strict=True))
            )
            loop, finals_ = self.loop(placements), sig.streams.finals_per_term(finals)
            inv = layout.before_loop(inv, placements)
            grads = backward(loop, Inputs(inv, ch), full, finals_, perturbed)
            return (
                [layout.reduce(grads.invariants[i], placements[i]) for i in diff.invariants],
                [grads.chunked[i] for i in diff.chunked],
            )

        given = Outputs(*(pick(g, p) for g, p in zip(cts, present, strict=True)))
        given_specs = Outputs(
            *(pick(g, p) for g, p in zip(self.output_specs, present, strict=True))
        )
        fn = self._mapped(
            local,
            (*in_specs, given_specs, [spec(None)] * sig.streams.n_finals),
            (
                [in_specs.invariants[i] for i in diff.invariants],
                [in_specs.chunked[i] for i in diff.chunked],
            ),
        )
        d_inv, d_ch = fn(*inputs, given, list(finals))
        like = lambda g, x: _compat.laid_out_like(g.astype(x.dtype), x)  # noqa: E731
        return inputs.placed(
            diff,
            [like(g, inputs.invariants[i]) for i, g in zip(diff.invariants, d_inv, strict=True)],
            [like(g, inputs.chunked[i]) for i, g in zip(diff.chunked, d_ch, strict=True)],
        )

    def jacobians(self, inputs: Inputs, perturbed: Inputs) -> tuple[list, Inputs]:
        """The fused forward: the sums and the Jacobian rows of the gradient-carrying ones
        with respect to the perturbed floating inputs (None elsewhere)."""
        sig, layout, spec = self.signature, self.layout, self.layout.spec
        placements, in_specs = self.layout.enter(self.signature, inputs)
        diff = Inputs(*map(wanted, inputs, perturbed))
        lead = int(self.split.gradient_width > 1)  # the rows of an invariant input

        def local(inv: list, ch: list) -> tuple:
            inv = layout.before_loop(inv, placements)
            sums, jac = jacobians(self.loop(placements), Inputs(inv, ch), perturbed)
            sums = [layout.reduce(s).astype(d) for s, d in zip(sums, sig.sum_dtypes(), strict=True)]
            return (
                sums,
                [layout.reduce(jac.invariants[i], placements[i]) for i in diff.invariants],
                [jac.chunked[i] for i in diff.chunked],
            )

        fn = self._mapped(
            local,
            tuple(in_specs),
            (
                self.output_specs.sums,
                [layout.spec_of(placements[i], lead) for i in diff.invariants],
                [spec(with_row_dim(sig.chunk_locs[i])) for i in diff.chunked],
            ),
        )
        key = ("jacobians", tuple(perturbed.flat()))
        sums, j_inv, j_ch = self._traced_once(key, fn, tuple(inputs), checked=True)
        return sums, inputs.placed(diff, j_inv, j_ch)

    def _traced_once(
        self, key: Hashable, fn: Callable[..., T], args: tuple, checked: bool = False
    ) -> T:
        """``fn(*args)``, traced once (``_jaxpr_at``) and replayed after: planning's
        validation and the call linearize the region alike, and the replay binds the traced
        equations instead of running the rules again. ``checked``: ``args`` are the region's
        inputs and the pass computes its values; under ``jax_debug_nans`` /
        ``jax_debug_infs`` the replay is one equation whose de-optimized run is the region
        as written (``_compat.checked_call``), so a value it makes invalid is named as the
        original names it, before any equation of the backward pass that the pass holds."""
        leaves, tree = jax.tree.flatten(args)
        avals = [_compat.aval_of(x) for x in leaves]
        closed, out_tree = self._jaxpr_at(
            (key, tree), lambda *flat: fn(*jax.tree.unflatten(tree, flat)), avals
        )
        if checked and _compat.debug_checks_on():
            outs = _compat.checked_call(closed, leaves, self.as_written)
        else:
            outs = jax.extend.core.jaxpr_as_fun(closed)(*leaves)
        return jax.tree.unflatten(out_tree, outs)

    def _jaxpr_at(
        self, key: Hashable, fn: Callable, avals: Sequence[Aval]
    ) -> tuple[ClosedJaxpr, PyTreeDef]:
        """``(ClosedJaxpr, output tree)`` of ``fn`` at the flat input ``avals``, traced once per
        ``key``, avals and context mesh (the region's one cache of traced programs)."""
        full_key = (key, tuple(avals), _compat.context_mesh_key())
        if full_key not in self._jaxprs:
            closed, shape = jax.make_jaxpr(fn, return_shape=True)(*avals)
            self._jaxprs[full_key] = (closed, jax.tree.structure(shape))
        return self._jaxprs[full_key]

    # -- as a traced program -------------------------------------------------------------
    def forward_jaxpr(self, avals: Sequence[Aval], checkpoint: bool = False) -> ClosedJaxpr:
        """The forward pass as a ``ClosedJaxpr`` at the flat input ``avals`` (cached per avals,
        context mesh and ``checkpoint``, as in ``forward``)."""

        def flat_forward(*flat: Array) -> list:
            return self.forward(self.signature.inputs(flat), checkpoint).flat()

        return self._jaxpr_at(("forward", checkpoint), flat_forward, avals)[0]

    def tangent_flags(self, avals: Sequence[Aval], perturbed: Sequence[bool]) -> Outputs:
        """Per output, whether its tangent is nonzero when the flagged inputs are perturbed:
        differentiable, and reached from a perturbed input through differentiable equations
        (JAX's JVP of the forward pass with symbolic zeros). An output computed through
        ``stop_gradient`` gets a symbolic zero, so the equations after the region that read
        only it are not differentiated, as in the original (a callback there has no JVP).

        A region that streams nothing, on one device, takes the JVP of its equations as
        written, once: the loop computes each output from the same equations, chunk by chunk
        (its sums from zeros), so their symbolic zeros are the loop's, whose JVP would
        differentiate the body twice (the fixpoint over the loop's carry). Where every
        equation's rule is known to ``_tangents``, they are read off the equations instead,
        with no JVP traced."""
        as_written = not (self.signature.streams.n_terms or self.split.deferred)
        as_written &= self.layout.devices == 1 and not _compat.union_varying(list(avals))
        reached, sig = None, self.signature
        if as_written:  # read off the equations, where their rules are known (``_tangents``)
            body, outputs = self.written_body(), sig.written_outputs
            reached = reached_outputs(body, sig.input_vars, outputs, perturbed)
        if reached is None:
            if as_written:
                closed = self._jaxpr_at(("as written",), self.as_written, avals)[0]
            else:
                closed = self.forward_jaxpr(avals)
            reached = _compat.nonzero_tangents(closed, perturbed)
        flags = sig.differentiable().flat()
        return sig.outputs([f and r for f, r in zip(flags, reached, strict=True)])

    def written_body(self) -> list:
        """The region's equations as written (on the whole axis), in program order, with
        those nested in them (``_compat.nested_eqns``)."""
        body = [self.split.jaxpr.eqns[i] for i in self.split.indices(BODY)]
        return list(_compat.nested_eqns(body))

    def as_written(self, *flat: Array) -> list:
        """The region's equations as written, on its whole inputs: its flat outputs, where
        it streams nothing (``tangent_flags``; ``_region_p``'s de-optimized run)."""
        env = dict(zip(self.signature.input_vars, flat, strict=True))
        _interpret.eval_eqns(self.split.jaxpr.eqns, env, indices=self.split.indices(BODY))
        return [_interpret.read(env, v) for v in self.signature.written_outputs]
