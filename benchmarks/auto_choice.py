"""Auto's choice between the fused and remat gradient modes, graded against the rule it follows.

Run from the repository root (CPU is fine; one process; needs the ``models`` extra for the
zoo; a full run takes about half an hour on 2 shared cores)::

    python benchmarks/auto_choice.py --write   # full run; rewrites its section of the docs
    python benchmarks/auto_choice.py --quick   # smoke run (minutes): smaller sizes, prints only
    python benchmarks/auto_choice.py --cases eqx-mlp,issue20-mlp   # only these cases

The rule (``grad="auto"``, docs/api.md, "Gradient modes"): auto weighs what each mode
adds over the other and (a) its memory is within 10% of the smaller of the two modes' memory;
(b) among the modes within that 10%, its time is within 10% of the fastest. Target: the rule
holds on at least 95% of the cases, the misses named.

Cases: every model of the real-model zoo (``benchmarks/zoo/``, at its chunk ``N // 8``,
serialized as the zoo does); the peers' dense MLP (``benchmarks/models.py``, 2048 rows,
``argnums=(1, 2)``, chunk 256); the Monte-Carlo encoder-decoder (16 samples, automatic
axis, chunk 4); the dropout transformer (``argnums=1``, chunk 4); a classifier returning its
loss with an accuracy and a confidence (``value_and_grad(..., has_aux=True)``: two
gradient-carrying sums and one without gradient); a loss built from three gradient-carrying
sums (an importance-weighted cross-entropy ``sum(w * ce) / sum(w)`` plus an activation
penalty); a parameter-dominated MLP (three 2048x2048 layers, 64 rows); and the dense 6-layer
tanh MLP of issue 20 (D 384, N 2048, chunk 256, ``argnums=1``, differentiated with respect to
the weights only) beside its hand-written ``lax.scan`` + ``jax.checkpoint`` version.

For each case:

- ``sf.explain(*args)`` under ``grad="auto"``, ``"fused"`` and ``"remat"``: auto's pick and
  why (auto's pick is then read from its plan for the compiled ``value_and_grad`` below, as
  auto plans per perturbation pattern and ``explain`` differentiates every floating
  argument); fused counts as not applicable where its plan is refused (explain shows ``remat``
  under ``grad="fused"``) or runs as written (``none``);
- memory: XLA's ``temp_size_in_bytes`` of ``jax.jit(jax.value_and_grad(f, argnums=<the
  floating arguments>))`` for the original, fused, remat and auto (auto's is compiled too,
  as a check that it is the program of the mode it picks);
- time: paired, interleaved rounds (``time_rounds``, ``harness.time_paired`` with the calls
  interleaved inside a round): each round runs the original, fused and remat back to back
  in rotated order, several passes for a fast program (about 40 ms of calls each, a
  program's round time the median of its calls, so that a call preempted by another job
  does not count), at least 7 timed rounds; the figures are medians of per-round ratios,
  against the original and fused against remat (with the interquartile range; a rule-(b)
  miss also gives the medians of the even and of the odd rounds, to show whether it is
  stable);
- auto's memory and time are those of the mode it picks (the original's where it runs the
  function as written); rules (a) and (b) are graded on them.

It also measures the first-call cost (wall time of the first call, which traces, plans and
compiles) of ``jax.jit(jax.value_and_grad(sf))`` on the MC encoder-decoder, for ``grad="auto"`` at
chunk 4 and for ``memory=`` a budget of half the original's temp bytes, against the
original's first call (fresh functions each time, the fastest of two alternating rounds).

The machine's load (``os.getloadavg()``) is printed at the start, after each case and at the
end, and written with the table. The process exits 1 if the rule holds on fewer than 95% of
the cases.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import harness  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import zoo as rm  # noqa: E402
from harness import md_table, tree_rel_error  # noqa: E402
from jax import lax  # noqa: E402
from models import (  # noqa: E402
    QUICK_SEED1,
    MLPConfig,
    Seed1Config,
    TransformerConfig,
    mlp_problem,
    seed1_problem,
    transformer_problem,
)

import jaxpr_accum as ja  # noqa: E402

SECTION = "auto_choice"
SLACK = 0.10  # the rule's 10%, for memory and for time
TARGET = 0.95  # the share of cases on which the rule must hold
MIN_ROUNDS = 7
CALLS_S = 0.04  # a program's calls in one round take about this long (at least one call)


# --------------------------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    key: str
    title: str
    make: Callable[[], tuple[Callable[..., Any], tuple]]
    n: int
    chunk: int
    serialize_kw: dict[str, Any]  # beside chunk and grad
    argnums: tuple[int, ...] | None = None  # differentiated; None: the floating arguments
    has_aux: bool = False
    peers: Callable[[], dict[str, Callable]] | None = None  # timed beside the modes


def _zoo_case(c: rm.Case) -> Case:
    kw = c.serialize_kwargs()
    chunk = kw.pop("chunk")
    return Case(c.name, f"{c.library}: {c.model}", c.make, c.n, chunk, kw)


def _classifier(rng: np.random.RandomState, n: int, d_in: int, width: int, depth: int, k: int):
    dims = [d_in] + [width] * depth + [k]
    params = [
        (jnp.asarray(rng.normal(size=(a, b)) / np.sqrt(a), jnp.float32), jnp.zeros(b))
        for a, b in zip(dims[:-1], dims[1:], strict=True)
    ]
    x = jnp.asarray(rng.normal(size=(n, d_in)), jnp.float32)
    y = jnp.asarray(rng.randint(0, k, size=n), jnp.int32)
    return params, x, y


def _hidden(params, x):
    h = x
    for w, b in params[:-1]:
        h = jax.nn.gelu(h @ w + b)
    return h


def make_metrics(n: int = 1024, width: int = 256):
    """Loss, accuracy (through argmax: no gradient) and confidence (a float metric with a
    gradient), differentiated with ``has_aux=True``."""
    params, x, y = _classifier(np.random.RandomState(1), n, 128, width, 3, 10)

    def loss(params, x, y):
        w, b = params[-1]
        logits = _hidden(params, x) @ w + b
        logp = jax.nn.log_softmax(logits)
        ce = -jnp.mean(jnp.take_along_axis(logp, y[:, None], 1))
        accuracy = jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32))
        confidence = jnp.mean(jnp.exp(jnp.max(logp, -1)))
        return ce, (accuracy, confidence)

    return loss, (params, x, y)


def make_three_sums(n: int = 1024, width: int = 256):
    """``sum(w * ce) / sum(w) + 1e-3 * mean(h ** 2)`` with ``w`` from the parameters: three
    gradient-carrying sums over the rows, combined non-linearly after the loop."""
    rng = np.random.RandomState(2)
    params, x, y = _classifier(rng, n, 128, width, 3, 10)
    v = jnp.asarray(rng.normal(size=(width,)) / np.sqrt(width), jnp.float32)

    def loss(params, v, x, y):
        h = _hidden(params, x)
        w_out, b_out = params[-1]
        logp = jax.nn.log_softmax(h @ w_out + b_out)
        ce = -jnp.take_along_axis(logp, y[:, None], 1)[:, 0]
        weight = jax.nn.sigmoid(h @ v)
        return jnp.sum(weight * ce) / jnp.sum(weight) + 1e-3 * jnp.mean(h**2)

    return loss, (params, v, x, y)


def make_param_dominated(n: int = 64, width: int = 2048, depth: int = 3):
    """Large weights, a small batch: parameters and their gradients dominate memory."""
    cfg = MLPConfig(rows=n, d_in=width, width=width, depth=depth, d_out=16, seed=3)
    return mlp_problem(cfg)


def make_issue20(n: int = 2048, d: int = 384, layers: int = 6):
    """The dense 6-layer tanh MLP of issue 20: ``loss(ws, x)``, rows of ``x`` serialized."""
    rng = np.random.RandomState(20)
    ws = [jnp.asarray(rng.normal(size=(d, d)) / np.sqrt(d), jnp.float32) for _ in range(layers)]
    x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
    return issue20_loss, (ws, x)


def _issue20_sum(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(h @ w)
    return jnp.sum(h**2)


def issue20_loss(ws, x):
    return _issue20_sum(ws, x) / x.size


def issue20_scan(chunk: int) -> Callable:
    """The hand-written ``lax.scan`` + ``jax.checkpoint`` version of ``issue20_loss``."""

    def loss(ws, x):
        n = x.shape[0]
        xs = x.reshape(n // chunk, chunk, *x.shape[1:])

        @jax.checkpoint
        def body(total, xc):
            return total + _issue20_sum(ws, xc), None

        total, _ = lax.scan(body, jnp.zeros((), x.dtype), xs)
        return total / x.size

    return loss


def make_cases(quick: bool) -> list[Case]:
    zoo = [c for c in rm.CASES if rm.available(c)]
    if quick:
        zoo = [c for c in zoo if c.name in ("eqx-mlp", "flax-vae", "flax-ppo", "optax-l2_loss")]
    mcfg = MLPConfig(rows=512, width=128, depth=3) if quick else MLPConfig(2048, width=384, depth=6)
    scfg = QUICK_SEED1 if quick else Seed1Config()
    tcfg = (
        TransformerConfig(batch=16, seq=32, embed=64, heads=2, layers=1, vocab=128)
        if quick
        else TransformerConfig()
    )
    rows = 256 if quick else 1024
    i20 = (512, 128) if quick else (2048, 384)
    i20_chunk = i20[0] // 8
    return [
        *(_zoo_case(c) for c in zoo),
        Case(
            "peers-mlp",
            f"peers' dense MLP ({mcfg.rows} rows, width {mcfg.width}, {mcfg.depth} layers)",
            lambda: mlp_problem(mcfg),
            mcfg.rows,
            mcfg.rows // 8,
            {"argnums": (1, 2)},
        ),
        Case(
            "mc_vae",
            f"Monte-Carlo encoder-decoder ({scfg.n_samples} samples, automatic axis)",
            lambda: seed1_problem(scfg),
            scfg.n_samples,
            4,
            {},
        ),
        Case(
            "dropout-transformer",
            f"dropout transformer (batch {tcfg.batch}, `argnums=1`)",
            lambda: transformer_problem(tcfg),
            tcfg.batch,
            4,
            {"argnums": 1},
        ),
        Case(
            "metrics",
            f"loss + accuracy + confidence, `has_aux=True` ({rows} rows)",
            lambda: make_metrics(rows, 128 if quick else 256),
            rows,
            rows // 8,
            {"argnums": (1, 2)},
            has_aux=True,
        ),
        Case(
            "three-sums",
            f"`sum(w*ce)/sum(w)` + activation penalty: 3 gradient-carrying sums ({rows} rows)",
            lambda: make_three_sums(rows, 128 if quick else 256),
            rows,
            rows // 8,
            {"argnums": (2, 3)},
        ),
        Case(
            "param-dominated",
            "parameter-dominated MLP (3 layers of 2048x2048, 64 rows)"
            if not quick
            else "parameter-dominated MLP (3 layers of 512x512, 32 rows)",
            (lambda: make_param_dominated(32, 512)) if quick else make_param_dominated,
            32 if quick else 64,
            4 if quick else 8,
            {"argnums": (1, 2)},
        ),
        Case(
            "issue20-mlp",
            f"issue 20: dense 6-layer tanh MLP (D {i20[1]}, N {i20[0]}), grads of the weights",
            lambda: make_issue20(*i20),
            i20[0],
            i20_chunk,
            {"argnums": 1},
            argnums=(0,),
            peers=lambda: {"scan+checkpoint": issue20_scan(i20_chunk)},
        ),
    ]


# --------------------------------------------------------------------------------------------
# Measuring one case
# --------------------------------------------------------------------------------------------


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
    t_compile = time.perf_counter() - t0
    if "auto" in compiled:  # auto plans per perturbation pattern: its pick for this gradient
        plan = _latest_plan(plans["auto"][0])
        if plan.grad != pick:
            res["notes"].append(
                f"explain (every floating argument differentiated) picks {pick}; for the "
                f"gradient measured here auto picks {plan.grad}"
            )
        pick = plan.grad
        res["pick"], res["why"] = pick, plan.grad_reason
        if pick not in fns and pick not in ("none", "error"):
            res["notes"].append(f"auto picks {pick}, which was not measured")

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
        t_compile=t_compile,
        t_time=time.perf_counter() - t1,
        load=os.getloadavg(),
    )
    ref = paired.outputs["original"]
    for n in timed:
        if n != "original" and n not in peers:
            err = tree_rel_error(paired.outputs[n], ref)
            if err > 1e-3:
                res["notes"].append(f"{n}'s value and gradients differ by {err:.1e} (relative)")
    grade(res)
    return res


def _latest_plan(sf: Any) -> Any:
    """The plan of ``sf``'s most recently planned call signature: after compiling its
    ``value_and_grad``, the one for that perturbation pattern (the plan cache is an LRU)."""
    cache = sf._cache or sf._pure._cache  # NNX arguments: the plans of its pure function
    return cache[next(reversed(cache))].plan


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


# --------------------------------------------------------------------------------------------
# First-call cost
# --------------------------------------------------------------------------------------------


def first_calls(quick: bool) -> dict[str, Any]:
    """Wall time of the first ``jax.jit(jax.value_and_grad(f))(*args)`` on fresh functions:
    the MC encoder-decoder as written, serialized with ``grad="auto"`` at chunk 4 and with
    ``memory=``."""
    cfg = QUICK_SEED1 if quick else Seed1Config()
    loss, args = seed1_problem(cfg)
    original_temp = rm.temp_bytes(loss, args, (0,))
    budget = original_temp // 2

    def fresh(which: str) -> Callable:
        f, _ = seed1_problem(cfg)
        if which == "auto":
            return ja.serialize_axis(f, chunk=4)
        if which == "memory":
            return ja.serialize_axis(f, memory=budget)
        return f

    times: dict[str, list[float]] = {"original": [], "auto": [], "memory": []}
    plans = {}
    for _ in range(2):
        for which in times:
            f = fresh(which)
            t = time.perf_counter()
            jax.block_until_ready(jax.jit(jax.value_and_grad(f))(*args))
            times[which].append(time.perf_counter() - t)
            if which != "original":
                plans[which] = f.explain(*args)
    mem = plans["memory"]
    return {
        "times": {k: min(v) for k, v in times.items()},
        "original_temp": original_temp,
        "budget": budget,
        "memory_chunk": mem.chunk,
        "memory_grad": mem.grad,
        "memory_measured": getattr(mem.budget, "measured", None),
        "auto_grad": plans["auto"].grad,
        "load": os.getloadavg(),
    }


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def _mib(b: int) -> str:
    v = b / 2**20
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def _ratio(paired: harness.PairedTimes, name: str, other: str | None = None) -> str:
    if name not in paired.times or (other and other not in paired.times):
        return "-"
    return f"{paired.median_ratio(name, other):.2f}"


def _iqr(paired: harness.PairedTimes, name: str, other: str) -> str:
    r = sorted(paired.ratios(name, other))
    if len(r) < 4:
        return ""
    q = statistics.quantiles(r, n=4)
    return f" [{q[0]:.2f}, {q[2]:.2f}]"


HEADERS = [
    "case",
    "N",
    "chunk",
    "original MiB",
    "fused MiB",
    "remat MiB",
    "fused time",
    "remat time",
    "fused / remat [IQR]",
    "rounds",
    "auto's pick",
    "rule holds?",
]


def table_row(res: dict[str, Any]) -> list[str]:
    case, temp, p = res["case"], res["temp"], res["paired"]
    fused = "fused" in temp and "fused" in p.times
    pick = res["pick"]
    if pick == "none":
        pick = "none (as written)"
    verdict = "yes" if res["holds"] else f"**no**: {res['why_not']}"
    if res["holds"] and not res["fused_applies"]:
        verdict = "yes (fused n/a)"
    return [
        case.key,
        str(case.n),
        str(case.chunk),
        _mib(temp["original"]) if "original" in temp else "-",
        _mib(temp["fused"]) if fused else "n/a",
        _mib(temp["remat"]) if "remat" in temp else "-",
        _ratio(p, "fused") if fused else "n/a",
        _ratio(p, "remat"),
        (_ratio(p, "fused", "remat") + _iqr(p, "fused", "remat")) if fused else "n/a",
        str(len(p.ratios("remat"))),
        pick,
        verdict,
    ]


def summary(results: list[dict[str, Any]]) -> list[str]:
    held = [r for r in results if r["holds"]]
    pct = 100 * len(held) / max(1, len(results))
    both = [r for r in results if r["fused_applies"]]
    lines = [
        f"**The rule holds on {len(held)} of {len(results)} cases ({pct:.0f}%)** "
        f"(target {TARGET:.0%}); on {sum(r['holds'] for r in both)} of {len(both)} where both "
        "modes apply."
    ]
    misses = [r for r in results if not r["holds"]]
    if misses:
        lines.append("Misses:")
        lines += [
            f'- `{r["case"].key}` (auto: {r["pick"]}): {r["why_not"]}. Auto\'s reason: "{r["why"]}"'
            for r in misses
        ]
    return lines


def refusals(results: list[dict[str, Any]]) -> list[str]:
    return [f"`{r['case'].key}`: {r['fused_refused']}" for r in results if r.get("fused_refused")]


def issue20_lines(results: list[dict[str, Any]]) -> list[str]:
    res = next((r for r in results if r["case"].key == "issue20-mlp"), None)
    if res is None:
        return []
    temp, p, pick = res["temp"], res["paired"], _mode_of(res["pick"])
    peer = "scan+checkpoint"
    if pick not in temp or peer not in temp:
        return [f"Issue 20's MLP: not measured ({res['pick']}; {res['notes']})."]
    t_orig = p.median_ratio(pick)
    t_scan = p.median_ratio(pick, peer)
    m_scan = temp[pick] / temp[peer]
    return [
        f"Issue 20's dense tanh MLP (chunk {res['case'].chunk}, auto = {res['pick']}): time "
        f"**{t_orig:.2f}x** the original's (target <= 1.10), {t_scan:.2f}x the hand-written "
        f"scan's; memory **{m_scan:.3f}x** the hand-written `lax.scan` + `jax.checkpoint`'s "
        f"({_mib(temp[pick])} vs {_mib(temp[peer])} MiB; target <= 1.05; the original: "
        f"{_mib(temp['original'])} MiB); the hand-written scan's time: "
        f"{p.median_ratio(peer):.2f}x the original's."
    ]


def first_call_lines(fc: dict[str, Any] | None) -> list[str]:
    if fc is None:
        return []
    t = fc["times"]
    measured = fc["memory_measured"]
    return [
        "First call of `jax.jit(jax.value_and_grad(f))(*args)` on the MC encoder-decoder (trace, "
        f"plan, compile; fresh functions, fastest of two): original **{t['original']:.1f} s**; "
        f'`grad="auto"`, chunk 4 ({fc["auto_grad"]}): **{t["auto"]:.1f} s** '
        f"({t['auto'] / t['original']:.1f}x); `memory=` {_mib(fc['budget'])} MiB (half the "
        f"original's {_mib(fc['original_temp'])} MiB; chose chunk {fc['memory_chunk']}, "
        f"{fc['memory_grad']}"
        + (f", {_mib(measured)} MiB" if measured is not None else "")
        + f"): **{t['memory']:.1f} s** ({t['memory'] / t['original']:.1f}x). Load average "
        f"{fc['load'][0]:.1f} then."
    ]


def _loads(loads: list[tuple[float, float, float]]) -> str:
    one = [x[0] for x in loads]
    return f"{min(one):.1f} to {max(one):.1f} (median {statistics.median(one):.1f})"


def markdown(results, fc, elapsed, loads, quick) -> str:
    notes = [f"- `{r['case'].key}`: {n}" for r in results for n in r["notes"]]
    parts = [
        "## Auto's choice: fused or remat (`benchmarks/auto_choice.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, {platform.machine()} with "
        f"{os.cpu_count()} CPU cores shared with other jobs; {'quick sizes, ' if quick else ''}"
        f"run time {elapsed / 60:.0f} min; one-minute load average {_loads(loads)} over the "
        "run. The rule of issue 20: (a) auto's memory is within 10% of the smaller of the fused "
        "and remat modes' memory; (b) among the modes within that 10%, auto's time is within "
        "10% of the fastest. Each case is measured in both modes: memory is XLA's temp bytes of "
        "`jax.jit(jax.value_and_grad(f, argnums=<the floating arguments>))` (issue 20's MLP: "
        "the weights only); times are medians over paired rounds (each round runs the original, "
        "fused and remat back to back in rotated order; a fast program in several interleaved "
        "passes of about 40 ms in all, its round time the median of its calls; at least "
        f"{MIN_ROUNDS} timed rounds) of the per-round ratio, against the original and "
        "fused against remat (with its interquartile range). Auto's memory and time are those "
        "of the mode it picks (`sf.explain(*args).grad`; auto's own program was compiled too "
        + (
            "and measured the same temp bytes). "
            if not any("auto's own program" in n for r in results for n in r["notes"])
            else "and differs where the notes below say). "
        )
        + "*fused n/a*: the plan refuses fused (listed below), so auto's only choice is remat.",
        "",
        *summary(results),
        "",
        md_table(HEADERS, [table_row(r) for r in results], right_from=1),
        "",
        *issue20_lines(results),
        "",
        *first_call_lines(fc),
        "",
    ]
    refused = refusals(results)
    if refused:
        parts += ["Fused refused:", "", *(f"- {x}" for x in refused), ""]
    if notes:
        parts += ["Notes:", "", *notes, ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: smaller sizes")
    parser.add_argument("--write", action="store_true", help="rewrite this section of --doc")
    parser.add_argument(
        "--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"), help="Markdown file"
    )
    parser.add_argument("--cases", default=None, help="comma-separated subset of case keys")
    parser.add_argument(
        "--no-first-call", action="store_true", help="skip the first-call measurement"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks")
    opts = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # "not expected to save memory" and untested-JAX notes
    t_start = time.perf_counter()
    loads = [os.getloadavg()]
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPU cores, "
        f"load average {loads[0][0]:.1f}" + (" [quick]" if opts.quick else ""),
        flush=True,
    )
    cases = make_cases(opts.quick)
    if opts.cases:
        wanted = opts.cases.split(",")
        cases = [c for c in cases if c.key in wanted]
    results = []
    for case in cases:
        try:
            res = measure(case, opts.quick, opts.verbose)
        except Exception as e:
            traceback.print_exc()
            print(f"{case.key}: FAILED to measure: {type(e).__name__}: {e}", flush=True)
            continue
        results.append(res)
        loads.append(res["load"])
        print(
            md_table(HEADERS, [table_row(res)], right_from=1).splitlines()[-1]
            + f"  (compile {res['t_compile']:.0f} s, timing {res['t_time']:.0f} s, x{res['reps']}"
            f" per call, load {res['load'][0]:.1f})",
            flush=True,
        )
        if opts.verbose:
            print(f"    auto: {res['why']}")
        for n in res["notes"]:
            print(f"    note: {n}", flush=True)
    fc = None
    if not opts.no_first_call and not opts.cases:
        print("first calls on the Monte-Carlo encoder-decoder ...", flush=True)
        fc = first_calls(opts.quick)
        loads.append(fc["load"])
    elapsed = time.perf_counter() - t_start
    loads.append(os.getloadavg())
    text = markdown(results, fc, elapsed, loads, opts.quick)
    print("\n" + text)
    print(f"total run time {elapsed:.0f} s; load average {_loads(loads)}")
    if opts.write:
        if opts.cases or opts.quick:
            parser.error("--write needs a full run: no --cases, no --quick")
        harness.write_doc_section(opts.doc, SECTION, text)
    held = sum(r["holds"] for r in results)
    return 0 if results and held >= TARGET * len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
