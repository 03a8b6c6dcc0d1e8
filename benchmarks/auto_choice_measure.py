"""Measuring one case of ``auto_choice.py``: each mode's plan, memory and paired time, auto's
pick graded against its rule, and the first-call cost of auto and ``memory=``."""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import harness
import jax
import jax.numpy as jnp
import zoo as rm
from auto_choice_cases import (
    Case,
)
from harness import tree_rel_error

import jaxpr_accum as ja

SLACK = 0.10  # the rule's 10%, for memory and for time
TARGET = 0.95  # the share of cases on which the rule must hold
MIN_ROUNDS = 7
CALLS_S = 0.04  # a program's calls in one round take about this long (at least one call)


def compile_value_and_grad(
    fns: dict[str, Callable], args: tuple, argnums: tuple[int, ...], has_aux: bool, verbose: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """``harness.compile_all`` with ``has_aux``: ``(compiled, errors)`` by name."""
    lowered, errors = {}, {}
    for name, f in fns.items():
        try:
            vg = jax.value_and_grad(f, argnums=argnums, has_aux=has_aux)
            lowered[name] = jax.jit(vg).lower(*args)
        except Exception as e:
            if verbose:
                traceback.print_exc()
            errors[name] = f"{type(e).__name__}: {e}"

    def one(item):
        name, low = item
        try:
            return name, low.compile(), None
        except Exception as e:
            if verbose:
                traceback.print_exc()
            return name, None, f"{type(e).__name__}: {e}"

    compiled = {}
    with ThreadPoolExecutor(2) as pool:
        for name, c, err in pool.map(one, lowered.items()):
            if err is None:
                compiled[name] = c
            else:
                errors[name] = err
    return compiled, errors


def time_rounds(
    calls: dict[str, Callable[[], Any]],
    reps: int,
    *,
    reference: str,
    min_rounds: int,
    max_rounds: int,
    budget_s: float,
) -> harness.PairedTimes:
    """``harness.time_paired`` with calls interleaved within each round, for a shared machine.

    A warm-up call of each (its output kept), then rounds until ``budget_s`` is spent (at
    least ``min_rounds``, at most ``max_rounds``): a round makes ``reps`` passes, each calling
    every program once, back to back, in an order rotated from pass to pass and from round to
    round; a program's time in the round is the median of its ``reps`` calls, so that a call
    preempted by another job does not count as the round's. Figures are then medians over
    rounds of per-round ratios, as in ``time_paired``.
    """
    names = list(calls)
    out = harness.PairedTimes({n: {} for n in names}, set(), reference, {})
    for n in names:
        out.outputs[n] = jax.block_until_ready(calls[n]())
    start, rnd = time.perf_counter(), 0
    while rnd < max_rounds:
        seen: dict[str, list[float]] = {n: [] for n in names}
        for i in range(reps):
            shift = (rnd + i) % len(names)
            for n in names[shift:] + names[:shift]:
                t = time.perf_counter()
                jax.block_until_ready(calls[n]())
                seen[n].append(time.perf_counter() - t)
        for n in names:
            out.times[n][rnd] = statistics.median(seen[n])
        rnd += 1
        if rnd >= min_rounds and time.perf_counter() - start > budget_s:
            break
    return out


def measure(case: Case, quick: bool, verbose: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    loss, args = case.make()
    diff = case.argnums or rm.float_argnums(args)
    res: dict[str, Any] = {"case": case, "diff": diff, "notes": []}
    plans = _explain_modes(case, loss, args, res, verbose)
    pick, fused_ok = res["pick"], res["fused_applies"]

    fns: dict[str, Callable] = {"original": loss, "auto": plans["auto"][0]}
    if fused_ok:
        fns["fused"] = plans["fused"][0]
    fns["remat"] = plans["remat"][0]
    if pick not in ("fused", "remat", "none", "error"):
        fns[pick] = ja.serialize_axis(loss, chunk=case.chunk, grad=pick, **case.serialize_kw)
    peers = case.peers() if case.peers else {}
    fns.update(peers)
    compiled, errors = compile_value_and_grad(fns, args, diff, case.has_aux, verbose)
    res["errors"] = errors
    for name, err in errors.items():
        res["notes"].append(f"{name} does not compile: {err[:200]}")
    res["temp"] = {n: c.memory_analysis().temp_size_in_bytes for n, c in compiled.items()}
    res["t_compile"] = time.perf_counter() - t0
    if "auto" in compiled:  # auto plans per perturbation pattern: its pick for this gradient
        plan = plan_for_gradient(plans["auto"][0], args, diff)
        if plan.grad != pick:
            res["notes"].append(
                f"explain (every floating argument differentiated) picks {pick}; for the "
                f"gradient measured here auto picks {plan.grad}"
            )
        pick = plan.grad
        res["pick"], res["why"] = pick, plan.grad_reason
        if pick not in fns and pick not in ("none", "error"):
            res["notes"].append(f"auto picks {pick}, which was not measured")

    _time_and_check(res, fns, compiled, args, set(peers), quick)
    grade(res)
    return res


def _explain_modes(
    case: Case, loss: Callable, args: tuple, res: dict[str, Any], verbose: bool
) -> dict[str, tuple[Any, Any]]:
    """``sf.explain`` under each mode: ``{mode: (sf, plan or None)}``; auto's pick and why,
    whether fused applies, and notes, in ``res``."""
    plans = {}
    for mode in ("auto", "fused", "remat"):
        sf = ja.serialize_axis(loss, chunk=case.chunk, grad=mode, **case.serialize_kw)
        try:
            plans[mode] = (sf, sf.explain(*args))
        except Exception as e:
            if verbose:
                traceback.print_exc()
            plans[mode] = (sf, None)
            res["notes"].append(f"explain under grad={mode!r} raised {type(e).__name__}: {e}")
    res["plans"] = {m: p for m, (_, p) in plans.items()}
    auto_plan, fused_plan, remat_plan = (res["plans"][m] for m in ("auto", "fused", "remat"))
    pick = auto_plan.grad if auto_plan is not None else "error"
    res["pick"], res["why"] = pick, auto_plan.grad_reason if auto_plan is not None else ""
    fused_ok = fused_plan is not None and fused_plan.grad == "fused"
    res["fused_applies"] = fused_ok
    if not fused_ok and fused_plan is not None:
        res["fused_refused"] = f"{fused_plan.grad}: {fused_plan.grad_reason}"
    if remat_plan is not None and remat_plan.grad != "remat":
        res["notes"].append(f"grad='remat' runs {remat_plan.grad}: {remat_plan.grad_reason}")
    return plans


def _time_and_check(
    res: dict[str, Any], fns: dict, compiled: dict, args: tuple, peers: set, quick: bool
) -> None:
    """Paired rounds of the compiled programs (auto's is its pick's), their times in ``res``,
    and a note for a mode whose value and gradients differ from the original's."""
    timed = [n for n in fns if n != "auto" and n in compiled]
    calls = {n: functools.partial(compiled[n], *args) for n in timed}
    jax.block_until_ready(calls["original"]())
    one = min(_time_once(calls["original"]) for _ in range(3))
    reps = max(1, min(50, math.ceil(CALLS_S / max(one, 1e-6))))
    t1 = time.perf_counter()
    paired = time_rounds(
        calls,
        reps,
        reference="original",
        min_rounds=3 if quick else MIN_ROUNDS,
        max_rounds=9 if quick else 25,
        budget_s=4.0 if quick else 25.0,
    )
    res.update(
        paired=paired,
        reps=reps,
        t_original=one,
        t_time=time.perf_counter() - t1,
        load=os.getloadavg(),
    )
    ref = paired.outputs["original"]
    for n in timed:
        if n != "original" and n not in peers:
            err = tree_rel_error(paired.outputs[n], ref)
            if err > 1e-3:
                res["notes"].append(f"{n}'s value and gradients differ by {err:.1e} (relative)")


def plan_for_gradient(sf: Any, args: tuple, diff: int | Sequence[int]) -> ja.Plan:
    """The plan ``sf`` makes for ``jax.value_and_grad(sf, diff)``: ``explain`` called where
    the arguments in ``diff`` are being differentiated (auto plans per perturbation pattern,
    and ``explain`` outside a gradient sees every floating argument as differentiated)."""
    nums = (diff,) if isinstance(diff, int) else tuple(diff)
    plans: list[ja.Plan] = []

    def probe(*perturbed: Any) -> jax.Array:
        full = list(args)
        for i, a in zip(nums, perturbed, strict=True):
            full[i] = a
        plans.append(sf.explain(*full))
        return jnp.zeros(())

    jax.grad(probe, argnums=tuple(range(len(nums))))(*(args[i] for i in nums))
    return plans[0]


def _time_once(call: Callable[[], Any]) -> float:
    t = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - t


def _mode_of(pick: str) -> str:
    """The timed program that auto's pick runs."""
    return "original" if pick == "none" else pick


def grade(res: dict[str, Any]) -> None:
    """Rules (a) and (b) on auto's pick; sets ``res['holds']`` and ``res['why_not']``."""
    temp, paired = res["temp"], res["paired"]
    modes = [m for m in ("fused", "remat") if m in temp and m in paired.times]
    pick = _mode_of(res["pick"])
    res["holds"], res["why_not"] = False, ""
    if not modes or pick not in temp or pick not in paired.times:
        res["why_not"] = f"not measured ({res['pick']})"
        return
    smallest = min(temp[m] for m in modes)
    within = [m for m in modes if temp[m] <= (1 + SLACK) * smallest]
    auto_mem = temp[pick]
    if "auto" in temp and abs(temp["auto"] - auto_mem) > 0.01 * auto_mem:
        res["notes"].append(
            f"auto's own program measures {_mib(temp['auto'])} MiB, not the {_mib(auto_mem)} MiB "
            f"of the {res['pick']} mode it picks"
        )
    reasons = []
    if auto_mem > (1 + SLACK) * smallest:
        reasons.append(
            f"(a) memory {auto_mem / smallest:.2f}x the smaller mode's "
            f"({_mib(auto_mem)} vs {_mib(smallest)} MiB)"
        )
    for m in within:
        if m == pick:
            continue
        r = paired.median_ratio(pick, m)
        if r > 1 + SLACK:
            ratios = paired.ratios(pick, m)
            halves = "/".join(f"{statistics.median(ratios[i::2]):.2f}" for i in (0, 1))
            reasons.append(
                f"(b) time {r:.2f}x {m}'s (even/odd rounds {halves}), which is within 10% in memory"
            )
    res["holds"] = not reasons
    res["why_not"] = "; ".join(reasons)


def _mib(b: int) -> str:
    v = b / 2**20
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"
