"""The harness the benchmark scripts share: compiling, timing, comparing and reporting.

- ``compile_all``: ``jit(value_and_grad(f))`` of several functions, compiled two at a time;
- ``time_paired``: interleaved rounds, medians of per-round time ratios (``PairedTimes``);
- ``tree_rel_error``: the largest per-leaf relative difference of two pytrees of arrays
  (``jaxpr_accum.testing.tree_difference``);
- ``fmt_bytes`` (B, KiB, MiB or GiB, as the package prints them; ``n/a`` for None),
  ``print_table``, ``md_table`` and ``acceptance_table`` (a benchmark's targets and verdicts);
- ``benchmark_options`` (``--quick``, ``--doc``) and ``write_doc_section`` (each script owns
  one marked section of ``docs/benchmarks.md``).

The measurements of a compiled program are in ``measuring.py``. The benchmarks import the
public API (``jaxpr_accum``, ``jaxpr_accum.testing``) and this folder's modules only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from jaxpr_accum.testing import tree_difference


def fmt_bytes(n: float | None) -> str:
    """``n`` bytes as the package prints them (``1.5 MiB``); ``n/a`` for None."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, out: Any = None
) -> None:
    """Print a plain-text table; the first ``left`` columns are left-aligned, the rest right."""
    out = out or sys.stdout
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(fmt(headers), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(fmt(r), file=out)


@dataclasses.dataclass
class PairedTimes:
    """Times and time ratios (vs the group's reference) of one group of thunks, per round."""

    times: dict[str, dict[int, float]]
    slow: set[str]
    reference: str
    outputs: dict[str, Any]  # each thunk's output from the warm-up round

    def rounds(self, name: str) -> list[int]:
        return sorted(self.times[name])

    def ratios(self, name: str, other: str | None = None) -> list[float]:
        """Per-round ``time(name) / time(other)`` (default: the reference), shared rounds."""
        a, b = self.times[name], self.times[other or self.reference]
        return [a[r] / b[r] for r in sorted(a) if r in b]

    def median_ratio(self, name: str, other: str | None = None) -> float:
        return statistics.median(self.ratios(name, other))

    def spread(self, name: str) -> tuple[float, float]:
        """Interquartile range of the paired ratios (min and max for fewer than 4 rounds)."""
        r = sorted(self.ratios(name))
        if len(r) < 4:
            return r[0], r[-1]
        q = statistics.quantiles(r, n=4)
        return q[0], q[2]

    def median_time(self, name: str) -> float:
        t = self.times[name]
        return statistics.median([v for r, v in t.items() if r > 0] or list(t.values()))


def compile_all(
    fns: dict[Any, Callable],
    args: tuple,
    verbose: bool,
    argnums: int | tuple[int, ...] = 0,
    describe: Callable[[BaseException], str] = lambda e: f"{type(e).__name__}: {e}",
) -> tuple[dict[Any, Any], dict[Any, str]]:
    """Lower each ``jit(value_and_grad(f, argnums))`` here, compile them two at a time in
    threads; ``(compiled, errors)`` by key, each error as ``describe`` words it."""
    lowered, errors = {}, {}
    for key, f in fns.items():
        try:
            lowered[key] = jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args)
        except Exception as e:
            if verbose:
                traceback.print_exc()
            errors[key] = describe(e)

    def compile_one(item):
        key, low = item
        try:
            return key, low.compile(), None
        except Exception as e:
            if verbose:
                traceback.print_exc()
            return key, None, describe(e)

    compiled = {}
    with ThreadPoolExecutor(2) as pool:
        for key, c, err in pool.map(compile_one, lowered.items()):
            if err is None:
                compiled[key] = c
            else:
                errors[key] = err
    return compiled, errors


def md_table(headers: list[str], rows: list[list[str]], right_from: int = 2) -> str:
    """A Markdown table, its columns from ``right_from`` on right-aligned."""
    aligns = ["---" if i < right_from else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(aligns) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def acceptance_table(checks: list[tuple[str, str, bool]], fail: str = "**FAIL**") -> str:
    """The acceptance table of a benchmark: per ``(target, measured, ok)``, its verdict."""
    rows = [[t, m, "PASS" if ok else fail] for t, m, ok in checks]
    return md_table(["target", "measured", "verdict"], rows, right_from=3)


def time_paired(
    groups: dict[Any, dict[str, Callable[[], Any]]],
    *,
    reference: str,
    min_rounds: int = 3,
    max_rounds: int = 25,
    budget_s: float = 30.0,
    slow_ratio: float = 8.0,
) -> dict[Any, PairedTimes]:
    """Time thunks in interleaved rounds; each round's times are divided by the reference's.

    ``groups`` maps a group key to ``{name: thunk}``, each group holding the ``reference``
    thunk. Every round calls every group's thunks once, back to back, the order rotated from
    round to round (so that drift and position effects hit all alike); the reported figure is
    the median over rounds of ``time(name) / time(reference)`` of the same round.

    Round 0 is the warm-up (its outputs are kept, for exactness checks) and is discarded,
    except for a thunk whose round-0 ratio exceeds ``slow_ratio`` (a pathological program,
    such as XLA:CPU's conv-in-a-loop trap): that one keeps its round-0 ratio and is not called
    again, so that a 40x outlier does not eat the
    budget. Timed rounds continue until ``budget_s`` is spent (at least ``min_rounds``, at
    most ``max_rounds``).
    """
    out = {g: PairedTimes({n: {} for n in th}, set(), reference, {}) for g, th in groups.items()}
    t_start = None
    rnd = 0
    while rnd <= max_rounds:
        t_round = time.perf_counter()
        for g, th in groups.items():
            res = out[g]
            names = [n for n in th if n not in res.slow or rnd == 0]
            shift = rnd % len(names)
            for n in names[shift:] + names[:shift]:
                t0 = time.perf_counter()
                y = jax.block_until_ready(th[n]())
                res.times[n][rnd] = time.perf_counter() - t0
                if rnd == 0:
                    res.outputs[n] = y
            if rnd == 0:
                ref0 = res.times[reference][0]
                for n in th:
                    if n != reference and res.times[n][0] / ref0 > slow_ratio:
                        res.slow.add(n)
                    else:
                        res.times[n].pop(0)  # warm-up
                res.times[reference][0] = ref0  # kept only for the slow ones' pairing
        if rnd == 0:
            t_start = time.perf_counter()
        else:
            spent = time.perf_counter() - t_start
            per_round = time.perf_counter() - t_round
            if rnd >= min_rounds and spent + per_round > budget_s:
                break
        rnd += 1
    for res in out.values():
        if not res.slow:
            res.times[reference].pop(0, None)
    return out


def tree_rel_error(got: Any, ref: Any) -> float:
    """Largest per-leaf ``max|got - ref| / scale`` over two pytrees of arrays, by
    ``jaxpr_accum.testing.tree_difference``'s rule: ``scale`` is the leaf's own ``max|ref|``,
    floored at 1e-3 of the largest over all leaves (a leaf that is zero in exact arithmetic is
    compared at the scale of the whole gradient); ``inf`` where the trees differ in shape."""
    try:
        return float(tree_difference(got, ref).max_rel)
    except AssertionError:
        return float("inf")


#: The sections of ``docs/benchmarks.md``, in order; each script rewrites its own.
DOC_SECTIONS = (
    "peers",
    "accuracy",
    "tracing",
    "planning_cost",
    "random_memory",
    "budget",
    "normalisers",
    "forward",
    "auto_choice",
    "pairwise",
    "rollouts",  # hand-written from benchmarks/rollouts.py's output
    "accelerator",  # hand-written from benchmarks/accelerator.py's output on a TPU
)
DOC_HEADER = """# Benchmarks

Written by the scripts in `benchmarks/` (each one rewrites its own section below): `python
benchmarks/peers.py`, `python benchmarks/accuracy.py`, `python benchmarks/tracing.py`, `python
benchmarks/planning_cost.py`, `python benchmarks/random_memory.py`, `python benchmarks/budget.py`,
`python benchmarks/normalisers.py --write`, `python benchmarks/forward.py`, `python
benchmarks/auto_choice.py --write`, `python benchmarks/pairwise.py --write`. Memory is XLA's own
accounting of the compiled `jax.jit(jax.value_and_grad(f))`
(`compiled.memory_analysis().temp_size_in_bytes`); times are medians of *paired* ratios from
interleaved repeats (every round runs the original and each variant back to back, the ratio is taken
per round, then the median over rounds), so that drift on a shared machine affects both sides of
every ratio alike.

The scripts use the public API only (`jaxpr_accum`, `ja.temp_bytes`, `jaxpr_accum.testing`)
and their own modules (`harness.py`, `measuring.py`, the models of `models.py`, `transformer.py`
and `zoo/`, which the real-model tests share); what measures the package's internals (the cost
model against XLA, the conv trap, the fuzz campaign) lives beside the tests.
"""


def benchmark_options(
    doc_string: str, quick_help: str, argv: list[str] | None, extra: Callable | None = None
) -> Any:
    """The command line every benchmark script shares: ``--quick`` and ``--doc``.

    ``opts.doc`` is the Markdown file to write: docs/benchmarks.md in a full run, none with
    ``--quick`` unless given. ``extra(parser)`` adds a script's own options.
    """
    parser = argparse.ArgumentParser(description=doc_string.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument(
        "--doc",
        default=None,
        help="Markdown output (default: docs/benchmarks.md in a full run; none with --quick)",
    )
    if extra is not None:
        extra(parser)
    opts = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    opts.doc = opts.doc or (None if opts.quick else os.path.join(root, "docs", "benchmarks.md"))
    return opts


def write_doc_section(path: str, name: str, markdown: str) -> None:
    """Replace section ``name`` of the Markdown file ``path`` (created if missing)."""
    assert name in DOC_SECTIONS, name
    text = DOC_HEADER
    if os.path.exists(path):
        with open(path) as fh:
            text = fh.read()
    sections = {}
    for sec in DOC_SECTIONS:
        m = re.search(rf"<!-- {sec}:begin -->\n(.*?)<!-- {sec}:end -->\n", text, re.S)
        if m:
            sections[sec] = m.group(1)
    head = text.split("<!-- ", 1)[0] if "<!-- " in text else text
    sections[name] = markdown.rstrip("\n") + "\n"
    body = "".join(
        f"<!-- {sec}:begin -->\n{sections[sec]}<!-- {sec}:end -->\n\n"
        for sec in DOC_SECTIONS
        if sec in sections
    )
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as fh:
        fh.write(head.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n")
    print(f"wrote {os.path.relpath(path)}")
