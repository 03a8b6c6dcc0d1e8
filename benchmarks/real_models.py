"""The real-model table of ``docs/real-models.md``: every case of ``benchmarks/zoo/``.

Run from the repository root (CPU is fine; needs the ``models`` extra)::

    python benchmarks/real_models.py                  # print the table
    python benchmarks/real_models.py --write          # and replace it in docs/real-models.md
    python benchmarks/real_models.py eqx-gru hk-lstm  # only these cases

For each case, at ``chunk = N // 8``: XLA's temp bytes of
``jax.jit(jax.value_and_grad(f, argnums=<float arguments>))``, original and serialized, and
their ratio; whether values and gradients match the original
(``jaxpr_accum.testing.assert_matches_original``); the structure check of
``tests/test_real_models.py`` (loops added, a non-empty body, no unexpected stop); the
known shortfalls (the case's strict xfails). No time column: a wall time measured on a
shared machine, without its CPU time and load, would not stay true.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import zoo as rm  # noqa: E402

from jaxpr_accum.testing import assert_matches_original  # noqa: E402

DOC = os.path.join(ROOT, "docs", "real-models.md")
BEGIN, END = "<!-- real-models:begin -->", "<!-- real-models:end -->"


def _kib(n: int) -> str:
    return f"{n / 1024:,.0f} KiB"


def row(c: rm.Case) -> tuple[str, bool]:
    """One Markdown row of the table, and whether the case passed every check it should."""
    loss, args = c.make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = rm.measure(c, loss, args)
        try:
            assert_matches_original(rm.serialized(c, loss), *args)
            exact = "yes"
        except AssertionError as e:
            exact = "**no**: " + str(e).splitlines()[0][:80]
    chunked = (
        m.loops_serialized > m.loops_original
        and m.body > 0
        and not m.unexpected_stops(c.expected_stops)
    )
    results = {"chunked": chunked, "exact": exact == "yes", "memory": m.ratio <= rm.MEMORY_LIMIT}
    ok = all(results[k] != (k in c.xfail) for k in rm.CHECKS)
    stops = sorted({rm.stop_primitive(s) for s in m.stops})
    notes = [f"xfail {k}" for k in rm.CHECKS if k in c.xfail]
    if stops:
        notes.append("stops at " + ", ".join(f"`{s}`" for s in stops))
    cells = [
        c.library,
        c.model,
        f"`{c.how}`",
        str(c.n),
        str(c.chunk),
        f"{_kib(m.temp_original)} → {_kib(m.temp_serialized)}",
        f"**{m.ratio:.2f}**",
        exact,
        f"{m.loops_original} → {m.loops_serialized}, body {m.body}",
        "; ".join(notes) or "",
    ]
    return "| " + " | ".join(cells) + " |", ok


HEADER = (
    "| library | model | axis | N | chunk | temp bytes, original → serialized | ratio "
    "| exact | loops, chunked equations | shortfalls |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    opts = parser.parse_args()
    cases = [rm.case(n) for n in opts.cases] if opts.cases else rm.CASES
    lines, failed = [HEADER], []
    print(HEADER, flush=True)
    for c in cases:
        if not rm.available(c):
            print(f"skipped {c.name}: {c.library} is not installed", file=sys.stderr)
            continue
        line, ok = row(c)
        print(line, flush=True)
        lines.append(line)
        if not ok:
            failed.append(c.name)
    xfails = [f"- `{c.name}` ({k}): {r}" for c in cases for k, r in c.xfail.items()]
    if xfails:
        print("\nstrict xfails:\n" + "\n".join(xfails))
    if opts.write:
        if opts.cases:
            parser.error("--write needs the whole table: give no case names")
        with open(DOC) as fh:
            text = fh.read()
        table = BEGIN + "\n" + "\n".join(lines) + "\n" + END
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S)
        with open(DOC, "w") as fh:
            fh.write(text)
        print(f"wrote {os.path.relpath(DOC)}")
    if failed:
        print("differs from the zoo's expectations: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
