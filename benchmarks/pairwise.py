"""Pairwise losses over the batch with itself: SimCLR, CLIP, MMD, triplets, distance matrices.

Run from the repository root (CPU is fine; one process)::

    python benchmarks/pairwise.py --write   # full run, writes its section of docs/benchmarks.md
    python benchmarks/pairwise.py --quick   # smoke run (~1 min): smaller batches, prints only

Every program encodes the chunked batch with a small MLP (``tanh(x @ W1) @ W2``) and compares
each example with every other one, so that the ``N x N`` part dominates memory:

* SimCLR's NT-Xent over ``N`` views, ``z @ z.T / t`` (diagonal ``-inf``, learnt ``t``);
* the same in the outer-product-then-sum form, ``sum(z[:, None] * z[None], -1)`` (diagonal
  ``-9e15``, constant temperature);
* symmetric CLIP, both towers from the chunked batch, ``(CE(rows) + CE(columns)) / 2``;
* an MMD-VAE's kernel MMD^2 (RBF) between the encoded batch and prior samples, chunked too;
* a batch-hard triplet loss on expanded pairwise distances;
* each row's nearest other row in a ``cdist`` matrix (``z[:, None] - z[None]``), summed.

The outer-product forms build ``[N, N, d]`` values: they use a narrow embedding. For each
program at two batch sizes ``N`` and ``2N`` (the chunk fixed): XLA's
``temp_size_in_bytes`` of ``jax.jit(jax.value_and_grad(f, argnums=<every floating
argument>))`` for the original and ``serialize_axis(f, chunk=k, argnums=<the batch>)``
(``grad="auto"``), the memory ratio, the time ratio (median over interleaved rounds of the
per-round ``time / time(original)``), the largest per-leaf relative difference of value and
gradients to the original's, and the growth from ``N`` to ``2N``. SimCLR also runs next to a
hand-written GradCache (Gao et al., 2021) in JAX: embed with ``lax.map`` without keeping
activations, the loss and its gradient with respect to the embeddings (the ``N x N`` part
whole), then the encoder's backward chunk by chunk (``lax.scan`` of ``jax.vjp``).

Targets: memory ratio at most 0.15 at the larger batch (4096), the
serialized memory at ``2N`` at most 2.3x the one at ``N``, time at most 1.5x, difference at
most 2e-4. The process exits 1 if a target fails. ``--write`` rewrites the ``pairwise``
section of docs/benchmarks.md (``harness.write_doc_section``; the other sections are kept).
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import (  # noqa: E402
    benchmark_options,
    fmt_bytes,
    md_table,
    time_paired,
    tree_rel_error,
    write_doc_section,
)
from pairwise_cases import (  # noqa: E402
    FULL,
    QUICK,
    Case,
    Sizes,
    cases,
    gradcache_simclr,
    simclr,
)

import jaxpr_accum as ja  # noqa: E402

SECTION = "pairwise"
MEMORY_TARGET, GROWTH_TARGET, TIME_TARGET, DIFF_TARGET = 0.15, 2.3, 1.5, 2e-4


# -- the programs ----------------------------------------------------------------------------


# -- the cases -------------------------------------------------------------------------------


def measure(case: Case, n: int, s: Sizes) -> dict:
    args = case.make_args(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ja.PlanWarning)
        sf = ja.serialize_axis(case.f, chunk=s.chunk, argnums=case.argnums)
        plan = sf.explain(*args)
    fns = {"original": case.f, "serialized": sf}
    compiled = {
        k: jax.jit(jax.value_and_grad(g, argnums=case.diff)).lower(*args).compile()
        for k, g in fns.items()
    }
    if case.f is simclr:
        compiled["GradCache"] = jax.jit(gradcache_simclr(s.chunk)).lower(*args).compile()
    memory = {k: c.memory_analysis().temp_size_in_bytes for k, c in compiled.items()}
    thunks = {k: (lambda c=c: c(*args)) for k, c in compiled.items()}
    timed = time_paired({0: thunks}, reference="original", budget_s=s.budget_s)[0]
    ref = timed.outputs["original"]
    return {
        "n": n,
        "memory": memory,
        "time": {k: timed.median_ratio(k) for k in compiled if k != "original"},
        "diff": {k: tree_rel_error(timed.outputs[k], ref) for k in compiled if k != "original"},
        "grads": (plan.grad, plan.second.grad if plan.second is not None else plan.grad),
        "two_passes": plan.second is not None,
    }


# -- report ----------------------------------------------------------------------------------


def rows(results: dict) -> list[list[str]]:
    out = []
    for name, runs in results.items():
        for r in runs:
            m = r["memory"]
            out.append([
                name, str(r["n"]), fmt_bytes(m["original"]), fmt_bytes(m["serialized"]),
                f"{m['serialized'] / m['original']:.3f}", f"{r['time']['serialized']:.2f}x",
                f"{r['diff']['serialized']:.1e}", " / ".join(r["grads"]),
            ])  # fmt: skip
    return out


def growth_rows(results: dict) -> list[list[str]]:
    out = []
    for name, (a, b) in results.items():
        ma, mb = a["memory"], b["memory"]
        out.append([
            name, f"{a['n']} -> {b['n']}", f"{mb['original'] / ma['original']:.2f}x",
            f"{mb['serialized'] / ma['serialized']:.2f}x",
        ])  # fmt: skip
    return out


def gradcache_rows(results: dict) -> list[list[str]]:
    out = []
    for r in next(iter(results.values())):
        m = r["memory"]
        for k in ("original", "GradCache", "serialized"):
            ratio = m[k] / m["original"]
            time_ = "1.00x" if k == "original" else f"{r['time'][k]:.2f}x"
            diff = "" if k == "original" else f"{r['diff'][k]:.1e}"
            out.append([str(r["n"]), k, fmt_bytes(m[k]), f"{ratio:.3f}", time_, diff])
    return out


def acceptance(results: dict) -> list[tuple[str, bool]]:
    checks = []
    for name, (a, b) in results.items():
        ratio = b["memory"]["serialized"] / b["memory"]["original"]
        growth = b["memory"]["serialized"] / a["memory"]["serialized"]
        worst_time = max(r["time"]["serialized"] for r in (a, b))
        worst_diff = max(r["diff"]["serialized"] for r in (a, b))
        checks += [
            (f"{name}: memory ratio {ratio:.3f} <= {MEMORY_TARGET} at {b['n']}",
             ratio <= MEMORY_TARGET),
            (f"{name}: memory growth {growth:.2f}x <= {GROWTH_TARGET}x", growth <= GROWTH_TARGET),
            (f"{name}: time {worst_time:.2f}x <= {TIME_TARGET}x", worst_time <= TIME_TARGET),
            (f"{name}: difference {worst_diff:.1e} <= {DIFF_TARGET}", worst_diff <= DIFF_TARGET),
            (f"{name}: two passes", all(r["two_passes"] for r in (a, b))),
        ]  # fmt: skip
    return checks


def markdown(results: dict, checks: list, s: Sizes, elapsed: float) -> str:
    cpu = platform.processor() or platform.machine()
    head = [
        "## Pairwise losses: the batch paired with itself (`benchmarks/pairwise.py`)",
        "",
        f"A small encoder (`tanh(x @ W1) @ W2`, {s.features} -> {s.hidden} -> {s.embed} "
        f"features; {s.outer_embed} for the `[N, N, d]` forms), chunk {s.chunk}, "
        '`grad="auto"`; `value_and_grad` with respect to every floating argument. Each '
        "program runs in two passes: the encoder chunked, its embeddings stacked; then the "
        "pairs by rows, the columns the whole stacked embeddings "
        "([pairwise terms](pairwise.md)). Modes: pass 1 / pass 2.",
        "",
        md_table(
            ["program", "N", "original", "serialized", "memory", "time", "diff", "modes"],
            rows(results),
        ),  # fmt: skip
        "",
        "Memory as the batch doubles (the chunk fixed):",
        "",
        md_table(["program", "batch", "original", "serialized"], growth_rows(results)),
        "",
        "Next to a hand-written GradCache in JAX at the same chunk (the encoder chunked, the "
        "`N x N` loss and its gradient with respect to the embeddings whole):",
        "",
        md_table(["N", "program", "temp", "memory", "time", "diff"], gradcache_rows(results)),
        "",
        "Targets: " + "; ".join(f"{c} {'PASS' if ok else 'FAIL'}" for c, ok in checks) + ".",
        "",
        f"jax {jax.__version__}, {cpu}, {os.cpu_count()} cores, {elapsed:.0f} s.",
    ]
    return "\n".join(head) + "\n"


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(
        __doc__, "smaller batches, prints only", argv,
        lambda p: p.add_argument("--write", action="store_true", help="write docs/benchmarks.md"),
    )  # fmt: skip
    s = QUICK if opts.quick else FULL
    t0 = time.perf_counter()
    results = {}
    for case in cases(s):
        results[case.name] = [measure(case, n, s) for n in s.batches]
        for r in results[case.name]:
            m = r["memory"]
            print(f"{case.name} N={r['n']}: {fmt_bytes(m['original'])} -> "
                  f"{fmt_bytes(m['serialized'])} ({m['serialized'] / m['original']:.3f}), "
                  f"time {r['time']['serialized']:.2f}x, diff {r['diff']['serialized']:.1e}",
                  flush=True)  # fmt: skip
    checks = acceptance(results)
    text = markdown(results, checks, s, time.perf_counter() - t0)
    print(text)
    if opts.write and opts.doc:
        write_doc_section(opts.doc, SECTION, text)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
