"""Command line: ``python -m jaxpr_accum demo [--quick]``."""

from __future__ import annotations

import argparse
import sys

from jaxpr_accum._base._settings import GRAD_MODES

#: the Monte-Carlo samples of the demo's model (``examples/mc_vae.py``'s ``Sizes.n_samples``,
#: at both sizes): the axis the demo serializes, so a chunk must be shorter
DEMO_SAMPLES = 16


def _chunk_list(text: str) -> tuple[int, ...]:
    try:
        chunks = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not chunks or any(not 0 < c < DEMO_SAMPLES for c in chunks):
        raise argparse.ArgumentTypeError(
            f"expected chunk sizes from 1 to {DEMO_SAMPLES - 1} (the model draws {DEMO_SAMPLES} "
            f"samples, and the demo finds that axis as one longer than the chunk), got {text!r}"
        )
    return chunks


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from e
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _mode_list(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes or any(m not in GRAD_MODES for m in modes):
        raise argparse.ArgumentTypeError(
            f"expected modes among {', '.join(GRAD_MODES)}, got {text!r}"
        )
    return modes


def main(argv: list[str] | None = None) -> int:
    from jaxpr_accum import __version__

    parser = argparse.ArgumentParser(
        prog="python -m jaxpr_accum",
        description="jaxpr_accum: run the batch or sample axis of a JAX function in chunks, "
        "with the same values and gradients. `demo` shows it on a Monte-Carlo encoder-decoder.",
    )
    parser.add_argument("--version", action="version", version=f"jaxpr_accum {__version__}")
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
        "--repeats", type=_positive, default=None, help="interleaved timing repeats (default 3)"
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
        from jaxpr_accum._api._demo import run_demo

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
