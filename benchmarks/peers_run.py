"""The models of ``peers.py`` and measuring one: every method (the hand-written peers and
the gradient modes) at every chunk, compiled, its temp bytes, paired times and exactness."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from harness import (
    compile_all,
    time_paired,
    tree_rel_error,
)
from measuring import temp_bytes_of
from models import (
    QUICK_SEED1,
    MLPConfig,
    Seed1Config,
    TransformerConfig,
    mlp_peers,
    mlp_problem,
    seed1_peers,
    seed1_problem,
)

import jaxpr_accum as ja

PEERS = ("scan+checkpoint", "lax.map", "lax.map+checkpoint")
MODES = tuple(m for m in ja.GRAD_MODES if m != "auto")  # the modes that run
METHODS = (*PEERS, *MODES)


class Model:
    """One benchmark problem: its loss, arguments, chunk sizes and how to build each method."""

    def __init__(
        self,
        key: str,
        title: str,
        loss: Callable,
        args: tuple,
        chunks: tuple[int, ...],
        peers: Callable[[int], dict[str, Callable]],
        serialize_kw: dict[str, Any],
        peers_exact: bool,
        budget_s: float,
        methods: tuple[str, ...] = METHODS,
    ):
        self.key, self.title, self.loss, self.args = key, title, loss, args
        self.chunks, self.peers, self.serialize_kw = chunks, peers, serialize_kw
        self.peers_exact, self.budget_s, self.method_names = peers_exact, budget_s, methods

    def methods(self, chunk: int) -> dict[str, Callable]:
        peers = self.peers(chunk)
        out = {}
        for name in self.method_names:
            if name in PEERS:
                out[name] = peers[name]
            else:
                out[name] = ja.serialize_axis(
                    self.loss, chunk=chunk, grad=name, **self.serialize_kw
                )
        return out

    def auto_mode(self, chunk: int) -> str:
        sf = ja.serialize_axis(self.loss, chunk=chunk, **self.serialize_kw)
        return sf.explain(*self.args).grad


def make_models(quick: bool) -> list[Model]:
    from models import transformer_peers, transformer_problem

    mcfg = MLPConfig(rows=2048, width=384, depth=6)
    scfg = QUICK_SEED1 if quick else Seed1Config()
    tcfg = (
        TransformerConfig(batch=16, seq=32, embed=64, heads=2, layers=1, vocab=128)
        if quick
        else TransformerConfig(batch=32, seq=64, embed=128, heads=4, layers=2, vocab=256)
    )
    mloss, margs = mlp_problem(mcfg)
    sloss, sargs = seed1_problem(scfg)
    tloss, targs = transformer_problem(tcfg)
    return [
        Model(
            "mlp",
            f"Dense MLP ({mcfg.rows} rows, width {mcfg.width}, {mcfg.depth} hidden layers, "
            f"d_in {mcfg.d_in}), `argnums=(1, 2)`",
            mloss,
            margs,
            (256,) if quick else (128, 256, 512),
            mlp_peers,
            {"argnums": (1, 2)},
            True,
            10.0 if quick else 60.0,
        ),
        Model(
            "seed1",
            f"Monte-Carlo encoder-decoder ({scfg.n_samples} samples, batch {scfg.batch}, "
            f"{scfg.height}x{scfg.width}, decoder widths {list(scfg.decoder_widths)}), "
            "automatic axis",
            sloss,
            sargs,
            (4,) if quick else (1, 2, 4, 8),
            partial(seed1_peers, scfg),
            {},
            True,
            5.0 if quick else 30.0,
            ("scan+checkpoint", "fused", "remat") if quick else METHODS,
        ),
        Model(
            "transformer",
            f"Transformer with dropout {tcfg.dropout} (Flax linen; batch {tcfg.batch}, seq "
            f"{tcfg.seq}, width {tcfg.embed}, {tcfg.heads} heads, {tcfg.layers} layers, vocab "
            f"{tcfg.vocab}), `argnums=1`",
            tloss,
            targs,
            (4,) if quick else (2, 4, 8),
            partial(transformer_peers, tcfg),
            {"argnums": 1},
            False,
            5.0 if quick else 40.0,
            ("scan+checkpoint", "fused") if quick else METHODS,
        ),
    ]


def run_model(model: Model, verbose: bool, deadline: float) -> dict[str, Any]:
    """Compile and measure every (chunk, method) of one model.

    Timing rounds stop at ``model.budget_s`` or at ``deadline`` (``time.perf_counter()``
    value), whichever comes first, after at least 3 timed rounds.
    """
    t0 = time.perf_counter()
    fns: dict[Any, Callable] = {"original": model.loss}
    for k in model.chunks:
        for name, f in model.methods(k).items():
            fns[(k, name)] = f
    compiled, errors = compile_all(fns, model.args, verbose)
    if "original" not in compiled:
        raise RuntimeError(f"the original does not compile: {errors['original']}")
    t_compile = time.perf_counter() - t0
    auto = {}
    for k in model.chunks:
        try:
            auto[k] = model.auto_mode(k)
        except Exception as e:
            auto[k] = f"error: {type(e).__name__}: {e}"

    groups = {
        k: {
            "original": partial(compiled["original"], *model.args),
            **{
                name: partial(compiled[(k, name)], *model.args)
                for name in METHODS
                if (k, name) in compiled
            },
        }
        for k in model.chunks
    }
    t1 = time.perf_counter()
    # The warm-up round (and the slow programs' single call) is not part of the budget.
    budget = min(model.budget_s, max(0.0, deadline - time.perf_counter()))
    timings = time_paired(groups, reference="original", budget_s=budget, max_rounds=40)
    t_time = time.perf_counter() - t1

    base_temp = temp_bytes_of(compiled["original"])
    rows = _rows(model, compiled, errors, timings, base_temp)
    return {
        "model": model,
        "base_temp": base_temp,
        "base_time": min(timings[k].median_time("original") for k in model.chunks),
        "rows": rows,
        "auto": auto,
        "t_compile": t_compile,
        "t_time": t_time,
        "timings": timings,
    }


def _rows(model: Model, compiled: dict, errors: dict, timings: dict, base_temp: int) -> dict:
    """Per (chunk, method): its temp bytes, time ratio and spread, exactness, or its error."""
    rows: dict[Any, dict[str, Any]] = {}
    for k in model.chunks:
        res = timings[k]
        ref_out = res.outputs["original"]
        for name in model.method_names:
            if (k, name) in errors:
                rows[(k, name)] = {"error": errors[(k, name)]}
                continue
            temp = temp_bytes_of(compiled[(k, name)])
            exact = name in MODES or model.peers_exact
            out = res.outputs[name]
            rows[(k, name)] = {
                "temp": temp,
                "mem_ratio": temp / base_temp,
                "time_ratio": res.median_ratio(name),
                "spread": res.spread(name),
                "n": len(res.ratios(name)),
                "slow": name in res.slow,
                "time_s": res.median_time(name),
                "diff": (
                    max(tree_rel_error(out[0], ref_out[0]), tree_rel_error(out[1], ref_out[1]))
                    if exact
                    else None
                ),
                "timings": res,
            }
    return rows
