"""Issue-2 acceptance: XLA temp memory of ``value_and_grad``, serialized vs original.

Run from the repository root (one process, CPU is fine; any backend works)::

    python benchmarks/memory.py            # acceptance table, exit 1 if a target fails
    python benchmarks/memory.py --no-peers # without the hand-written reference rows

Memory is XLA's own accounting (docs/benchmarks.md, "How figures are measured"):
``jax.jit(jax.value_and_grad(f)).lower(*args).compile().memory_analysis().temp_size_in_bytes``.

Targets:

(a) Monte-Carlo encoder-decoder, 16 Monte-Carlo samples, automatic axis:
    chunk=4 -> ratio <= 0.40, chunk=1 -> ratio <= 0.20;
(b) MLP over 1024 rows (width 512, 4 hidden layers), ``argnums=(1, 2)`` microbatching,
    chunk=128 -> ratio <= 0.35;
(c) every serialized variant above: value and gradients within 2e-4 of the original's,
    relative to the magnitude of each (per gradient leaf).

The hand-written peers (``lax.scan`` + ``jax.checkpoint``, ``jax.lax.map(batch_size=k)`` with
and without checkpoint) are printed as reference rows, without targets.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from harness import fmt_bytes, print_table  # noqa: E402
from measuring import EXACT_RTOL, compare_exact, compile_value_and_grad, temp_bytes_of  # noqa: E402
from models import MLPConfig, Seed1Config, mlp_peers, mlp_problem, seed1_peers, seed1_problem  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

SEED1_TARGETS = {4: 0.40, 1: 0.20}
MLP_CHUNK = 128
MLP_TARGET = 0.35


class Results:
    def __init__(self) -> None:
        self.rows: list[list[str]] = []
        self.records: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.errors: list[tuple[str, str]] = []
        self.base: int | None = None
        self.base_compiled: Any = None

    def add(self, case, variant, temp, base, target=None, diff=None, error=None, graded=True):
        """One table row; ``graded=False`` rows (peers, the original) get no verdict."""
        ratio = temp / base if temp is not None and base else None
        verdict = ""
        if graded:
            ok = error is None
            if target is not None:
                ok &= ratio is not None and ratio <= target
            if diff is not None:
                ok &= max(diff) <= EXACT_RTOL
            elif error is None:
                ok = False  # a graded row without an exactness check is not a pass
            verdict = "PASS" if ok else "FAIL"
            if not ok:
                self.failures.append(f"{case} / {variant}")
        if error is not None:
            self.errors.append((f"{case} / {variant}", error))
        self.rows.append(
            [
                case,
                variant,
                "error" if error else fmt_bytes(temp),
                "-" if ratio is None else f"{ratio:.3f}",
                "-" if target is None else f"<= {target:.2f}",
                "-" if diff is None else f"{max(diff):.1e}",
                "-" if not graded else f"<= {EXACT_RTOL:.0e}",
                verdict,
            ]
        )
        self.records.append(
            {
                "case": case,
                "variant": variant,
                "temp_bytes": temp,
                "original_temp_bytes": base,
                "ratio": ratio,
                "ratio_target": target,
                "value_rel_diff": None if diff is None else diff[0],
                "grad_rel_diff": None if diff is None else diff[1],
                "verdict": verdict or None,
                "error": error,
            }
        )


def _measure(res, case, label, loss, args, make, target=None, graded=True, verbose=False):
    """Compile ``value_and_grad`` of ``make()``, record its temp memory and its exactness."""
    temp = None
    try:
        f = make()
        compiled = compile_value_and_grad(f, args)
        temp = temp_bytes_of(compiled)
        diff = compare_exact(loss, f, args, compiled=(res.base_compiled, compiled))
    except Exception as e:
        if verbose:
            traceback.print_exc()
        error = f"{type(e).__name__}: {e}"
        res.add(case, label, temp, res.base, target=target, error=error, graded=graded)
        return
    res.add(case, label, temp, res.base, target=target, diff=diff, graded=graded)


def _original(res, case, loss, args):
    res.base_compiled = compile_value_and_grad(loss, args)
    res.base = temp_bytes_of(res.base_compiled)
    res.add(case, "original", res.base, res.base, graded=False)


def _seed1(res: Results, opts: argparse.Namespace) -> None:
    """(a) Monte-Carlo encoder-decoder, automatic axis."""
    cfg = Seed1Config()
    loss, args = seed1_problem(cfg)
    case = f"MC encoder-decoder (N={cfg.n_samples})"
    _original(res, case, loss, args)
    for k, target in SEED1_TARGETS.items():
        _measure(
            res,
            case,
            f"serialize_axis(chunk={k})",
            loss,
            args,
            lambda k=k: ja.serialize_axis(loss, chunk=k),
            target=target,
            verbose=opts.verbose,
        )
    if not opts.no_peers:
        for k in SEED1_TARGETS:
            for name, f in seed1_peers(cfg, k).items():
                _measure(res, case, f"{name} (k={k})", loss, args, lambda f=f: f, graded=False)


def _mlp(res: Results, opts: argparse.Namespace) -> None:
    """(b) MLP over rows, argnums microbatching."""
    mcfg = MLPConfig()
    loss, args = mlp_problem(mcfg)
    case = f"MLP ({mcfg.rows} rows, w={mcfg.width})"
    _original(res, case, loss, args)
    _measure(
        res,
        case,
        f"serialize_axis(chunk={MLP_CHUNK}, argnums=(1, 2))",
        loss,
        args,
        lambda: ja.serialize_axis(loss, chunk=MLP_CHUNK, argnums=(1, 2)),
        target=MLP_TARGET,
        verbose=opts.verbose,
    )
    if not opts.no_peers:
        for name, f in mlp_peers(MLP_CHUNK).items():
            _measure(res, case, f"{name} (k={MLP_CHUNK})", loss, args, lambda f=f: f, graded=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-peers", action="store_true", help="skip the hand-written rows")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    opts = parser.parse_args(argv)

    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    res = Results()

    _seed1(res, opts)
    _mlp(res, opts)

    graded = [r for r in res.records if r["verdict"] is not None and r["grad_rel_diff"] is not None]
    worst = max((max(r["value_rel_diff"], r["grad_rel_diff"]) for r in graded), default=None)
    exact_ok = (
        worst is not None
        and worst <= EXACT_RTOL
        and len(graded) == sum(r["verdict"] is not None for r in res.records)
    )
    if not exact_ok:
        res.failures.append("(c) exactness")

    rows = [list(r) for r in res.rows]
    for prev, row in zip(res.rows, rows[1:], strict=False):
        if row[0] == prev[0]:
            row[0] = ""
    print()
    print_table(
        ["case", "variant", "temp", "ratio", "target", "max rel diff", "tol", "verdict"],
        rows,
        left=2,
    )
    print(
        "\nratio: temp memory of value_and_grad vs the original's; max rel diff: largest of the "
        "value's and every gradient leaf's max|diff| / max|original| (target (c))."
    )
    print(
        f"(c) largest relative value/gradient difference over the serialized variants: "
        f"{'n/a' if worst is None else f'{worst:.1e}'} (<= {EXACT_RTOL:g}) "
        f"{'PASS' if exact_ok else 'FAIL'}"
    )
    for where, msg in res.errors:
        print(f"\nerror in {where}: {msg}")
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(
                {"jax": jax.__version__, "backend": jax.default_backend(), "rows": res.records},
                fh,
                indent=2,
            )
    if res.failures:
        print(f"\nFAILED: {', '.join(res.failures)}")
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
