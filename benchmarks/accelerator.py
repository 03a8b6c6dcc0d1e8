"""The accelerator benchmark: a transformer language model and a SimCLR loss over N x N pairs,
as written, serialized at several chunks, and as a hand-written ``lax.scan`` +
``jax.checkpoint`` microbatch loop, on whatever device JAX sees.

For each program, of ``jax.jit(jax.value_and_grad(f))``:

- XLA's temp bytes (``memory_analysis().temp_size_in_bytes``);
- the first call (trace, lower, compile and run once), and the step time (the median of
  ``--repeats`` calls after one warm-up, each ``block_until_ready``);
- the gradient's agreement with the original's, compiled at ``highest`` matmul precision
  (relative L2 over every leaf; the hand-written loop draws other dropout masks, so it is not
  compared);
- with ``--largest``, the largest batch that compiles in the device's memory, doubling from
  the configured batch up to ``--max-batch`` (a compile that runs out of memory ends the
  search).

``--size tiny`` runs a model small enough for a CPU (the test suite runs it, so the script
cannot rot); ``--size tpu`` is the 219M-parameter model (d_model 1024, 12 layers, sequence
1024, vocabulary 32k, dropout 0.1) and SimCLR at N up to 65,536 measured on a TPU v5e.
``--only lm`` / ``--only simclr`` run one part (a TPU compile of the model takes about a
minute, so the parts fit separate calls).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_accum as ja
from benchmarks.harness import fmt_bytes, print_table
from benchmarks.measuring import compile_value_and_grad, temp_bytes_of
from benchmarks.pairwise_cases import simclr
from benchmarks.transformer import TransformerConfig, transformer_peers, transformer_problem


@dataclasses.dataclass(frozen=True)
class Scale:
    """The sizes of one run."""

    lm: TransformerConfig
    lm_chunks: tuple[int, ...]
    hand_chunk: int
    max_batch: int
    simclr_batches: tuple[int, ...]
    simclr_width: tuple[int, int, int]  # features, hidden, embedding
    repeats: int


SCALES = {
    "tiny": Scale(
        lm=TransformerConfig(batch=4, seq=16, embed=32, heads=2, layers=1, vocab=64),
        lm_chunks=(1, 2),
        hand_chunk=2,
        max_batch=8,
        simclr_batches=(64,),
        simclr_width=(8, 16, 16),
        repeats=2,
    ),
    "tpu": Scale(
        lm=TransformerConfig(batch=8, seq=1024, embed=1024, heads=16, layers=12, vocab=32000),
        lm_chunks=(1, 2),
        hand_chunk=2,
        max_batch=1024,
        simclr_batches=(8192, 65536),
        simclr_width=(256, 1024, 128),
        repeats=5,
    ),
}


@dataclasses.dataclass
class Row:
    """The measurements of one program (None: not measured, or it did not fit)."""

    name: str
    temp_bytes: int | None = None
    first_call_s: float | None = None
    step_s: float | None = None
    grad_rel_l2: float | None = None
    error: str | None = None


def out_of_memory(err: BaseException) -> bool:
    """Whether a compile or run failed for lack of device memory."""
    text = str(err)
    return any(s in text for s in ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory"))


def relative_l2(got: Any, ref: Any) -> float:
    """``||got - ref|| / ||ref||`` over every leaf of two gradient pytrees, in float64."""
    num = sum(
        float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True)
    )
    den = sum(float(np.sum(np.asarray(b, np.float64) ** 2)) for b in jax.tree.leaves(ref))
    return float(np.sqrt(num / den)) if den else float(np.sqrt(num))


def measure(name: str, f: Callable[..., Any], args: tuple, repeats: int) -> tuple[Row, Any]:
    """Compile ``value_and_grad(f)`` at ``args``, run it, time it: its row and its gradient."""
    row = Row(name)
    start = time.perf_counter()
    try:
        compiled = jax.jit(jax.value_and_grad(f)).lower(*args).compile()
        out = jax.block_until_ready(compiled(*args))
    except Exception as err:  # noqa: BLE001 - a program that does not fit is a result
        row.error = "out of memory" if out_of_memory(err) else f"{type(err).__name__}: {err}"
        row.error = row.error.splitlines()[0][:120]
        return row, None
    row.first_call_s = time.perf_counter() - start
    row.temp_bytes = temp_bytes_of(compiled)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    row.step_s = statistics.median(times)
    return row, out[1]


def gradient_at_highest(f: Callable[..., Any], args: tuple) -> Any:
    """The gradient of ``f`` (argument 0) compiled at ``highest`` matmul precision."""
    return compile_value_and_grad(f, args, 0, precision="highest")(*args)[1]


def compare(rows: list[Row], programs: dict[str, Callable[..., Any]], args: tuple) -> None:
    """Fill ``grad_rel_l2`` of every serialized row against the original at ``highest``."""
    if rows[0].error is not None:
        return  # the original does not fit: nothing to compare with
    ref = gradient_at_highest(programs["original"], args)
    for row in rows:
        if row.name.startswith("serialize_axis") and row.error is None:
            row.grad_rel_l2 = relative_l2(gradient_at_highest(programs[row.name], args), ref)


def largest_batch(
    at_batch: Callable[[int], tuple], f: Callable[..., Any], start: int, limit: int
) -> tuple[int | None, str]:
    """The largest batch in ``start, 2 start, ...`` (at most ``limit``) whose value and gradient
    compile in the device's memory, and why the search stopped."""
    fits = None
    batch = start
    while batch <= limit:
        try:
            jax.jit(jax.value_and_grad(f)).lower(*at_batch(batch)).compile()
        except Exception as err:  # noqa: BLE001
            if not out_of_memory(err):
                raise
            return fits, f"batch {batch} ran out of memory"
        fits = batch
        batch *= 2
    return fits, f"reached the search's limit, {limit}"


def lm_programs(scale: Scale, batch: int) -> tuple[dict[str, Callable[..., Any]], tuple]:
    """The language model's programs at ``batch`` sequences, and their arguments."""
    cfg = dataclasses.replace(scale.lm, batch=batch)
    loss, args = transformer_problem(cfg)
    programs: dict[str, Callable[..., Any]] = {"original": loss}
    for chunk in scale.lm_chunks:
        programs[f"serialize_axis, chunk {chunk}"] = ja.serialize_axis(loss, chunk=chunk, argnums=1)
    hand = transformer_peers(cfg, scale.hand_chunk)["scan+checkpoint"]
    programs[f"hand-written scan+checkpoint, chunk {scale.hand_chunk}"] = hand
    return programs, args


def simclr_programs(scale: Scale, n: int) -> tuple[dict[str, Callable[..., Any]], tuple]:
    """SimCLR at ``n`` rows: the original and serialized at chunk ``n // 8``."""
    features, hidden, embed = scale.simclr_width
    kw, kx = jax.random.split(jax.random.PRNGKey(0))
    w = (
        jax.random.normal(kw, (features, hidden)) / np.sqrt(features),
        jax.random.normal(kw, (hidden, embed)) / np.sqrt(hidden),
    )
    x = jax.random.normal(kx, (n, features))
    programs = {
        "original": simclr,
        f"serialize_axis, chunk {n // 8}": ja.serialize_axis(simclr, chunk=n // 8, argnums=1),
    }
    return programs, (w, x, jnp.float32(0.5))


def run_part(
    title: str,
    programs: dict[str, Callable[..., Any]],
    args: tuple,
    repeats: int,
) -> list[Row]:
    """Measure and compare every program of one part, and print its table."""
    rows = []
    for name, f in programs.items():
        rows.append(measure(name, f, args, repeats)[0])
        print(f"measured: {rows[-1]}", flush=True)
    compare(rows, programs, args)
    print(f"\n{title} ({jax.devices()[0].device_kind}, {jax.default_backend()})")
    original = rows[0].temp_bytes

    def ratio(row: Row) -> str:
        return f"{row.temp_bytes / original:.2f}" if row.temp_bytes and original else "n/a"

    print_table(
        ["program", "temp memory", "ratio", "first call", "step", "grad rel L2 (highest)"],
        [
            [
                r.name,
                r.error or fmt_bytes(r.temp_bytes),
                ratio(r),
                "n/a" if r.first_call_s is None else f"{r.first_call_s:.1f} s",
                "n/a" if r.step_s is None else f"{r.step_s * 1e3:.1f} ms",
                "n/a" if r.grad_rel_l2 is None else f"{r.grad_rel_l2:.1e}",
            ]
            for r in rows
        ],
    )
    return rows


def run_lm(scale: Scale, largest: bool) -> None:
    programs, args = lm_programs(scale, scale.lm.batch)
    run_part(f"Transformer LM, batch {scale.lm.batch}", programs, args, scale.repeats)
    if not largest:
        return
    params, tokens, key = args
    vocab = scale.lm.vocab

    def at_batch(batch: int) -> tuple:
        more = jax.random.randint(jax.random.PRNGKey(batch), (batch, tokens.shape[1]), 0, vocab)
        return params, more, key

    for name, f in programs.items():
        fits, why = largest_batch(at_batch, f, scale.lm.batch, scale.max_batch)
        print(f"largest batch that fits, {name}: {fits} ({why})", flush=True)


def run_simclr(scale: Scale) -> None:
    for n in scale.simclr_batches:
        programs, args = simclr_programs(scale, n)
        run_part(f"SimCLR, N = {n}", programs, args, scale.repeats)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--only", choices=("lm", "simclr"), default=None)
    parser.add_argument("--largest", action="store_true", help="search the largest batch")
    opts = parser.parse_args(argv)
    scale = SCALES[opts.size]
    if opts.only in (None, "lm"):
        run_lm(scale, opts.largest)
    if opts.only in (None, "simclr"):
        run_simclr(scale)


if __name__ == "__main__":
    main()
