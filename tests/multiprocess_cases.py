"""One process of the multi-process check in ``tests/test_multiprocess.py``.

``python tests/multiprocess_cases.py RANK N_PROCESSES PORT OUTDIR`` starts a JAX process with
4 CPU devices, joins the others with ``jax.distributed.initialize`` over
``127.0.0.1:PORT`` (the CPU collectives are gloo, the jax 0.10 default), and builds one
global mesh ``("data",)`` over every process's devices (8 for 2 processes). Then, for each
case of ``model_cases`` (the dense MLP and the Flax dropout MLP of
``tests/sharding_cases.py``, each gradient mode with both models and both layouts):

* the reference: ``jax.value_and_grad`` of the *unchanged* loss on the full host arrays, in
  this process, on one local device, no sharding, no chunks;
* the serialized loss, ``serialize_axis(loss, chunk=16, argnums=1, grad=mode,
  mesh_axis="data")``, on the batch sharded over the global mesh, compiled once with
  ``jax.jit(jax.value_and_grad(sf)).lower(...).compile()``: its value and gradients (the
  batch gradient gathered from every process), and the collectives in its HLO
  (``benchmarks/hlo.py``'s ``hlo_facts``); the ``fsdp-`` cases shard the parameters over
  ``"data"`` too (FSDP, ``param_specs=``), with the gradients' shardings;
* three ``optax.adam`` steps of the serialized loss on the global mesh, the same three steps
  of the reference in this process, and the parameters after them, saved to
  ``OUTDIR/params-{case}-{rank}.npz`` so that the test compares them across processes.

It writes one JSON object per line to ``OUTDIR/facts-{rank}.jsonl``: ``{"case": name, ...}``
or ``{"case": name, "error": traceback}``. It only measures; the assertions live in
``test_multiprocess.py``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import jax

LOCAL_DEVICES = 4
CHUNK = 16  # 64 rows over 8 devices: 8 rows each, 2 per chunk, 4 chunks
STEPS = 3
MODELS = ("mlp", "dropout")


def model_cases(modes: tuple[str, ...]) -> list[tuple[str, str, bool]]:
    """``(model, mode, fsdp)``: every mode with both models and both layouts (replicated
    parameters, FSDP), and each model with both layouts: 8 of the 16 combinations."""
    return [
        (model, mode, (i + j) % 2 == 1)
        for i, mode in enumerate(modes)
        for j, model in enumerate(MODELS)
    ]


def case_name(model: str, mode: str, fsdp: bool) -> str:
    return f"{'fsdp-' if fsdp else ''}{model}-{mode}"


def main(rank: int, n_processes: int, port: str, outdir: Path) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    address = f"127.0.0.1:{port}"
    jax.distributed.initialize(
        address,
        num_processes=n_processes,
        process_id=rank,
        coordinator_bind_address=address,
        initialization_timeout=120,
    )
    facts_file = outdir / f"facts-{rank}.jsonl"
    try:
        with facts_file.open("w") as out:
            for name, run in cases(outdir, rank).items():
                try:
                    facts = {"case": name, **run()}
                except Exception:
                    facts = {"case": name, "error": traceback.format_exc()}
                out.write(json.dumps(facts) + "\n")
                out.flush()
    finally:
        jax.distributed.shutdown()


def cases(outdir: Path, rank: int) -> dict[str, Any]:
    # Imported after the backend is initialised: sharding_cases sets XLA_FLAGS for its own
    # single-process use, which no longer matters once the devices exist.
    import numpy as np
    import optax
    from jax.experimental import multihost_utils
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxpr_accum as ja
    from benchmarks.hlo import hlo_facts
    from tests.oracle import GRAD_MODES
    from tests.sharding_cases import dropout_problem, mlp_problem, rel_err
    from tests.sharding_fsdp import FSDP, dropout_specs, placed_spec, spec_text

    def devices() -> dict[str, Any]:
        return {
            "process_index": jax.process_index(),
            "process_count": jax.process_count(),
            "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(),
        }

    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    local = jax.local_devices()[0]

    def place(tree: Any, spec: Any) -> Any:
        """Global arrays from the full host arrays every process holds (``spec``: one for
        every leaf, or a tree of them)."""
        specs = jax.tree.map(lambda _: spec, tree) if isinstance(spec, P) else spec
        return jax.tree.map(
            lambda a, s: jax.make_array_from_callback(
                a.shape, NamedSharding(mesh, s), lambda idx: a[idx]
            ),
            tree,
            specs,
        )

    def to_host(tree: Any) -> Any:
        """Every leaf's full value, on every process."""
        return jax.tree.map(
            lambda a: np.asarray(multihost_utils.process_allgather(a, tiled=True)), tree
        )

    def problem(model: str) -> tuple[Any, Any, Any, tuple]:
        loss, params, batch, rest = {"mlp": mlp_problem, "dropout": dropout_problem}[model]()
        if rest:  # the dropout key, as raw key data that can be replicated over the mesh
            key_data = np.asarray(jax.random.key_data(rest[0]))

            def keyed(params: Any, batch: Any, key_data: jax.Array, loss=loss) -> jax.Array:
                return loss(params, batch, jax.random.wrap_key_data(key_data))

            return keyed, params, batch, (key_data,)
        return loss, params, batch, rest

    def weights(tree: Any) -> list:
        return [a for a in jax.tree.leaves(tree) if a.ndim == 2]

    def model_case(model: str, mode: str, fsdp: bool) -> dict[str, Any]:
        loss, params, batch, rest = problem(model)
        vg = {"argnums": (0, 1)}
        ref_value, ref_grads = jax.jit(jax.value_and_grad(loss, **vg))(
            *jax.device_put((params, batch, *rest), local)
        )
        # FSDP: the parameters sharded over "data" (``param_specs``: the mesh's axes are Auto),
        # those whose dimensions 8 devices do not divide placed whole
        specs = {"mlp": FSDP, "dropout": dropout_specs(P("data", None), P("data"))}[model]
        specs = jax.tree.map(lambda a, s: placed_spec(a.shape, s, mesh), params, specs)
        kw = {"param_specs": (specs, None, *(None for _ in rest))} if fsdp else {}
        sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, grad=mode, mesh_axis="data", **kw)
        args = (place(params, specs if fsdp else P()), place(batch, P("data")), *place(rest, P()))
        compiled = jax.jit(jax.value_and_grad(sf, **vg)).lower(*args).compile()
        out = compiled(*args)
        sharded_grads, (value, grads) = out[1], to_host(out)
        plan = sf.explain(*args)

        # Three optimiser steps, serialized on the global mesh and as written on one device.
        opt = optax.adam(1e-2)

        def step(loss_fn: Any) -> Any:
            @jax.jit
            def update(params: Any, state: Any, batch: Any, *rest: Any) -> Any:
                grads = jax.grad(loss_fn)(params, batch, *rest)
                updates, state = opt.update(grads, state, params)
                return optax.apply_updates(params, updates), state

            return update

        p_sf = args[0]
        state_sf = opt.init(p_sf)
        update_sf = step(sf)
        p_ref = jax.device_put(params, local)
        state_ref = opt.init(p_ref)
        update_ref = step(loss)
        ref_args = jax.device_put((batch, *rest), local)
        for _ in range(STEPS):
            p_sf, state_sf = update_sf(p_sf, state_sf, *args[1:])
            p_ref, state_ref = update_ref(p_ref, state_ref, *ref_args)
        p_sf_host = to_host(p_sf)
        leaves = jax.tree.leaves(p_sf_host)
        np.savez(
            outdir / f"params-{'fsdp-' if fsdp else ''}{model}-{mode}-{rank}.npz",
            **{f"leaf{i}": leaf for i, leaf in enumerate(leaves)},
        )

        batch_grads, ref_batch_grads = jax.tree.leaves(grads[1]), jax.tree.leaves(ref_grads[1])
        return {
            "value_err": rel_err(value, ref_value),
            "params_grad_err": rel_err(grads[0], ref_grads[0]),
            "batch_grad_err": rel_err(batch_grads, ref_batch_grads),
            "batch_grad_zeros_equal": all(
                bool(np.array_equal(g == 0, np.asarray(r) == 0))
                for g, r in zip(batch_grads, ref_batch_grads, strict=True)
            ),
            "batch_grad_zero_fraction": float(np.mean(np.asarray(ref_batch_grads[0]) == 0)),
            "steps_err": rel_err(p_sf_host, p_ref),
            "n_param_leaves": len(leaves),
            "plan_grad": plan.grad,
            "plan_chunk": plan.chunk,
            "plan_axis_size": plan.axis_size,
            "plan_layout": str(plan.layout),
            # the weights' (the loop reads them as passed; biases are broadcast before it)
            "grad_specs": [spec_text(g.sharding.spec) for g in weights(sharded_grads[0])],
            "param_specs": [spec_text(a.sharding.spec) for a in weights(args[0])],
            **hlo_facts(compiled.as_text()),
        }

    out: dict[str, Any] = {"devices": devices}
    for model, mode, fsdp in model_cases(tuple(GRAD_MODES)):
        out[case_name(model, mode, fsdp)] = functools.partial(model_case, model, mode, fsdp)
    return out


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    os.chdir(root)
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
