"""Streamed normalisers: softmax, logsumexp and label look-ups over the chunked axis.

Run from the repository root (CPU is fine; one process)::

    python benchmarks/normalisers.py --write   # full run (~2 min on 2 cores), writes its section
    python benchmarks/normalisers.py --quick   # smoke run (~20 s): smaller sizes, prints only

Four programs whose chunked axis is normalised over *inside* the region (float32,
``jax.jit(jax.value_and_grad(f, argnums=...))`` with respect to the parameters and the
chunked inputs):

* (a) attention, ``sum(softmax(q @ k.T / sqrt(d)) @ v)``, serialized over the keys
  (``argnums=(1, 2), axis=0``), next to ``jax.nn.dot_product_attention(implementation="xla")``
  and a hand-written Rabe-Staats chunked attention (``lax.scan`` over key chunks carrying the
  running max, sum and numerator, ``jax.checkpoint`` on the step) at the same chunk;
* (b) an LM head's cross-entropy, ``optax.softmax_cross_entropy_with_integer_labels(h @ W,
  y).mean()`` with ``W`` [d, V], serialized over the vocabulary (``argnums=0, axis=1``), next
  to a hand-written chunked cross-entropy (``lax.scan`` over vocabulary chunks, each slicing
  its columns of ``W`` with ``lax.dynamic_slice``, ``jax.checkpoint`` on the step: online
  logsumexp and the label's logit looked up per chunk), and the same loss serialized over the
  tokens (``argnums=(1, 2), axis=0``) for comparison;
* (c) softmax-weighted pooling over a set, ``p = softmax(tanh(x @ W1) @ w2)``, ``p @ h``,
  serialized over the set (``argnums=2, axis=0``);
* (d) a CLIP-style contrastive loss: ``za`` from the chunked batch ``xa``, ``zb`` from the
  unchunked ``xb``, ``logits = za @ zb.T / tau``, cross-entropy over the rows and over the
  columns with labels ``arange``; the second normalises over the chunked batch
  (``argnums=2, axis=0``).

For each: XLA's ``temp_size_in_bytes`` of the original and of ``serialize_axis`` with
``grad="auto"`` and ``"remat"`` (one row when auto picks remat: the same program), the memory
ratio graded against the program's target, the time ratio (median over interleaved rounds of
the per-round ``time / time(original)``; target <= 1.5x), and the largest per-leaf relative
difference of value and gradients to the original's (leaf's own magnitude, floored at 1e-3 of
the largest leaf; target <= 2e-4). For attention and cross-entropy, *memory as the axis
grows*: temp memory at a fixed chunk for axis lengths N, 2N and 4N, serialized (auto) next to
the original and the hand-written peer; target: the serialized program's memory grows at most
2x from N to 4N (the original's grows about 4x). The table also shows what each plan still
stacks back to full size and where its region stops (``sf.explain``).

The process exits 1 if a target fails. ``--write`` rewrites the ``normalisers`` section of
docs/benchmarks.md (appended at the end if missing; the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import re
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from harness import (  # noqa: E402
    compile_all,
    fmt_bytes,
    md_table,
    time_paired,
    tree_rel_error,
    write_doc_section,
)
from jax import lax  # noqa: E402
from measuring import temp_bytes_of  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "normalisers"
TIME_TARGET, DIFF_TARGET, GROWTH_TARGET = 1.5, 2e-4, 2.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Every size the benchmark uses; ``FULL`` and ``QUICK`` below."""

    queries: int = 1024
    keys: int = 2048
    head_dim: int = 64
    attn_chunk: int = 256
    tokens: int = 512
    d_model: int = 256
    vocab: int = 16384
    vocab_chunk: int = 2048
    token_chunk: int = 64
    set_size: int = 4096
    set_in: int = 128
    set_hidden: int = 256
    set_chunk: int = 256
    batch: int = 2048
    clip_in: int = 128
    clip_hidden: int = 256
    clip_embed: int = 128
    clip_chunk: int = 256
    tau: float = 0.07
    budget_s: float = 30.0  # timing per program family
    max_rounds: int = 40


FULL = Sizes()
QUICK = Sizes(
    queries=256,
    keys=1024,
    attn_chunk=128,
    tokens=256,
    d_model=64,
    vocab=4096,
    vocab_chunk=512,
    token_chunk=32,
    set_size=1024,
    set_hidden=128,
    set_chunk=128,
    batch=512,
    clip_hidden=128,
    clip_embed=64,
    clip_chunk=64,
    budget_s=2.0,
    max_rounds=4,
)


# ---- the programs ----------------------------------------------------------------------------


def attention_loss(q, k, v):
    """Plain-jnp single-head attention; ``k``, ``v``: [keys, d]."""
    return jnp.sum(jax.nn.softmax(q @ k.T / math.sqrt(q.shape[-1]), axis=-1) @ v)


def dpa_loss(q, k, v):
    """The same loss with ``jax.nn.dot_product_attention`` ([batch, seq, heads, dim] layout)."""
    out = jax.nn.dot_product_attention(
        q[None, :, None], k[None, :, None], v[None, :, None], implementation="xla"
    )
    return jnp.sum(out)


def rabe_staats_loss(q, k, v, *, chunk):
    """Attention in key chunks (Rabe & Staats 2021): running max, sum and numerator."""
    (n_keys, d), n_q = k.shape, q.shape[0]
    assert n_keys % chunk == 0, (n_keys, chunk)
    kc = k.reshape(n_keys // chunk, chunk, d)
    vc = v.reshape(n_keys // chunk, chunk, d)
    qs = q / math.sqrt(d)

    @jax.checkpoint
    def step(carry, kv):
        m, s, num = carry
        kb, vb = kv
        logits = qs @ kb.T  # [queries, chunk]
        m_new = jnp.maximum(m, lax.stop_gradient(logits.max(-1)))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(logits - m_new[:, None])
        return (m_new, s * corr + p.sum(-1), num * corr[:, None] + p @ vb), None

    init = (jnp.full((n_q,), -jnp.inf, q.dtype), jnp.zeros((n_q,), q.dtype), jnp.zeros_like(q))
    (_, s, num), _ = lax.scan(step, init, (kc, vc))
    return jnp.sum(num / s[:, None])


def ce_loss(W, h, y):
    """An LM head's mean cross-entropy; ``W``: [d, vocab], ``h``: [tokens, d]."""
    return optax.softmax_cross_entropy_with_integer_labels(h @ W, y).mean()


def chunked_ce_loss(W, h, y, *, chunk):
    """The same loss over vocabulary chunks: online logsumexp, the label's logit per chunk."""
    d, vocab = W.shape
    assert vocab % chunk == 0, (vocab, chunk)

    @jax.checkpoint
    def step(carry, start):
        m, s, picked = carry
        logits = h @ lax.dynamic_slice_in_dim(W, start, chunk, axis=1)  # [tokens, chunk]
        m_new = jnp.maximum(m, lax.stop_gradient(logits.max(-1)))
        s = s * jnp.exp(m - m_new) + jnp.exp(logits - m_new[:, None]).sum(-1)
        idx = y - start
        inside = (idx >= 0) & (idx < chunk)
        hit = jnp.take_along_axis(logits, jnp.clip(idx, 0, chunk - 1)[:, None], axis=-1)[:, 0]
        return (m_new, s, picked + jnp.where(inside, hit, 0.0)), None

    t = h.shape[0]
    init = (jnp.full((t,), -jnp.inf, h.dtype), jnp.zeros((t,), h.dtype), jnp.zeros((t,), h.dtype))
    (m, s, picked), _ = lax.scan(step, init, jnp.arange(vocab // chunk) * chunk)
    return jnp.mean(m + jnp.log(s) - picked)


def pooling_loss(W1, w2, x):
    """Softmax-weighted pooling over the set ``x`` [set, d_in]."""
    h = jnp.tanh(x @ W1)  # [set, hidden]
    p = jax.nn.softmax(h @ w2)  # [set]
    return jnp.sum((p @ h) ** 2)


def _encode(p, x):
    z = jnp.tanh(x @ p["w1"]) @ p["w2"]
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)


def make_clip_loss(tau: float) -> Callable:
    def clip_loss(pa, pb, xa, xb):
        """CLIP-style loss: cross-entropy over the rows and over the columns of the logits."""
        logits = _encode(pa, xa) @ _encode(pb, xb).T / tau  # [batch a, batch b]
        labels = jnp.arange(xa.shape[0])
        ce = optax.softmax_cross_entropy_with_integer_labels
        return (ce(logits, labels).mean() + ce(logits.T, labels).mean()) / 2

    return clip_loss


def _normal(key, shape, scale=1.0):
    return scale * jax.random.normal(key, shape, jnp.float32)


def attention_args(s: Sizes, keys: int | None = None) -> tuple:
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    n = keys or s.keys
    d = s.head_dim
    return _normal(kq, (s.queries, d)), _normal(kk, (n, d)), _normal(kv, (n, d))


def ce_args(s: Sizes, vocab: int | None = None) -> tuple:
    kw, kh, ky = jax.random.split(jax.random.key(1), 3)
    v = vocab or s.vocab
    W = _normal(kw, (s.d_model, v), 1 / math.sqrt(s.d_model))
    h = _normal(kh, (s.tokens, s.d_model))
    return W, h, jax.random.randint(ky, (s.tokens,), 0, v)


def pooling_args(s: Sizes) -> tuple:
    k1, k2, kx = jax.random.split(jax.random.key(2), 3)
    W1 = _normal(k1, (s.set_in, s.set_hidden), 1 / math.sqrt(s.set_in))
    w2 = _normal(k2, (s.set_hidden,), 1 / math.sqrt(s.set_hidden))
    return W1, w2, _normal(kx, (s.set_size, s.set_in))


def clip_args(s: Sizes) -> tuple:
    ks = jax.random.split(jax.random.key(3), 6)

    def enc(k1, k2):
        return {
            "w1": _normal(k1, (s.clip_in, s.clip_hidden), 1 / math.sqrt(s.clip_in)),
            "w2": _normal(k2, (s.clip_hidden, s.clip_embed), 1 / math.sqrt(s.clip_hidden)),
        }

    xa = _normal(ks[4], (s.batch, s.clip_in))
    xb = _normal(ks[5], (s.batch, s.clip_in))
    return enc(ks[0], ks[1]), enc(ks[2], ks[3]), xa, xb


# ---- the cases -------------------------------------------------------------------------------


@dataclasses.dataclass
class Serialized:
    """One ``serialize_axis`` setting of a case's loss, measured with auto and remat."""

    name: str  # a short label, e.g. "over keys"
    chunk: int
    settings: dict[str, Any]
    target: float | None  # graded memory ratio (auto), None: shown for comparison only


@dataclasses.dataclass
class Case:
    key: str
    short: str  # for the acceptance table
    title: str
    loss: Callable
    args: tuple
    diff: tuple[int, ...]  # argnums of value_and_grad
    serialized: list[Serialized]
    peers: dict[str, Callable]  # name -> loss with the same signature
    # "memory as the axis grows": axis length -> (args, peer losses) at the first chunk
    growth: dict[int, tuple[tuple, dict[str, Callable]]] | None = None


def _bind(f: Callable, chunk: int) -> Callable:
    def bound(*args):
        return f(*args, chunk=chunk)

    bound.__name__ = f.__name__
    return bound


def make_cases(s: Sizes) -> list[Case]:
    rabe_staats = {"Rabe-Staats scan+checkpoint": _bind(rabe_staats_loss, s.attn_chunk)}
    chunked_ce = {"hand-written chunked CE": _bind(chunked_ce_loss, s.vocab_chunk)}
    return [
        Case(
            "attention",
            "(a) attention",
            f"(a) Attention: {s.queries} queries over {s.keys} keys, d {s.head_dim}, chunk "
            f"{s.attn_chunk} keys, `argnums=(1, 2), axis=0`",
            attention_loss,
            attention_args(s),
            (0, 1, 2),
            [Serialized("over keys", s.attn_chunk, {"argnums": (1, 2), "axis": 0}, 0.30)],
            {"jax.nn.dot_product_attention (xla)": dpa_loss, **rabe_staats},
            {n: (attention_args(s, n), rabe_staats) for n in (s.keys // 2, s.keys, 2 * s.keys)},
        ),
        Case(
            "ce",
            "(b) cross-entropy",
            f"(b) Cross-entropy: {s.tokens} tokens, d {s.d_model}, vocabulary {s.vocab}; over "
            f"the vocabulary (chunk {s.vocab_chunk}, `argnums=0, axis=1`) and over the tokens "
            f"(chunk {s.token_chunk}, `argnums=(1, 2), axis=0`)",
            ce_loss,
            ce_args(s),
            (0, 1),
            [
                Serialized("over vocab", s.vocab_chunk, {"argnums": 0, "axis": 1}, 0.30),
                Serialized("over tokens", s.token_chunk, {"argnums": (1, 2), "axis": 0}, None),
            ],
            chunked_ce,
            {n: (ce_args(s, n), chunked_ce) for n in (s.vocab // 2, s.vocab, 2 * s.vocab)},
        ),
        Case(
            "pooling",
            "(c) pooling",
            f"(c) Softmax-weighted pooling over a set of {s.set_size} (d_in {s.set_in}, hidden "
            f"{s.set_hidden}), chunk {s.set_chunk}, `argnums=2, axis=0`",
            pooling_loss,
            pooling_args(s),
            (0, 1, 2),
            [Serialized("over the set", s.set_chunk, {"argnums": 2, "axis": 0}, 0.30)],
            {},
        ),
        Case(
            "clip",
            "(d) contrastive",
            f"(d) Contrastive (CLIP-style) loss over a batch of {s.batch} (encoders {s.clip_in}"
            f" -> {s.clip_hidden} -> {s.clip_embed}), rows of `xa` in chunks of {s.clip_chunk},"
            " `argnums=2, axis=0`",
            make_clip_loss(s.tau),
            clip_args(s),
            (0, 1, 2),
            [Serialized("over batch a", s.clip_chunk, {"argnums": 2, "axis": 0}, 0.40)],
            {},
        ),
    ]


# ---- measuring -------------------------------------------------------------------------------


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


# ---- reporting -------------------------------------------------------------------------------

HEADERS = [
    "method",
    "temp memory",
    "mem ratio",
    "target",
    "time ratio [IQR]",
    "n",
    "max rel diff",
    "stacked",
    "stops",
]


def _fmt_time(row: dict) -> str:
    lo, hi = row["spread"]
    return f"{row['time_ratio']:.2f} [{lo:.2f}, {hi:.2f}]"


def table_rows(res: dict) -> list[list[str]]:
    out = [
        [
            "original",
            fmt_bytes(res["base_temp"]),
            "1.000",
            "-",
            f"1 ({res['base_time'] * 1e3:.0f} ms)",
            "-",
            "-",
            "-",
            "-",
        ]
    ]
    for name, row in res["rows"].items():
        ser, mode = res["labels"].get(name, (None, None))
        if ser is not None:
            label = f"serialize_axis {ser.name}, chunk {ser.chunk}: {mode}"
            plan = res["plans"][ser.name]
            stacked = fmt_bytes(plan["stacked"]) if "stacked" in plan else "?"
            stops = str(len(plan["stops"])) if "stops" in plan else "?"
            target = f"<= {ser.target:.2f}" if ser.target is not None and "auto" in mode else "-"
        else:
            label, stacked, stops, target = name, "-", "-", "-"
        if "error" in row:
            out.append([label, "error", "-", target, "-", "-", row["error"][:60], stacked, stops])
            continue
        out.append(
            [
                label,
                fmt_bytes(row["temp"]),
                f"{row['mem_ratio']:.3f}",
                target,
                _fmt_time(row),
                str(row["n"]),
                f"{row['diff']:.1e}",
                stacked,
                stops,
            ]
        )
    return out


GROWTH_HEADERS = ["program", "axis length", "original", "serialized (auto)", "ratio", "peer"]


def growth_rows(res: dict) -> list[list[str]]:
    rows = []
    for n, mem in res["growth"].items():
        orig, ser = mem.get("original"), mem.get("serialized")
        peers = [(k, v) for k, v in mem.items() if k not in ("original", "serialized")]
        ok = isinstance(orig, int) and isinstance(ser, int)
        rows.append(
            [
                res["case"].key,
                str(n),
                fmt_bytes(orig) if isinstance(orig, int) else "error",
                fmt_bytes(ser) if isinstance(ser, int) else "error",
                f"{ser / orig:.3f}" if ok else "-",
                "; ".join(
                    f"{k}: {fmt_bytes(v) if isinstance(v, int) else 'error'}" for k, v in peers
                )
                or "-",
            ]
        )
    return rows


def acceptance(results: dict[str, dict]) -> list[tuple[str, str, bool]]:
    """``(target, measured, ok)`` for every graded target."""
    checks = []
    for res in results.values():
        case = res["case"]
        short = case.short
        for ser in case.serialized:
            row = res["rows"].get(f"{ser.name}: auto", {})
            what = f"{short} {ser.name}, chunk {ser.chunk}, auto"
            if "error" in row or not row:
                checks.append((f"{what}: runs", row.get("error", "missing")[:80], False))
                continue
            mode = res["labels"][f"{ser.name}: auto"][1]
            if ser.target is not None:
                checks.append(
                    (
                        f"{what}: temp memory <= {ser.target:.2f}x original",
                        f"{row['mem_ratio']:.3f}x ({mode})",
                        row["mem_ratio"] <= ser.target,
                    )
                )
                checks.append(
                    (
                        f"{what}: time <= {TIME_TARGET:.1f}x original",
                        f"{row['time_ratio']:.2f}x",
                        row["time_ratio"] <= TIME_TARGET,
                    )
                )
            checks.append(
                (
                    f"{what}: value and gradients within {DIFF_TARGET:.0e} of the original",
                    f"{row['diff']:.1e}",
                    row["diff"] <= DIFF_TARGET,
                )
            )
        if res["growth"]:
            sizes = sorted(res["growth"])
            lo, hi = res["growth"][sizes[0]], res["growth"][sizes[-1]]
            what = (
                f"{short}: serialized memory grows <= {GROWTH_TARGET:g}x from "
                f"{sizes[0]} to {sizes[-1]}"
            )
            if all(isinstance(m.get(k), int) for m in (lo, hi) for k in ("original", "serialized")):
                g_ser = hi["serialized"] / max(lo["serialized"], 1)
                g_orig = hi["original"] / max(lo["original"], 1)
                checks.append(
                    (what, f"{g_ser:.2f}x (original {g_orig:.2f}x)", g_ser <= GROWTH_TARGET)
                )
            else:
                checks.append((what, "error", False))
    return checks


def stops_text(res: dict) -> list[str]:
    lines = []
    for ser in res["case"].serialized:
        plan = res["plans"][ser.name]
        if "error" in plan:
            lines.append(f"- {ser.name}: `explain` failed: {plan['error']}")
        elif not plan["stops"]:
            lines.append(f"- {ser.name}: the region does not stop (no barrier).")
        else:
            lines.append(f"- {ser.name}: the region stops at " + "; ".join(plan["stops"]))
        if plan.get("warning"):
            lines.append(f"  ({plan['warning']})")
    return lines


def markdown(results, checks, elapsed, cpu, load, quick) -> str:
    parts = [
        "## Streamed normalisers: softmax, logsumexp and label look-ups "
        "(`benchmarks/normalisers.py`)",
        "",
        f"jax {jax.__version__}, backend `{jax.default_backend()}`, "
        f"{platform.machine()} with {os.cpu_count()} CPU cores; "
        f"{'quick sizes, ' if quick else ''}run time {elapsed:.0f} s wall, {cpu:.0f} s CPU "
        f"(load average {load:.1f} at the end). Programs whose chunked axis is normalised over "
        "inside the region: attention's softmax over the keys, a cross-entropy's logsumexp "
        "and label look-up over the vocabulary, a softmax over a set, a contrastive loss whose "
        "column cross-entropy normalises over the chunked batch. float32, "
        "`value_and_grad` with respect to the parameters and the chunked inputs. *mem ratio*: "
        "temp memory / the original's. *time ratio*: median over paired rounds of time / the "
        "original's time in the same round, with the interquartile range (`n`: rounds). "
        "*max rel diff*: value and gradients vs the original's, per leaf, relative to the "
        "leaf's magnitude (floored at 1e-3 of the largest leaf). *stacked*: what the plan "
        "still stacks back to full size; *stops*: the places its region stops (listed below "
        "each table).",
        "",
        "### Acceptance",
        "",
        md_table(
            ["target", "measured", "verdict"],
            [[t, m, "PASS" if ok else "**FAIL**"] for t, m, ok in checks],
            right_from=3,
        ),
        "",
    ]
    for res in results.values():
        parts += [f"### {res['case'].title}", "", md_table(HEADERS, table_rows(res), 1), ""]
        parts += stops_text(res) + [""]
    grow = [r for res in results.values() if res["growth"] for r in growth_rows(res)]
    if grow:
        parts += [
            "### Memory as the axis grows (fixed chunk)",
            "",
            md_table(GROWTH_HEADERS, grow, right_from=1),
            "",
        ]
    return "\n".join(parts)


def write_section(path: str, text: str) -> None:
    """Replace (or append) the ``normalisers`` section of ``path``; keep everything else.

    Also names this script in the list of scripts at the top of the file.
    """
    write_doc_section(path, SECTION, text)
    with open(path) as fh:
        head, sep, rest = fh.read().partition("<!-- ")
    if "benchmarks/normalisers.py" not in head:
        with open(path, "w") as fh:
            fh.write(_list_script(head) + sep + rest)


def _list_script(head: str) -> str:
    """``head`` with this script added after the last ``python benchmarks/...`` it names.

    The paragraph that names it is re-wrapped at 96 columns, as the rest of the file.
    """
    scripts = list(re.finditer(r"`python\s+benchmarks/\w+\.py`", head))
    if not scripts:
        return head
    at = scripts[-1].end()
    head = head[:at] + ", `python benchmarks/normalisers.py`" + head[at:]
    start = head.rfind("\n\n", 0, at) + 2 if "\n\n" in head[:at] else 0
    end = head.find("\n\n", at)
    end = len(head.rstrip("\n")) if end < 0 else end
    text = " ".join(head[start:end].split())
    wrapped = textwrap.fill(text, width=96, break_long_words=False, break_on_hyphens=False)
    return head[:start] + wrapped + head[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~20 s)")
    parser.add_argument(
        "--write", action="store_true", help="rewrite the normalisers section of --doc"
    )
    parser.add_argument(
        "--doc", default=os.path.join(ROOT, "docs", "benchmarks.md"), help="Markdown file"
    )
    parser.add_argument(
        "--cases", default="attention,ce,pooling,clip", help="comma-separated subset to run"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="plans and tracebacks")
    opts = parser.parse_args(argv)
    sizes = QUICK if opts.quick else FULL
    # Until the region streams its normaliser, most plans stack their outputs; say it once.
    warnings.filterwarnings("ignore", message=".*not expected to save memory")

    t_start = time.perf_counter()
    print(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPU cores"
        + (" [quick]" if opts.quick else "")
    )
    wanted = opts.cases.split(",")
    results: dict[str, dict] = {}
    for case in make_cases(sizes):
        if case.key not in wanted:
            continue
        print(f"\n== {case.title}", flush=True)
        res = run_case(case, sizes, opts.verbose)
        results[case.key] = res
        print(
            f"compiled {1 + len(res['rows'])} programs in {res['t_compile']:.0f} s, "
            f"timed in {res['t_time']:.0f} s"
        )
        print(md_table(HEADERS, table_rows(res), 1))
        for line in stops_text(res):
            print(line)
        if res["growth"]:
            print()
            print(md_table(GROWTH_HEADERS, growth_rows(res), 1))

    checks = acceptance(results)
    elapsed = time.perf_counter() - t_start
    cpu, load = time.process_time(), os.getloadavg()[0]
    text = markdown(results, checks, elapsed, cpu, load, opts.quick)
    print("\n### Acceptance" + (" (quick sizes)" if opts.quick else "") + "\n")
    print(
        md_table(
            ["target", "measured", "verdict"],
            [[t, m, "PASS" if ok else "**FAIL**"] for t, m, ok in checks],
            right_from=3,
        )
    )
    print(f"\ntotal run time {elapsed:.0f} s wall, {cpu:.0f} s CPU (load average {load:.1f})")
    if opts.write:
        write_section(opts.doc, text)
    failed = [t for t, _, ok in checks if not ok]
    print("result: OK" if not failed else f"FAILED: {len(failed)} of {len(checks)} targets")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
