"""Multi-device cases for ``tests/test_sharding.py``, run in a subprocess with 8 CPU devices.

XLA reads ``--xla_force_host_platform_device_count`` once, when JAX initialises its backend,
so the multi-device checks cannot run in the pytest process (which keeps one device, see
``conftest.py``). ``test_sharding.py`` runs this script once::

    python tests/sharding_cases.py [CASE ...]     # no names: every case

and reads one JSON object per line from stdout: ``{"case": name, ...facts}`` or
``{"case": name, "error": traceback}``. The script only *measures* (errors against the
oracle, collectives in the compiled HLO, the ``explain`` text, error messages); the
assertions, with their thresholds, live in ``test_sharding.py``.

The oracle is the unsharded, unchunked original: ``jax.value_and_grad(loss)`` on host
(numpy) inputs, on one device. The serialized function runs on inputs placed with
``NamedSharding(mesh, P("data"))`` and is compiled once per case with
``jax.jit(jax.value_and_grad(sf)).lower(...).compile()``; that executable gives both the
values and the HLO text.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxpr_accum as ja  # noqa: E402
from benchmarks.hlo import hlo_facts  # noqa: E402
from tests.oracle import GRAD_MODES  # noqa: E402

N_DEVICES = 8
BATCH = 64  # 8 rows per device
CHUNK = 16  # 2 rows per device per chunk: 4 chunks

# --------------------------------------------------------------------------------------
# Comparing with the oracle
# --------------------------------------------------------------------------------------


def rel_err(got: Any, ref: Any) -> float:
    """Largest ``max|got - ref| / max|ref|`` over the leaves (``max|ref| == 0``: absolute)."""
    worst = 0.0
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        if g.shape != r.shape:
            return float("inf")
        scale = float(np.max(np.abs(r), initial=0.0)) or 1.0
        worst = max(worst, float(np.max(np.abs(g - r), initial=0.0)) / scale)
    return worst


def host(tree: Any) -> Any:
    return jax.tree.map(np.asarray, tree)


# --------------------------------------------------------------------------------------
# Models: loss(params, batch, *rest) -> scalar; batch is serialized (argnums=1)
# --------------------------------------------------------------------------------------


def mlp_problem() -> tuple[Callable, Any, Any, tuple]:
    rng = np.random.RandomState(0)
    sizes = [16, 32, 32, 4]
    params = [
        (
            rng.normal(size=(a, b)).astype(np.float32) / np.sqrt(a),
            rng.normal(size=(b,)).astype(np.float32) * 0.1,
        )
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]
    x = rng.normal(size=(BATCH, 16)).astype(np.float32)
    y = rng.normal(size=(BATCH, 4)).astype(np.float32)

    def loss(params: Any, batch: Any) -> jax.Array:
        h, target = batch
        for i, (w, b) in enumerate(params):
            h = h @ w + b
            if i < len(params) - 1:
                h = jnp.tanh(h)
        return jnp.mean((h - target) ** 2)

    return loss, params, (x, y), ()


class ConvNet(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3), strides=(2, 2))(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(10)(x)


def conv_problem() -> tuple[Callable, Any, Any, tuple]:
    rng = np.random.RandomState(1)
    x = rng.normal(size=(BATCH, 8, 8, 3)).astype(np.float32)
    labels = rng.randint(0, 10, size=(BATCH,)).astype(np.int32)
    model = ConvNet()
    params = host(model.init(jax.random.key(0), x[:1]))

    def loss(params: Any, batch: Any) -> jax.Array:
        images, labels = batch
        logits = model.apply(params, images)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return loss, params, (x, labels), ()


class DropoutMLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.Dropout(0.5, deterministic=False)(x)  # on the input: zeros in d loss / d x
        x = nn.relu(nn.Dense(32)(x))
        x = nn.Dropout(0.3, deterministic=False)(x)
        return nn.Dense(1)(x)[:, 0]


def dropout_problem() -> tuple[Callable, Any, Any, tuple]:
    rng = np.random.RandomState(2)
    x = rng.normal(size=(BATCH, 16)).astype(np.float32)
    y = rng.normal(size=(BATCH,)).astype(np.float32)
    model = DropoutMLP()
    params = host(model.init({"params": jax.random.key(0)}, x[:1]))

    def loss(params: Any, batch: Any, key: jax.Array) -> jax.Array:
        x, y = batch
        pred = model.apply(params, x, rngs={"dropout": key})
        return jnp.mean((pred - y) ** 2)

    return loss, params, (x, y), (jax.random.key(42),)


def pool_problem() -> tuple[Callable, Any, Any, tuple]:
    """Softmax pooling over the batch: a streamed normaliser (per-device online max and
    sums, merged across devices after the loop)."""
    rng = np.random.RandomState(3)
    x = rng.normal(size=(BATCH, 16)).astype(np.float32)
    y = rng.normal(size=(BATCH,)).astype(np.float32)
    params = (
        rng.normal(size=(16, 16)).astype(np.float32) / 4,
        rng.normal(size=(16,)).astype(np.float32) * 3,
    )

    def loss(params: Any, batch: Any) -> jax.Array:
        w, v = params
        x, y = batch
        h = jnp.tanh(x @ w)
        weights = jax.nn.softmax(h @ v + y)
        return jnp.sum((weights @ h) ** 2) + jax.nn.logsumexp(h @ v)

    return loss, params, (x, y), ()


PROBLEMS = {
    "mlp": mlp_problem,
    "conv": conv_problem,
    "dropout": dropout_problem,
    "pool": pool_problem,
}


# --------------------------------------------------------------------------------------
# One model case: sharded serialized run vs the unsharded original
# --------------------------------------------------------------------------------------


def run_model(
    model: str,
    grad: str,
    *,
    mesh: Any,
    batch_spec: Any,
    set_mesh: bool = False,
    mesh_axis: Any = None,
    chunk: int = CHUNK,
) -> dict[str, Any]:
    loss, params, batch, rest = PROBLEMS[model]()
    argnums = (0, 1)  # d/d params and d/d batch (zeros of input dropout are visible there)
    vg = {"argnums": argnums, "allow_int": True}  # integer labels: float0 cotangents
    ref_value, ref_grads = jax.jit(jax.value_and_grad(loss, **vg))(params, batch, *rest)

    ctx = jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext()
    with ctx:
        params_s = jax.device_put(params, NamedSharding(mesh, P()))
        batch_s = jax.device_put(batch, NamedSharding(mesh, batch_spec))
        sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad, mesh_axis=mesh_axis)
        args = (params_s, batch_s, *rest)
        compiled = jax.jit(jax.value_and_grad(sf, **vg)).lower(*args).compile()
        value, grads = compiled(*args)
        plan = sf.explain(*args)
        batch_grad_spec = [
            str(g.sharding.spec) for g in jax.tree.leaves(grads[1]) if hasattr(g, "sharding")
        ]

    float_batch = [i for i, b in enumerate(batch) if np.issubdtype(b.dtype, np.floating)]
    facts: dict[str, Any] = {
        "value_err": rel_err(value, ref_value),
        "params_grad_err": rel_err(grads[0], ref_grads[0]),
        "batch_grad_err": rel_err(
            [grads[1][i] for i in float_batch], [ref_grads[1][i] for i in float_batch]
        ),
        # bit-level check of the dropout draws: d loss / d x is exactly 0 where x was dropped
        "batch_grad_zeros_equal": all(
            bool(np.array_equal(np.asarray(grads[1][i]) == 0, np.asarray(ref_grads[1][i]) == 0))
            for i in float_batch
        ),
        "batch_grad_zero_fraction": float(np.mean(np.asarray(ref_grads[1][0]) == 0)),
        "batch_grad_spec": batch_grad_spec,
        "n_grad_leaves": len(jax.tree.leaves(grads)),
        "n_outputs": 1,
        "chunk": chunk,
        "batch": BATCH,
        "plan_grad": plan.grad,
        "explain": str(plan),
    }
    facts.update(hlo_facts(compiled.as_text()))
    return facts


def explicit_mesh() -> Any:
    return jax.make_mesh((N_DEVICES,), ("data",), axis_types=(AxisType.Explicit,))


def auto_mesh() -> Any:
    return jax.make_mesh((N_DEVICES,), ("data",), axis_types=(AxisType.Auto,))


# --------------------------------------------------------------------------------------
# Other cases
# --------------------------------------------------------------------------------------


def case_devices() -> dict[str, Any]:
    return {"device_count": jax.device_count()}


def case_draws() -> dict[str, Any]:
    """Random draws of a stacked (per-row) output are bit-identical to the original's."""

    def noisy(x: jax.Array, key: jax.Array) -> jax.Array:
        u = jax.random.uniform(key, x.shape)
        keep = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.5, x.shape)
        return x * u + keep.astype(x.dtype)

    x = np.random.RandomState(3).normal(size=(BATCH, 16)).astype(np.float32)
    key = jax.random.key(7)
    ref = np.asarray(jax.jit(noisy)(x, key))
    mesh = explicit_mesh()
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    sf = ja.serialize_axis(noisy, chunk=CHUNK, argnums=0)
    got = np.asarray(jax.jit(sf)(xs, key))
    return {
        "bit_identical": bool(np.array_equal(got, ref)),
        "n_different": int(np.sum(got != ref)),
        "explain": str(sf.explain(xs, key)),
    }


def case_parser_control() -> dict[str, Any]:
    """A negative control for ``hlo_facts``: collectives placed inside a scan are found."""
    mesh = explicit_mesh()

    def per_device(x: jax.Array) -> jax.Array:
        def step(carry: jax.Array, row: jax.Array) -> tuple[jax.Array, None]:
            gathered = jax.lax.all_gather(row, "data", tiled=True)
            return carry + jax.lax.psum(jnp.sum(row), "data") + jnp.sum(gathered**2), None

        return jax.lax.scan(step, jnp.zeros((), x.dtype), x)[0]

    f = jax.shard_map(
        per_device, mesh=mesh, in_specs=P(None, "data"), out_specs=P(), check_vma=False
    )
    x = jax.device_put(np.ones((16, BATCH), np.float32), NamedSharding(mesh, P(None, "data")))
    return hlo_facts(jax.jit(f).lower(x).compile().as_text())


def chunk_error(mesh: Any, *, set_mesh: bool, mesh_axis: Any, chunk: int) -> dict[str, Any]:
    loss, params, batch, rest = mlp_problem()
    ctx = jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext()
    facts: dict[str, Any] = {"chunk": chunk}
    with ctx:
        batch_s = jax.device_put(batch, NamedSharding(mesh, P("data")))
        try:
            sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, mesh_axis=mesh_axis)
            facts["decoration_error"] = None
        except Exception as e:  # recorded: the test asserts there is none
            facts["decoration_error"] = f"{type(e).__name__}: {e}"
            return facts
        for how, call in [
            ("call", lambda: sf(params, batch_s)),
            ("jit_value_and_grad", lambda: jax.jit(jax.value_and_grad(sf))(params, batch_s)),
        ]:
            try:
                call()
                facts[how] = None
            except Exception as e:
                facts[how] = {
                    "type": type(e).__name__,
                    "is_value_error": isinstance(e, ValueError),
                    "message": str(e),
                }
    return facts


def case_uneven_axis() -> dict[str, Any]:
    """An axis of 60 rows that 8 shards do not divide, sharded through ``mesh_axis``."""
    loss, params, (x, y), _ = mlp_problem()
    batch = (x[:60], y[:60])
    mesh = auto_mesh()
    with jax.set_mesh(mesh):
        sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, mesh_axis="data")
        try:
            sf(params, batch)
            return {"error_raised": None}
        except Exception as e:
            return {
                "error_raised": {
                    "type": type(e).__name__,
                    "is_value_error": isinstance(e, ValueError),
                    "message": str(e),
                }
            }


def case_reuse(first: str) -> dict[str, Any]:
    """One ``SerializedFunction`` called on unsharded and on sharded inputs (either order).

    Both calls must be right and each must use its own layout: the sharding is part of
    the call signature, as it is for ``jax.jit``.
    """
    loss, params, batch, _ = mlp_problem()
    ref_value, ref_grad = jax.jit(jax.value_and_grad(loss))(params, batch)
    mesh = explicit_mesh()
    placed = {
        "one": (params, batch),
        "sharded": (
            jax.device_put(params, NamedSharding(mesh, P())),
            jax.device_put(batch, NamedSharding(mesh, P("data"))),
        ),
    }
    sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, grad="auto")
    facts: dict[str, Any] = {}
    for which in (first, "sharded" if first == "one" else "one"):
        args = placed[which]
        try:
            value, grad = jax.jit(jax.value_and_grad(sf))(*args)
            facts[which] = {
                "err": max(rel_err(value, ref_value), rel_err(grad, ref_grad)),
                "layout": sf.explain(*args).layout,
            }
        except Exception as e:
            facts[which] = {"raised": f"{type(e).__name__}: {str(e)[:400]}"}
    return facts


def case_bad_mesh_axis() -> dict[str, Any]:
    """``mesh_axis`` naming an axis the mesh lacks, and ``mesh_axis`` without any mesh."""
    loss, params, batch, _ = mlp_problem()
    mesh = auto_mesh()
    placed = jax.device_put(batch, NamedSharding(mesh, P("data")))
    facts: dict[str, Any] = {}
    for how, mesh_axis, b in (("unknown_axis", "model", placed), ("no_mesh", "data", batch)):
        sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, mesh_axis=mesh_axis)
        try:
            sf(params, b)
            facts[how] = None
        except Exception as e:
            facts[how] = {"is_value_error": isinstance(e, ValueError), "message": str(e)}
    return facts


def model_case(model: str, grad: str, **kw: Any) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        kw.setdefault("mesh", explicit_mesh())
        kw.setdefault("batch_spec", P("data"))
        return run_model(model, grad, **kw)

    return run


CASES: dict[str, Callable[[], dict[str, Any]]] = {"devices": case_devices}
# Explicit-sharding mode: the sharding is read from the avals (no mesh_axis).
for _model in PROBLEMS:
    for _grad in ("remat", "auto", "native"):
        CASES[f"{_model}-{_grad}"] = model_case(_model, _grad)
# mesh_axis= on a mesh of Auto axes, whose avals do not carry the sharding.
CASES["mesh_axis-set_mesh-mlp-auto"] = lambda: run_model(
    "mlp", "auto", mesh=auto_mesh(), batch_spec=P("data"), set_mesh=True, mesh_axis="data"
)
CASES["mesh_axis-set_mesh-dropout-remat"] = lambda: run_model(
    "dropout", "remat", mesh=auto_mesh(), batch_spec=P("data"), set_mesh=True, mesh_axis="data"
)
CASES["mesh_axis-inputs-mlp-auto"] = lambda: run_model(
    "mlp", "auto", mesh=auto_mesh(), batch_spec=P("data"), mesh_axis="data"
)
CASES["mesh_axis-inputs-conv-native"] = lambda: run_model(
    "conv", "native", mesh=auto_mesh(), batch_spec=P("data"), mesh_axis="data"
)
# Explicit mode under jax.set_mesh (the sharding is in the avals and in the context).
CASES["set_mesh-explicit-mlp-remat"] = lambda: run_model(
    "mlp", "remat", mesh=explicit_mesh(), batch_spec=P("data"), set_mesh=True
)
# chunk 24: 3 rows per device per chunk, 2 full chunks and a remainder of 2 rows per device.
CASES["dropout-remainder-remat"] = model_case("dropout", "remat", chunk=24)
CASES["set_mesh-explicit-dropout-auto"] = lambda: run_model(
    "dropout", "auto", mesh=explicit_mesh(), batch_spec=P("data"), set_mesh=True
)
# Two mesh axes: the batch over both (a tuple), or over one of them only.
CASES["mesh2d-tuple-mlp-auto"] = lambda: run_model(
    "mlp",
    "auto",
    mesh=jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2),
    batch_spec=P(("x", "y")),
    mesh_axis=("x", "y"),
)
CASES["mesh2d-data-only-mlp-remat"] = lambda: run_model(
    "mlp",
    "remat",
    mesh=jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2),
    batch_spec=P("data"),
    chunk=8,
)
CASES["draws"] = case_draws
CASES["parser_control"] = case_parser_control
CASES["chunk_error-explicit"] = lambda: chunk_error(
    explicit_mesh(), set_mesh=False, mesh_axis=None, chunk=12
)
CASES["chunk_error-mesh_axis"] = lambda: chunk_error(
    auto_mesh(), set_mesh=True, mesh_axis="data", chunk=20
)
CASES["uneven_axis"] = case_uneven_axis
CASES["bad_mesh_axis"] = case_bad_mesh_axis
CASES["reuse-one-then-sharded"] = lambda: case_reuse("one")
CASES["reuse-sharded-then-one"] = lambda: case_reuse("sharded")


def case_shard_map_inside() -> dict[str, Any]:
    """A serialized function called inside ``jax.shard_map`` (per-shard microbatching), with
    ``check_vma`` on (the default) and off, in every mode: outside report r15. The oracle
    is the original under the same ``shard_map``; the loss is a plain MLP and a softmax
    pooling over the (per-shard) batch, which is streamed."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    rs = np.random.RandomState(0)
    w = jnp.asarray(rs.normal(size=(4, 3)) / 2, jnp.float32)
    x = jnp.asarray(rs.normal(size=(64, 4)), jnp.float32)

    def mlp(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def pooled(w, x):
        h = x @ w
        return jnp.sum(jax.nn.softmax(h[:, 0]) * jnp.tanh(h[:, 1]))

    def step(g: Callable, check_vma: bool) -> Callable:
        def per_shard(w, x):
            value, grads = jax.value_and_grad(g, argnums=(0, 1))(w, x)
            return jax.lax.pmean(value, "d"), jax.lax.pmean(grads[0], "d"), grads[1]

        return jax.jit(
            jax.shard_map(
                per_shard,
                mesh=mesh,
                in_specs=(P(), P("d")),
                out_specs=(P(), P(), P("d")),
                check_vma=check_vma,
            )
        )

    facts: dict[str, Any] = {}
    for name, loss in (("mlp", mlp), ("pooled", pooled)):
        for check_vma in (True, False):
            ref = step(loss, check_vma)(w, x)
            for grad in GRAD_MODES:
                key = f"{name}-{grad}-check_vma={check_vma}"
                sf = ja.serialize_axis(loss, chunk=3, argnums=1, grad=grad)
                try:
                    facts[key] = {"err": rel_err(step(sf, check_vma)(w, x), ref)}
                except Exception as e:
                    facts[key] = {"raised": f"{type(e).__name__}: {str(e)[:400]}"}
    return facts


CASES["shard_map_inside"] = case_shard_map_inside


@jax.custom_vjp
def _batch_normalised_cotangent(z: jax.Array) -> jax.Array:
    return z  # identity; the backward divides the cotangent by its (per-shard) batch mean


_batch_normalised_cotangent.defvjp(
    lambda z: (z, None), lambda _, g: (g / (jnp.mean(jnp.abs(g), axis=0) + 1.0),)
)


def case_shard_map_idioms() -> dict[str, Any]:
    """Idioms inside ``jax.shard_map`` (``check_vma=True``) that the fuzzer found (repros
    f02-f04) and their class: a ``custom_vjp`` whose backward mixes the batch, a
    ``jax.checkpoint`` or a ``lax.scan`` over replicated weights (fused once gave their
    gradients 8x, summed over the mesh twice), a function of a batch variance, a streamed
    pooling under a checkpoint. Gradients with respect to every argument, taken inside the
    ``shard_map`` and outside it, in every mode; the oracle is the original under the same
    stack."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
    rs = np.random.RandomState(1)
    w = jnp.asarray(rs.normal(size=(3, 4)), jnp.float32)
    ws = jnp.asarray(rs.normal(size=(2, 4, 4)) / 2, jnp.float32)
    x = jnp.asarray(rs.normal(size=(64, 3)), jnp.float32)

    def custom_vjp(w, ws, x):
        return jnp.mean(jnp.tanh(_batch_normalised_cotangent(x @ w)) ** 2)

    def checkpoint(w, ws, x):
        return jnp.mean(jax.checkpoint(lambda z: jnp.tanh(z @ w))(x) ** 2)

    def scan(w, ws, x):
        h, _ = jax.lax.scan(lambda c, v: (c + 0.5 * jnp.tanh(c @ v), None), jnp.tanh(x @ w), ws)
        return jnp.mean(h**2)

    def variance(w, ws, x):
        return jnp.sum(jnp.log(jnp.var(jnp.tanh(x @ w), axis=0) + 0.1))

    def pooled_checkpoint(w, ws, x):
        h = jax.checkpoint(lambda z: z @ w)(x)
        return jnp.sum(jax.nn.softmax(h[:, 0]) * jnp.tanh(h[:, 1])) + jnp.clip(h.mean(), -1, 1)

    specs = (P(), P(), P("d"))

    def inside(g: Callable) -> Callable:
        def per_shard(w, ws, x):
            value, (dw, dws, dx) = jax.value_and_grad(g, argnums=(0, 1, 2))(w, ws, x)
            return tuple(jax.lax.pmean(a, "d") for a in (value, dw, dws)) + (dx,)

        out_specs = (P(), P(), P(), P("d"))
        return jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=specs, out_specs=out_specs))

    def outside(g: Callable) -> Callable:
        mapped = jax.shard_map(
            lambda w, ws, x: jax.lax.pmean(g(w, ws, x), "d"),
            mesh=mesh,
            in_specs=specs,
            out_specs=P(),
        )
        return jax.jit(jax.value_and_grad(mapped, argnums=(0, 1, 2)))

    # the chunked axis a replicated weight's: the hidden units of ``w`` (the fuzzer's seed 808,
    # where the automatic axis chose them: fused's rows of that weight were summed twice)
    axes = {"batch": {"argnums": 2}, "hidden_units": {"in_axes": (1, None, None)}}
    facts: dict[str, Any] = {}
    cases = [(f, "batch") for f in (custom_vjp, checkpoint, scan, variance, pooled_checkpoint)]
    cases += [(checkpoint, "hidden_units")]
    for loss, axis in cases:
        for where in (inside, outside):
            ref = where(loss)(w, ws, x)
            for grad in GRAD_MODES:
                key = f"{loss.__name__}-{where.__name__}-{grad}-{axis}"
                sf = ja.serialize_axis(loss, chunk=3, grad=grad, **axes[axis])
                try:
                    facts[key] = {"err": rel_err(where(sf)(w, ws, x), ref)}
                except Exception as e:
                    facts[key] = {"raised": f"{type(e).__name__}: {str(e)[:400]}"}
    return facts


CASES["shard_map_idioms"] = case_shard_map_idioms


def case_checkify() -> dict[str, Any]:
    """``checkify`` of a serialized function whose batch is sharded (a user check on one row;
    24 rows, 3 per device: chunk 8 takes one a device, chunk 16 two and a remainder), inside
    ``jax.set_mesh`` and not, erring and clean: each report, and the original's."""
    from jax.experimental import checkify

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        checkify.check(jnp.all(x[:, 0] > -5), "bad row {v}", v=jnp.min(x[:, 0]))
        return jnp.mean(jnp.tanh(x @ w))

    rs = np.random.RandomState(0)
    w, x = rs.normal(size=(3, 4)).astype(np.float32), rs.normal(size=(24, 3)).astype(np.float32)
    x[17, 0] = -20.0
    mesh = explicit_mesh()
    args = {
        clean: (
            jax.device_put(w, NamedSharding(mesh, P())),
            jax.device_put(np.abs(x) if clean else x, NamedSharding(mesh, P("data"))),
        )
        for clean in (False, True)
    }

    def report(f: Callable, clean: bool) -> str | None:
        try:
            return jax.jit(checkify.checkify(f, errors=checkify.user_checks))(*args[clean])[0].get()
        except Exception as e:
            return f"raised {type(e).__name__}: {str(e)[:300]}"

    facts: dict[str, Any] = {}
    for set_mesh in (False, True):
        with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
            for clean in (False, True):
                facts[f"original-{set_mesh}-{clean}"] = report(loss, clean)
                for grad in GRAD_MODES:
                    for chunk in (8, 16):
                        sf = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad)
                        facts[f"{grad}-{chunk}-{set_mesh}-{clean}"] = report(sf, clean)
    return {"reports": facts}


CASES["checkify"] = case_checkify


def _automatic_checks() -> dict[str, Callable]:
    """Programs whose checks fire per row where ``x[:, 0]`` is below a threshold: -5 in rows
    5 (a device's remainder) and 23, -25 in row 23 only (the last device's remainder), -19
    in both."""

    def lookup(w: jax.Array, x: jax.Array, below: float) -> jax.Array:
        idx = jnp.where(x[:, 0] < below, 100 + jnp.arange(x.shape[0]), 0)
        return jnp.take(w[0], idx, mode=None)[:, None]

    def division(x: jax.Array, below: float) -> jax.Array:
        return (1 // (x[:, :1] >= below).astype(jnp.int32)).astype(x.dtype)

    def head(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    return {
        "div": lambda w, x: jnp.mean(head(w, x) + division(x, -5.0)),
        "nan": lambda w, x: jnp.mean(head(w, x) + jnp.log(x[:, :1] + 5.0)),
        "index": lambda w, x: jnp.mean(head(w, x) + lookup(w, x, -5.0)),
        # two of one kind: the first in the program (``log``) fires only in row 23, the
        # second (``sqrt``) also in row 5 (an earlier device); the original reports ``log``
        "two_nans": lambda w, x: jnp.mean(
            head(w, x) + jnp.log(x[:, :1] + 25.0) + jnp.sqrt(x[:, :1] + 5.0)
        ),
        # two kinds: the division (first in the program) fires only in row 23, the lookup
        # in row 5 too; the original reports the division
        "two_kinds": lambda w, x: jnp.mean(head(w, x) + division(x, -25.0) + lookup(w, x, -5.0)),
        # two of one kind in a loop of the user's: the first in the program (``log``) fires
        # at the last step only (rows 5 and 23), the second (``sqrt``) at every step (row 23,
        # the last device); the original reports ``sqrt``, which fires at the earlier step
        "loop_two_nans": lambda w, x: jnp.mean(
            jax.lax.scan(
                lambda h, s: (
                    h + jnp.log(x[:, :1] + 19.0 + 30.0 * (s < 2)) + jnp.sqrt(x[:, :1] + 25.0),
                    None,
                ),
                head(w, x),
                jnp.arange(3),
            )[0]
        ),
    }


def case_checkify_automatic() -> dict[str, Any]:
    """``checkify`` with JAX's automatic checks (``all_checks``) of a serialized function
    whose batch is sharded (24 rows, 3 per device, chunk 16: 2 rows, then a remainder, on
    each), on an explicit mesh and on an auto one (``mesh_axis``): each report, and the
    original's (None where it raises, as JAX's checkify of a lookup does on an explicit
    mesh)."""
    from jax.experimental import checkify

    rs = np.random.RandomState(0)
    w, x = rs.normal(size=(3, 4)).astype(np.float32), np.abs(rs.normal(size=(24, 3)))
    x = x.astype(np.float32)
    x[5, 0], x[23, 0] = -20.0, -30.0
    calls = {"forward": lambda f: f, "value_and_grad": lambda f: jax.value_and_grad(f)}

    def report(f: Callable, args: tuple, jit: bool = True) -> str | None:
        checked = checkify.checkify(f, errors=checkify.all_checks)
        try:
            return (jax.jit(checked) if jit else checked)(*args)[0].get()
        except Exception as e:
            return f"raised {type(e).__name__}: {str(e)[:300]}"

    def jvp(f: Callable) -> Callable:  # tangents made inside, eagerly: not laid out as x
        return lambda w, x: jax.jvp(f, (w, x), (jnp.ones_like(w), jnp.ones_like(x)))

    facts: dict[str, Any] = {}
    for name, mesh, kw in [
        ("explicit", explicit_mesh(), {}),
        ("auto", auto_mesh(), {"mesh_axis": "data"}),
    ]:
        args = (
            jax.device_put(w, NamedSharding(mesh, P())),
            jax.device_put(x, NamedSharding(mesh, P("data"))),
        )
        for program, loss in _automatic_checks().items():
            for grad, call in [("remat", "forward"), ("fused", "value_and_grad"),
                               ("native", "value_and_grad"), ("auto", "forward"),
                               ("remat", "value_and_grad")]:  # fmt: skip
                sf = ja.serialize_axis(loss, chunk=16, argnums=1, grad=grad, **kw)
                key = f"{name}/{program}/{call}"
                facts.setdefault(key, {"original": report(calls[call](loss), args)})
                facts[key][grad] = report(calls[call](sf), args)
        with jax.set_mesh(mesh):
            loss = _automatic_checks()["nan"]
            sf = ja.serialize_axis(loss, chunk=16, argnums=1, **kw)
            facts[f"{name}/nan/eager jvp"] = {
                "original": report(jvp(loss), args, jit=False),
                "auto": report(jvp(sf), args, jit=False),
            }
    return {"reports": facts}


CASES["checkify-automatic"] = case_checkify_automatic


def _nested_tails() -> dict[str, Callable]:
    """Parts that run as written (they mix the rows of ``h``, the region's rows) inside a
    jaxpr of their own: a ``scan``, ``cond``, ``while``, ``jit``, custom VJP, checkpoint."""

    @jax.custom_vjp
    def centred(h: jax.Array) -> jax.Array:
        return h - jnp.mean(h, axis=0)

    centred.defvjp(lambda h: (centred(h), None), lambda _, g: (g - jnp.mean(g, axis=0),))
    return {
        "scan": lambda h, x: jax.lax.scan(
            lambda c, s: (c + jnp.sum(h) * s, None), jnp.zeros(()), jnp.arange(3.0)
        )[0],
        "cond": lambda h, x: jax.lax.cond(
            jnp.sum(x) > 0, lambda h: jnp.sum(h**2), lambda h: jnp.sum(h), h
        ),
        "while": lambda h, x: jax.lax.fori_loop(0, 2, lambda i, c: c + jnp.sum(h * c), 0.5),
        "jit": lambda h, x: jnp.sum(jax.jit(lambda h: (h - h.mean(0)) / (h.std(0) + 1.0))(h) ** 2),
        "custom_vjp": lambda h, x: jnp.sum(centred(h) ** 2),
        "checkpoint": lambda h, x: jnp.sum(jax.checkpoint(lambda h: jnp.sin(h - h.mean(0)))(h)),
    }


def case_nested_as_written() -> dict[str, Any]:
    """On an explicit mesh, a part that runs as written inside a jaxpr of its own (traced
    without the mesh's layouts) and reads the sharded rows: ``jax.grad`` raised JAX's
    "Expected cotangent type float32[24@data,4]" or ``shard_map``'s "in_specs ... does not
    match", in every mode, native included. Per program and mode, with and without
    ``jax.set_mesh``: the error of values and gradients (both arguments) against the
    original on the same inputs, and ``checkify`` of the gradient (``all_checks``, a NaN in
    row 17) against the original's report."""
    from jax.experimental import checkify

    rs = np.random.RandomState(0)
    mesh = explicit_mesh()
    w = jax.device_put(rs.normal(size=(3, 4)).astype(np.float32), NamedSharding(mesh, P()))
    x = rs.normal(size=(24, 3)).astype(np.float32)
    erring = x.copy()
    erring[17, 0] = -20.0
    x, erring = (jax.device_put(v, NamedSharding(mesh, P("data"))) for v in (x, erring))

    def report(f: Callable) -> str | None:
        checked = checkify.checkify(jax.grad(f, argnums=(0, 1)), errors=checkify.all_checks)
        return jax.jit(checked)(w, erring)[0].get()

    facts: dict[str, Any] = {}
    for set_mesh in (False, True):
        with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
            for name, tail in _nested_tails().items():

                def loss(w: jax.Array, x: jax.Array, tail: Callable = tail) -> jax.Array:
                    h = jnp.tanh(x @ w)
                    return jnp.mean(jnp.log(h + 2.0)) + tail(h, x) + jnp.mean(jnp.sqrt(x + 3.0))

                want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, x)
                wanted_report = report(loss)
                for grad in ("remat", "fused", "native"):  # auto is one of the first two
                    sf = ja.serialize_axis(loss, chunk=16, argnums=1, grad=grad)
                    key = f"{name}/{grad}/{'set_mesh' if set_mesh else 'inputs'}"
                    try:
                        got = jax.jit(jax.value_and_grad(sf, argnums=(0, 1)))(w, x)
                        facts[key] = {
                            "err": rel_err(got, want),
                            "report": report(sf),
                            "original": wanted_report,
                        }
                    except Exception as e:
                        facts[key] = {"raised": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"programs": facts}


CASES["nested-as-written"] = case_nested_as_written


def case_parameters_sharded_batch_whole() -> dict[str, Any]:
    """Tensor parallelism alone on an explicit mesh: the parameters and the features sharded
    over ``model``, the batch whole (one device's loop, no ``shard_map``), a ``lax.scan`` of
    checkpointed layers. Under ``jax.set_mesh`` remat and fused raised "scan body function
    carry input and carry output must have equal types" (the gradient accumulators started
    whole, their updates sharded). Per mode, with and without ``jax.set_mesh``: the error
    of values and gradients against the original on the same inputs, and the gradient's
    spec."""
    mesh = jax.make_mesh((8,), ("model",), axis_types=(AxisType.Explicit,))

    def loss(ws: jax.Array, x: jax.Array) -> jax.Array:
        def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
            return jnp.tanh(h * w[0] + 0.01 * jnp.sum(w)), None

        h, _ = jax.lax.scan(jax.checkpoint(layer), x, ws)
        return jnp.mean(h**2)

    rs = np.random.RandomState(0)
    ws = rs.normal(size=(3, 16, 16)).astype(np.float32) * 0.3
    ws = jax.device_put(ws, NamedSharding(mesh, P(None, None, "model")))
    x = rs.normal(size=(32, 16)).astype(np.float32)
    x = jax.device_put(x, NamedSharding(mesh, P(None, "model")))
    facts: dict[str, Any] = {}
    for set_mesh in (False, True):
        with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
            want = jax.jit(jax.value_and_grad(loss))(ws, x)
            for grad in GRAD_MODES:
                sf = ja.serialize_axis(loss, chunk=8, argnums=1, grad=grad)
                key = f"{grad}/{'set_mesh' if set_mesh else 'inputs'}"
                try:
                    got = jax.jit(jax.value_and_grad(sf))(ws, x)
                    spec = str(jax.typeof(got[1]).sharding.spec)
                    facts[key] = {"err": rel_err(got, want), "spec": spec}
                except Exception as e:
                    facts[key] = {"raised": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"modes": facts}


CASES["parameters-sharded-batch-whole"] = case_parameters_sharded_batch_whole


def case_layout_errors() -> dict[str, Any]:
    """Programs JAX refuses on an explicit mesh, at their layouts: a ``lax.scan`` over the
    sharded rows, a lookup with sharded indices and no ``out_sharding``, a matmul whose
    contracted dimension is sharded on both sides (as FSDP parameters make it). The library
    traces without explicit layouts, so each runs with the unsharded program's values. Per
    program and mode, with and without ``jax.set_mesh``: the original's exception, and the
    serialized function's error of values and gradients against the unsharded original."""
    data = explicit_mesh()
    two_d = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rs = np.random.RandomState(0)
    w, x = rs.normal(size=(8, 4)).astype(np.float32), rs.normal(size=(24, 8)).astype(np.float32)

    def scan_rows(w: jax.Array, x: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ w)
        return jnp.mean(jax.lax.scan(lambda c, r: (0.9 * c + r, c), jnp.zeros(4), h)[1] ** 2)

    def lookup(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w)) + jnp.mean(jnp.take(w[0], (x[:, 0] < 0).astype(int)))

    def contraction(w: jax.Array, x: jax.Array) -> jax.Array:  # both sides over model
        return jnp.mean(jnp.tanh(x @ w) @ w.T)

    programs = {
        "scan_rows": (scan_rows, data, P(), P("data")),
        "lookup": (lookup, data, P(), P("data")),
        "contraction": (contraction, two_d, P(None, "model"), P("data")),
    }

    facts: dict[str, Any] = {}
    for name, (loss, mesh, w_spec, x_spec) in programs.items():
        want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, x)
        args = (
            jax.device_put(w, NamedSharding(mesh, w_spec)),
            jax.device_put(x, NamedSharding(mesh, x_spec)),
        )
        for set_mesh in (False, True):
            with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
                got: dict[str, Any] = {}
                for grad in ("original", "remat", "native"):
                    f = (
                        loss
                        if grad == "original"
                        else ja.serialize_axis(loss, chunk=8, argnums=1, grad=grad)
                    )
                    try:
                        out = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(*args)
                        got[grad] = {"err": rel_err(host(out), want)}
                    except Exception as e:
                        got[grad] = {"raised": f"{type(e).__name__}: {str(e)[:200]}"}
                facts[f"{name}/{'set_mesh' if set_mesh else 'inputs'}"] = got
    return {"programs": facts}


CASES["layout-errors"] = case_layout_errors


def case_batch_and_features_sharded() -> dict[str, Any]:
    """The batch over ``data`` and its features over ``model`` (a 4 x 2 explicit mesh): the
    chunk loop's ``shard_map`` takes the batch by its rows only, and raised "in_specs ...
    P('data', None) does not match ... P('data', 'model')" in every mode. Per mode, with and
    without ``jax.set_mesh``: the error of values and gradients against the original on the
    same inputs, and the batch gradient's spec."""
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rs = np.random.RandomState(0)
    w = jax.device_put(rs.normal(size=(8, 4)).astype(np.float32), NamedSharding(mesh, P()))
    x = rs.normal(size=(24, 8)).astype(np.float32)
    x = jax.device_put(x, NamedSharding(mesh, P("data", "model")))

    def loss(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(jnp.sin(x))

    facts: dict[str, Any] = {}
    for set_mesh in (False, True):
        with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
            want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, x)
            for grad in GRAD_MODES:
                sf = ja.serialize_axis(loss, chunk=8, argnums=1, grad=grad)
                key = f"{grad}/{'set_mesh' if set_mesh else 'inputs'}"
                try:
                    got = jax.jit(jax.value_and_grad(sf, argnums=(0, 1)))(w, x)
                    spec = str(jax.typeof(got[1][1]).sharding.spec)
                    facts[key] = {"err": rel_err(got, want), "spec": spec}
                except Exception as e:
                    facts[key] = {"raised": f"{type(e).__name__}: {str(e)[:300]}"}
    return {"modes": facts}


CASES["batch-and-features-sharded"] = case_batch_and_features_sharded


def main(names: list[str]) -> None:
    from tests.sharding_fsdp import CASES as FSDP_CASES  # imports this module: not at the top

    cases = {**CASES, **FSDP_CASES}
    for name in names or list(cases):
        try:
            facts = {"case": name, **cases[name]()}
        except Exception:
            facts = {"case": name, "error": traceback.format_exc()}
        print(json.dumps(facts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
