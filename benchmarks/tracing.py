"""Cost of tracing + analysis + rewriting a 12-layer transformer loss.

Run from the repository root::

    python benchmarks/tracing.py           # writes its section of docs/benchmarks.md
    python benchmarks/tracing.py --quick   # 4 layers, 2 repeats

The loss is the Flax linen transformer language model of ``benchmarks/models.py`` with dropout
(12 layers, batch 32, seq 64, width 128). Three things are timed, interleaved, each on a
fresh function object (a new linen module and a new ``loss`` closure, so that no trace cache
is hit), best of 3:

* ``jax.make_jaxpr(loss)(...)``: tracing alone, what any JAX transformation pays;
* ``ja.serialize_axis(loss, chunk=4, argnums=1).jaxpr(...)``: a fresh ``SerializedFunction``
  traces, analyses the axes, plans, resizes and builds the chunked program (``.jaxpr`` traces
  the rewritten program too);
* the same with the automatic axis (``ja.serialize_axis(loss, chunk=4)``): every candidate axis
  is analysed and estimated.

Target (docs/benchmarks.md, "Targets"): the serialized version costs less than 2 s more than
plain tracing (wall clock; the process CPU time is shown as well, since the machine is shared).
Exit 1 if not.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import benchmark_options, print_table, write_doc_section  # noqa: E402
from models import TransformerConfig, make_transformer_loss, transformer_problem  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

TARGET_S = 2.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def n_eqns(jaxpr) -> int:
    """Equations in a jaxpr, sub-jaxprs included."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                    total += n_eqns(sub.jaxpr)
                elif hasattr(sub, "eqns"):
                    total += n_eqns(sub)
    return total


def _traces(cfg: TransformerConfig, args: tuple, repeats: int) -> tuple[dict, dict, dict, dict]:
    """Fresh traces of the loss, plain and serialized, interleaved: the cases, and per case
    the wall and CPU seconds of each repeat and the equations of its jaxpr."""

    def trace_only():
        return jax.make_jaxpr(make_transformer_loss(cfg))(*args)

    def serialized_argnums():
        return ja.serialize_axis(make_transformer_loss(cfg), chunk=4, argnums=1).jaxpr(*args)

    def serialized_auto():
        return ja.serialize_axis(make_transformer_loss(cfg), chunk=4).jaxpr(*args)

    cases = {
        "jax.make_jaxpr(loss)": trace_only,
        "serialize_axis(chunk=4, argnums=1).jaxpr": serialized_argnums,
        "serialize_axis(chunk=4).jaxpr (automatic axis)": serialized_auto,
    }
    wall = {n: [] for n in cases}
    cpu = {n: [] for n in cases}
    sizes = {}
    for _ in range(repeats):
        for name, fn in cases.items():
            w0, c0 = time.perf_counter(), time.process_time()
            jaxpr = fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
            sizes[name] = n_eqns(jaxpr.jaxpr)
    return cases, wall, cpu, sizes


def _rows(cases: dict, wall: dict, cpu: dict, sizes: dict) -> tuple[list[list[str]], bool]:
    """The table's rows (the serialized ones graded against plain tracing), and the verdict."""
    base = min(wall["jax.make_jaxpr(loss)"])
    base_cpu = min(cpu["jax.make_jaxpr(loss)"])
    rows, ok = [], True
    for name in cases:
        extra = min(wall[name]) - base
        graded = name != "jax.make_jaxpr(loss)"
        verdict = ""
        if graded:
            verdict = "PASS" if extra < TARGET_S else "FAIL"
            ok &= extra < TARGET_S
        rows.append(
            [
                name,
                str(sizes[name]),
                f"{min(wall[name]):.2f} s",
                f"{min(cpu[name]):.2f} s",
                f"+{extra:.2f} s" if graded else "-",
                f"+{min(cpu[name]) - base_cpu:.2f} s" if graded else "-",
                f"< {TARGET_S:.0f} s" if graded else "-",
                verdict,
            ]
        )
    return rows, ok


def _markdown(cfg, repeats, elapsed, headers, rows, auto_axis) -> list[str]:
    """The lines of this script's section of docs/benchmarks.md."""
    return [
        "## Tracing and rewriting cost (`benchmarks/tracing.py`)",
        "",
        f"A {cfg.layers}-layer Flax linen transformer loss with dropout (batch {cfg.batch}, "
        f"seq {cfg.seq}, width {cfg.embed}). Best of {repeats} traces, each of a fresh "
        "function object (new module, new closure: no trace cache hit), interleaved; "
        "`.jaxpr(...)` includes tracing, axis analysis, planning, resizing and tracing the "
        "rewritten program. *eqns*: equations of the resulting jaxpr, sub-jaxprs included. "
        f"Target: less than {TARGET_S:.0f} s more than plain tracing (wall clock; CPU time "
        f"of the process shown too, the machine being shared). Run time {elapsed:.0f} s.",
        "",
        "| " + " | ".join(headers) + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        f"The automatic axis found: {auto_axis}.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(
        __doc__,
        "4 layers, 2 repeats",
        argv,
        lambda parser: parser.add_argument(
            "--repeats", type=int, default=None, help="fresh traces of each (3)"
        ),
    )
    doc = opts.doc
    repeats = opts.repeats or (2 if opts.quick else 3)
    t_start = time.perf_counter()

    cfg = TransformerConfig(layers=4 if opts.quick else 12)
    _, args = transformer_problem(cfg)
    print(
        f"jax {jax.__version__}: {cfg.layers}-layer Flax linen transformer with dropout "
        f"(batch {cfg.batch}, seq {cfg.seq}, width {cfg.embed}); best of {repeats} fresh traces"
    )

    cases, wall, cpu, sizes = _traces(cfg, args, repeats)

    sf = ja.serialize_axis(make_transformer_loss(cfg), chunk=4)
    plan = sf.explain(*args)
    auto_axis = f"size {plan.axis_size} born at {plan.born}"

    rows, ok = _rows(cases, wall, cpu, sizes)
    headers = [
        "what",
        "eqns",
        "best wall",
        "best CPU",
        "extra wall",
        "extra CPU",
        "target",
        "verdict",
    ]
    print()
    print_table(headers, rows)
    print(f"\nautomatic axis: {auto_axis} (gradient mode {plan.grad})")
    print(
        "all wall times: "
        + "; ".join(f"{n}: " + ", ".join(f"{t:.2f}" for t in wall[n]) for n in cases)
    )
    elapsed = time.perf_counter() - t_start
    print(f"\n{'PASS' if ok else 'FAIL'}  serialization adds < {TARGET_S:.0f} s to tracing")
    print(f"run time {elapsed:.0f} s")

    if doc:
        md = _markdown(cfg, repeats, elapsed, headers, rows, auto_axis)
        write_doc_section(doc, "tracing", "\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
