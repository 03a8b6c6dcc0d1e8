"""FSDP and tensor parallelism on 8 (simulated) devices: what each device holds, and the
collectives of each program (``benchmarks/sharding.py --fsdp`` prints the tables).

The model: ``depth`` dense layers of ``width`` x ``width`` (no biases, gelu between them), a
mean-squared-error loss over ``rows`` rows. Every program is ``jax.value_and_grad`` of it,
compiled as an FSDP training step: parameters and batch placed with ``NamedSharding``, the
gradients' ``out_shardings`` those of the parameters. Per-device temp memory is
``compiled.memory_analysis().temp_size_in_bytes`` (per device for an SPMD program).

* **FSDP** (mesh ``(8,)``, ``Auto`` axes; weights ``P("data", None)``, batch ``P("data")``),
  at ``chunk = rows / 16``:

  - *original*: the loss as written, partitioned by GSPMD;
  - *serialize_axis*: ``serialize_axis(loss, chunk, argnums=1, grad="remat",
    mesh_axis="data", param_specs=...)``: each device holds its weight shards across the
    loop, gathers each weight in each chunk, reduce-scatters its gradient there;
  - *serialize_axis, gather once*: the same with ``gather="once"``: each weight gathered once
    before each pass's loop, its gradient accumulated whole and reduce-scattered after it;
  - *hand-written scan*: a ``lax.scan`` over strided chunks of the batch (chunk ``c`` takes
    rows ``c, c + n, ...``, spread over every device) of ``jax.value_and_grad`` of each
    chunk's loss, the gradient accumulator constrained to the parameters' sharding
    (``with_sharding_constraint``) in every step.

* **FSDP + tensor parallelism** (mesh ``(4, 2)``, ``("data", "model")``, ``Auto`` axes;
  weights ``P("data", "model")``): *original* and *serialize_axis*, whose values and
  gradients are checked against the unsharded original's (one device, host inputs).

The two serialize_axis programs are also timed (``time``: the median of 3 steps after one).
Collectives are counted by kind and by place (inside a while loop, outside) in each compiled
program's HLO text (``hlo.collectives_by_place``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hlo import collectives_by_place
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from measuring import EXACT_RTOL, difference, step_time, temp_bytes_of

import jaxpr_accum as ja


def make_problem(rows: int, width: int, depth: int, seed: int = 0) -> tuple[Any, list, tuple]:
    rng = np.random.RandomState(seed)
    params = [
        (rng.normal(size=(width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(depth)
    ]
    batch = tuple(rng.normal(size=(rows, width)).astype(np.float32) for _ in range(2))

    def loss(params: list, batch: tuple) -> jax.Array:
        h, y = batch
        for w in params[:-1]:
            h = jax.nn.gelu(h @ w)
        return jnp.mean((h @ params[-1] - y) ** 2)

    return loss, params, batch


def hand_scan(loss: Any, chunks: int, shardings: list) -> Any:
    """``value_and_grad`` of ``loss`` as a scan over ``chunks`` strided chunks of the batch,
    the accumulator constrained to the parameters' ``shardings`` (equal chunks: the mean of
    the chunks' means is the loss)."""

    def run(params: list, batch: tuple) -> tuple:
        strided = [a.reshape(a.shape[0] // chunks, chunks, *a.shape[1:]) for a in batch]
        xs = tuple(jnp.swapaxes(a, 0, 1) for a in strided)

        def step(carry: tuple, chunk: tuple) -> tuple:
            total, acc = carry
            value, grads = jax.value_and_grad(loss)(params, chunk)
            acc = jax.lax.with_sharding_constraint(
                [a + g for a, g in zip(acc, grads, strict=True)], shardings
            )
            return (total + value, acc), None

        zeros = jax.lax.with_sharding_constraint([jnp.zeros_like(w) for w in params], shardings)
        (total, acc), _ = jax.lax.scan(step, (jnp.zeros(()), zeros), xs)
        return total / chunks, [a / chunks for a in acc]

    return run


def compiled_step(fn: Any, args: tuple, shardings: list) -> Any:
    """``fn`` (returning value and gradients) compiled as an FSDP step at ``args``."""
    return jax.jit(fn, out_shardings=(None, shardings)).lower(*args).compile()


def placed(mesh: Any, params: list, batch: tuple, spec: Any) -> tuple[tuple, list]:
    shardings = [NamedSharding(mesh, spec) for _ in params]
    args = (
        [jax.device_put(w, s) for w, s in zip(params, shardings, strict=True)],
        jax.device_put(batch, NamedSharding(mesh, P("data"))),
    )
    return args, shardings


def fsdp_rows(rows: int, width: int, depth: int) -> list[dict[str, Any]]:
    """Temp memory per device and collectives of the three FSDP programs at ``rows``."""
    loss, params, batch = make_problem(rows, width, depth)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    args, shardings = placed(mesh, params, batch, P("data", None))
    specs = ([P("data", None)] * depth, None)
    kw = {"chunk": rows // 16, "argnums": 1, "grad": "remat", "mesh_axis": "data"}
    sf = ja.serialize_axis(loss, param_specs=specs, **kw)
    once = ja.serialize_axis(loss, param_specs=specs, gather="once", **kw)
    programs = {
        "original (GSPMD)": jax.value_and_grad(loss),
        "serialize_axis": jax.value_and_grad(sf),
        "serialize_axis, gather once": jax.value_and_grad(once),
        "hand-written scan": hand_scan(loss, 16, shardings),
    }
    out = []
    for name, fn in programs.items():
        compiled = compiled_step(fn, args, shardings)
        text = compiled.as_text()
        row = {"program": name, "temp": temp_bytes_of(compiled), **_placed_counts(text)}
        if name.startswith("serialize_axis"):
            row["time"] = step_time(compiled, args)
        out.append(row)
    return out


def fsdp_tp_rows(rows: int, width: int, depth: int) -> list[dict[str, Any]]:
    """The 4 x 2 mesh: temp memory per device, collectives, and the difference from the
    unsharded original."""
    loss, params, batch = make_problem(rows, width, depth, seed=1)
    ref = jax.jit(jax.value_and_grad(loss))(params, batch)
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    args, shardings = placed(mesh, params, batch, P("data", "model"))
    specs = ([P("data", "model")] * depth, None)
    sf = ja.serialize_axis(
        loss, chunk=rows // 16, argnums=1, grad="remat", mesh_axis="data", param_specs=specs
    )
    out = []
    for name, fn in (("original (GSPMD)", loss), ("serialize_axis", sf)):
        compiled = compiled_step(jax.value_and_grad(fn), args, shardings)
        got = compiled(*args)
        err = max(difference(got[0], ref[0]), difference(got[1], ref[1]))
        assert err <= EXACT_RTOL, f"{name}: differs from the unsharded original by {err:.2e}"
        text = compiled.as_text()
        out.append(
            {"program": name, "temp": temp_bytes_of(compiled), "err": err, **_placed_counts(text)}
        )
    return out


def _placed_counts(text: str) -> dict[str, str]:
    by_place = collectives_by_place(text)
    return {
        place: ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "none"
        for place, counts in by_place.items()
    }
