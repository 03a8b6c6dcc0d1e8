"""The Markdown of ``peers.py``: the commentary on the measured figures and its section of
docs/benchmarks.md."""

from __future__ import annotations

import os
import platform

import jax
from harness import (
    acceptance_table,
    md_table,
    write_doc_section,
)
from peers_report import HEADERS, table_rows
from peers_run import METHODS


def commentary(results: dict[str, dict]) -> str:
    """Short observations computed from the numbers (so that they stay true on re-runs)."""
    notes = []
    mlp = results.get("mlp")
    if mlp:
        r = mlp["rows"]
        ks = mlp["model"].chunks
        best_fused = min(
            r[(k, "fused")]["time_ratio"] for k in ks if "error" not in r[(k, "fused")]
        )
        notes.append(
            "- **Dense MLP.** Every chunked method cuts temp memory by the ratio of the chunk to "
            "the batch, plus the parameter gradients; `lax.map` *without* checkpoint keeps every "
            f"chunk's activations for the backward pass and needs "
            f"{r[(ks[0], 'lax.map')]['mem_ratio']:.2f}x the original's memory. The fused mode "
            "(value and per-chunk gradient in one pass, no second forward) is the fastest "
            f"chunked method (best {best_fused:.2f}x the original), for slightly more memory "
            "than remat."
        )
    seed = results.get("seed1")
    if seed:
        notes.append(_seed1_note(seed))
    tr = results.get("transformer")
    if tr:
        r = tr["rows"]
        ks = tr["model"].chunks
        k = 4 if 4 in ks else ks[0]
        f = r[(k, "fused")]
        s = r[(k, "scan+checkpoint")]
        if "error" not in f and "error" not in s:
            notes.append(
                f"- **Transformer with dropout.** At chunk {k}, fused: {f['mem_ratio']:.3f}x "
                f"memory, {f['time_ratio']:.2f}x time; hand-written scan+checkpoint: "
                f"{s['mem_ratio']:.3f}x memory, {s['time_ratio']:.2f}x time. The serialized "
                "program draws exactly the original's dropout masks (chunk by chunk, from the "
                "same key); the hand-written peers fold a chunk index into the key, so their "
                "masks differ (not compared for exactness)."
            )
    notes.append(
        "- Chunked programs can run faster than the original on XLA:CPU (the fused mode does "
        "here); smaller per-chunk buffers (better cache use, fewer large allocations) are the "
        "likely reason (not investigated further). The fused mode does one forward and one "
        "backward per chunk; remat, native and the checkpointed peers do two forwards and one "
        "backward. "
        "The spread (IQR) shows how noisy the shared 2-core machine was; `n` is the number "
        "of paired rounds. Ratios also move with the machine's load (in our runs the chunked "
        "methods looked faster against the original at load averages near 10 than near 5): "
        "compare runs at similar load."
    )
    return "\n".join(notes)


def write_docs(results, checks, elapsed, cpu, load, quick, md_path, png_path) -> None:
    parts = [
        "## Peers: memory and time side by side (`benchmarks/peers.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, "
        f"{platform.machine()} with {os.cpu_count()} CPU cores shared with other jobs; "
        f"{'quick sizes, ' if quick else ''}run time {elapsed:.0f} s wall, {cpu:.0f} s CPU "
        f"(load average {load:.1f} at the end). "
        "*mem ratio*: temp memory / the original's. *time ratio*: median over paired rounds "
        "of time / the original's time in the same round, with the interquartile range "
        "(`n`: rounds; `n = 1`: more than 8x slower in the warm-up round, timed once). "
        "*max rel diff*: value and gradients vs the original's, per leaf, relative to the "
        "leaf's magnitude (floored at 1e-3 of the largest leaf). `(= auto)` marks the mode "
        'that `grad="auto"` picks (the same program).',
        "",
        f"![memory and time against chunk size]({os.path.basename(png_path)})",
        "",
        "### Acceptance",
        "",
        acceptance_table(checks),
        "",
    ]
    for res in results.values():
        m = res["model"]
        parts += [
            f"### {m.title}",
            "",
            md_table(HEADERS, table_rows(res)),
            "",
        ]
    parts += ["### Observations", "", commentary(results), ""]
    write_doc_section(md_path, "peers", "\n".join(parts))


def _seed1_note(seed: dict) -> str:
    """The MC encoder-decoder's line: which methods hit the conv-in-a-loop trap, and ours."""
    r = seed["rows"]
    ks = seed["model"].chunks
    slow = [
        (k, n)
        for k in ks
        for n in seed["model"].method_names
        if "error" not in r[(k, n)] and r[(k, n)]["time_ratio"] > 4
    ]
    slow_names = sorted({n for _, n in slow}, key=METHODS.index)
    ours = [
        r[(k, n)]["time_ratio"]
        for k in ks
        for n in ("fused", "remat")
        if (k, n) in r and "error" not in r[(k, n)]
    ]
    if slow:
        worst = max(r[s]["time_ratio"] for s in slow)
        return (
            "- **MC encoder-decoder.** On XLA:CPU, "
            + ", ".join(f"`{n}`" for n in slow_names)
            + f" run {min(r[s]['time_ratio'] for s in slow):.0f}-{worst:.0f}x slower than "
            "the original: the weight gradient of a convolution inside a while loop hits "
            "[the conv-in-a-loop trap](#the-conv-in-a-loop-trap). The fused and remat modes "
            "emit their per-chunk pullbacks with canonical convolutions and take "
            f"{min(ours):.2f}-{max(ours):.2f}x the original's time. The native mode "
            "leaves the differentiation of the scan to JAX, so it cannot avoid the trap. "
            "(The trap is XLA:CPU's; not measured on a GPU here.)"
        )
    return "- **MC encoder-decoder.** No method is more than 4x slower than the original."
