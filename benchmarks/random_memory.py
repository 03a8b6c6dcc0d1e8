"""Random draws in the chunked region cost no memory: dropout and Monte-Carlo noise.

Run from the repository root::

    python benchmarks/random_memory.py           # writes its section of docs/benchmarks.md
    python benchmarks/random_memory.py --quick   # smaller transformer and MC model

(a) Dropout. The Flax linen transformer of ``benchmarks/models.py`` (batch 32, seq 64, width
    128, 2 layers) is built twice: with dropout 0.1 (residual, MLP and attention dropout; every
    draw is a ``u32[batch, ...]`` buffer in the original) and without dropout (no random draws
    at all). The batch is serialized with ``argnums=1`` in chunks of 4. For each, the ratio
    ``temp(serialized) / temp(original)`` of XLA's temp memory of ``jax.value_and_grad`` is
    measured. Target: ``ratio_with_dropout <= 1.1 * ratio_without_dropout`` (the draws cost
    nothing extra: they are generated per chunk and recomputed in the backward pass, never
    stored); whether the two ratios are also within 10% of each other both ways is reported.
    Graded for the default mode (``auto``) and for ``remat``.

(b) Monte-Carlo noise of the MC encoder-decoder (16 samples, automatic axis, chunk 4): the rewritten
    program ``sf.jaxpr(...)`` has no ``random_bits`` equation at all (the noise is drawn per
    chunk from the threefry counters of the chunk's slice), and the compiled HLO of
    ``jit(value_and_grad(sf))`` has no ``u32`` buffer of the full noise shape, nor any ``u32``
    buffer of at least half its elements (the halves of a 2x32-bit threefry), while the
    original's HLO has one (so the check is not vacuous). The same structural facts are
    reported for the dropout transformer.

The process exits 1 if a check fails.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import benchmark_options, fmt_bytes, print_table, write_doc_section  # noqa: E402
from measuring import compile_value_and_grad, temp_bytes_of  # noqa: E402
from models import (  # noqa: E402
    QUICK_SEED1,
    Seed1Config,
    TransformerConfig,
    seed1_problem,
    transformer_problem,
)

import jaxpr_accum as ja  # noqa: E402

CHUNK = 4
RATIO_TOL = 1.1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def random_bits_shapes(jaxpr) -> list[tuple[int, ...]]:
    """Output shapes of every ``random_bits`` equation, sub-jaxprs included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "random_bits":
            out.append(tuple(eqn.outvars[0].aval.shape))
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                    out += random_bits_shapes(sub.jaxpr)
                elif hasattr(sub, "eqns"):
                    out += random_bits_shapes(sub)
    return out


def u32_shapes(hlo_text: str) -> set[tuple[int, ...]]:
    """Every ``u32[...]`` array shape that appears in an HLO module's text."""
    shapes = set()
    for dims in re.findall(r"\bu32\[([0-9,]*)\]", hlo_text):
        shapes.add(tuple(int(d) for d in dims.split(",") if d))
    return shapes


def hlo_text(f, args) -> str:
    return compile_value_and_grad(f, args).as_text()


def dropout_memory(quick: bool) -> tuple[list[list[str]], list[tuple[str, str, bool]], dict]:
    """(a): temp memory ratios with and without dropout, and structure of the draws."""
    size = (
        dict(batch=16, seq=32, embed=64, heads=2, layers=1, vocab=128)
        if quick
        else dict(batch=32, seq=64, embed=128, heads=4, layers=2, vocab=256)
    )
    temps: dict[tuple[str, str], int] = {}
    info = {}
    for label, rate in (("with dropout", 0.1), ("without dropout", 0.0)):
        cfg = TransformerConfig(dropout=rate, **size)
        loss, args = transformer_problem(cfg)
        temps[(label, "original")] = temp_bytes_of(compile_value_and_grad(loss, args))
        for mode in ("auto", "remat"):
            sf = ja.serialize_axis(loss, chunk=CHUNK, argnums=1, grad=mode)
            compiled = compile_value_and_grad(sf, args)
            temps[(label, mode)] = temp_bytes_of(compiled)
            if mode == "auto":
                info[f"auto mode ({label})"] = sf.explain(*args).grad
            if rate > 0 and mode == "auto":
                # Draws along the batch axis: leading dimension = batch. (Flax broadcasts
                # attention dropout over batch and heads: its (1, 1, q, k) draw does not carry
                # the axis, is loop-invariant and is hoisted before the loop, as it should be.)
                draws = set(random_bits_shapes(jax.make_jaxpr(loss)(*args).jaxpr))
                full = {d for d in draws if d and d[0] == cfg.batch}
                sf_bits = random_bits_shapes(sf.jaxpr(*args).jaxpr)
                info["draws"] = sorted(draws)
                info["full draws"] = sorted(full)
                info["sf full random_bits"] = [d for d in sf_bits if d in full]
                info["sf other random_bits"] = [d for d in sf_bits if d not in full]
                info["sf full u32"] = sorted(full & u32_shapes(compiled.as_text()))
                info["orig full u32"] = sorted(full & u32_shapes(hlo_text(loss, args)))
        info["cfg"] = cfg

    rows, checks = [], []
    for mode in ("auto", "remat"):
        r_with = temps[("with dropout", mode)] / temps[("with dropout", "original")]
        r_without = temps[("without dropout", mode)] / temps[("without dropout", "original")]
        q = r_with / r_without
        ok = r_with <= RATIO_TOL * r_without
        both = 1 / RATIO_TOL <= q <= RATIO_TOL
        checks.append(
            (
                f"dropout transformer, {mode}: ratio with dropout <= {RATIO_TOL}x ratio without",
                f"{r_with:.3f} vs {r_without:.3f} (x{q:.3f}; "
                f"{'within' if both else 'outside'} [0.9, 1.1])",
                ok,
            )
        )
        for label, r in (("with dropout", r_with), ("without dropout", r_without)):
            rows.append(
                [
                    label,
                    mode,
                    fmt_bytes(temps[(label, "original")]),
                    fmt_bytes(temps[(label, mode)]),
                    f"{r:.3f}",
                    f"{q:.3f}" if label == "with dropout" else "",
                    ("PASS" if ok else "FAIL") if label == "with dropout" else "",
                ]
            )
    info["temps"] = temps
    return rows, checks, info


def seed1_structure(quick: bool) -> tuple[list[tuple[str, str, bool]], dict]:
    """(b): no ``random_bits`` in the rewritten MC encoder-decoder, no full u32 buffer."""
    cfg = QUICK_SEED1 if quick else Seed1Config()
    loss, args = seed1_problem(cfg)
    sf = ja.serialize_axis(loss, chunk=CHUNK)
    full_shapes = random_bits_shapes(jax.make_jaxpr(loss)(*args).jaxpr)
    noise = max(full_shapes, key=math.prod)
    n_full = math.prod(noise)
    sf_bits = random_bits_shapes(sf.jaxpr(*args).jaxpr)
    sf_u32 = u32_shapes(hlo_text(sf, args))
    orig_u32 = u32_shapes(hlo_text(loss, args))
    big = sorted(s for s in sf_u32 if math.prod(s) * 2 >= n_full)
    orig_big = sorted(s for s in orig_u32 if math.prod(s) * 2 >= n_full)
    largest = max(sf_u32, key=math.prod, default=())
    checks = [
        (
            "MC encoder-decoder, chunk 4: no `random_bits` equation in sf.jaxpr(...)",
            f"{len(sf_bits)} (original: {len(full_shapes)}, shape {noise})",
            not sf_bits,
        ),
        (
            f"MC model, chunk 4: no u32 buffer of the noise shape {noise} (or >= half its size) "
            "in the compiled HLO",
            f"{len(big)} such buffers (largest u32: {list(largest)}); original has "
            f"{len(orig_big)}: {[list(s) for s in orig_big]}",
            not big and bool(orig_big),
        ),
    ]
    return checks, {"cfg": cfg, "noise": noise, "largest": largest}


def _markdown(rows, checks, info, seed_info, headers, elapsed) -> list[str]:
    """The lines of this script's section of docs/benchmarks.md."""
    cfg, scfg = info["cfg"], seed_info["cfg"]
    t = info["temps"]
    return [
        "## Random draws cost no memory (`benchmarks/random_memory.py`)",
        "",
        f"(a) Flax linen transformer (batch {cfg.batch}, seq {cfg.seq}, width {cfg.embed}, "
        f"{cfg.layers} layers), token batch serialized with `argnums=1`, chunk {CHUNK}; "
        "built with dropout 0.1 (residual, MLP and attention dropout) and without dropout. "
        "*ratio*: XLA temp memory of `value_and_grad`, serialized / original. Target: the "
        f"ratio with dropout at most {RATIO_TOL}x the ratio without.",
        "",
        "| " + " | ".join(headers[:-1]) + " | verdict |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "Dropout costs the original "
        f"{fmt_bytes(t[('with dropout', 'original')] - t[('without dropout', 'original')])}"
        " of temp memory (its `u32[batch, ...]` random bits and masks, kept for the "
        "backward pass); it costs the serialized program "
        f"{fmt_bytes(t[('with dropout', 'auto')] - t[('without dropout', 'auto')])} "
        f"(auto) and "
        f"{fmt_bytes(t[('with dropout', 'remat')] - t[('without dropout', 'remat')])} "
        "(remat).",
        "",
        f"(b) Structure (chunk {CHUNK}): MC encoder-decoder ({scfg.n_samples} samples, "
        f"{scfg.height}x{scfg.width}, automatic axis; full noise "
        f"`u32{list(seed_info['noise'])}`) and the dropout transformer above.",
        "",
        "| check | measured | verdict |",
        "| --- | --- | --- |",
        *(f"| {c} | {m} | {'PASS' if k else '**FAIL**'} |" for c, m, k in checks),
        "",
        f"Run time {elapsed:.0f} s.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(__doc__, "smaller models", argv)
    doc = opts.doc
    t_start = time.perf_counter()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}; chunk {CHUNK}")

    rows, checks, info = dropout_memory(opts.quick)
    cfg = info["cfg"]
    headers = ["model", "grad", "original temp", "serialized temp", "ratio", "with/without", ""]
    print(
        f"\n(a) transformer (batch {cfg.batch}, seq {cfg.seq}, width {cfg.embed}, "
        f"{cfg.layers} layers), argnums=1, chunk {CHUNK}; auto picks "
        + ", ".join(f"{v} {k[10:]}" for k, v in info.items() if k.startswith("auto mode"))
    )
    print_table(headers, rows, left=2)
    print(
        f"dropout draw shapes in the original: {info['draws']}; along the batch axis: "
        f"{info['full draws']}"
    )
    print(
        f"serialized: random_bits in sf.jaxpr along the batch axis: "
        f"{info['sf full random_bits']}, others (axis-free, hoisted): "
        f"{info['sf other random_bits']}; full-shape u32 buffers in its HLO: "
        f"{info['sf full u32']} (original's HLO: {info['orig full u32']})"
    )
    tr_struct_ok = (
        not info["sf full random_bits"] and not info["sf full u32"] and bool(info["orig full u32"])
    )
    checks.append(
        (
            "dropout transformer, chunk 4: no batch-sized `random_bits` in sf.jaxpr, no u32 "
            "buffer of a batch-sized dropout draw's shape in the compiled HLO",
            f"{len(info['sf full random_bits'])} batch-sized random_bits "
            f"({len(info['sf other random_bits'])} axis-free ones hoisted: "
            f"{sorted(set(info['sf other random_bits']))}), {len(info['sf full u32'])} "
            f"full-shape u32 buffers (original HLO: {len(info['orig full u32'])}: "
            f"{[list(d) for d in info['orig full u32']]})",
            tr_struct_ok,
        )
    )

    seed_checks, seed_info = seed1_structure(opts.quick)
    checks += seed_checks
    elapsed = time.perf_counter() - t_start
    print("\nchecks:")
    for target, measured, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {target}: {measured}")
    print(f"run time {elapsed:.0f} s")
    ok = all(c[2] for c in checks)

    if doc:
        md = _markdown(rows, checks, info, seed_info, headers, elapsed)
        write_doc_section(doc, "random_memory", "\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
