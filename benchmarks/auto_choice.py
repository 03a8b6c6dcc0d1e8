"""Auto's choice between the fused and remat gradient modes, graded against the rule it follows.

Run from the repository root (CPU is fine; one process; needs the ``models`` extra for the
zoo; a full run takes about half an hour on 2 shared cores)::

    python benchmarks/auto_choice.py --write   # full run; rewrites its section of the docs
    python benchmarks/auto_choice.py --quick   # smoke run (minutes): smaller sizes, prints only
    python benchmarks/auto_choice.py --cases eqx-mlp,issue20-mlp   # only these cases

The rule (``grad="auto"``, docs/api.md, "Gradient modes"): auto weighs what each mode
adds over the other and (a) its memory is within 10% of the smaller of the two modes' memory;
(b) among the modes within that 10%, its time is within 10% of the fastest. Target: the rule
holds on at least 95% of the cases, the misses named.

Cases: every model of the real-model zoo (``benchmarks/zoo/``, at its chunk ``N // 8``,
serialized as the zoo does); the peers' dense MLP (``benchmarks/models.py``, 2048 rows,
``argnums=(1, 2)``, chunk 256); the Monte-Carlo encoder-decoder (16 samples, automatic
axis, chunk 4); the dropout transformer (``argnums=1``, chunk 4); a classifier returning its
loss with an accuracy and a confidence (``value_and_grad(..., has_aux=True)``: two
gradient-carrying sums and one without gradient); a loss built from three gradient-carrying
sums (an importance-weighted cross-entropy ``sum(w * ce) / sum(w)`` plus an activation
penalty); a parameter-dominated MLP (three 2048x2048 layers, 64 rows); and the dense 6-layer
tanh MLP of issue 20 (D 384, N 2048, chunk 256, ``argnums=1``, differentiated with respect to
the weights only) beside its hand-written ``lax.scan`` + ``jax.checkpoint`` version.

For each case:

- ``sf.explain(*args)`` under ``grad="auto"``, ``"fused"`` and ``"remat"``: auto's pick and
  why (auto's pick is then read from its plan for the compiled ``value_and_grad`` below, as
  auto plans per perturbation pattern and ``explain`` differentiates every floating
  argument); fused counts as not applicable where its plan is refused (explain shows ``remat``
  under ``grad="fused"``) or runs as written (``none``);
- memory: XLA's ``temp_size_in_bytes`` of ``jax.jit(jax.value_and_grad(f, argnums=<the
  floating arguments>))`` for the original, fused, remat and auto (auto's is compiled too,
  as a check that it is the program of the mode it picks);
- time: paired, interleaved rounds (``time_rounds``, ``harness.time_paired`` with the calls
  interleaved inside a round): each round runs the original, fused and remat back to back
  in rotated order, several passes for a fast program (about 40 ms of calls each, a
  program's round time the median of its calls, so that a call preempted by another job
  does not count), at least 7 timed rounds; the figures are medians of per-round ratios,
  against the original and fused against remat (with the interquartile range; a rule-(b)
  miss also gives the medians of the even and of the odd rounds, to show whether it is
  stable);
- auto's memory and time are those of the mode it picks (the original's where it runs the
  function as written); rules (a) and (b) are graded on them.

It also measures the first-call cost (wall time of the first call, which traces, plans and
compiles) of ``jax.jit(jax.value_and_grad(sf))`` on the MC encoder-decoder, for ``grad="auto"`` at
chunk 4 and for ``memory=`` a budget of half the original's temp bytes, against the
original's first call (fresh functions each time, the fastest of two alternating rounds).

The machine's load (``os.getloadavg()``) is printed at the start, after each case and at the
end, and written with the table. The process exits 1 if the rule holds on fewer than 95% of
the cases.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import harness  # noqa: E402
import jax  # noqa: E402
import zoo as rm  # noqa: E402
from auto_choice_cases import (  # noqa: E402
    make_cases,
)
from auto_choice_measure import (  # noqa: E402
    TARGET,
    measure,
)
from auto_choice_report import (  # noqa: E402
    HEADERS,
    _loads,
    markdown,
    table_row,
)
from harness import md_table  # noqa: E402
from models import QUICK_SEED1, Seed1Config, seed1_problem  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

SECTION = "auto_choice"


def first_calls(quick: bool) -> dict[str, Any]:
    """Wall time of the first ``jax.jit(jax.value_and_grad(f))(*args)`` on fresh functions:
    the MC encoder-decoder as written, serialized with ``grad="auto"`` at chunk 4 and with
    ``memory=``."""
    cfg = QUICK_SEED1 if quick else Seed1Config()
    loss, args = seed1_problem(cfg)
    original_temp = rm.temp_bytes(loss, args, (0,))
    budget = original_temp // 2

    def fresh(which: str) -> Callable:
        f, _ = seed1_problem(cfg)
        if which == "auto":
            return ja.serialize_axis(f, chunk=4)
        if which == "memory":
            return ja.serialize_axis(f, memory=budget)
        return f

    times: dict[str, list[float]] = {"original": [], "auto": [], "memory": []}
    plans = {}
    for _ in range(2):
        for which in times:
            f = fresh(which)
            t = time.perf_counter()
            jax.block_until_ready(jax.jit(jax.value_and_grad(f))(*args))
            times[which].append(time.perf_counter() - t)
            if which != "original":
                plans[which] = f.explain(*args)
    mem = plans["memory"]
    return {
        "times": {k: min(v) for k, v in times.items()},
        "original_temp": original_temp,
        "budget": budget,
        "memory_chunk": mem.chunk,
        "memory_grad": mem.grad,
        "memory_measured": getattr(mem.budget, "measured", None),
        "auto_grad": plans["auto"].grad,
        "load": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller sizes")
    parser.add_argument("--write", action="store_true", help="rewrite this section of --doc")
    parser.add_argument(
        "--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"), help="Markdown file"
    )
    parser.add_argument("--cases", default=None, help="comma-separated subset of case keys")
    parser.add_argument(
        "--no-first-call", action="store_true", help="skip the first-call measurement"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    opts = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # "not expected to save memory" and untested-JAX notes
    t_start = time.perf_counter()
    loads = [os.getloadavg()]
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPU cores, "
        f"load average {loads[0][0]:.1f}" + (" [quick]" if opts.quick else ""),
        flush=True,
    )
    cases = make_cases(opts.quick)
    if opts.cases:
        wanted = opts.cases.split(",")
        cases = [c for c in cases if c.key in wanted]
    results = []
    for case in cases:
        try:
            res = measure(case, opts.quick, opts.verbose)
        except Exception as e:
            traceback.print_exc()
            print(f"{case.key}: FAILED to measure: {type(e).__name__}: {e}", flush=True)
            continue
        results.append(res)
        loads.append(res["load"])
        print(
            md_table(HEADERS, [table_row(res)], right_from=1).splitlines()[-1]
            + f"  (compile {res['t_compile']:.0f} s, timing {res['t_time']:.0f} s, x{res['reps']}"
            f" per call, load {res['load'][0]:.1f})",
            flush=True,
        )
        if opts.verbose:
            print(f"    auto: {res['why']}")
        for n in res["notes"]:
            print(f"    note: {n}", flush=True)
    fc = None
    if not opts.no_first_call and not opts.cases:
        print("first calls on the Monte-Carlo encoder-decoder ...", flush=True)
        fc = first_calls(opts.quick)
        loads.append(fc["load"])
    elapsed = time.perf_counter() - t_start
    loads.append(os.getloadavg())
    text = markdown(results, fc, elapsed, loads, opts.quick)
    print("\n" + text)
    print(f"total run time {elapsed:.0f} s; load average {_loads(loads)}")
    if opts.write:
        if opts.cases or opts.quick:
            parser.error("--write needs a full run: no --cases, no --quick")
        harness.write_doc_section(opts.doc, SECTION, text)
    held = sum(r["holds"] for r in results)
    return 0 if results and held >= TARGET * len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
