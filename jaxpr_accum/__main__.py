"""Command line: ``python -m jaxpr_accum demo [--quick]``."""

from __future__ import annotations

import argparse
import sys


def _chunk_list(text: str) -> tuple[int, ...]:
    try:
        chunks = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not chunks or any(c <= 0 for c in chunks):
        raise argparse.ArgumentTypeError(f"expected positive chunk sizes, got {text!r}")
    return chunks


def _mode_list(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    allowed = ("auto", "remat", "fused", "native")
    if not modes or any(m not in allowed for m in modes):
        raise argparse.ArgumentTypeError(f"expected modes among {', '.join(allowed)}, got {text!r}")
    return modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxpr_accum")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="serialize the Monte-Carlo samples of an encoder-decoder and compare",
        description=(
            "Run the Monte-Carlo encoder-decoder of examples/mc_vae.py (16 samples, "
            "vmap(decoder) inside a Flax module) as written and through ja.serialize_axis at "
            "several chunk sizes; print XLA temp memory, time and gradient differences, and "
            "the plan (progress on stderr, results on stdout). Exits non-zero if any gradient "
            "differs from the original's by more than 2e-4 (relative)."
        ),
    )
    demo.add_argument("--quick", action="store_true", help="small sizes, chunk 4 only")
    demo.add_argument(
        "--chunks", type=_chunk_list, default=None, help="comma-separated chunk sizes (2,4,8)"
    )
    demo.add_argument(
        "--repeats", type=int, default=None, help="interleaved timing repeats (default 3)"
    )
    demo.add_argument(
        "--grads",
        type=_mode_list,
        default=None,
        help="comma-separated gradient modes to sweep (auto, remat, fused, native; default: "
        "the one auto chooses at chunk 4)",
    )
    demo.add_argument(
        "--plot", default=None, metavar="PATH", help="write the sweep's figure there (PNG)"
    )
    demo.add_argument(
        "--time-budget",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="fewer repeats if timing would take longer than this (default 10)",
    )
    args = parser.parse_args(argv)

    if args.command == "demo":
        from jaxpr_accum._demo import run_demo

        return run_demo(
            quick=args.quick,
            chunks=args.chunks,
            repeats=args.repeats,
            time_budget_s=args.time_budget,
            grads=args.grads,
            plot=args.plot,
        )
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
