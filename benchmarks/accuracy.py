"""Accuracy of 16-bit gradient accumulation: bf16 parameters, 128 chunks.

Run from the repository root::

    python benchmarks/accuracy.py           # writes its section of docs/benchmarks.md
    python benchmarks/accuracy.py --quick   # fewer rows (512, chunk 4: still 128 chunks)

The dense MLP of ``benchmarks/models.py`` (2048 rows, width 384, 6 hidden layers) with
parameters *and* data in bfloat16 is microbatched with ``argnums=(1, 2)`` in chunks of 16 rows,
i.e. 128 chunks whose gradients are added up. Each variant's gradient is compared with a
float32 reference: the same computation on the same (bf16-representable) values, in float32.
The error is ``max|g - g_ref| / max|g_ref|`` with both maxima taken over all leaves.

Variants: the unchunked bf16 gradient (the error bf16 arithmetic costs anyway); serialized
with the default accumulation (float32 accumulators for 16-bit cotangents), in the ``auto``
(= fused) and ``remat`` modes; serialized with ``accum_dtype=jnp.bfloat16`` (what a naive
bf16 carry costs); and ``native`` (JAX differentiates the scan; shown for information).

Every gradient must come back in bfloat16 (asserted). Target: the default-accumulated error is
at most 1.5x the unchunked bf16 error. The process exits 1 if it is not.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import benchmark_options, print_table, write_doc_section  # noqa: E402
from models import MLPConfig, mlp_problem  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

TARGET = 1.5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def global_rel_error(got, ref) -> float:
    """``max|got - ref| / max|ref|``, both maxima over all leaves (computed in float64)."""
    num = den = 0.0
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True):
        g = np.asarray(g, np.float64)
        r = np.asarray(r, np.float64)
        num = max(num, float(np.abs(g - r).max()))
        den = max(den, float(np.abs(r).max()))
    return num / den


def _gradients(loss, args: tuple, args32: tuple, chunk: int) -> tuple[dict, dict, dict, dict]:
    """The variants, and per variant its gradient's error against the float32 gradient
    ``g_ref``, its gradient dtypes and (serialized) the mode its plan took."""
    with jax.default_matmul_precision("highest"):
        g_ref = jax.jit(jax.grad(loss))(*args32)

    def sf(**kw):
        return ja.serialize_axis(loss, chunk=chunk, argnums=(1, 2), **kw)

    variants = {
        "unchunked bf16": (loss, "-"),
        "serialize_axis auto, default accumulation": (sf(), "float32 (default)"),
        "serialize_axis remat, default accumulation": (sf(grad="remat"), "float32 (default)"),
        "serialize_axis auto, accum_dtype=bfloat16": (
            sf(accum_dtype=jnp.bfloat16),
            "bfloat16",
        ),
        "serialize_axis remat, accum_dtype=bfloat16": (
            sf(grad="remat", accum_dtype=jnp.bfloat16),
            "bfloat16",
        ),
        "serialize_axis native (JAX differentiates the scan)": (sf(grad="native"), "JAX's"),
    }
    errors, dtypes, modes = {}, {}, {}
    for name, (f, _) in variants.items():
        g = jax.jit(jax.grad(f))(*args)
        leaf_dtypes = {str(leaf.dtype) for leaf in jax.tree.leaves(g)}
        assert leaf_dtypes == {"bfloat16"}, f"{name}: gradient dtypes {leaf_dtypes}, want bfloat16"
        dtypes[name] = ", ".join(sorted(leaf_dtypes))
        errors[name] = global_rel_error(g, g_ref)
        if isinstance(f, ja.SerializedFunction):
            modes[name] = f.explain(*args).grad
    return variants, errors, dtypes, modes


def _markdown(rows, cfg, chunk, elapsed, headers, table, errors, graded) -> list[str]:
    """The lines of this script's section of docs/benchmarks.md."""
    n_chunks = rows // chunk
    base = errors["unchunked bf16"]
    return [
        "## Accuracy of 16-bit accumulation (`benchmarks/accuracy.py`)",
        "",
        f"Dense MLP, {rows} rows, width {cfg.width}, {cfg.depth} hidden layers, bf16 "
        f"parameters and data, microbatched in chunks of {chunk} ({n_chunks} chunks). Error "
        "= max|g - g_ref| / max|g_ref| over all gradient leaves, against the float32 "
        "gradient of the same computation; every gradient is returned in bfloat16. Target: "
        f"default (float32) accumulation within {TARGET}x the unchunked bf16 error. "
        f"Run time {elapsed:.0f} s.",
        "",
        "| " + " | ".join(headers[:-1]) + " | verdict |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
        *("| " + " | ".join(r) + " |" for r in table),
        "",
        f"Accumulating {n_chunks} chunk gradients in float32 (the default for 16-bit "
        f"cotangents) gives {max(errors[n] for n in graded) / base:.2f}x the error of the "
        "unchunked bf16 gradient; a bfloat16 accumulator (`accum_dtype=jnp.bfloat16`) "
        "rounds every partial sum to 8 bits of mantissa and gives "
        f"{errors['serialize_axis auto, accum_dtype=bfloat16'] / base:.2f}x.",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    opts = benchmark_options(__doc__, "512 rows in chunks of 4", argv)
    doc = opts.doc
    t_start = time.perf_counter()

    rows, chunk = (512, 4) if opts.quick else (2048, 16)
    cfg = MLPConfig(rows=rows, width=384, depth=6, dtype="bfloat16")
    loss, args = mlp_problem(cfg)
    n_chunks = rows // chunk
    args32 = jax.tree.map(lambda a: a.astype(jnp.float32), args)
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}: MLP {rows} rows, width "
        f"{cfg.width}, {cfg.depth} hidden layers, bf16 parameters and data; chunk {chunk} "
        f"({n_chunks} chunks)"
    )

    variants, errors, dtypes, modes = _gradients(loss, args, args32, chunk)

    base = errors["unchunked bf16"]
    graded = [n for n in variants if "default accumulation" in n]
    ok = all(errors[n] <= TARGET * base for n in graded)
    table = []
    for name, (_, acc) in variants.items():
        verdict = ""
        if name in graded:
            verdict = "PASS" if errors[name] <= TARGET * base else "FAIL"
        mode = f" [{modes[name]}]" if name in modes and "auto" in name else ""
        table.append(
            [
                name + mode,
                acc,
                dtypes[name],
                f"{100 * errors[name]:.2f}%",
                f"{errors[name] / base:.2f}",
                f"<= {TARGET}" if name in graded else "-",
                verdict,
            ]
        )
    headers = ["variant", "accumulation", "grad dtype", "error", "x unchunked", "target", ""]
    print()
    print_table(headers, table, left=3)
    print(
        "\nerror: max|g - g_ref| / max|g_ref| over all leaves, g_ref the float32 gradient of "
        "the same computation."
    )
    elapsed = time.perf_counter() - t_start
    print(
        f"\n{'PASS' if ok else 'FAIL'}  default-accumulated error <= {TARGET}x the unchunked "
        f"bf16 error: "
        + ", ".join(f"{errors[n] / base:.2f}x ({100 * errors[n]:.2f}%)" for n in graded)
        + f" vs {100 * base:.2f}%"
    )
    print(f"run time {elapsed:.0f} s")

    if doc:
        md = _markdown(rows, cfg, chunk, elapsed, headers, table, errors, graded)
        write_doc_section(doc, "accuracy", "\n".join(md))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
