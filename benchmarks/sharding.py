"""Data parallelism: the chunked run sharded over 8 devices vs the same run on one device;
FSDP and tensor parallelism (``sharding_fsdp``).

Run from the repository root (CPU is fine: it simulates 8 devices)::

    python benchmarks/sharding.py              # Markdown tables: data parallel, then FSDP
    python benchmarks/sharding.py --repeats 31 --rows 4096
    python benchmarks/sharding.py --part fsdp --fsdp-rows 4096 16384

An MLP regression loss over ``rows`` rows is serialized with ``argnums=1`` (the batch) and
``chunk`` rows per chunk, and ``jax.jit(jax.value_and_grad(sf))`` is compiled twice:

* *sharded*: the batch placed with ``NamedSharding(mesh, P("data"))`` on an 8-device mesh,
  so every device scans its own ``rows / 8`` rows in chunks of ``chunk / 8`` and the
  accumulators are ``psum``-ed once after the loop;
* *one device*: the same function on the same (unsharded) batch: ``rows / chunk`` chunks of
  ``chunk`` rows.

Reported per gradient mode: the per-device temp memory of each
(``compiled.memory_analysis().temp_size_in_bytes``; for an SPMD program that figure is per
device), their ratio, and the median of the paired time ratios sharded / one device over
interleaved repeats (the order alternates, so drift affects both sides alike), with its
interquartile range. Values and gradients of both are checked against each other first.

On a CPU host the 8 "devices" share the host's cores, so the time ratio measures the overhead
of the sharded layout (shard_map, per-device loops, one all-reduce), not a speed-up; on 8
real accelerators the sharded run does 1/8 of the work per device.

``--part fsdp`` prints the FSDP tables of ``sharding_fsdp`` (per-device temp memory of the
original, ``serialize_axis`` gathering per chunk and once, and a hand-written scan at each of
``--fsdp-rows``; the step time of the two serialize_axis programs; the 4 x 2 mesh; the
collectives of every program by kind and place) and whether ``serialize_axis``
meets its targets: at most half the original's memory at the largest batch, below it at the
smallest, and at most the hand-written scan's at every batch.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from harness import fmt_bytes  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from measuring import temp_bytes_of  # noqa: E402
from sharding_fsdp import fsdp_rows, fsdp_tp_rows  # noqa: E402

import jaxpr_accum as ja  # noqa: E402

N_DEVICES = 8


def make_problem(rows: int, width: int, depth: int, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.RandomState(seed)
    dims = [64] + [width] * depth + [8]
    params = [
        (
            (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
            np.zeros((b,), np.float32),
        )
        for a, b in zip(dims[:-1], dims[1:], strict=True)
    ]
    batch = (
        rng.normal(size=(rows, dims[0])).astype(np.float32),
        rng.normal(size=(rows, dims[-1])).astype(np.float32),
    )

    def loss(params: Any, batch: Any) -> jax.Array:
        h, y = batch
        for w, b in params[:-1]:
            h = jax.nn.gelu(h @ w + b)
        w, b = params[-1]
        return jnp.mean((h @ w + b - y) ** 2)

    return loss, params, batch


def rel_err(a: Any, b: Any) -> float:
    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = float(np.max(np.abs(y), initial=0.0)) or 1.0
        worst = max(worst, float(np.max(np.abs(x - y))) / scale)
    return worst


def timed(fn: Any, args: tuple) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def measure(grad: str, args: argparse.Namespace, mesh: Any) -> dict[str, Any]:
    loss, params, batch = make_problem(args.rows, args.width, args.depth)
    # One SerializedFunction per placement: its trace cache is keyed on shapes and dtypes,
    # not on shardings, so one object would reuse the first placement's plan for the other.
    sf = ja.serialize_axis(loss, chunk=args.chunk, argnums=1, grad=grad)
    sf_one = ja.serialize_axis(loss, chunk=args.chunk, argnums=1, grad=grad)

    one = (jax.device_put(params), jax.device_put(batch))
    sharded = (
        jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(batch, NamedSharding(mesh, P("data"))),
    )
    c_one = jax.jit(jax.value_and_grad(sf_one)).lower(*one).compile()
    c_sh = jax.jit(jax.value_and_grad(sf)).lower(*sharded).compile()
    layout = sf.explain(*sharded).layout
    assert "sharded" in layout, layout
    assert "one device" in sf_one.explain(*one).layout

    out_one, out_sh = c_one(*one), c_sh(*sharded)
    err = rel_err(out_sh, out_one)
    assert err <= 2e-4, f"{grad}: sharded and one-device results differ by {err:.2e}"

    for _ in range(2):  # warm-up
        timed(c_one, one)
        timed(c_sh, sharded)
    ratios, t_one, t_sh = [], [], []
    for i in range(args.repeats):
        if i % 2:
            a, b = timed(c_sh, sharded), timed(c_one, one)
        else:
            b, a = timed(c_one, one), timed(c_sh, sharded)
        t_sh.append(a)
        t_one.append(b)
        ratios.append(a / b)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {
        "grad": sf.explain(*sharded).grad,
        "temp_one": temp_bytes_of(c_one),
        "temp_sharded": temp_bytes_of(c_sh),
        "time_one": statistics.median(t_one),
        "time_sharded": statistics.median(t_sh),
        "ratio": statistics.median(ratios),
        "ratio_iqr": (q1, q3),
        "err": err,
    }


def table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print()


def fsdp_tables(args: argparse.Namespace) -> None:
    """The FSDP tables (module docstring) and the targets' check."""
    width, depth = args.fsdp_width, args.fsdp_depth
    print(
        f"FSDP: {depth} layers of {width} x {width} sharded P('data', None) on {N_DEVICES} "
        "devices (Auto axes), chunk = N / 16, grad='remat', per-device temp memory\n"
    )
    by_rows = {n: {r["program"]: r for r in fsdp_rows(n, width, depth)} for n in args.fsdp_rows}
    programs = list(next(iter(by_rows.values())))
    cells = []
    for n, found in by_rows.items():
        base = found["original (GSPMD)"]["temp"]
        cells.append(
            [f"{n:,}"]
            + [f"{fmt_bytes(found[p]['temp'])} ({found[p]['temp'] / base:.2f}x)" for p in programs]
        )
    table(["batch N", *programs], cells)
    counts = [
        [f"{n:,}", p, r["loop"], r["outside"]]
        for n, found in by_rows.items()
        for p, r in found.items()
    ]
    table(["batch N", "program", "collectives inside the loop", "outside"], counts)
    times = [
        [f"{n:,}", p, fmt_bytes(r["temp"]), f"{r['time']:.2f} s"]
        for n, found in by_rows.items()
        for p, r in found.items()
        if "time" in r
    ]
    table(["batch N", "program", "temp / device", "step time"], times)
    n_tp = min(args.fsdp_rows)
    print(
        f"FSDP on 'data' and tensor parallel on 'model': mesh (4, 2), weights P('data', 'model'), "
        f"N = {n_tp:,}, chunk = N / 16\n"
    )
    tp = fsdp_tp_rows(n_tp, width, depth)
    table(
        ["program", "temp / device", "max rel. diff vs unsharded", "inside the loop", "outside"],
        [
            [r["program"], fmt_bytes(r["temp"]), f"{r['err']:.1e}", r["loop"], r["outside"]]
            for r in tp
        ],
    )
    ratio = {
        n: f["serialize_axis"]["temp"] / f["original (GSPMD)"]["temp"] for n, f in by_rows.items()
    }
    small, large = min(by_rows), max(by_rows)
    met = (
        ratio[large] <= 0.5
        and ratio[small] < 1
        and all(
            f["serialize_axis"]["temp"] <= f["hand-written scan"]["temp"] for f in by_rows.values()
        )
    )
    print(
        f"targets {'met' if met else 'NOT met'}: serialize_axis / original "
        + ", ".join(f"{r:.2f} at N={n:,}" for n, r in ratio.items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--grad", nargs="+", default=["auto", "remat"])
    parser.add_argument("--part", choices=("all", "dp", "fsdp"), default="all")
    parser.add_argument("--fsdp-rows", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--fsdp-width", type=int, default=1024)
    parser.add_argument("--fsdp-depth", type=int, default=6)
    args = parser.parse_args()

    assert jax.device_count() == N_DEVICES, jax.devices()
    if args.part != "fsdp":
        data_parallel_table(args)
    if args.part != "dp":
        fsdp_tables(args)


def data_parallel_table(args: argparse.Namespace) -> None:
    """The data-parallel table: the sharded run vs one device, per gradient mode."""
    mesh = jax.make_mesh((N_DEVICES,), ("data",))
    rows = [measure(g, args, mesh) for g in args.grad]

    print(
        f"MLP {args.depth}x{args.width}, {args.rows} rows, chunk {args.chunk} "
        f"({args.chunk // N_DEVICES} rows per device per chunk on {N_DEVICES} devices), "
        f"{args.repeats} interleaved repeats, backend {jax.default_backend()}\n"
    )
    header = [
        "grad",
        "temp / device, 8 devices",
        "temp, 1 device",
        "memory ratio",
        "median time, 8 devices",
        "median time, 1 device",
        "time ratio (median of pairs) [IQR]",
        "max rel. diff",
    ]
    cells = []
    for r in rows:
        cells.append(
            [
                r["grad"],
                fmt_bytes(r["temp_sharded"]),
                fmt_bytes(r["temp_one"]),
                f"{r['temp_sharded'] / r['temp_one']:.3f}",
                f"{r['time_sharded'] * 1e3:.1f} ms",
                f"{r['time_one'] * 1e3:.1f} ms",
                f"{r['ratio']:.2f} [{r['ratio_iqr'][0]:.2f}, {r['ratio_iqr'][1]:.2f}]",
                f"{r['err']:.1e}",
            ]
        )
    table(header, cells)


if __name__ == "__main__":
    main()
