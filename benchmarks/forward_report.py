"""The report of ``forward.py``: the forward-mode and Jacobian tables, the checks against the
targets, and the Markdown section."""

from __future__ import annotations

import os
import platform

import jax
from harness import (
    acceptance_table,
    fmt_bytes,
    md_table,
)

JVP_TARGET, DIFF_TARGET = 0.5, 2e-4


def forward_table(res: dict) -> tuple[list[str], list[list[str]]]:
    headers = [
        "program",
        "jvp temp memory",
        "mem ratio",
        "jvp time ratio [IQR]",
        "n",
        "linearize holds (of which residuals)",
        "max rel diff",
    ]
    rows = []
    for name, r in res["rows"].items():
        label = "original" if name == "original" else f"serialize_axis {name}"
        if name == "original":
            t = f"1 ({res['base_time'] * 1e3:.0f} ms)"
            n = "-"
        else:
            lo, hi = r["spread"]
            t, n = f"{r['time_ratio']:.2f} [{lo:.2f}, {hi:.2f}]", str(r["n"])
        rows.append(
            [
                label,
                fmt_bytes(r["temp"]),
                f"{r['mem_ratio']:.3f}",
                t,
                n,
                f"{fmt_bytes(r['lin_total'])} ({fmt_bytes(r['lin_residual'])})",
                "-" if name == "original" else f"{r['diff']:.1e}",
            ]
        )
    return headers, rows


def jacobian_table(cases: list[dict]) -> tuple[list[str], list[list[str]]]:
    headers = [
        "program",
        "basis axis (size=)",
        "temp memory, original",
        "serialized",
        "ratio",
        "time ratio (n)",
        "max rel diff",
        "automatic mode (no size=)",
    ]
    rows = []
    for c in cases:
        auto = (
            f"the basis axis ({fmt_bytes(c['temp_auto'])}, diff {c['diff_auto']:.0e})"
            if c["auto_axis"] == c["size"] and c["temp_auto"] == c["temp_ser"]
            else f"axis of size {c['auto_axis']} born at {c['auto_born']}: "
            f"{fmt_bytes(c['temp_auto'])}"
        )
        rows.append(
            [
                c["what"],
                f"{c['size']:,}, chunk {c['chunk']}",
                fmt_bytes(c["temp"]),
                fmt_bytes(c["temp_ser"]),
                f"{c['temp_ser'] / c['temp']:.3f}",
                f"{c['time_ratio']:.2f} ({c['n']})",
                f"{c['diff']:.1e}",
                auto,
            ]
        )
    return headers, rows


def checks(res: dict, cases: list[dict]) -> list[tuple[str, str, bool]]:
    out = []
    for name, r in res["rows"].items():
        if name == "original":
            continue
        out.append(
            (
                f"jvp at chunk N/8, {name}: temp memory <= {JVP_TARGET}x original",
                f"{r['mem_ratio']:.3f}x",
                r["mem_ratio"] <= JVP_TARGET,
            )
        )
        out.append((f"jvp, {name}: exact", f"{r['diff']:.1e}", r["diff"] <= DIFF_TARGET))
    for c in cases:
        out.append((f"{c['what']}: exact", f"{c['diff']:.1e}", c["diff"] <= DIFF_TARGET))
        out.append(
            (
                f"{c['what']}: automatic mode picks the basis axis",
                f"size {c['auto_axis']} at {c['auto_born']}",
                c["auto_axis"] == c["size"] and c["diff_auto"] <= DIFF_TARGET,
            )
        )
    return out


def markdown(res: dict, cases: list[dict], info: dict, verdicts: list, elapsed: float) -> str:
    layers, width, rows, chunk = res["sizes"]
    load = os.getloadavg()[0]
    h1, r1 = forward_table(res)
    h2, r2 = jacobian_table(cases)
    lines = [
        "## Forward mode and chunked Jacobians (`benchmarks/forward.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, {platform.machine()} with "
        f"{os.cpu_count()} CPU cores shared with other jobs; run time {elapsed:.0f} s wall "
        f"(load average {load:.1f} at the end). Memory here is XLA's temp memory of the compiled "
        "program named in each table (not of `value_and_grad`, except where it says so).",
        "",
        "### Acceptance",
        "",
        acceptance_table(verdicts, fail="FAIL"),
        "",
        f"### `jax.jvp` of a {layers}-layer tanh MLP (width {width}, {rows} rows), "
        f"`argnums=1`, chunk {chunk}",
        "",
        "Tangents for every weight and for the rows. *mem ratio*: temp memory of "
        "`jax.jit(jax.jvp)` / the original's. *jvp time ratio*: median over paired rounds of "
        "the serialized jvp's time / the original jvp's in the same round, with the "
        "interquartile range (`n`: rounds). *linearize holds*: bytes of the arrays that "
        "`jax.linearize`'s linear function closes over "
        "(`jax.tree_util.tree_leaves(f_lin)`); in parentheses, those that are not the inputs "
        f"themselves ({fmt_bytes(res['input_bytes'])} of weights and rows).",
        "",
        md_table(h1, r1),
        "",
        f"### Jacobians of a 2-layer model ({info['rows']:,} outputs, {info['params']:,} "
        f"parameters: `tanh(x @ w1) @ w2`, `w1` [{info['d_in']}, {info['hidden']}])",
        "",
        "*temp memory*: of `jax.jit` of the program (of `jax.jit(jax.value_and_grad(...))` "
        "for the penalty). The Jacobian is an output: its bytes "
        f"({fmt_bytes(4 * info['rows'] * info['params'])}) are not temp memory, but the "
        "serialized program stacks it from the chunks, which can add a transposed copy. "
        "*time ratio*: median of paired rounds (`n`). *automatic mode*: what "
        "`serialize_axis(f, chunk=64)` without `size=` picks, its memory and its difference.",
        "",
        md_table(h2, r2),
        "",
        "The basis axis is born inside the function (an `iota` in JAX's basis construction) and "
        "is independent: each basis vector's pullback (jacrev) or pushforward (jacfwd) is "
        "computed on its own, so every chunk computes its rows of the Jacobian exactly as the "
        "`vmap` did. The memory the original spends is the vmapped pullback's or pushforward's "
        "activations, one copy per basis vector.",
    ]
    return "\n".join(lines) + "\n"
