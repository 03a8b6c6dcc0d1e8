"""The report of ``normalisers.py``: tables, the acceptance checks and the Markdown section."""

from __future__ import annotations

import os
import platform
import re
import textwrap

import jax
from harness import (
    acceptance_table,
    fmt_bytes,
    md_table,
    write_doc_section,
)

SECTION = "normalisers"
TIME_TARGET, DIFF_TARGET, GROWTH_TARGET = 1.5, 2e-4, 2.0

HEADERS = [
    "method",
    "temp memory",
    "mem ratio",
    "target",
    "time ratio [IQR]",
    "n",
    "max rel diff",
    "stacked",
    "stops",
]


def _fmt_time(row: dict) -> str:
    lo, hi = row["spread"]
    return f"{row['time_ratio']:.2f} [{lo:.2f}, {hi:.2f}]"


def table_rows(res: dict) -> list[list[str]]:
    out = [
        [
            "original",
            fmt_bytes(res["base_temp"]),
            "1.000",
            "-",
            f"1 ({res['base_time'] * 1e3:.0f} ms)",
            "-",
            "-",
            "-",
            "-",
        ]
    ]
    for name, row in res["rows"].items():
        ser, mode = res["labels"].get(name, (None, None))
        if ser is not None:
            label = f"serialize_axis {ser.name}, chunk {ser.chunk}: {mode}"
            plan = res["plans"][ser.name]
            stacked = fmt_bytes(plan["stacked"]) if "stacked" in plan else "?"
            stops = str(len(plan["stops"])) if "stops" in plan else "?"
            target = f"<= {ser.target:.2f}" if ser.target is not None and "auto" in mode else "-"
        else:
            label, stacked, stops, target = name, "-", "-", "-"
        if "error" in row:
            out.append([label, "error", "-", target, "-", "-", row["error"][:60], stacked, stops])
            continue
        out.append(
            [
                label,
                fmt_bytes(row["temp"]),
                f"{row['mem_ratio']:.3f}",
                target,
                _fmt_time(row),
                str(row["n"]),
                f"{row['diff']:.1e}",
                stacked,
                stops,
            ]
        )
    return out


GROWTH_HEADERS = ["program", "axis length", "original", "serialized (auto)", "ratio", "peer"]


def growth_rows(res: dict) -> list[list[str]]:
    rows = []
    for n, mem in res["growth"].items():
        orig, ser = mem.get("original"), mem.get("serialized")
        peers = [(k, v) for k, v in mem.items() if k not in ("original", "serialized")]
        ok = isinstance(orig, int) and isinstance(ser, int)
        rows.append(
            [
                res["case"].key,
                str(n),
                fmt_bytes(orig) if isinstance(orig, int) else "error",
                fmt_bytes(ser) if isinstance(ser, int) else "error",
                f"{ser / orig:.3f}" if ok else "-",
                "; ".join(
                    f"{k}: {fmt_bytes(v) if isinstance(v, int) else 'error'}" for k, v in peers
                )
                or "-",
            ]
        )
    return rows


def acceptance(results: dict[str, dict]) -> list[tuple[str, str, bool]]:
    """``(target, measured, ok)`` for every graded target."""
    checks = []
    for res in results.values():
        case = res["case"]
        short = case.short
        for ser in case.serialized:
            row = res["rows"].get(f"{ser.name}: auto", {})
            what = f"{short} {ser.name}, chunk {ser.chunk}, auto"
            if "error" in row or not row:
                checks.append((f"{what}: runs", row.get("error", "missing")[:80], False))
                continue
            mode = res["labels"][f"{ser.name}: auto"][1]
            if ser.target is not None:
                checks.append(
                    (
                        f"{what}: temp memory <= {ser.target:.2f}x original",
                        f"{row['mem_ratio']:.3f}x ({mode})",
                        row["mem_ratio"] <= ser.target,
                    )
                )
                checks.append(
                    (
                        f"{what}: time <= {TIME_TARGET:.1f}x original",
                        f"{row['time_ratio']:.2f}x",
                        row["time_ratio"] <= TIME_TARGET,
                    )
                )
            checks.append(
                (
                    f"{what}: value and gradients within {DIFF_TARGET:.0e} of the original",
                    f"{row['diff']:.1e}",
                    row["diff"] <= DIFF_TARGET,
                )
            )
        if res["growth"]:
            sizes = sorted(res["growth"])
            lo, hi = res["growth"][sizes[0]], res["growth"][sizes[-1]]
            what = (
                f"{short}: serialized memory grows <= {GROWTH_TARGET:g}x from "
                f"{sizes[0]} to {sizes[-1]}"
            )
            if all(isinstance(m.get(k), int) for m in (lo, hi) for k in ("original", "serialized")):
                g_ser = hi["serialized"] / max(lo["serialized"], 1)
                g_orig = hi["original"] / max(lo["original"], 1)
                checks.append(
                    (what, f"{g_ser:.2f}x (original {g_orig:.2f}x)", g_ser <= GROWTH_TARGET)
                )
            else:
                checks.append((what, "error", False))
    return checks


def stops_text(res: dict) -> list[str]:
    lines = []
    for ser in res["case"].serialized:
        plan = res["plans"][ser.name]
        if "error" in plan:
            lines.append(f"- {ser.name}: `explain` failed: {plan['error']}")
        elif not plan["stops"]:
            lines.append(f"- {ser.name}: the region does not stop (no barrier).")
        else:
            lines.append(f"- {ser.name}: the region stops at " + "; ".join(plan["stops"]))
        if plan.get("warning"):
            lines.append(f"  ({plan['warning']})")
    return lines


def markdown(results, checks, elapsed, cpu, load, quick) -> str:
    parts = [
        "## Streamed normalisers: softmax, logsumexp and label look-ups "
        "(`benchmarks/normalisers.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, "
        f"{platform.machine()} with {os.cpu_count()} CPU cores; "
        f"{'quick sizes, ' if quick else ''}run time {elapsed:.0f} s wall, {cpu:.0f} s CPU "
        f"(load average {load:.1f} at the end). Programs whose chunked axis is normalised over "
        "inside the region: attention's softmax over the keys, a cross-entropy's logsumexp "
        "and label look-up over the vocabulary, a softmax over a set, a contrastive loss whose "
        "column cross-entropy normalises over the chunked batch. float32, "
        "`value_and_grad` with respect to the parameters and the chunked inputs. *mem ratio*: "
        "temp memory / the original's. *time ratio*: median over paired rounds of time / the "
        "original's time in the same round, with the interquartile range (`n`: rounds). "
        "*max rel diff*: value and gradients vs the original's, per leaf, relative to the "
        "leaf's magnitude (floored at 1e-3 of the largest leaf). *stacked*: what the plan "
        "still stacks back to full size; *stops*: the places its region stops (listed below "
        "each table).",
        "",
        "### Acceptance",
        "",
        acceptance_table(checks),
        "",
    ]
    for res in results.values():
        parts += [f"### {res['case'].title}", "", md_table(HEADERS, table_rows(res), 1), ""]
        parts += stops_text(res) + [""]
    grow = [r for res in results.values() if res["growth"] for r in growth_rows(res)]
    if grow:
        parts += [
            "### Memory as the axis grows (fixed chunk)",
            "",
            md_table(GROWTH_HEADERS, grow, right_from=1),
            "",
        ]
    return "\n".join(parts)


def write_section(path: str, text: str) -> None:
    """Replace (or append) the ``normalisers`` section of ``path``; keep everything else.

    Also names this script in the list of scripts at the top of the file.
    """
    write_doc_section(path, SECTION, text)
    with open(path) as fh:
        head, sep, rest = fh.read().partition("<!-- ")
    if "benchmarks/normalisers.py" not in head:
        with open(path, "w") as fh:
            fh.write(_list_script(head) + sep + rest)


def _list_script(head: str) -> str:
    """``head`` with this script added after the last ``python benchmarks/...`` it names.

    The paragraph that names it is re-wrapped at 96 columns, as the rest of the file.
    """
    scripts = list(re.finditer(r"`python\s+benchmarks/\w+\.py`", head))
    if not scripts:
        return head
    at = scripts[-1].end()
    head = head[:at] + ", `python benchmarks/normalisers.py`" + head[at:]
    start = head.rfind("\n\n", 0, at) + 2 if "\n\n" in head[:at] else 0
    end = head.find("\n\n", at)
    end = len(head.rstrip("\n")) if end < 0 else end
    text = " ".join(head[start:end].split())
    wrapped = textwrap.fill(text, width=96, break_long_words=False, break_on_hyphens=False)
    return head[:start] + wrapped + head[end:]
