"""The chunk chosen from a memory budget: its search cost, and how it compares to the best.

Run from the repository root::

    python benchmarks/budget.py           # writes its section of docs/benchmarks.md
    python benchmarks/budget.py --quick   # smaller models, prints only

For each model (the MLP over 1024 rows with ``argnums=(1, 2)``, the Monte-Carlo conv
encoder-decoder over its 16 Monte-Carlo samples with ``size=16``, the dropout transformer over
its batch of 32 with ``argnums=1``):

- brute force: the measure the budget bounds (XLA temp bytes of ``jax.jit(jax.value_and_grad)``
  with respect to the floating arguments) at every chunk that divides the axis, and the
  original's;
- the budget: a quarter of the way from chunk 1's memory to the single chunk's (on the
  geometric scale), so that the answer is a real chunk;
- ``serialize_axis(f, memory=budget)``: the chosen chunk and gradient mode, its memory, the
  compiles and seconds the search took, and the brute-force best (the largest divisor within
  the budget);
- the first-call cost: ``jax.jit(jax.value_and_grad(sf))(*args)`` on a fresh function, with
  ``memory=budget`` against ``chunk=<the chosen chunk>`` (fastest of two alternating rounds).
  Target: at most 6x the fixed-chunk first call plus 2 s.

The process exits 1 if a chosen chunk does not fit, is not within a factor 2 of the best, or
the first-call target fails.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import benchmark_options, fmt_bytes, print_table, write_doc_section  # noqa: E402
from measuring import float_argnums  # noqa: E402
from models import (  # noqa: E402
    MLPConfig,
    Seed1Config,
    TransformerConfig,
    mlp_problem,
    seed1_problem,
    transformer_problem,
)

import jaxpr_accum as ja  # noqa: E402

RATIO_TARGET, SLACK_S = 6.0, 2.0


def problems(quick: bool) -> list[tuple[str, Any, tuple, dict, int]]:
    """``(name, loss, args, axis settings, axis size)``."""
    mlp = MLPConfig(rows=256, width=128) if quick else MLPConfig()
    seed1 = Seed1Config(height=16, width=16, decoder_widths=(16, 16)) if quick else Seed1Config()
    tr = TransformerConfig(batch=8, seq=32, embed=64) if quick else TransformerConfig()
    out = []
    loss, args = mlp_problem(mlp)
    out.append((f"MLP ({mlp.rows} rows)", loss, args, {"argnums": (1, 2)}, mlp.rows))
    loss, args = seed1_problem(seed1)
    out.append(
        (f"MC encoder-decoder ({seed1.n_samples} samples)", loss, args,
         {"size": seed1.n_samples}, seed1.n_samples)
    )  # fmt: skip
    loss, args = transformer_problem(tr)
    out.append((f"dropout transformer (batch {tr.batch})", loss, args, {"argnums": 1}, tr.batch))
    return out


def memory_at(loss: Any, args: tuple, **settings: Any) -> int:
    """What ``memory=`` bounds (``ja.temp_bytes``), serialized with ``settings`` or not."""
    return ja.temp_bytes(ja.serialize_axis(loss, **settings) if settings else loss, *args)


def first_call(loss: Any, args: tuple, **settings: Any) -> float:
    sf = ja.serialize_axis(loss, **settings)
    t0 = time.perf_counter()
    jax.block_until_ready(jax.jit(jax.value_and_grad(sf, argnums=float_argnums(args)))(*args))
    return time.perf_counter() - t0


def _one(name: str, loss: Any, args: tuple, axis: dict, n: int, failures: list[str]) -> list[str]:
    """One model: the brute force, the budget's choice, the first calls; its table cells (a
    failed target appended to ``failures``)."""
    print(f"{name}: brute force ...", flush=True)
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    brute = {k: memory_at(loss, args, chunk=k, **axis) for k in divisors}
    original = memory_at(loss, args)
    lo, hi = brute[1], brute[n]
    budget = int(lo * (hi / lo) ** 0.25) if hi > lo else hi
    best = max((k for k in divisors if brute[k] <= budget), default=None)
    sf = ja.serialize_axis(loss, memory=budget, **axis)
    sf(*args)
    plan = sf.explain(*args)
    info = plan.budget
    fixed, searched = [], []
    for _ in range(2):
        fixed.append(first_call(loss, args, chunk=plan.chunk, **axis))
        searched.append(first_call(loss, args, memory=budget, **axis))
    t_fixed, t_search = min(fixed), min(searched)
    ratio = t_search / t_fixed
    ok_fit = info.measured <= budget
    ok_best = best is not None and 2 * plan.chunk > best
    ok_time = t_search <= RATIO_TARGET * t_fixed + SLACK_S
    for ok, what in ((ok_fit, "fits"), (ok_best, "near best"), (ok_time, "first call")):
        if not ok:
            failures.append(f"{name}: {what}")
    cells = [
        name,
        fmt_bytes(budget),
        f"{plan.chunk} ({plan.grad})",
        str(best),
        fmt_bytes(info.measured),
        fmt_bytes(brute.get(best)) if best else "-",
        fmt_bytes(original),
        f"{len(info.tried)} / {info.seconds:.1f} s",
        f"{t_fixed:.1f} s",
        f"{t_search:.1f} s",
        f"{ratio:.1f}x" + ("" if ok_time else " FAIL"),
    ]
    print("  brute force: " + ", ".join(f"{k}: {fmt_bytes(m)}" for k, m in brute.items()))
    print(
        "  tried: "
        + ", ".join(f"{t.chunk} ({t.grad}): {fmt_bytes(t.measured)}" for t in info.tried)
    )
    return cells


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(__doc__, "smaller models", argv)
    warnings.filterwarnings("ignore", message=".*not expected to save memory")  # one chunk
    rows, md_rows, failures = [], [], []
    for name, loss, args, axis, n in problems(opts.quick):
        cells = _one(name, loss, args, axis, n, failures)
        rows.append(cells)
        md_rows.append(cells)
    headers = [
        "model",
        "budget",
        "chosen chunk",
        "best chunk",
        "memory (chosen)",
        "memory (best)",
        "original",
        "compiles / search",
        "first call, chunk=",
        "first call, memory=",
        "ratio",
    ]
    print()
    print_table(headers, rows)
    print("\nresult:", "OK" if not failures else "FAILED: " + "; ".join(failures))
    if opts.doc:
        md = [
            "## Choosing the chunk from a memory budget (`benchmarks/budget.py`)",
            "",
            "`serialize_axis(f, memory=budget)` against a brute force over every chunk that "
            "divides the axis, on "
            f"{jax.default_backend()} (jax {jax.__version__}). The budget is a quarter of the "
            "way from chunk 1's memory to one chunk's (geometric scale); *best* is the largest "
            "divisor within it. *Search* is the compiles and the seconds the search took; the "
            "first calls are `jax.jit(jax.value_and_grad(sf))(*args)` on a fresh function "
            "(fastest of two alternating rounds), with the budget vs with the chosen chunk "
            f"fixed. Target: at most {RATIO_TARGET:g}x + {SLACK_S:g} s. Memory here is with "
            "respect to every floating argument (the budget's measure: the image and "
            "mask too), so *original* differs from the other sections' parameter-only figures. "
            "The search compiles the built program (prologue, region, epilogue) at each trial "
            "chunk; the original is compiled only for `explain`.",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "---|" * len(headers),
            *("| " + " | ".join(r) + " |" for r in md_rows),
            "",
        ]
        write_doc_section(opts.doc, "budget", "\n".join(md))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
