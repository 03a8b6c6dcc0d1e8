"""A long differential-fuzzing campaign over transformation stacks (the grammar in ``tests/fuzz``).

Run from the repository root (CPU, one process; about 2-5 s per pair on 2 cores)::

    python tests/fuzz/campaign.py --pairs 5000 --seed 7
    python tests/fuzz/campaign.py --pairs 200 --families vmap reverse --shrink-seconds 0
    python tests/fuzz/campaign.py --pairs 100000 --minutes 40 --seed 7

Hypothesis draws ``--pairs`` program-and-stack pairs at random (seeded by ``--seed``; not
derandomized), from every stack family (``plain``, ``reverse``, ``vmap``, ``forward``,
``mixed``, ``shard``; the process starts JAX with 8 CPU devices so that ``shard`` runs here),
every grad mode and chunk kind, with ``JAXPR_ACCUM_STRICT=1``. Each pair runs the stack on the
original (the oracle) and on the serialized function and is classified (``PASS``,
``ORIGINAL_FAILS``, ``EXPECTED_ERROR``, ``MISMATCH``, ``CRASH``, ``FALLBACK``,
``FUZZER_ERROR``; see ``tests/fuzz/runner.py``). Progress: one line per pair on stdout, and
every result appended to ``results.jsonl`` as it comes.

At the end (after ``--pairs``, or ``--minutes``, or on Ctrl-C / SIGTERM, which skip shrinking),
for each failure class (a crash by exception type and first line, a mismatch by stack family and
grad mode) the smallest example is shrunk (layers dropped, heads removed, smaller sizes;
``--shrink-seconds`` per class) and its standalone script written to ``repros/``;
``summary.json`` and ``summary.md`` hold the counts per outcome, per family and per mode, the
time per pair, every failure class with its repro, and the ``SerializeError`` classes with the
programs that raised them.

The findings are also kept in a Hypothesis directory database (``.hypothesis/fuzz_campaign/db``,
one entry per failure class: the shrunk pair as JSON); the next campaign replays them first
and says which still fail (``--no-replay`` skips that). Outputs go to
``.hypothesis/fuzz_campaign/seed-<seed>/`` unless ``--out`` names a directory.

Exit status: 0 whatever was found (a campaign reports; the tests assert).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DB_KEY = b"jaxpr_accum.fuzz_campaign.findings"


def _setup_env() -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["JAXPR_ACCUM_STRICT"] = "1"
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


class _TimeUp(KeyboardInterrupt):
    """``--minutes`` ran out (a KeyboardInterrupt, so that Hypothesis lets it through)."""


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    ap.add_argument("--families", nargs="+", default=None, help="default: every family")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--shrink-seconds", type=float, default=90.0, help="per failure class")
    ap.add_argument("--no-replay", action="store_true", help="skip the database's findings")
    ap.add_argument("--clear-caches-every", type=int, default=50)
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="stop drawing pairs after this (then shrink)",
    )
    args = ap.parse_args(argv)
    # Ctrl-C, and SIGINT/SIGTERM from a job runner, summarise what ran (a background job of a
    # non-interactive shell starts with SIGINT ignored: restore Python's handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    _setup_env()

    import jax
    from hypothesis.database import DirectoryBasedExampleDatabase

    from tests.fuzz import FAMILIES, run_pair, script, shrink
    from tests.fuzz.driver import (
        classes,
        counts,
        pair_from_json,
        pair_to_json,
        result_to_json,
        run_examples,
        size,
    )

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    families = args.families or list(FAMILIES)
    out = args.out or ROOT / ".hypothesis" / "fuzz_campaign" / f"seed-{seed}"
    (out / "repros").mkdir(parents=True, exist_ok=True)
    db = DirectoryBasedExampleDatabase(str(ROOT / ".hypothesis" / "fuzz_campaign" / "db"))
    log = open(out / "results.jsonl", "w")  # noqa: SIM115
    print(f"campaign: {args.pairs} pairs, seed {seed}, families {families}, output {out}")
    print(f"jax {jax.__version__}, {jax.device_count()} devices, JAXPR_ACCUM_STRICT=1", flush=True)

    # 1. the database's findings from earlier campaigns
    replayed = []
    if not args.no_replay:
        for raw in sorted(db.fetch(DB_KEY)):
            try:
                pair = pair_from_json(raw.decode())
            except Exception as e:  # the grammar changed since: drop the entry
                print(f"replay: dropping an entry that no longer parses ({e})")
                db.delete(DB_KEY, raw)
                continue
            r = run_pair(pair)
            replayed.append(r)
            print(f"replay: {r.outcome:14s} {r.cls[:70]} || {pair.summary()}", flush=True)

    # 2. the random search
    results = []
    t0 = time.perf_counter()

    def on_result(r) -> None:
        results.append(r)
        log.write(json.dumps(result_to_json(r)) + "\n")
        log.flush()
        i = len(results)
        print(
            f"[{i}/{args.pairs}] {r.outcome:14s} {r.seconds:5.1f}s {r.cls[:70]} || "
            f"{r.pair.summary()}",
            flush=True,
        )

    def between(i: int) -> None:
        if args.minutes is not None and time.perf_counter() - t0 > 60 * args.minutes:
            raise _TimeUp
        if i and i % args.clear_caches_every == 0:
            jax.clear_caches()

    interrupted = False
    try:
        run_examples(
            families,
            args.pairs,
            derandomize=False,
            seed=seed,
            database=db,
            on_result=on_result,
            between=between,
        )
    except _TimeUp:
        print(f"--minutes {args.minutes} ran out after {len(results)} pairs", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: summarising what ran", flush=True)
    wall = time.perf_counter() - t0

    # 3. shrink one example per failure class, keep it in the database
    groups = classes(results)
    repros = {}
    for k, (name, group) in enumerate(groups.items()):
        smallest = min(group, key=lambda r: size(r.pair))
        shrunk = smallest
        if args.shrink_seconds > 0 and not interrupted:
            print(f"shrinking {name} ({len(group)} pairs)", flush=True)
            shrunk = shrink(smallest, args.shrink_seconds, log=print)
        path = out / "repros" / f"{k:02d}_{_slug(name)}.py"
        path.write_text(script(shrunk.pair))
        db.save(DB_KEY, pair_to_json(shrunk.pair).encode())
        repros[name] = (shrunk, path)

    # 4. the summary
    secs = [r.seconds for r in results] or [0.0]

    def table(key) -> dict:
        t: dict = collections.defaultdict(collections.Counter)
        for r in results:
            t[key(r)][r.outcome] += 1
        return {k: dict(v) for k, v in sorted(t.items())}

    expected = classes(results, outcomes=("EXPECTED_ERROR",))
    summary = {
        "seed": seed,
        "pairs": len(results),
        "interrupted": interrupted,
        "wall_seconds": round(wall, 1),
        "seconds_per_pair": {
            "mean": round(statistics.mean(secs), 3),
            "median": round(statistics.median(secs), 3),
            "max": round(max(secs), 3),
        },
        "counts": counts(results),
        "by_family": table(lambda r: r.pair.family),
        "by_mode": table(lambda r: r.pair.mode),
        "failure_classes": [
            {
                "class": name,
                "count": len(group),
                "modes": sorted({r.pair.mode for r in group}),
                "families": sorted({r.pair.family for r in group}),
                "stacks": sorted({r.pair.stack_label() for r in group})[:12],
                "first_detail": group[0].detail,
                "repro": str(repros[name][1]),
                "repro_summary": repros[name][0].pair.summary(),
            }
            for name, group in groups.items()
        ],
        "expected_error_classes": [
            {
                "class": name,
                "count": len(group),
                "programs": sorted({r.pair.program.summary() for r in group})[:20],
            }
            for name, group in expected.items()
        ],
        "replayed": [
            {"outcome": r.outcome, "class": r.cls, "summary": r.pair.summary()} for r in replayed
        ],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    md = [
        f"# Fuzz campaign, seed {seed}",
        "",
        f"{len(results)} pairs in {wall:.0f} s ({summary['seconds_per_pair']['mean']} s mean, "
        f"{summary['seconds_per_pair']['median']} s median per pair); JAXPR_ACCUM_STRICT=1.",
        "",
        "| outcome | pairs |",
        "|---|---|",
        *(f"| {o} | {n} |" for o, n in summary["counts"].items()),
        "",
        "## Failure classes",
        "",
    ]
    for entry in summary["failure_classes"]:
        name = entry["class"]
        md += [
            f"### {name}",
            "",
            f"{entry['count']} pairs; modes {', '.join(entry['modes'])}; families "
            f"{', '.join(entry['families'])}; stacks {', '.join(entry['stacks'])}",
            "",
            f"Shrunk repro (`{entry['repro']}`): {entry['repro_summary']}",
            "",
            "```",
            repros[name][0].detail,
            "```",
            "",
        ]
    md += ["## SerializeError (expected errors)", ""]
    for entry in summary["expected_error_classes"]:
        md += [f"- {entry['class']} ({entry['count']} pairs), e.g.:"]
        md += [f"  - {p}" for p in entry["programs"][:5]]
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"\nwritten: {out / 'summary.md'}, {out / 'summary.json'}, {out / 'repros'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
