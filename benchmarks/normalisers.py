"""Streamed normalisers: softmax, logsumexp and label look-ups over the chunked axis.

Run from the repository root (CPU is fine; one process)::

    python benchmarks/normalisers.py --write   # full run (~2 min on 2 cores), writes its section
    python benchmarks/normalisers.py --quick   # smoke run (~20 s): smaller sizes, prints only

Four programs whose chunked axis is normalised over *inside* the region (float32,
``jax.jit(jax.value_and_grad(f, argnums=...))`` with respect to the parameters and the
chunked inputs):

* (a) attention, ``sum(softmax(q @ k.T / sqrt(d)) @ v)``, serialized over the keys
  (``argnums=(1, 2), axis=0``), next to ``jax.nn.dot_product_attention(implementation="xla")``
  and a hand-written Rabe-Staats chunked attention (``lax.scan`` over key chunks carrying the
  running max, sum and numerator, ``jax.checkpoint`` on the step) at the same chunk;
* (b) an LM head's cross-entropy, ``optax.softmax_cross_entropy_with_integer_labels(h @ W,
  y).mean()`` with ``W`` [d, V], serialized over the vocabulary (``argnums=0, axis=1``), next
  to a hand-written chunked cross-entropy (``lax.scan`` over vocabulary chunks, each slicing
  its columns of ``W`` with ``lax.dynamic_slice``, ``jax.checkpoint`` on the step: online
  logsumexp and the label's logit looked up per chunk), and the same loss serialized over the
  tokens (``argnums=(1, 2), axis=0``) for comparison;
* (c) softmax-weighted pooling over a set, ``p = softmax(tanh(x @ W1) @ w2)``, ``p @ h``,
  serialized over the set (``argnums=2, axis=0``);
* (d) a CLIP-style contrastive loss: ``za`` from the chunked batch ``xa``, ``zb`` from the
  unchunked ``xb``, ``logits = za @ zb.T / tau``, cross-entropy over the rows and over the
  columns with labels ``arange``; the second normalises over the chunked batch
  (``argnums=2, axis=0``).

For each: XLA's ``temp_size_in_bytes`` of the original and of ``serialize_axis`` with
``grad="auto"`` and ``"remat"`` (one row when auto picks remat: the same program), the memory
ratio graded against the program's target, the time ratio (median over interleaved rounds of
the per-round ``time / time(original)``; target <= 1.5x), and the largest per-leaf relative
difference of value and gradients to the original's (leaf's own magnitude, floored at 1e-3 of
the largest leaf; target <= 2e-4). For attention and cross-entropy, *memory as the axis
grows*: temp memory at a fixed chunk for axis lengths N, 2N and 4N, serialized (auto) next to
the original and the hand-written peer; target: the serialized program's memory grows at most
2x from N to 4N (the original's grows about 4x). The table also shows what each plan still
stacks back to full size and where its region stops (``sf.explain``).

The process exits 1 if a target fails. ``--write`` rewrites the ``normalisers`` section of
docs/benchmarks.md (appended at the end if missing; the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import (  # noqa: E402
    acceptance_table,
    md_table,
)
from normalisers_cases import (  # noqa: E402
    FULL,
    QUICK,
    make_cases,
)
from normalisers_measure import run_case  # noqa: E402
from normalisers_report import (  # noqa: E402
    GROWTH_HEADERS,
    HEADERS,
    acceptance,
    growth_rows,
    markdown,
    stops_text,
    table_rows,
    write_section,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~20 s)")
    parser.add_argument(
        "--write", action="store_true", help="rewrite the normalisers section of --doc"
    )
    parser.add_argument(
        "--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"), help="Markdown file"
    )
    parser.add_argument(
        "--cases", default="attention,ce,pooling,clip", help="comma-separated subset to run"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="plans and tracebacks")
    opts = parser.parse_args(argv)
    sizes = QUICK if opts.quick else FULL
    # Until the region streams its normaliser, most plans stack their outputs; say it once.
    warnings.filterwarnings("ignore", message=".*not expected to save memory")

    t_start = time.perf_counter()
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPU cores"
        + (" [quick]" if opts.quick else "")
    )
    wanted = opts.cases.split(",")
    results: dict[str, dict] = {}
    for case in make_cases(sizes):
        if case.key not in wanted:
            continue
        print(f"\n== {case.title}", flush=True)
        res = run_case(case, sizes, opts.verbose)
        results[case.key] = res
        print(
            f"compiled {1 + len(res['rows'])} programs in {res['t_compile']:.0f} s, "
            f"timed in {res['t_time']:.0f} s"
        )
        print(md_table(HEADERS, table_rows(res), 1))
        for line in stops_text(res):
            print(line)
        if res["growth"]:
            print()
            print(md_table(GROWTH_HEADERS, growth_rows(res), 1))

    checks = acceptance(results)
    elapsed = time.perf_counter() - t_start
    cpu, load = time.process_time(), os.getloadavg()[0]
    text = markdown(results, checks, elapsed, cpu, load, opts.quick)
    print("\n### Acceptance" + (" (quick sizes)" if opts.quick else "") + "\n")
    print(acceptance_table(checks))
    print(f"\ntotal run time {elapsed:.0f} s wall, {cpu:.0f} s CPU (load average {load:.1f})")
    if opts.write:
        write_section(opts.doc, text)
    failed = [t for t, _, ok in checks if not ok]
    print("result: OK" if not failed else f"FAILED: {len(failed)} of {len(checks)} targets")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
