"""Forward mode and chunked Jacobians: memory, time and exactness against the original.

Run from the repository root::

    python benchmarks/forward.py           # writes its section of docs/benchmarks.md
    python benchmarks/forward.py --quick   # smaller models, prints only

(a) Forward mode on a model whose per-layer activations dominate: a 6-layer tanh MLP, width
    384, 2048 rows, its loss ``mean(h ** 2)`` serialized over the rows (``argnums=1``) in
    chunks of 256 (N/8), in every gradient mode. For each: XLA's temp memory of
    ``jax.jit(jax.jvp)`` (tangents for every weight and for the rows) against the original's
    (target: at most 0.5, docs/benchmarks.md), the time of that jvp against the original's jvp
    (interleaved paired rounds, median of the per-round ratios), the largest relative
    difference of value and tangent, and what ``jax.linearize`` holds: the bytes of the arrays
    its linear function closes over (``jax.tree_util.tree_leaves(f_lin)``), of which those
    that are not the inputs themselves (the residuals proper).

(b) Chunked Jacobians: a Jacobian built by ``jax.jacrev`` / ``jax.jacfwd`` is a ``vmap`` over a
    basis, an axis born inside the function, which ``size=`` names. A 2-layer model
    ``tanh(x @ w1) @ w2`` with 1,024 rows (outputs) and 12,288 parameters (``w1`` [383, 32],
    ``w2`` [32]); chunks of 64. The Jacobian functions themselves (temp memory of
    ``jax.jit(jacobian)``), and ``jax.value_and_grad`` of a loss built on a Jacobian (its
    squared Frobenius norm, a Jacobian penalty). For each, the axis that automatic mode (no
    ``size=``) picks. The largest relative difference is against the original's result.

The process exits 1 if a check fails (a result not exact to 2e-4, the jvp memory target, or
automatic mode not finding the basis axis).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from forward_report import checks, forward_table, jacobian_table, markdown  # noqa: E402
from harness import (  # noqa: E402
    benchmark_options,
    print_table,
    time_paired,
    tree_rel_error,
    write_doc_section,
)

import jaxpr_accum as ja  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def temp_of(fun: Callable, *args: Any) -> tuple[Any, int]:
    """``jax.jit(fun)`` compiled for ``args``, and XLA's temp bytes for it."""
    compiled = jax.jit(fun).lower(*args).compile()
    return compiled, compiled.memory_analysis().temp_size_in_bytes


# ---- (a) forward mode on an activation-dominated MLP -----------------------------------------


def deep_mlp(layers: int, width: int, rows: int) -> tuple[Callable, tuple, tuple]:
    ks = jax.random.split(jax.random.key(0), layers + 2)
    ws = [jax.random.normal(k, (width, width)) / width**0.5 for k in ks[:layers]]
    x = jax.random.normal(ks[layers], (rows, width))

    def loss(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    tangents = (
        [jnp.cos(3.0 * w) for w in ws],
        jax.random.normal(ks[layers + 1], x.shape),
    )
    return loss, (ws, x), tangents


def linearize_bytes(fun: Callable, args: tuple) -> tuple[int, int]:
    """Bytes of what ``jax.linearize(fun, *args)``'s linear function closes over; of those,
    the arrays that are not the inputs themselves."""
    _, f_lin = jax.linearize(fun, *args)
    inputs = {id(a) for a in jax.tree.leaves(args)}
    leaves = [a for a in jax.tree_util.tree_leaves(f_lin) if hasattr(a, "nbytes")]
    total = sum(a.nbytes for a in leaves)
    return total, sum(a.nbytes for a in leaves if id(a) not in inputs)


def forward_mode(quick: bool) -> dict:
    layers, width, rows = (6, 128, 512) if quick else (6, 384, 2048)
    chunk = rows // 8
    loss, args, tangents = deep_mlp(layers, width, rows)

    def jvp_of(f: Callable) -> Callable:
        return lambda ws, x: jax.jvp(f, (ws, x), tangents)

    fns = {"original": loss}
    fns.update({m: ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=m) for m in ja.GRAD_MODES})
    rows_out, thunks, ref = {}, {}, None
    for name, f in fns.items():
        compiled, temp = temp_of(jvp_of(f), *args)
        total, residual = linearize_bytes(f, args)
        rows_out[name] = {"temp": temp, "lin_total": total, "lin_residual": residual}
        thunks[name] = lambda c=compiled: c(*args)
    plan = fns["auto"].explain(*args)
    timed = time_paired({"jvp": thunks}, reference="original", min_rounds=7, budget_s=40.0)["jvp"]
    ref = timed.outputs["original"]
    base = rows_out["original"]["temp"]
    for name, row in rows_out.items():
        row["mem_ratio"] = row["temp"] / base
        row["diff"] = tree_rel_error(timed.outputs[name], ref)
        if name != "original":
            row["time_ratio"] = timed.median_ratio(name)
            row["spread"] = timed.spread(name)
            row["n"] = len(timed.ratios(name))
    return {
        "rows": rows_out,
        "base_time": timed.median_time("original"),
        "sizes": (layers, width, rows, chunk),
        "auto_mode": plan.grad,
        "input_bytes": sum(a.nbytes for a in jax.tree.leaves(args)),
    }


# ---- (b) chunked Jacobians -------------------------------------------------------------------


def two_layer(rows: int, d_in: int, hidden: int) -> tuple[Callable, tuple]:
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    params = {
        "w1": jax.random.normal(k1, (d_in, hidden)) / d_in**0.5,
        "w2": jax.random.normal(k2, (hidden,)) / hidden**0.5,
    }
    x = jax.random.normal(k3, (rows, d_in))

    def model(p, x):  # one output per row
        return jnp.tanh(x @ p["w1"]) @ p["w2"]

    return model, (params, x)


def jacobian_cases(quick: bool) -> tuple[list[dict], dict]:
    rows, d_in, hidden = (256, 95, 32) if quick else (1024, 383, 32)
    chunk = 64
    model, args = two_layer(rows, d_in, hidden)
    n_params = sum(a.size for a in jax.tree.leaves(args[0]))

    def jacrev(p, x):
        return jax.jacrev(model)(p, x)

    def jacfwd(p, x):
        return jax.jacfwd(model)(p, x)

    def penalty(p, x):  # squared Frobenius norm of the Jacobian
        return sum(jnp.sum(j**2) for j in jax.tree.leaves(jax.jacrev(model)(p, x)))

    cases = [
        ("jax.jacrev(model)", jacrev, rows, False),
        ("jax.jacfwd(model)", jacfwd, n_params, False),
        ("jax.value_and_grad of sum(jacrev(model) ** 2)", penalty, rows, True),
    ]
    out = []
    for what, fun, size, vg in cases:
        sf = ja.serialize_axis(fun, chunk=chunk, size=size)
        auto = ja.serialize_axis(fun, chunk=chunk)
        run: Callable = jax.value_and_grad if vg else (lambda f: f)
        c0, m0 = temp_of(run(fun), *args)
        c1, m1 = temp_of(run(sf), *args)
        ca, ma = temp_of(run(auto), *args)
        plan, auto_plan = sf.explain(*args), auto.explain(*args)
        timed = time_paired(
            {"j": {"original": lambda c=c0: c(*args), "serialized": lambda c=c1: c(*args)}},
            reference="original",
            min_rounds=3,
            max_rounds=5,
            budget_s=20.0,
        )["j"]
        r0, r1 = timed.outputs["original"], timed.outputs["serialized"]
        out.append(
            {
                "what": what,
                "size": size,
                "chunk": chunk,
                "temp": m0,
                "temp_ser": m1,
                "temp_auto": ma,
                "diff": tree_rel_error(r1, r0),
                "diff_auto": tree_rel_error(ca(*args), r0),
                "time_ratio": timed.median_ratio("serialized"),
                "n": len(timed.ratios("serialized")),
                "base_time": timed.median_time("original"),
                "axis": plan.axis_size,
                "auto_axis": auto_plan.axis_size,
                "auto_born": auto_plan.born.replace(ROOT + os.sep, ""),
                "stacked": sum(b for _, b in plan.stacked),
            }
        )
    return out, {"rows": rows, "d_in": d_in, "hidden": hidden, "params": n_params}


# ---- report ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(__doc__, "smaller models, prints only", argv)
    t0 = time.perf_counter()
    res = forward_mode(opts.quick)
    h1, r1 = forward_table(res)
    print_table(h1, r1)
    cases, info = jacobian_cases(opts.quick)
    h2, r2 = jacobian_table(cases)
    print_table(h2, r2)
    verdicts = checks(res, cases)
    for t, m, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {t}: {m}")
    elapsed = time.perf_counter() - t0
    print(f"\ntotal run time {elapsed:.0f} s wall (load average {os.getloadavg()[0]:.1f})")
    if opts.doc:
        write_doc_section(opts.doc, "forward", markdown(res, cases, info, verdicts, elapsed))
    return 0 if all(ok for _, _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
