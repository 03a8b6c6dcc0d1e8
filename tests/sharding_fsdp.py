"""FSDP and tensor-parallel cases for ``tests/test_sharding.py``, run in the 8-device subprocess
of ``tests/sharding_cases.py`` (whose ``main`` adds ``CASES`` to its own).

The parameters are sharded: over the batch's mesh axis (FSDP, ``P("data", None)``), over
another one (tensor parallelism, ``P(None, "model")``) or both (``P("data", "model")`` on a
4 x 2 mesh), on ``Explicit`` meshes (the shardings are in the avals) and on ``Auto`` ones
(``param_specs=`` names them). A case measures, against the *unsharded, unchunked* original
(``jax.value_and_grad`` on host arrays, one device), the value and gradient errors, the
gradients' shardings, the collectives of the compiled ``jax.jit(jax.value_and_grad(sf))`` by
kind and place (inside a while loop or outside) and the all-reduces' shapes, and the
``explain`` text; ``test_sharding.py`` asserts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxpr_accum as ja
from benchmarks.hlo import all_reduce_shapes, collectives_by_place
from tests.sharding_cases import dropout_problem, mlp_problem, rel_err

GRADS = ("remat", "fused", "native", "auto")


def mlp_specs(weight: Any, bias: Any, last: Any) -> list:
    """Specs of ``mlp_problem``'s three (w, b) layers (the last: ``last``, 32 x 4 and 4)."""
    return [(weight, bias), (weight, bias), last]


def dropout_specs(weight: Any, bias: Any) -> dict:
    """Specs of ``dropout_problem``'s two Dense layers (16 x 32 and 32 x 1: its bias of 1 is
    placed whole)."""
    layer = {"kernel": weight, "bias": bias}
    return {"params": {"Dense_0": layer, "Dense_1": layer}}


def mesh_of(shape: tuple[int, ...], explicit: bool) -> Any:
    names = ("data",) if len(shape) == 1 else ("data", "model")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))


def spec_text(spec: Any) -> str:
    """A spec without its trailing Nones (``P('data', None)`` is ``P('data')``)."""
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return str(P(*entries))


def run_fsdp(
    model: str,
    grad: str,
    *,
    mesh: Any,
    specs: Any,
    explicit: bool,
    chunk: int = 16,
    gather: str = "auto",
) -> dict[str, Any]:
    """One FSDP / tensor-parallel case: ``specs`` place the parameters (on an ``Auto`` mesh,
    ``param_specs=`` says so), the batch is sharded over ``data``; ``gather=`` as given."""
    loss, params, batch, rest = {"mlp": mlp_problem, "dropout": dropout_problem}[model]()
    vg = {"argnums": (0, 1), "allow_int": True}
    ref_value, ref_grads = jax.jit(jax.value_and_grad(loss, **vg))(params, batch, *rest)
    # a spec that does not divide a dimension (4 outputs over 8 devices): placed whole
    placeable = jax.tree.map(lambda a, s: placed_spec(a.shape, s, mesh), params, specs)
    params_s = jax.tree.map(
        lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), params, placeable
    )
    batch_s = jax.device_put(batch, NamedSharding(mesh, P("data")))
    kw = {} if explicit else {"mesh_axis": "data", "param_specs": (specs, None)}
    sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad, gather=gather, **kw)
    args = (params_s, batch_s, *rest)
    compiled = jax.jit(jax.value_and_grad(sf, **vg)).lower(*args).compile()
    value, grads = compiled(*args)
    text = compiled.as_text()
    plan = sf.explain(*args)
    sharded = [
        a.shape
        for a, s in zip(jax.tree.leaves(params), jax.tree.leaves(placeable), strict=True)
        if any(s)
    ]
    return {
        "value_err": rel_err(value, ref_value),
        "params_grad_err": rel_err(grads[0], ref_grads[0]),
        "batch_grad_err": rel_err(grads[1], ref_grads[1]),
        "batch_grad_zeros_equal": all(
            bool(np.array_equal(np.asarray(g) == 0, np.asarray(r) == 0))
            for g, r in zip(jax.tree.leaves(grads[1]), jax.tree.leaves(ref_grads[1]), strict=True)
        ),
        "grad_specs": [spec_text(g.sharding.spec) for g in jax.tree.leaves(grads[0])],
        "param_specs": [spec_text(s) for s in jax.tree.leaves(placeable)],
        "param_ndims": [a.ndim for a in jax.tree.leaves(params)],
        "sharded_shapes": [list(s) for s in sharded],
        "collectives": collectives_by_place(text),
        "all_reduce_shapes": [list(s) for s in all_reduce_shapes(text)],
        "plan_grad": plan.grad,
        "explain": str(plan),
    }


def placed_spec(shape: tuple[int, ...], spec: Any, mesh: Any) -> Any:
    """``spec``, or ``P()`` where it does not divide a dimension: JAX places no array so
    (``param_specs`` may still name it: the loop then keeps the input whole)."""
    for n, entry in zip(shape, spec, strict=False):
        names = () if entry is None else (entry,) if isinstance(entry, str) else entry
        if n % int(np.prod([mesh.shape[a] for a in names])):
            return P()
    return spec


def case(
    model: str, grad: str, shape: tuple[int, ...], explicit: bool, specs: Any, **kw: Any
) -> Callable:
    return lambda: run_fsdp(
        model, grad, mesh=mesh_of(shape, explicit), specs=specs, explicit=explicit, **kw
    )


# the last layer's 4 outputs over 8 devices: uneven, placed whole (``param_specs``: kept whole)
FSDP = mlp_specs(P("data", None), P("data"), (P(None, "data"), P("data")))
FSDP_TP = mlp_specs(P("data", "model"), P("model"), (P("data", "model"), P("model")))
TP = mlp_specs(P(None, "model"), P("model"), (P(None, "model"), P("model")))

CASES: dict[str, Callable[[], dict[str, Any]]] = {}
for _grad in GRADS:
    CASES[f"fsdp-auto-mlp-{_grad}"] = case("mlp", _grad, (8,), False, FSDP)
    CASES[f"fsdp-explicit-mlp-{_grad}"] = case("mlp", _grad, (8,), True, FSDP)
    CASES[f"fsdp_tp-explicit-mlp-{_grad}"] = case("mlp", _grad, (4, 2), True, FSDP_TP, chunk=8)
CASES["fsdp_tp-auto-mlp-remat"] = case("mlp", "remat", (4, 2), False, FSDP_TP, chunk=8)
CASES["tp-explicit-mlp-remat"] = case("mlp", "remat", (4, 2), True, TP, chunk=8)
CASES["tp-explicit-mlp-native"] = case("mlp", "native", (4, 2), True, TP, chunk=8)
# chunk 24: 3 rows per device per chunk, 2 full chunks and a remainder of 2 rows per device
for _grad in ("remat", "fused", "native"):
    CASES[f"fsdp-remainder-dropout-{_grad}"] = case(
        "dropout", _grad, (8,), True, dropout_specs(P("data", None), P("data")), chunk=24
    )
CASES["fsdp-auto-remainder-mlp-remat"] = case("mlp", "remat", (8,), False, FSDP, chunk=24)


def case_two_sums(gather: str = "auto") -> dict[str, Any]:
    """Two sums (fused's Jacobian rows have a leading row dimension) of a ``P("data",
    "model")`` weight on the 4 x 2 mesh: ``jax.jacrev`` in every mode and ``jax.linearize``
    (the chunked forward mode) against the unsharded original's (``gather=`` as given)."""
    rng = np.random.RandomState(4)
    w = rng.normal(size=(16, 32)).astype(np.float32) / 4
    x = rng.normal(size=(64, 16)).astype(np.float32)
    t = rng.normal(size=w.shape).astype(np.float32)

    def f(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jax.numpy.tanh(x @ w)
        return jax.numpy.stack([jax.numpy.mean(h**2), jax.numpy.mean(h)])

    ref_jac = jax.jacrev(f)(w, x)
    ref_tangent = jax.jvp(lambda w: f(w, x), (w,), (t,))[1]
    mesh = mesh_of((4, 2), True)
    spec = NamedSharding(mesh, P("data", "model"))
    ws, ts = jax.device_put(w, spec), jax.device_put(t, spec)
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    facts: dict[str, Any] = {}
    for grad in ("remat", "fused", "native"):
        sf = ja.serialize_axis(f, chunk=8, argnums=1, grad=grad, gather=gather)
        jac = jax.jit(jax.jacrev(sf))(ws, xs)

        def linearized(w: jax.Array, t: jax.Array, sf: Any = sf) -> jax.Array:
            return jax.linearize(lambda w: sf(w, xs), w)[1](t)

        facts[grad] = {
            "jacrev_err": rel_err(jac, ref_jac),
            "jacrev_spec": spec_text(jac.sharding.spec),
            "linearize_err": rel_err(jax.jit(linearized)(ws, ts), ref_tangent),
            "plan_grad": sf.explain(ws, xs).grad,
        }
    return facts


CASES["fsdp_tp-two_sums"] = case_two_sums
CASES["fsdp_tp-two_sums-once"] = lambda: case_two_sums("once")


# gathered once before the loop (``gather="once"``): remat, native, fused, a remainder
for _grad in ("remat", "native", "fused"):
    CASES[f"fsdp-once-explicit-mlp-{_grad}"] = case("mlp", _grad, (8,), True, FSDP, gather="once")
CASES["fsdp-once-remainder-dropout-remat"] = case(
    "dropout",
    "remat",
    (8,),
    True,
    dropout_specs(P("data", None), P("data")),
    chunk=24,
    gather="once",
)


def case_gather_budget() -> dict[str, Any]:
    """``gather="auto"`` under ``memory=`` (two 128 x 128 weights ``P("data", None)`` on an
    ``Auto`` mesh, remat): the least memory of each gathering (the ``SerializeError`` of a
    1-byte budget names it), a budget 4 KiB above gathering once's and one between the two
    least (which fits only gathering per chunk); each plan's layout line and value error."""
    rng = np.random.RandomState(5)
    params = [rng.normal(size=(128, 128)).astype(np.float32) / 11 for _ in range(2)]
    x = rng.normal(size=(1024, 128)).astype(np.float32)  # activations grow with the chunk

    def loss(params: list, x: jax.Array) -> jax.Array:
        return jax.numpy.mean(jax.numpy.tanh(jax.numpy.tanh(x @ params[0]) @ params[1]) ** 2)

    mesh = mesh_of((8,), False)
    specs = [P("data", None)] * 2
    args = (
        [jax.device_put(w, NamedSharding(mesh, s)) for w, s in zip(params, specs, strict=True)],
        jax.device_put(x, NamedSharding(mesh, P("data"))),
    )
    kw = {"argnums": 1, "grad": "remat", "mesh_axis": "data", "param_specs": (specs, None)}

    def least(gather: str) -> int:
        try:
            ja.serialize_axis(loss, memory=1, gather=gather, **kw).explain(*args)
        except ja.SerializeError as e:
            return int(re.search(r"at least .*? \((\d+) bytes\)", str(e)).group(1))
        raise AssertionError("a 1-byte budget fits")

    def planned(memory: Any) -> dict[str, Any]:
        sf = ja.serialize_axis(loss, memory=memory, **kw)
        plan = sf.explain(*args)
        value = sf(*args)  # eagerly: the search cannot lower under jit on an Auto mesh
        return {"layout": plan.layout, "chunk": plan.chunk, "err": rel_err(value, loss(*args))}

    chunk, once = least("chunk"), least("once")
    return {
        "least": {"chunk": chunk, "once": once},
        "fits": planned(once + 4096),
        "over": planned((chunk + once) // 2),
    }


CASES["fsdp-gather_budget"] = case_gather_budget
