"""The report of ``peers.py``: the table rows, the acceptance checks against the targets of
docs/benchmarks.md and the figure."""

from __future__ import annotations

import jax
from harness import (
    fmt_bytes,
)
from peers_run import MODES, PEERS


def _fmt_ratio(row: dict) -> str:
    if "error" in row:
        return "error"
    lo, hi = row["spread"]
    if row["n"] == 1:
        return f"{row['time_ratio']:.2f}"
    return f"{row['time_ratio']:.2f} [{lo:.2f}, {hi:.2f}]"


def table_rows(result: dict) -> list[list[str]]:
    model = result["model"]
    out = [
        [
            "-",
            "original (vmapped)",
            fmt_bytes(result["base_temp"]),
            "1.000",
            f"1 ({result['base_time'] * 1e3:.0f} ms)",
            "-",
            "-",
        ]
    ]
    for k in model.chunks:
        for name in model.method_names:
            row = result["rows"][(k, name)]
            label = name if name in PEERS else f"serialize_axis {name}"
            if result["auto"].get(k) == name:
                label += " (= auto)"
            if "error" in row:
                out.append([str(k), label, "error", "-", "-", "-", row["error"][:60]])
                continue
            out.append(
                [
                    str(k),
                    label,
                    fmt_bytes(row["temp"]),
                    f"{row['mem_ratio']:.3f}",
                    _fmt_ratio(row),
                    str(row["n"]),
                    "n/a (own masks)" if row["diff"] is None else f"{row['diff']:.1e}",
                ]
            )
    return out


HEADERS = ["chunk", "method", "temp memory", "mem ratio", "time ratio [IQR]", "n", "max rel diff"]


def acceptance(results: dict[str, dict]) -> list[tuple[str, str, bool]]:
    """(target, measured, ok) for each graded target."""
    checks: list[tuple[str, str, bool]] = []

    def row(model, k, name):
        r = results.get(model, {}).get("rows", {}).get((k, name))
        return r if r is not None and "error" not in r else None

    fused, scan, remat = row("mlp", 256, "fused"), row("mlp", 256, "scan+checkpoint"), None
    remat = row("mlp", 256, "remat")
    if fused:
        checks.append(
            (
                "Dense MLP, chunk 256: fused time <= 1.10x original",
                f"{fused['time_ratio']:.3f}x",
                fused["time_ratio"] <= 1.10,
            )
        )
        checks.append(
            (
                "Dense MLP, chunk 256: fused temp memory <= 0.30x original",
                f"{fused['mem_ratio']:.3f}x",
                fused["mem_ratio"] <= 0.30,
            )
        )
    else:
        checks.append(("Dense MLP, chunk 256: fused (time, memory)", "error", False))
    if fused and scan:
        t = fused["timings"].median_ratio("fused", "scan+checkpoint")
        m = fused["temp"] / scan["temp"]
        checks.append(
            (
                "Dense MLP, chunk 256: fused time <= 1.05x scan+checkpoint, at memory <= 1.10x",
                f"time {t:.3f}x, memory {m:.3f}x",
                t <= 1.05 and m <= 1.10,
            )
        )
    else:
        checks.append(("Dense MLP, chunk 256: fused vs scan+checkpoint", "error", False))
    checks.append(
        (
            "Dense MLP, chunk 256: remat time <= 1.40x original",
            f"{remat['time_ratio']:.3f}x" if remat else "error",
            bool(remat) and remat["time_ratio"] <= 1.40,
        )
    )
    seed = results.get("seed1")
    mode = seed["auto"].get(4) if seed else None
    auto = row("seed1", 4, mode) if mode in MODES else None
    checks.append(
        (
            "MC encoder-decoder (16 samples), chunk 4: auto time <= 1.5x original",
            f"{auto['time_ratio']:.3f}x (auto = {mode})" if auto else f"error ({mode})",
            bool(auto) and auto["time_ratio"] <= 1.5,
        )
    )
    return checks


def plot(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    keys = [k for k in ("mlp", "seed1", "transformer") if k in results]
    fig, axes = plt.subplots(2, len(keys), figsize=(5.2 * len(keys), 8), squeeze=False)
    styles = {
        "scan+checkpoint": ("tab:gray", "s", "--"),
        "lax.map": ("tab:brown", "v", ":"),
        "lax.map+checkpoint": ("tab:olive", "^", "--"),
        "fused": ("tab:blue", "o", "-"),
        "remat": ("tab:orange", "o", "-"),
        "native": ("tab:green", "o", "-"),
    }
    short = {"mlp": "Dense MLP", "seed1": "MC encoder-decoder", "transformer": "Transformer"}
    for j, key in enumerate(keys):
        res = results[key]
        chunks = res["model"].chunks
        ax_m, ax_t = axes[0][j], axes[1][j]
        for name in res["model"].method_names:
            color, marker, ls = styles[name]
            label = name if name in PEERS else f"serialize_axis {name}"
            pts = [(k, res["rows"][(k, name)]) for k in chunks]
            pts = [(k, r) for k, r in pts if "error" not in r]
            if not pts:
                continue
            ks = [k for k, _ in pts]
            ax_m.plot(
                ks, [r["temp"] / 2**20 for _, r in pts], marker=marker, ls=ls, c=color, label=label
            )
            ax_t.plot(
                ks, [r["time_ratio"] for _, r in pts], marker=marker, ls=ls, c=color, label=label
            )
        ax_m.axhline(res["base_temp"] / 2**20, c="k", lw=1, ls="-.", label="original (vmapped)")
        ax_t.axhline(1.0, c="k", lw=1, ls="-.", label="original (vmapped)")
        for ax in (ax_m, ax_t):
            ax.set_xscale("log", base=2)
            ax.set_xticks(chunks, [str(k) for k in chunks])
            ax.set_xlabel("chunk size")
            ax.grid(alpha=0.3)
        ax_m.set_title(f"{short[key]}: temp memory")
        ax_m.set_ylabel("XLA temp memory of value_and_grad (MiB)")
        ax_m.set_ylim(bottom=0)
        ax_t.set_title(f"{short[key]}: time vs original")
        ax_t.set_ylabel("time / original (median of paired ratios)")
        ratios = [r["time_ratio"] for r in res["rows"].values() if "error" not in r] + [1.0]
        if max(ratios) / min(ratios) > 4:  # the conv trap: tens of times slower
            ax_t.set_yscale("log")
            ax_t.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax_t.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax_t.yaxis.set_minor_formatter(ticker.NullFormatter())
    axes[0][0].legend(fontsize=8, loc="best")
    fig.suptitle(
        f"jaxpr_accum vs hand-written peers (jax {jax.__version__}, {jax.default_backend()})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
