"""The demo behind ``python -m jaxpr_accum demo``: the seed-1 model (``_seed1``), original vs
serialized.

Measured as ``docs/benchmarks.md`` says ("How figures are measured"), by
``SerializedFunction.sweep``:

- memory: XLA's own accounting, ``jax.jit(jax.value_and_grad(f)).lower(*args).compile()
  .memory_analysis().temp_size_in_bytes``, serialized vs original, in one process;
- time: medians of interleaved repeats of the compiled ``value_and_grad``, as a ratio;
- exactness: the largest difference of value and gradients against the original, each leaf
  relative to its own magnitude floored at 1e-3 of the largest leaf's
  (``jaxpr_accum.testing.tree_difference``).

Then the chunk that ``memory=`` chooses for 40% of the original's memory, and the plan. Flax is
needed (``pip install -e '.[flax]'``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxpr_accum._cost import format_bytes
from jaxpr_accum._measure import compare_exact
from jaxpr_accum._seed1 import QUICK_SEED1, Seed1Config, seed1_problem

#: The relative tolerance on value and gradients (float32's, as ``jaxpr_accum.testing`` uses).
EXACT_RTOL = 2e-4


def run_demo(
    quick: bool = False,
    chunks: Sequence[int] | None = None,
    repeats: int | None = None,
    time_budget_s: float = 20.0,
    grads: Sequence[str] = ("auto",),
    plot: str | None = None,
) -> int:
    """Run the demo; return the process exit code (0: every chunk size was exact).

    The table is ``SerializedFunction.sweep``'s: the original and each chunk in each of
    ``grads``. ``repeats`` is lowered (to no fewer than 1) when that many rounds of calls would
    not fit ``time_budget_s``. ``plot``: a path to write the sweep's figure to (PNG).
    """
    import jaxpr_accum as ja
    from jaxpr_accum._sweep import measure_sweep

    cfg = QUICK_SEED1 if quick else Seed1Config()
    if chunks is None:
        chunks = (4,) if quick else (1, 2, 4, 8)
    if repeats is None:
        repeats = 2 if quick else 3

    print(
        f"jaxpr_accum demo: seed-1 encoder-decoder, {cfg.n_samples} Monte-Carlo samples, "
        f"batch {cfg.batch}, {cfg.height}x{cfg.width}x{cfg.channels} images, "
        f"decoder widths {list(cfg.decoder_widths)}  [jax {jax.__version__}, "
        f"{jax.default_backend()}]"
    )
    loss, args = seed1_problem(cfg)
    n_params = sum(int(np.size(p)) for p in jax.tree.leaves(args[0]))
    print(f"parameters: {n_params} ({format_bytes(4 * n_params)})")

    t0 = time.perf_counter()
    sf = ja.serialize_axis(loss, chunk=chunks[0])  # the axis is found, as in the seed
    sweep = measure_sweep(
        sf, args, chunks=chunks, grads=grads, repeats=repeats, time_budget_s=time_budget_s,
        check_precision="highest",
    )  # fmt: skip
    print(f"compiled, checked and timed in {time.perf_counter() - t0:.1f} s\n")
    print(sweep)
    ok = _check_rows(sweep.rows)

    base = sweep.rows[0]["temp_bytes"]
    if base:  # the budget row: the chunk chosen for 40% of the original's memory
        ok &= _budget_line(loss, args, int(0.4 * base), sweep.rows[1:])

    k = 4 if 4 in chunks else chunks[0]
    print(f"\nsf.explain(...) for chunk={k}:\n")
    try:
        print(str(ja.serialize_axis(loss, chunk=k, grad=grads[0]).explain(*args)))
    except Exception as e:
        ok = False
        print(f"explain failed: {type(e).__name__}: {e}")

    if plot is not None:
        sweep.plot(plot)
        print(f"\nplot written to {plot}")
    print("\nresult:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _check_rows(rows: list[dict]) -> bool:
    """Print the original's time and whether every chunk's value and gradients are within
    ``EXACT_RTOL`` of the original's, then a line per row that is not; whether all are."""
    original, rows = rows[0], rows[1:]
    bad = [
        r
        for r in rows
        if r["error"] or not (r["value_rel_err"] <= EXACT_RTOL and r["max_rel_err"] <= EXACT_RTOL)
    ]
    print(
        f"(original value_and_grad: {original['time_s'] * 1e3:.1f} ms median; "
        f"errs are relative to the original's magnitude, tolerance {EXACT_RTOL:g}: "
        + ("all within)" if not bad else f"{len(bad)} FAIL)")
    )
    for r in bad:
        why = r["error"] or "differs from the original"
        print(f"FAIL: chunk {r['chunk']} ({r['grad']}): {why}")
    return not bad


def _budget_line(loss: Callable[..., Any], args: tuple, limit: int, rows: list) -> bool:
    """Print the chunk ``memory=limit`` chooses and its measured memory; check it exactly
    unless the sweep measured the same program. Whether it is exact."""
    import jaxpr_accum as ja

    try:
        sf = ja.serialize_axis(loss, memory=limit)
        budget = sf.explain(*args).budget
        swept = any(r["chunk"] == budget.chunk and r["mode"] == budget.grad for r in rows)
        vdiff, gdiff = (0.0, 0.0) if swept else compare_exact(loss, sf, args)
    except Exception as e:
        print(f"\nmemory={format_bytes(limit)} failed: {type(e).__name__}: {e}")
        return False
    exact = vdiff <= EXACT_RTOL and gdiff <= EXACT_RTOL
    print(
        f"\nmemory={format_bytes(limit)} (40% of the original's) chooses chunk {budget.chunk} "
        f"({budget.grad}), measured {format_bytes(budget.measured)}"
        + ("" if swept else f"; value err {vdiff:.1e}, grad err {gdiff:.1e}")
        + ("" if exact else " FAIL")
    )
    return exact
