"""``SerializedFunction.sweep``: the original and every ``(chunk, grad)`` pair, side by side.

Each function measured is the original, ``sf.original``, or a copy of ``sf`` with one chunk and
one gradient mode and the rest of ``sf``'s settings (``Settings`` with ``chunk`` and ``grad``
replaced, ``memory`` dropped). For each, ``jax.jit(jax.value_and_grad(g, argnums))`` is
lowered at the arguments and compiled once, where ``g`` reduces the function's floating
outputs to a scalar as the memory budget does (``_budget.scalar_of``). Then:

- memory: XLA's temp bytes of that compiled program (``memory_analysis()``; None where the
  backend does not report it);
- error: its first call (also the warm-up) gives value and gradients, compared with the
  original's by ``jaxpr_accum.testing.tree_difference``: the largest difference over every
  leaf, relative to that leaf's own magnitude (``inf`` where the trees differ in structure);
- time: ``repeats`` rounds, each calling every compiled program once in the same order (so
  drift, other processes and thermal state hit all of them alike), each call timed to
  ``block_until_ready``; the median per function.

Arguments with no array leaves (static Python values) are closed over, not traced. A copy
that fails to compile or run is a row with its ``error`` and no numbers; the original failing
is an error of the sweep itself. The copies' own ``PlanWarning`` (a chunk as large as the
axis is not expected to save memory) is not issued: each row carries its plan's ``warning``.
"""

from __future__ import annotations

import dataclasses
import operator
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from html import escape
from typing import Any

import jax
import numpy as np

from jaxpr_accum import _html
from jaxpr_accum._budget import scalar_of
from jaxpr_accum._cost import format_bytes
from jaxpr_accum._errors import PlanWarning
from jaxpr_accum._settings import GRAD_MODES, Settings

PLOT_EXTRA = "pip install 'jaxpr-accum[plot]'"


@dataclasses.dataclass
class Sweep:
    """What ``SerializedFunction.sweep`` measured: one row per function, the original first.

    ``rows``: dicts with ``chunk`` and ``grad`` (None for the original), ``mode`` (the gradient
    mode the plan took, which ``"auto"`` resolves), ``temp_bytes``, ``time_s`` (median),
    ``memory_ratio`` and ``time_ratio`` (to the original's), ``max_rel_err`` (the gradients'
    largest per-leaf relative difference from the original's), ``value_rel_err``, ``warning``
    (the plan's, if it is not expected to save memory) and ``error`` (None, or why the row has
    no numbers). ``str(sweep)`` is a table; ``sweep.plot()`` draws memory and time by chunk.
    """

    rows: list[dict[str, Any]]
    name: str
    axis_size: int
    argnums: tuple[int, ...]
    repeats: int

    def __str__(self) -> str:
        head = (
            f"jaxpr_accum sweep of {self.name}: axis of size {self.axis_size}, "
            f"value_and_grad with respect to argnums {self.argnums}, median of {self.repeats} "
            f"interleaved repeat{'s' if self.repeats != 1 else ''}"
        )
        cells = [_cells(r) for r in self.rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(COLUMNS)]

        def line(cs: Sequence[str]) -> str:
            return "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cs, widths, strict=True))
            ).rstrip()

        lines = [head, line(COLUMNS), "  ".join("-" * w for w in widths), *map(line, cells)]
        lines += [f"{_label(r)}: {r['error']}" for r in self.rows if r["error"]]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        def row(cells: Sequence[str], tag: str = "td") -> str:
            tds = (_html.cell(c, tag, "left" if i < 2 else "right") for i, c in enumerate(cells))
            return f"<tr>{''.join(tds)}</tr>"

        caption = (
            f"jaxpr_accum sweep of {self.name}: axis of size {self.axis_size}, value_and_grad "
            f"with respect to argnums {self.argnums}, median of {self.repeats} interleaved "
            f"repeat{'s' if self.repeats != 1 else ''}; ratios to the original's"
        )
        notes = [f"{_label(r)}: {r['error']}" for r in self.rows if r["error"]]
        notes += [f"{_label(r)}: {r['warning']}" for r in self.rows if r["warning"]]
        return (
            f'<div><table {_html.TABLE}><caption style="caption-side: top; text-align: left">'
            f"{escape(caption)}</caption><thead>{row(COLUMNS, 'th')}</thead><tbody>"
            + "".join(row(_cells(r)) for r in self.rows)
            + f"</tbody></table>{_html.items('notes', notes)}</div>"
        )

    def plot(self, path: str | None = None) -> Any:
        """A matplotlib ``Figure``: temp memory and time against the chunk, one line per
        gradient mode, the original's as a dashed horizontal line; with ``path``, also written
        there as a PNG. Needs matplotlib (``pip install 'jaxpr-accum[plot]'``)."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError(f"Sweep.plot needs matplotlib: {PLOT_EXTRA}") from e
        fig = Figure(figsize=(10, 4), layout="constrained")
        FigureCanvasAgg(fig)  # Agg: draws to memory and files, never to a window
        ax_mem, ax_time = fig.subplots(1, 2)
        original, rows = self.rows[0], self.rows[1:]
        mem_unit, mem_scale = _unit(self.rows, "temp_bytes", _BYTE_UNITS)
        time_unit, time_scale = _unit(self.rows, "time_s", _TIME_UNITS)
        panels = (
            (ax_mem, "temp_bytes", mem_scale, f"XLA temp memory of value_and_grad ({mem_unit})"),
            (ax_time, "time_s", time_scale, f"median time of value_and_grad ({time_unit})"),
        )
        chunks = sorted({r["chunk"] for r in rows})
        for ax, key, scale, title in panels:
            for grad in dict.fromkeys(r["grad"] for r in rows):
                pts = [(r["chunk"], r[key]) for r in rows if r["grad"] == grad]
                pts = [(c, v * scale) for c, v in pts if v is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"grad={grad}")
            if original[key] is not None:
                ax.axhline(original[key] * scale, color="k", ls="--", lw=1, label="original")
            ax.set_xscale("log", base=2)
            ax.set_xticks(chunks, [str(c) for c in chunks])
            ax.set_xlabel(f"chunk (axis of size {self.axis_size})")
            ax.set_title(title, fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        ax_mem.legend(fontsize=9)
        fig.suptitle(f"jaxpr_accum sweep of {self.name}", fontsize=11)
        if path is not None:
            fig.savefig(path, dpi=100)
        return fig


_BYTE_UNITS = (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10), ("B", 1.0))
_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6))


def _unit(rows: list[dict[str, Any]], key: str, units: tuple) -> tuple[str, float]:
    """The largest unit that the largest value of ``key`` reaches, and the factor to it."""
    top = max((r[key] for r in rows if r[key] is not None), default=0)
    name, size = next(((n, u) for n, u in units if top >= u), units[-1])
    return name, 1.0 / size


COLUMNS = (
    "chunk", "grad", "temp memory", "memory ratio", "time", "time ratio", "value err", "grad err"
)  # fmt: skip


def _label(row: dict[str, Any]) -> str:
    return "original" if row["chunk"] is None else f"chunk {row['chunk']} ({row['grad']})"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _cells(r: dict[str, Any]) -> list[str]:
    if r["chunk"] is None:
        return ["original", "-", _bytes(r["temp_bytes"]), "1", _time(r["time_s"]), "1", "-", "-"]
    grad = r["grad"] if r["mode"] in (None, r["grad"]) else f"{r['grad']} ({r['mode']})"
    if r["error"]:
        return [str(r["chunk"]), grad, "error", "-", "-", "-", "-", "-"]
    return [
        str(r["chunk"]),
        grad,
        _bytes(r["temp_bytes"]),
        _ratio(r["memory_ratio"]),
        _time(r["time_s"]),
        _ratio(r["time_ratio"]),
        _err(r["value_rel_err"]),
        _err(r["max_rel_err"]),
    ]


def _bytes(n: int | None) -> str:
    return "n/a" if n is None else format_bytes(n)


def _time(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.2f} ms"


# -- arguments ---------------------------------------------------------------------------------


def check_chunks(chunks: Any, axis_size: int) -> list[int]:
    """The chunks to measure, ascending: ``chunks``, or powers of two up to the axis size and
    the axis size itself."""
    if chunks is None:
        n = max(axis_size, 1)
        return sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
    items = [chunks] if hasattr(chunks, "__index__") else chunks
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise TypeError(f"`chunks` must be None, an int or a sequence of ints, got {chunks!r}")
    out = []
    for c in items:
        if isinstance(c, bool) or not hasattr(c, "__index__"):
            raise TypeError(f"`chunks` must hold positive ints, got {c!r} in {chunks!r}")
        if operator.index(c) < 1:
            raise ValueError(f"`chunks` must hold positive ints, got {c!r} in {chunks!r}")
        out.append(operator.index(c))
    if not out:
        raise ValueError("`chunks` is empty: pass at least one chunk size, or None")
    return sorted(set(out))


def check_grads(grads: Any) -> list[str]:
    items = [grads] if isinstance(grads, str) else grads
    if not isinstance(items, Iterable):
        raise TypeError(f"`grads` must be a sequence of gradient modes, got {grads!r}")
    out = list(dict.fromkeys(items))
    bad = [g for g in out if g not in GRAD_MODES]
    if bad:
        raise ValueError(
            f"`grads` must hold gradient modes among {', '.join(map(repr, GRAD_MODES))}; got "
            f"{bad[0]!r}"
        )
    if not out:
        raise ValueError(f"`grads` is empty: pass at least one of {GRAD_MODES}")
    return out


def check_argnums(argnums: Any, args: tuple) -> tuple[int, ...]:
    nums = argnums if isinstance(argnums, (tuple, list)) else (argnums,)
    if not nums:
        raise ValueError("`argnums` must name at least one argument")
    out = []
    for a in nums:
        if isinstance(a, bool) or not isinstance(a, int):
            raise TypeError(f"`argnums` must be an int or a tuple of ints, got {argnums!r}")
        if not -len(args) <= a < len(args):
            raise ValueError(
                f"`argnums` {a} is out of range for a sweep with {len(args)} positional argument(s)"
            )
        out.append(a % len(args))
    return tuple(out)


def _has_arrays(x: Any) -> bool:
    return any(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in jax.tree.leaves(x))


# -- measuring ---------------------------------------------------------------------------------


def measure_sweep(
    sf: Any,
    args: tuple,
    *,
    chunks: Any = None,
    grads: Any = ("auto",),
    argnums: Any = 0,
    repeats: int = 3,
    progress: bool | None = None,
    time_budget_s: float | None = None,
    check_precision: str | None = None,
) -> Sweep:
    """``sf.sweep(*args, ...)``. For the demo: ``time_budget_s``, fewer repeats where that
    many rounds would take longer than this, judged by the warm-up round; ``check_precision``,
    off CPU the values and gradients compared are those of programs compiled again at that
    matmul precision (``"highest"``: no TF32 rounding to drown the differences checked)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"`repeats` must be an int >= 1, got {repeats!r}")
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"`progress` must be None, True or False, got {progress!r}")
    modes = check_grads(grads)
    nums = check_argnums(argnums, args)
    if chunks is not None:
        check_chunks(chunks, 1)  # bad arguments fail before anything is traced
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    say = _Progress(progress)

    axis_size = sf.explain(*args).axis_size
    sizes = check_chunks(chunks, axis_size)
    dynamic = [i for i, a in enumerate(args) if _has_arrays(a)]
    static = [i for i in nums if i not in dynamic]
    if static:
        raise ValueError(f"`argnums` {static[0]} names an argument with no array leaves")
    dyn_args = [args[i] for i in dynamic]
    diff = tuple(dynamic.index(i) for i in nums)
    diff_arg: int | tuple[int, ...] = diff[0] if isinstance(argnums, int) else diff

    def closed(f: Callable) -> Callable:
        def scalar(*dyn: Any) -> Any:
            full = list(args)
            for i, x in zip(dynamic, dyn, strict=True):
                full[i] = x
            return scalar_of(jax.tree.leaves(f(*full)))

        return scalar

    fields = {f.name: getattr(sf.settings, f.name) for f in dataclasses.fields(Settings)}
    entries: list[tuple[dict[str, Any], Any]] = [(_row(None, None), sf.original)]
    for g in modes:
        for c in sizes:
            settings = Settings.validated(**{**fields, "chunk": c, "grad": g, "memory": None})
            entries.append((_row(c, g), type(sf)(sf.original, settings)))

    name = getattr(sf.original, "__name__", repr(sf.original))
    compiled: list[Any] = []
    results: list[Any] = []
    rounds: list[float] = []
    for step, (row, f) in enumerate(entries):
        say(f"[{step + 1}/{len(entries)}] compiling and checking {_label(row)}")
        exe: Any = None
        try:
            with warnings.catch_warnings():
                if row["chunk"] is not None:
                    warnings.simplefilter("ignore", PlanWarning)
                    plan = f.explain(*args)
                    row["mode"], row["warning"] = plan.grad, plan.warning
                fn = jax.jit(jax.value_and_grad(closed(f), argnums=diff_arg))
                exe = fn.lower(*dyn_args).compile()
                t0 = time.perf_counter()
                out = jax.block_until_ready(exe(*dyn_args))
                rounds.append(time.perf_counter() - t0)
                if check_precision is not None and jax.default_backend() != "cpu":
                    with jax.default_matmul_precision(check_precision):
                        fn = jax.jit(jax.value_and_grad(closed(f), argnums=diff_arg))
                        out = fn.lower(*dyn_args).compile()(*dyn_args)
        except Exception as e:
            if row["chunk"] is None:
                raise
            row["error"] = f"{type(e).__name__}: {e}"
            exe = out = None
        stats = None if exe is None else exe.memory_analysis()
        row["temp_bytes"] = None if stats is None else int(stats.temp_size_in_bytes)
        compiled.append(exe)
        results.append(out)

    if time_budget_s is not None and sum(rounds) > 0:
        repeats = max(1, min(repeats, int(time_budget_s / sum(rounds))))
    times: list[list[float]] = [[] for _ in entries]
    for r in range(repeats):
        say(f"timing round {r + 1}/{repeats} ({len(entries)} functions)")
        for exe, ts in zip(compiled, times, strict=True):
            if exe is not None:
                t0 = time.perf_counter()
                jax.block_until_ready(exe(*dyn_args))
                ts.append(time.perf_counter() - t0)

    base, (v0, g0) = entries[0][0], results[0]
    for (row, _), out, ts in zip(entries, results, times, strict=True):
        row["time_s"] = statistics.median(ts) if ts else None
        if out is None:
            continue
        row["memory_ratio"] = _div(row["temp_bytes"], base["temp_bytes"])
        row["time_ratio"] = _div(row["time_s"], base["time_s"])
        row["value_rel_err"] = _difference(out[0], v0)
        row["max_rel_err"] = _difference(out[1], g0)
    return Sweep([row for row, _ in entries], name, axis_size, nums, repeats)


def _row(chunk: int | None, grad: str | None) -> dict[str, Any]:
    return dict.fromkeys(
        ("temp_bytes", "time_s", "memory_ratio", "time_ratio", "max_rel_err", "value_rel_err"),
        None,
    ) | {"chunk": chunk, "grad": grad, "mode": None, "warning": None, "error": None}


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _difference(got: Any, ref: Any) -> float:
    from jaxpr_accum.testing import tree_difference

    try:
        return float(tree_difference(got, ref).max_rel)
    except AssertionError:  # the trees differ in structure, shapes or dtypes
        return float("inf")


class _Progress:
    """One line per step on stderr, when on."""

    def __init__(self, on: bool):
        self.on, self.t0 = on, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.on:
            took = time.perf_counter() - self.t0
            print(f"jaxpr_accum sweep [{took:6.1f} s] {message}", file=sys.stderr, flush=True)
