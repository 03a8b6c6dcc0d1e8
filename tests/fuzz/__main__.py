"""``python -m tests.fuzz --families shard --examples 24``: run pairs, one JSON line each.

The multi-device entry point: ``tests/test_fuzz.py`` runs the ``shard`` family in a subprocess
with 8 CPU devices (the device count is fixed when JAX starts, and the test process has one)
and reads the results from stdout. Set ``XLA_FLAGS`` before this module imports JAX; with
``--devices 8`` it is set here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--families", nargs="+", default=["shard"])
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--seed", type=int, default=None, help="random search with this seed")
    ap.add_argument("--devices", type=int, default=8)
    args = ap.parse_args(argv)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["JAXPR_ACCUM_STRICT"] = "1"

    from .driver import result_to_json, run_examples

    def emit(result):
        print(json.dumps(result_to_json(result, with_script=result.failed)), flush=True)

    run_examples(
        args.families,
        args.examples,
        derandomize=args.seed is None,
        seed=args.seed,
        on_result=emit,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
