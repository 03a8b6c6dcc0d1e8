"""Run many pairs: a Hypothesis search that never fails, collecting every result.

The search itself does not raise on a failing pair, so it runs exactly the number of
examples asked for (Hypothesis would stop soon after a first failure and spend its time
shrinking it); failures are gathered, grouped by class and reported at the end
(:func:`report`), each with the standalone script of its smallest example.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from .programs import Head, Program
from .runner import FAILURES, OUTCOMES, Pair, Result, pairs, run_pair, script
from .stacks import FAMILIES, Layer


def derandomized(n: int) -> Any:
    """Hypothesis settings of a fuzz family's CI run: ``n`` examples, the same on every run,
    no deadline, no health check, no example database."""
    return settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


def strategy(
    families: Iterable[str], eager_one_in: int = 8, idiom: str | None = None
) -> st.SearchStrategy[Pair]:
    families = tuple(families)
    if len(families) == 1:
        return pairs(families[0], eager_one_in, idiom)
    return st.sampled_from(families).flatmap(lambda fam: pairs(fam, eager_one_in, idiom))


def run_examples(
    families: Iterable[str],
    n: int,
    *,
    derandomize: bool = True,
    seed: int | None = None,
    database: Any = None,
    on_result: Callable[[Result], None] | None = None,
    between: Callable[[int], None] | None = None,
    eager_one_in: int = 8,
    idiom: str | None = None,
) -> list[Result]:
    """Draw and run ``n`` pairs of ``families``; every :class:`Result`, in order. A pair runs
    without an outer ``jit`` one time in ``eager_one_in`` (never with 0); ``idiom``: a head or
    callback of ``idioms.py`` in every program."""
    results: list[Result] = []
    seen: set[Pair] = set()
    strat = strategy(families, eager_one_in, idiom)

    @settings(
        max_examples=n,
        derandomize=derandomize,
        database=database,
        deadline=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(st.data())
    def search(data: Any) -> None:
        pair = data.draw(strat, label="pair")
        # Hypothesis mutates earlier examples; run each program, stack, mode and chunk once
        assume(dataclasses.replace(pair, seed=0) not in seen)
        seen.add(dataclasses.replace(pair, seed=0))
        if between is not None:
            between(len(results))
        result = run_pair(pair)
        results.append(result)
        if on_result is not None:
            on_result(result)

    if seed is not None and not derandomize:
        from hypothesis import seed as with_seed

        search = with_seed(seed)(search)
    search()
    return results


# ------------------------------------------------------------------------------------------
# Summaries
# ------------------------------------------------------------------------------------------


def size(pair: Pair) -> tuple:
    """How big a pair's repro is (smaller first)."""
    prog = pair.program
    return (len(pair.layers), len(prog.heads), prog.n, len(script(pair)))


def classes(results: list[Result], outcomes: Iterable[str] = FAILURES) -> dict[str, list[Result]]:
    """``{outcome: class: [results]}`` flattened to ``{"OUTCOME | class": results}``."""
    out: dict[str, list[Result]] = collections.defaultdict(list)
    for r in results:
        if r.outcome in outcomes:
            out[f"{r.outcome} | {r.cls}"].append(r)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def counts(results: list[Result]) -> dict[str, int]:
    c = collections.Counter(r.outcome for r in results)
    return {o: c.get(o, 0) for o in OUTCOMES}


def report(results: list[Result], scripts: bool = True) -> str:
    """A text report: counts, then each failure class with its smallest example's script."""
    secs = [r.seconds for r in results] or [0.0]
    lines = [
        f"{len(results)} pairs, {sum(secs):.0f} s ({statistics.mean(secs):.2f} s mean, "
        f"{statistics.median(secs):.2f} s median per pair): {counts(results)}"
    ]
    for name, group in classes(results).items():
        smallest = min(group, key=lambda r: size(r.pair))
        modes = sorted({r.pair.mode for r in group})
        lines += [
            "",
            f"=== {name}: {len(group)} pair(s), modes {modes}",
            f"    smallest: {smallest.pair.summary()}",
            "    " + smallest.detail.replace("\n", "\n    "),
        ]
        if scripts:
            lines += ["    --- repro script ---", script(smallest.pair)]
    return "\n".join(lines)


def assert_no_failures(results: list[Result], expected: int) -> None:
    """The tests' assertion: at least ``expected`` pairs ran, none a MISMATCH, a CRASH, a
    FALLBACK (an internal error under ``JAXPR_ACCUM_STRICT=1``) or a FUZZER_ERROR; the message
    has each failure class with its smallest example's script."""
    print(report(results, scripts=False))
    assert len(results) >= expected, f"ran {len(results)} pairs, expected {expected}"
    assert not any(r.failed for r in results), report(results)


# ------------------------------------------------------------------------------------------
# Pairs as JSON (the campaign's database of findings, the subprocess protocol)
# ------------------------------------------------------------------------------------------


def _tuples(v: Any) -> Any:
    return tuple(_tuples(a) for a in v) if isinstance(v, list) else v


def pair_to_json(pair: Pair) -> str:
    return json.dumps(dataclasses.asdict(pair), sort_keys=True)


def pair_from_json(text: str) -> Pair:
    d = json.loads(text)
    prog = dict(d["program"])
    prog["heads"] = tuple(Head(**h) for h in prog["heads"])
    layers = tuple(
        Layer(kind=lyr["kind"], argnums=_tuples(lyr["argnums"]), in_axes=_tuples(lyr["in_axes"]),
              size=lyr["size"])
        for lyr in d["layers"]
    )  # fmt: skip
    rest = {k: v for k, v in d.items() if k not in ("program", "layers")}
    return Pair(program=Program(**prog), layers=layers, **rest)


def result_to_json(r: Result, with_script: bool = False) -> dict[str, Any]:
    out = {
        "outcome": r.outcome,
        "cls": r.cls,
        "detail": r.detail,
        "seconds": round(r.seconds, 3),
        "family": r.pair.family,
        "mode": r.pair.mode,
        "summary": r.pair.summary(),
        "pair": json.loads(pair_to_json(r.pair)),
    }
    if with_script:
        out["script"] = script(r.pair)
    return out


def result_from_json(d: dict[str, Any]) -> Result:
    pair = pair_from_json(json.dumps(d["pair"]))
    return Result(pair, d["outcome"], d["cls"], d["detail"], d["seconds"])


__all__ = ["FAMILIES", "assert_no_failures", "classes", "counts", "report", "run_examples"]
