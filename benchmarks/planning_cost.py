"""What planning costs on a 12-layer transformer: ``sf.jaxpr`` against tracing, and the first
call of ``jax.jit(jax.value_and_grad(sf))`` against the original's.

Run from the repository root::

    python benchmarks/planning_cost.py           # 12 layers, 3 interleaved repeats
    python benchmarks/planning_cost.py --quick   # 4 layers, 2 repeats
    python benchmarks/planning_cost.py --repeats 7

The loss is the Flax linen transformer language model with dropout of ``benchmarks/models.py``
(12 layers, batch 16, seq 32, width 64), serialized with ``chunk=4, argnums=1`` under
the default ``grad="auto"``. Each measurement uses a fresh function object (a new linen module
and a new closure: no trace or compile cache is hit), and the pairs are interleaved:

* *planning*: ``jax.make_jaxpr(loss)(*args)`` against ``sf.jaxpr(*args)`` (tracing, axis
  analysis, planning, building and tracing the rewritten program). Target: at most 2 s more
  than tracing;
* *first call*: ``jax.jit(jax.value_and_grad(f))(*args)`` of the original against the same of
  ``sf`` (trace, plan, compile, run). Target: at most 1.3x the original's;
* where it goes: the same program lowered (``.lower``: tracing, and for ``sf`` planning) and
  compiled by XLA (``.compile``), each timed on its own, original and ``sf``.

Figures are process CPU time (the machine is shared: CPU time is what the load inflates
least); the table shows medians over the repeats, and each comparison is the median over the
repeats of that repeat's ratio (or difference) of the interleaved pair, with wall times and
the load average beside them. Exit 1 if a target is missed. A full run rewrites its section of
docs/benchmarks.md (``--doc`` names another file).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import (  # noqa: E402
    benchmark_options,
    md_table,
    print_table,
    write_doc_section,
)
from models import TransformerConfig, make_transformer_loss, transformer_problem  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

EXTRA_S = 2.0  # planning: at most this much beyond tracing
FIRST_CALL_RATIO = 1.3  # the first call: at most this many times the original's


METHOD = (
    "The loss is the Flax linen transformer language model with dropout of "
    "`benchmarks/models.py`; every measurement uses a fresh function object (a new module and "
    "closure: no trace or compile cache is hit). *Planning*: `sf.jaxpr(*args)` (tracing, axis "
    "analysis, planning, building and tracing the rewritten program) against "
    "`jax.make_jaxpr(loss)(*args)`; target at most 2 s more. *First call*: "
    "`jax.jit(jax.value_and_grad(f))(*args)` (trace, plan, compile, run), `sf` against the "
    "original; target at most 1.3x. *lower* and *compile*: the same program's `.lower` and "
    "`.compile`, each timed on its own. Process CPU time; the table shows medians over the "
    "repeats, and each comparison is the median over the repeats of that repeat's ratio (or "
    "difference) of the interleaved pair."
)


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """``(CPU seconds, wall seconds)`` of ``fn()``, its result blocked on."""
    w0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    return time.process_time() - c0, time.perf_counter() - w0


def measured_cases(cfg: TransformerConfig, args: tuple) -> dict[str, Callable[[], object]]:
    """What is timed, by name, each on a fresh function object."""

    def serialized():
        return ja.serialize_axis(make_transformer_loss(cfg), chunk=4, argnums=1)

    def first_call(f):
        return jax.jit(jax.value_and_grad(f))(*args)

    lowered: dict[str, Any] = {}

    def lower(name: str, f: Callable) -> Callable[[], object]:
        def run() -> object:
            lowered[name] = jax.jit(jax.value_and_grad(f())).lower(*args)
            return None

        return run

    return {
        "make_jaxpr(loss)": lambda: jax.make_jaxpr(make_transformer_loss(cfg))(*args),
        "sf.jaxpr": lambda: serialized().jaxpr(*args),
        "first call, original": lambda: first_call(make_transformer_loss(cfg)),
        "first call, sf": lambda: first_call(serialized()),
        "  lower, original": lower("original", lambda: make_transformer_loss(cfg)),
        "  lower, sf": lower("sf", serialized),
        "  compile, original": lambda: lowered["original"].compile(),
        "  compile, sf": lambda: lowered["sf"].compile(),
    }


Times = dict[str, list[float]]


def paired(times: Times, sf: str, original: str, ratio: bool) -> float:
    """The median over the repeats of each repeat's ratio (or difference) of the pair."""
    each = [s / o if ratio else s - o for s, o in zip(times[sf], times[original], strict=True)]
    return statistics.median(each)


def verdicts(cpu: Times, wall: Times) -> tuple[list[str], bool]:
    """The lines grading the targets (and where the first call's time goes); whether both
    targets are met."""
    extra_cpu = paired(cpu, "sf.jaxpr", "make_jaxpr(loss)", ratio=False)
    extra_wall = paired(wall, "sf.jaxpr", "make_jaxpr(loss)", ratio=False)
    ratio_cpu = paired(cpu, "first call, sf", "first call, original", ratio=True)
    ratio_wall = paired(wall, "first call, sf", "first call, original", ratio=True)
    first_calls = zip(cpu["first call, sf"], cpu["first call, original"], strict=True)
    ok_plan, ok_call = extra_cpu <= EXTRA_S, ratio_cpu <= FIRST_CALL_RATIO
    lines = [
        f"planning: `sf.jaxpr` - `make_jaxpr` = {extra_cpu:+.2f} s CPU ({extra_wall:+.2f} s "
        f"wall), target <= {EXTRA_S:.0f} s: **{'PASS' if ok_plan else 'FAIL'}**",
        f"first call: sf / original = {ratio_cpu:.2f}x CPU ({ratio_wall:.2f}x wall), target "
        f"<= {FIRST_CALL_RATIO}x: **{'PASS' if ok_call else 'FAIL'}** (each repeat: "
        + ", ".join(f"{s / o:.2f}x" for s, o in first_calls)
        + ")",
    ]
    for part, what in (("lower", "tracing, and for sf planning"), ("compile", "XLA")):
        sf_name, orig_name = f"  {part}, sf", f"  {part}, original"
        ratio = paired(cpu, sf_name, orig_name, ratio=True)
        extra = paired(cpu, sf_name, orig_name, ratio=False)
        lines.append(f"`.{part}` ({what}): sf / original = {ratio:.2f}x CPU ({extra:+.2f} s)")
    return lines, ok_plan and ok_call


def markdown(header: str, rows: list[list[str]], lines: list[str], loads: list[float]) -> str:
    """This script's section of docs/benchmarks.md."""
    return "\n".join(
        [
            "## Planning cost and the first call (`benchmarks/planning_cost.py`)",
            "",
            f"{header}. {METHOD}",
            "",
            md_table(["what", "median CPU", "median wall"], rows),
            "",
            *(f"- {line}" for line in lines),
            "",
            "Load average (1 min) before and after each repeat: "
            + ", ".join(f"{x:.1f}" for x in loads)
            + ".",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    def repeats_option(parser: Any) -> None:
        parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats")

    opts = benchmark_options(__doc__, "4 layers, 2 repeats", argv, repeats_option)
    repeats = opts.repeats or (2 if opts.quick else 3)
    cfg = TransformerConfig(batch=16, seq=32, embed=64, layers=4 if opts.quick else 12)
    _, args = transformer_problem(cfg)
    cases = measured_cases(cfg, args)
    cpu: Times = {n: [] for n in cases}
    wall: Times = {n: [] for n in cases}
    loads = [os.getloadavg()[0]]
    header = (
        f"jax {jax.__version__}, {jax.default_backend()}: {cfg.layers}-layer transformer "
        f"(batch {cfg.batch}, seq {cfg.seq}, width {cfg.embed}), `chunk=4, argnums=1`, "
        f"auto's mode; {repeats} interleaved repeats"
    )
    print(f"{header}; load {loads[0]:.1f}", flush=True)
    for _ in range(repeats):
        for name, fn in cases.items():
            c, w = timed(fn)
            cpu[name].append(c)
            wall[name].append(w)
        loads.append(os.getloadavg()[0])
    med = {n: (statistics.median(cpu[n]), statistics.median(wall[n])) for n in cases}
    rows = [[n.strip(), f"{c:.2f} s", f"{w:.2f} s"] for n, (c, w) in med.items()]
    print_table(["what", "median CPU", "median wall"], rows)
    plan = ja.serialize_axis(make_transformer_loss(cfg), chunk=4, argnums=1).explain(*args)
    print(f"\nauto's mode: {plan.grad} ({plan.grad_reason})")
    lines, ok = verdicts(cpu, wall)
    print("\n".join(line.replace("**", "").replace("`", "") for line in lines))
    print("load average (1 min): " + ", ".join(f"{x:.1f}" for x in loads))
    if opts.doc:
        write_doc_section(opts.doc, "planning_cost", markdown(header, rows, lines, loads))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
