"""The report of ``auto_choice.py``: the table, the summary against the rule, the first-call
lines and the Markdown section."""

from __future__ import annotations

import os
import platform
import statistics
from typing import Any

import harness
import jax
from auto_choice_measure import (
    MIN_ROUNDS,
    TARGET,
    _mib,
    _mode_of,
)
from harness import md_table


def _ratio(paired: harness.PairedTimes, name: str, other: str | None = None) -> str:
    if name not in paired.times or (other and other not in paired.times):
        return "-"
    return f"{paired.median_ratio(name, other):.2f}"


def _iqr(paired: harness.PairedTimes, name: str, other: str) -> str:
    r = sorted(paired.ratios(name, other))
    if len(r) < 4:
        return ""
    q = statistics.quantiles(r, n=4)
    return f" [{q[0]:.2f}, {q[2]:.2f}]"


HEADERS = [
    "case",
    "N",
    "chunk",
    "original MiB",
    "fused MiB",
    "remat MiB",
    "fused time",
    "remat time",
    "fused / remat [IQR]",
    "rounds",
    "auto's pick",
    "rule holds?",
]


def table_row(res: dict[str, Any]) -> list[str]:
    case, temp, p = res["case"], res["temp"], res["paired"]
    fused = "fused" in temp and "fused" in p.times
    pick = res["pick"]
    if pick == "none":
        pick = "none (as written)"
    verdict = "yes" if res["holds"] else f"**no**: {res['why_not']}"
    if res["holds"] and not res["fused_applies"]:
        verdict = "yes (fused n/a)"
    return [
        case.key,
        str(case.n),
        str(case.chunk),
        _mib(temp["original"]) if "original" in temp else "-",
        _mib(temp["fused"]) if fused else "n/a",
        _mib(temp["remat"]) if "remat" in temp else "-",
        _ratio(p, "fused") if fused else "n/a",
        _ratio(p, "remat"),
        (_ratio(p, "fused", "remat") + _iqr(p, "fused", "remat")) if fused else "n/a",
        str(len(p.ratios("remat"))),
        pick,
        verdict,
    ]


def summary(results: list[dict[str, Any]]) -> list[str]:
    held = [r for r in results if r["holds"]]
    pct = 100 * len(held) / max(1, len(results))
    both = [r for r in results if r["fused_applies"]]
    lines = [
        f"**The rule holds on {len(held)} of {len(results)} cases ({pct:.0f}%)** "
        f"(target {TARGET:.0%}); on {sum(r['holds'] for r in both)} of {len(both)} where both "
        "modes apply."
    ]
    misses = [r for r in results if not r["holds"]]
    if misses:
        lines.append("Misses:")
        lines += [
            f'- `{r["case"].key}` (auto: {r["pick"]}): {r["why_not"]}. Auto\'s reason: "{r["why"]}"'
            for r in misses
        ]
    return lines


def refusals(results: list[dict[str, Any]]) -> list[str]:
    return [f"`{r['case'].key}`: {r['fused_refused']}" for r in results if r.get("fused_refused")]


def issue20_lines(results: list[dict[str, Any]]) -> list[str]:
    res = next((r for r in results if r["case"].key == "issue20-mlp"), None)
    if res is None:
        return []
    temp, p, pick = res["temp"], res["paired"], _mode_of(res["pick"])
    peer = "scan+checkpoint"
    if pick not in temp or peer not in temp:
        return [f"Issue 20's MLP: not measured ({res['pick']}; {res['notes']})."]
    t_orig = p.median_ratio(pick)
    t_scan = p.median_ratio(pick, peer)
    m_scan = temp[pick] / temp[peer]
    return [
        f"Issue 20's dense tanh MLP (chunk {res['case'].chunk}, auto = {res['pick']}): time "
        f"**{t_orig:.2f}x** the original's (target <= 1.10), {t_scan:.2f}x the hand-written "
        f"scan's; memory **{m_scan:.3f}x** the hand-written `lax.scan` + `jax.checkpoint`'s "
        f"({_mib(temp[pick])} vs {_mib(temp[peer])} MiB; target <= 1.05; the original: "
        f"{_mib(temp['original'])} MiB); the hand-written scan's time: "
        f"{p.median_ratio(peer):.2f}x the original's."
    ]


def first_call_lines(fc: dict[str, Any] | None) -> list[str]:
    if fc is None:
        return []
    t = fc["times"]
    measured = fc["memory_measured"]
    return [
        "First call of `jax.jit(jax.value_and_grad(f))(*args)` on the MC encoder-decoder (trace, "
        f"plan, compile; fresh functions, fastest of two): original **{t['original']:.1f} s**; "
        f'`grad="auto"`, chunk 4 ({fc["auto_grad"]}): **{t["auto"]:.1f} s** '
        f"({t['auto'] / t['original']:.1f}x); `memory=` {_mib(fc['budget'])} MiB (half the "
        f"original's {_mib(fc['original_temp'])} MiB; chose chunk {fc['memory_chunk']}, "
        f"{fc['memory_grad']}"
        + (f", {_mib(measured)} MiB" if measured is not None else "")
        + f"): **{t['memory']:.1f} s** ({t['memory'] / t['original']:.1f}x). Load average "
        f"{fc['load'][0]:.1f} then."
    ]


def _loads(loads: list[tuple[float, float, float]]) -> str:
    one = [x[0] for x in loads]
    return f"{min(one):.1f} to {max(one):.1f} (median {statistics.median(one):.1f})"


def markdown(results, fc, elapsed, loads, quick) -> str:
    notes = [f"- `{r['case'].key}`: {n}" for r in results for n in r["notes"]]
    parts = [
        "## Auto's choice: fused or remat (`benchmarks/auto_choice.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, {platform.machine()} with "
        f"{os.cpu_count()} CPU cores shared with other jobs; {'quick sizes, ' if quick else ''}"
        f"run time {elapsed / 60:.0f} min; one-minute load average {_loads(loads)} over the "
        "run. The rule of issue 20: (a) auto's memory is within 10% of the smaller of the fused "
        "and remat modes' memory; (b) among the modes within that 10%, auto's time is within "
        "10% of the fastest. Each case is measured in both modes: memory is XLA's temp bytes of "
        "`jax.jit(jax.value_and_grad(f, argnums=<the floating arguments>))` (issue 20's MLP: "
        "the weights only); times are medians over paired rounds (each round runs the original, "
        "fused and remat back to back in rotated order; a fast program in several interleaved "
        "passes of about 40 ms in all, its round time the median of its calls; at least "
        f"{MIN_ROUNDS} timed rounds) of the per-round ratio, against the original and "
        "fused against remat (with its interquartile range). Auto's memory and time are those "
        "of the mode it picks (`sf.explain(*args).grad`; auto's own program was compiled too "
        + (
            "and measured the same temp bytes). "
            if not any("auto's own program" in n for r in results for n in r["notes"])
            else "and differs where the notes below say). "
        )
        + "*fused n/a*: the plan refuses fused (listed below), so auto's only choice is remat.",
        "",
        *summary(results),
        "",
        md_table(HEADERS, [table_row(r) for r in results], right_from=1),
        "",
        *issue20_lines(results),
        "",
        *first_call_lines(fc),
        "",
    ]
    refused = refusals(results)
    if refused:
        parts += ["Fused refused:", "", *(f"- {x}" for x in refused), ""]
    if notes:
        parts += ["Notes:", "", *notes, ""]
    return "\n".join(parts)
