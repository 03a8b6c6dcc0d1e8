"""Measuring one case of ``normalisers.py``: its plan, memory, time and exactness against the
original and the peer, and the temp bytes' growth with the axis length."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from harness import (
    compile_all,
    time_paired,
    tree_rel_error,
)
from measuring import temp_bytes_of
from normalisers_cases import (
    Case,
    Serialized,
    Sizes,
)

import jaxpr_accum as ja


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".split("\n")[0]


_PATH = re.compile(r"(/[^\s:`]+/)([^/\s:`]+\.py)")


def short_stop(stop: str) -> str:
    """A stop reason with file paths cut to their base name."""
    return _PATH.sub(r"\2", stop)


def plan_info(sf: Any, args: tuple) -> dict[str, Any]:
    try:
        plan = sf.explain(*args)
    except Exception as e:
        return {"error": _err(e)}
    return {
        "grad": plan.grad,
        "stacked": sum(b for _, b in plan.stacked),
        "stops": [short_stop(x) for x in plan.stops],
        "warning": plan.warning,
        "text": str(plan),
    }


def run_case(case: Case, s: Sizes, verbose: bool) -> dict[str, Any]:
    """Compile and time every method of one case; measure its growth with the axis."""
    t0 = time.perf_counter()
    fns: dict[str, Callable] = {"original": case.loss}
    plans: dict[str, dict[str, Any]] = {}
    labels: dict[str, tuple[Serialized, str]] = {}  # method name -> (setting, mode label)
    for ser in case.serialized:
        auto = ja.serialize_axis(case.loss, chunk=ser.chunk, **ser.settings)
        info = plan_info(auto, case.args)
        mode = info.get("grad", "?")
        plans[ser.name] = info
        fns[f"{ser.name}: auto"] = auto
        labels[f"{ser.name}: auto"] = (ser, f"auto = {mode}")
        if mode != "remat":
            fns[f"{ser.name}: remat"] = ja.serialize_axis(
                case.loss, chunk=ser.chunk, grad="remat", **ser.settings
            )
            labels[f"{ser.name}: remat"] = (ser, "remat")
        if verbose:
            print(info.get("text", info.get("error")))
    fns.update(case.peers)
    compiled, errors = compile_all(fns, case.args, verbose, argnums=case.diff, describe=_err)
    if "original" not in compiled:
        raise RuntimeError(f"the original does not compile: {errors['original']}")
    t_compile = time.perf_counter() - t0

    t1 = time.perf_counter()
    group = {name: _thunk(c, case.args) for name, c in compiled.items()}
    timings = time_paired(
        {case.key: group}, reference="original", budget_s=s.budget_s, max_rounds=s.max_rounds
    )[case.key]
    t_time = time.perf_counter() - t1

    base = temp_bytes_of(compiled["original"])
    ref = timings.outputs["original"]
    rows: dict[str, dict[str, Any]] = {}
    for name in fns:
        if name == "original":
            continue
        if name in errors:
            rows[name] = {"error": errors[name]}
            continue
        out = timings.outputs[name]
        temp = temp_bytes_of(compiled[name])
        rows[name] = {
            "temp": temp,
            "mem_ratio": temp / base,
            "time_ratio": timings.median_ratio(name),
            "spread": timings.spread(name),
            "n": len(timings.ratios(name)),
            "diff": max(tree_rel_error(out[0], ref[0]), tree_rel_error(out[1], ref[1])),
        }
    growth = measure_growth(case, verbose) if case.growth else None
    return {
        "case": case,
        "base_temp": base,
        "base_time": timings.median_time("original"),
        "rows": rows,
        "labels": labels,
        "plans": plans,
        "growth": growth,
        "t_compile": t_compile,
        "t_time": t_time,
    }


def _thunk(compiled: Any, args: tuple) -> Callable[[], Any]:
    return lambda: compiled(*args)


def measure_growth(case: Case, verbose: bool) -> dict[int, dict[str, int | str]]:
    """Temp memory at each axis length: original, serialized (auto, first setting), peers."""
    ser = case.serialized[0]
    out: dict[int, dict[str, int | str]] = {}
    for n, (args, peers) in case.growth.items():
        fns = {
            "original": case.loss,
            "serialized": ja.serialize_axis(case.loss, chunk=ser.chunk, **ser.settings),
            **peers,
        }
        compiled, errors = compile_all(fns, args, verbose, argnums=case.diff, describe=_err)
        out[n] = {name: temp_bytes_of(c) for name, c in compiled.items()} | errors
    return out
