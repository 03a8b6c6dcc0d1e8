"""Tracing: pytrees in, one flat top-level jaxpr out.

1. Take the flattened call (``_arguments``: array leaves are dynamic, the others static).
2. Trace the function on the dynamic leaves' avals with ``jax.make_jaxpr`` (a tracer's own
   aval: weak types and, inside ``shard_map``, varying manual axes, as the original sees).
3. Inline nested ``jit`` / ``closed_call`` equations (so that a reduction inside a jitted
   helper is visible to the planner), by re-tracing through an interpreter that keeps each
   equation's source information; inline a ``checkpoint`` whose outputs only the program
   returns (``jax.checkpoint(loss)``); read the outputs of a ``checkpoint`` or a ``scan`` that
   only pass an input through (Flax NNX's graph updates hand the layer parameters back this
   way) from that input instead; then drop dead equations.
4. Turn the jaxpr's constants into leading inputs: closed-over tracers (parameters closed
   over inside an outer ``jax.grad``) become explicit, differentiable inputs.
5. Find a custom rule that closes over a tracer (a value the function computed, or one of a
   transformation around it): such a program cannot be differentiated once staged
   (``unstageable``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import jax

from jaxpr_accum import _compat
from jaxpr_accum._analysis import _arguments
from jaxpr_accum._base._collector import collector_paused
from jaxpr_accum._base._dtypes import has_float_dtype, is_array_or_tracer
from jaxpr_accum._compat import Array, Atom, ClosedJaxpr, Eqn, Jaxpr, JaxprEqn
from jaxpr_accum._engine import _interpret


@dataclass
class Traced:
    """A traced call: the flat jaxpr and how to get its inputs from a call's arguments."""

    jaxpr: Jaxpr  # no constvars: inputs are ``consts + dynamic leaves``
    consts: list  # values of the leading inputs (concrete arrays or outer tracers)
    out_tree: jax.tree_util.PyTreeDef
    arg_leaf_ranges: list[range]  # positional argument i owns dynamic leaves in this range
    leaf_names: list[str]  # a readable name per dynamic leaf: ``params['Dense_0']['kernel']``
    seed_axes: list | None = None  # the serialized axis per dynamic leaf (argnums / in_axes)
    #: a custom rule call whose rules close over a tracer (``why_unstageable``)
    unstageable: JaxprEqn | None = None

    @property
    def n_consts(self) -> int:
        return len(self.consts)

    @property
    def has_tracer_consts(self) -> bool:
        return any(isinstance(c, jax.core.Tracer) for c in self.consts)

    def why_unstageable(self) -> str | None:
        """Why the program cannot be differentiated once staged, or None: a custom rule reads
        a traced value it closes over (computed inside the function, or of a transformation
        around it; JAX has the same limit, ``jax.grad(jax.jit(f))`` fails alike). A constant
        array it closes over stays the call's constant (``_compat.bind``)."""
        if self.unstageable is None:
            return None
        name, where = _compat.custom_call_identity(self.unstageable)
        return (
            f"a rule of custom-derivative function `{name}` (defined at "
            f"{where.rpartition(' at ')[2]}) closes over an array that the staged program "
            "cannot differentiate: a traced value (computed inside the function, or by a "
            "transformation around it; `jax.grad(jax.jit(f))` fails alike). The function runs "
            f"as written, unchunked. Pass that array to `{name}` as an argument (or use "
            "`jax.closure_convert`) to have it chunked."
        )

    def differentiated(self, inputs: list, pattern: tuple | None) -> list[int]:
        """Indices in ``inputs`` of what the caller differentiates: the floating arguments
        the ``pattern`` marks and the closed-over values an outer ``jax.grad`` traces; every
        floating argument when the pattern is not known (a plain call, or one under
        ``jax.jit``)."""
        if pattern is None:
            return self.float_arguments(inputs)
        nc = self.n_consts
        consts = [i for i in range(nc) if has_float_dtype(inputs[i])]
        consts = [i for i in consts if _compat.differentiated(inputs[i])]
        args = [nc + j for j, p in enumerate(pattern) if p and has_float_dtype(inputs[nc + j])]
        return consts + args

    def float_arguments(self, inputs: list) -> list[int]:
        """Indices in ``inputs`` of the floating arguments (closed-over constants excluded)."""
        nc = self.n_consts
        return [i for i, x in enumerate(inputs) if i >= nc and has_float_dtype(x)]


def trace(fun: Callable, call: _arguments.Call, seed_axes: list | None = None) -> Traced:
    """``fun`` traced at ``call``'s dynamic leaves (the static ones fixed)."""
    leaves, treedef, dynamic = call.leaves, call.treedef, call.dynamic
    out_store: list = []

    def flat_fun(*dyn_leaves: Array) -> list:
        it = iter(dyn_leaves)
        merged = [next(it) if d else leaf for leaf, d in zip(leaves, dynamic, strict=True)]
        args, kwargs = jax.tree_util.tree_unflatten(treedef, merged)
        out = fun(*args, **kwargs)
        paths, out_tree = jax.tree_util.tree_flatten_with_path(out)
        for path, leaf in paths:
            if not (is_array_or_tracer(leaf) or isinstance(leaf, (bool, int, float, complex))):
                name = getattr(fun, "__name__", repr(fun))
                raise TypeError(
                    f"`{name}` returned a {type(leaf).__name__} at output"
                    f"{jax.tree_util.keystr(path) or ''}; a serialized function returns "
                    "arrays (and Python numbers), as a `jax.jit`-ed one does"
                )
        out_leaves = [leaf for _, leaf in paths]
        out_store.append(out_tree)
        return out_leaves

    dyn_avals = [_compat.trace_aval(x) for x, d in zip(leaves, dynamic, strict=True) if d]
    closed = jax.make_jaxpr(flat_fun)(*dyn_avals)
    closed = inline_tail_checkpoints(private_constants(inline_calls(closed)))
    closed = _compat.dce(forward_passthroughs(closed))
    jaxpr, consts = _compat.constvars_to_invars(closed)
    names = _arguments.leaf_names(fun, call)
    with collector_paused():  # traces the custom rules, as planning does
        closing = _compat.first_eqn(jaxpr.eqns, _compat.rules_close_over_tracers)
    return Traced(jaxpr, consts, out_store[0], call.ranges, names, seed_axes, closing)


def inline_calls(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The same program with every nested ``jit`` / ``closed_call`` inlined."""
    if not _interpret.has_calls(closed):
        return closed
    avals = [v.aval for v in closed.jaxpr.invars]
    return jax.make_jaxpr(
        lambda *a: _interpret.eval_jaxpr(closed, a, _interpret.inlining(_interpret.retrace))
    )(*avals)


def inline_tail_checkpoints(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The same program with each top-level ``checkpoint`` whose outputs only the program
    returns evaluated inline: ``jax.checkpoint(loss)`` hides the loss's reduction over the
    axis from the planner. Such a checkpoint lowers no peak within the function (recomputing
    it is the first thing the backward pass does, while all before it is still held), and the
    chunk loop rematerialises the region itself."""
    jaxpr = closed.jaxpr
    read = {v for e in jaxpr.eqns for v in e.invars if not isinstance(v, _compat.Literal)}
    tails = {
        i
        for i, e in enumerate(jaxpr.eqns)
        if _compat.is_checkpoint(e) and not any(v in read for v in e.outvars)
    }
    if not tails:
        return closed

    def emit(idx: int, eqn: Eqn, invals: list) -> list:
        if idx in tails:
            inline = _interpret.inlining(_interpret.retrace, eqn)
            return _interpret.eval_jaxpr(_compat.called_jaxpr(eqn), invals, inline)
        return _interpret.retrace(idx, eqn, invals)

    avals = [v.aval for v in jaxpr.invars]  # and again: a checkpoint may hold another
    return inline_tail_checkpoints(
        jax.make_jaxpr(lambda *a: _interpret.eval_jaxpr(closed, a, emit))(*avals)
    )


def _passed_input(jaxpr: Jaxpr, v: Atom) -> int | None:
    """The index of the input of ``jaxpr`` that output ``v`` is, unchanged, through nested
    ``checkpoint`` calls; None if it is computed."""
    for _ in range(16):
        if isinstance(v, _compat.Literal):  # a constant output: computed
            return None
        if v in jaxpr.invars:
            return jaxpr.invars.index(v)
        eqn = next((e for e in jaxpr.eqns if v in e.outvars), None)
        if eqn is None or not _compat.is_checkpoint(eqn):
            return None
        inner = _compat.open_jaxpr(eqn.params["jaxpr"])
        i = _passed_input(inner, inner.outvars[eqn.outvars.index(v)])
        if i is None or isinstance(outer := eqn.invars[i], _compat.Literal):
            return None
        v = outer
    return None


def _passthrough_sources(eqn: Eqn) -> dict:
    """``{output index: operand}`` for the outputs of a top-level ``checkpoint`` or ``scan``
    that are one of its operands unchanged (a scan's carried value that is never updated,
    or its per-step output that is its per-step input)."""
    if _compat.is_checkpoint(eqn):
        inner = _compat.open_jaxpr(eqn.params["jaxpr"])
        found = {j: _passed_input(inner, v) for j, v in enumerate(inner.outvars)}
        return {j: eqn.invars[i] for j, i in found.items() if i is not None}
    if eqn.primitive is not _compat.primitive("scan"):
        return {}
    p = eqn.params
    nc, ncarry, body = p["num_consts"], p["num_carry"], p["jaxpr"].jaxpr
    out = {}
    for j, v in enumerate(body.outvars):
        i = _passed_input(body, v)
        if i is None:
            continue
        carried = j < ncarry and i == nc + j  # a carry that comes back unchanged
        per_step = j >= ncarry and i >= nc + ncarry  # a per-step input returned as is
        if carried or per_step:
            out[j] = eqn.invars[i]
    return out


def forward_passthroughs(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The same program where readers of a passed-through output read its source."""
    rename: dict = {}
    for eqn in closed.jaxpr.eqns:
        for j, src in _passthrough_sources(eqn).items():
            if not isinstance(eqn.outvars[j], _compat.DropVar):
                rename[eqn.outvars[j]] = rename.get(src, src)
    if not rename:
        return closed
    jaxpr = closed.jaxpr

    def fix(vs: Iterable[Atom]) -> list:
        return [rename.get(v, v) if not isinstance(v, _compat.Literal) else v for v in vs]

    eqns = [e.replace(invars=fix(e.invars)) for e in jaxpr.eqns]
    return closed.replace(jaxpr=jaxpr.replace(eqns=eqns, outvars=fix(jaxpr.outvars)))


def private_constants(closed: ClosedJaxpr) -> ClosedJaxpr:
    """The same program where every equation that reads an integer value computed from
    constants alone (``jnp.arange(n)`` and what is computed from it) has its own copy of that
    computation. One ``arange`` used as each row's own position by one lookup and as labels
    by another would otherwise have to carry the axis for both; copies are free to differ
    (XLA merges them again)."""
    jaxpr = closed.jaxpr
    constant: dict = {}  # value -> the equation computing it from literals alone
    readers: dict = {}
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, _compat.Literal)]
        for v in set(ins) & constant.keys():
            readers[v] = readers.get(v, 0) + 1
        if all(v in constant for v in ins) and _compat.is_pure(eqn) and _integral(eqn):
            constant.update((v, eqn) for v in eqn.outvars)
    if all(n < 2 for n in readers.values()):
        return closed

    eqns: list = []

    def value(v: Atom, copy: dict) -> Atom:
        if isinstance(v, _compat.Literal) or v not in constant:
            return v
        if v not in copy:
            eqn = constant[v]
            invars = [value(x, copy) for x in eqn.invars]
            outvars = [_compat.new_var(x.aval) for x in eqn.outvars]
            copy.update(zip(eqn.outvars, outvars, strict=True))
            eqns.append(eqn.replace(invars=invars, outvars=outvars))
        return copy[v]

    for eqn in jaxpr.eqns:
        if eqn.outvars and eqn.outvars[0] in constant:
            continue
        copy: dict = {}
        eqns.append(eqn.replace(invars=[value(v, copy) for v in eqn.invars]))
    copy = {}
    outvars = [value(v, copy) for v in jaxpr.outvars]
    return closed.replace(jaxpr=jaxpr.replace(eqns=eqns, outvars=outvars))


def _integral(eqn: Eqn) -> bool:
    return all(
        jax.numpy.issubdtype(_compat.shaped(v).dtype, jax.numpy.integer)
        or jax.numpy.issubdtype(_compat.shaped(v).dtype, jax.numpy.bool_)
        for v in eqn.outvars
    )
