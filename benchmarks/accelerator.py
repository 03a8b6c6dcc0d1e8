"""The accelerator benchmark: a transformer language model and a SimCLR loss over N x N pairs,
as written, serialized at several chunks, and as a hand-written ``lax.scan`` +
``jax.checkpoint`` microbatch loop, on whatever device JAX sees.

For each program, of ``jax.jit(jax.value_and_grad(f))``:

- XLA's temp bytes (``memory_analysis().temp_size_in_bytes``);
- the first call (trace, lower, compile and run once), and the step time (the median of
  the scale's ``repeats`` calls after one warm-up, each ``block_until_ready``);
- the gradient's agreement with the original's, compiled at ``highest`` matmul precision
  (relative L2 over every leaf; the hand-written loop draws other dropout masks, so it is not
  compared);
- the largest batch of the language model that compiles in the device's memory, on the ladder
  from the configured batch doubling up to the scale's ``max_batch`` (``largest_batch``).

``--steps`` picks among these (``measure``, ``compare``, ``largest``), ``--only lm`` /
``--only simclr`` one part and ``--match`` the programs whose names hold a string, so that a
TPU's minute-long compiles fit separate calls; ``compare``'s and ``largest``'s compiles run on
threads of their own. ``--size tiny`` runs a model small enough for a CPU (the test suite runs
it, so the script cannot rot); ``--size tpu`` is the 219M-parameter model (d_model 1024, 12
layers, sequence 1024, vocabulary 32k, dropout 0.1) and SimCLR at N up to 65,536.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxpr_accum as ja
from benchmarks.harness import fmt_bytes, print_table
from benchmarks.measuring import (
    compile_value_and_grad,
    concurrently,
    out_of_memory,
    relative_l2,
    step_time,
    temp_bytes_of,
)
from benchmarks.pairwise_cases import simclr
from benchmarks.transformer import TransformerConfig, transformer_peers, transformer_problem

STEPS = ("measure", "compare", "largest")


@dataclasses.dataclass(frozen=True)
class Scale:
    """The sizes of one run."""

    lm: TransformerConfig
    lm_chunks: tuple[int, ...]
    lm_grads: tuple[str, ...]  # serialize_axis's ``grad=`` at each chunk
    hand_chunk: int
    max_batch: int
    simclr_batches: tuple[int, ...]
    simclr_width: tuple[int, int, int]  # features, hidden, embedding
    repeats: int


SCALES = {
    "tiny": Scale(
        lm=TransformerConfig(batch=4, seq=16, embed=32, heads=2, layers=1, vocab=64),
        lm_chunks=(2,),
        lm_grads=("auto",),
        hand_chunk=2,
        max_batch=8,
        simclr_batches=(64,),
        simclr_width=(8, 16, 16),
        repeats=2,
    ),
    "tpu": Scale(
        lm=TransformerConfig(batch=8, seq=1024, embed=1024, heads=16, layers=12, vocab=32000),
        lm_chunks=(1, 2),
        lm_grads=("auto", "remat"),
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
    error: str | None = None


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
    row.step_s = step_time(compiled, args, repeats)
    return row, out[1]


def compare(programs: dict[str, Callable[..., Any]], args: tuple) -> None:
    """Print each serialized program's gradient against the original's, every program
    compiled at ``highest`` matmul precision (relative L2 over every leaf; the hand-written
    loop draws other dropout masks, so it is not compared)."""
    names = [n for n in programs if n == "original" or n.startswith("serialize_axis")]
    if names[:1] != ["original"]:
        return  # not selected: nothing to compare with
    compiled = concurrently(
        {
            n: functools.partial(compile_value_and_grad, programs[n], args, 0, "highest")
            for n in names
        }
    )
    if isinstance(compiled["original"], Exception):
        print(f"gradient at highest precision: the original failed ({compiled['original']!r:.120})")
        return
    ref = compiled["original"](*args)[1]
    for name in names[1:]:
        c = compiled[name]
        agreement = (
            f"{c!r:.120}" if isinstance(c, Exception) else f"{relative_l2(c(*args)[1], ref):.1e}"
        )
        print(f"gradient at highest precision, {name}: relative L2 {agreement}", flush=True)


def largest_batch(
    at_batch: Callable[[int], tuple], f: Callable[..., Any], start: int, limit: int
) -> tuple[int | None, str]:
    """The largest batch in ``start, 2 start, ...`` (at most ``limit``) whose value and gradient
    compile in the device's memory, and why the search stopped. A program's memory grows with
    the batch, so the ladder's top is probed first (a serialized program fits it in one
    compile), then the ladder from ``2 start`` up to the first that does not fit (``start``
    is the batch measured already)."""

    def fits(batch: int) -> bool:
        try:
            jax.jit(jax.value_and_grad(f)).lower(*at_batch(batch)).compile()
        except Exception as err:  # noqa: BLE001
            if not out_of_memory(err):
                raise
            return False
        return True

    top = start * 2 ** int(np.log2(limit // start)) if limit >= start else start
    if fits(top):
        return top, f"reached the search's limit, {limit}"
    batch = start
    while batch * 2 < top and fits(batch * 2):
        batch *= 2
    return batch, f"batch {batch * 2} ran out of memory"


def lm_programs(scale: Scale, batch: int) -> tuple[dict[str, Callable[..., Any]], tuple]:
    """The language model's programs at ``batch`` sequences, and their arguments."""
    cfg = dataclasses.replace(scale.lm, batch=batch)
    loss, args = transformer_problem(cfg)
    programs: dict[str, Callable[..., Any]] = {"original": loss}
    for grad in scale.lm_grads:
        for chunk in scale.lm_chunks:
            name = f"serialize_axis, chunk {chunk}" + ("" if grad == "auto" else f", grad={grad}")
            programs[name] = ja.serialize_axis(loss, chunk=chunk, argnums=1, grad=grad)
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
    """Measure every program of one part, and print its table."""
    rows = []
    for name, f in programs.items():
        rows.append(measure(name, f, args, repeats)[0])
        print(f"measured: {rows[-1]}", flush=True)
    print(f"\n{title} ({jax.devices()[0].device_kind}, {jax.default_backend()})")
    original = rows[0].temp_bytes if rows and rows[0].name == "original" else None

    def ratio(row: Row) -> str:
        return f"{row.temp_bytes / original:.2f}" if row.temp_bytes and original else "n/a"

    print_table(
        ["program", "temp memory", "ratio", "first call", "step"],
        [
            [
                r.name,
                r.error or fmt_bytes(r.temp_bytes),
                ratio(r),
                "n/a" if r.first_call_s is None else f"{r.first_call_s:.1f} s",
                "n/a" if r.step_s is None else f"{r.step_s * 1e3:.1f} ms",
            ]
            for r in rows
        ],
    )
    return rows


def run_lm(scale: Scale, steps: Sequence[str], match: str | None = None) -> None:
    programs, args = lm_programs(scale, scale.lm.batch)
    programs = {n: f for n, f in programs.items() if match is None or match in n}
    title = f"Transformer LM, batch {scale.lm.batch}"
    if "measure" in steps:
        run_part(title, programs, args, scale.repeats)
    if "compare" in steps:
        compare(programs, args)
    if "largest" not in steps:
        return
    params, tokens, key = args
    vocab = scale.lm.vocab

    def at_batch(batch: int) -> tuple:
        more = jax.random.randint(jax.random.PRNGKey(batch), (batch, tokens.shape[1]), 0, vocab)
        return params, more, key

    searches = {
        name: functools.partial(largest_batch, at_batch, f, scale.lm.batch, scale.max_batch)
        for name, f in programs.items()
    }
    for name, found in concurrently(searches).items():
        fits, why = (None, f"{found!r:.120}") if isinstance(found, Exception) else found
        print(f"largest batch that fits, {name}: {fits} ({why})", flush=True)


def run_simclr(scale: Scale, steps: Sequence[str], match: str | None = None) -> None:
    for n in scale.simclr_batches:
        programs, args = simclr_programs(scale, n)
        programs = {n: f for n, f in programs.items() if match is None or match in n}
        if "measure" in steps:
            run_part(f"SimCLR, N = {n}", programs, args, scale.repeats)
        if "compare" in steps:
            compare(programs, args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--only", choices=("lm", "simclr"), default=None)
    parser.add_argument(
        "--steps",
        nargs="+",
        choices=STEPS,
        default=STEPS[:2],
        help="measure: memory and times; compare: the gradients at highest precision; "
        "largest: the largest batch of the language model that fits",
    )
    parser.add_argument("--match", default=None, help="only the programs whose names hold this")
    opts = parser.parse_args(argv)
    scale = SCALES[opts.size]
    if opts.only in (None, "lm"):
        run_lm(scale, opts.steps, opts.match)
    if opts.only in (None, "simclr"):
        run_simclr(scale, opts.steps, opts.match)


if __name__ == "__main__":
    main()
