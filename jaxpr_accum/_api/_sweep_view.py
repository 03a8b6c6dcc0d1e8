"""How a ``Sweep`` shows: its text table, its HTML table and its matplotlib figure.

The functions take the ``Sweep`` (``_sweep``, as a ``Table``); this module imports nothing of
it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any, Protocol

from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._base._install import install_hint
from jaxpr_accum._report import _html

if TYPE_CHECKING:  # imported when drawn
    from matplotlib.figure import Figure


class Table(Protocol):
    """What the views read of a ``Sweep``: its rows (dicts of mixed values) and header."""

    rows: list[dict[str, Any]]
    name: str
    axis_size: int
    grad_argnums: tuple[int, ...]
    repeats: int


def text(sweep: Table) -> str:
    """The sweep as a table, one line per row, then the notes."""
    head = (
        f"jaxpr_accum sweep of {sweep.name}: axis of size {sweep.axis_size}, "
        f"value_and_grad with respect to grad_argnums {sweep.grad_argnums}, median of "
        f"{sweep.repeats} interleaved repeat{'s' if sweep.repeats != 1 else ''}"
    )
    cells = [_cells(r) for r in sweep.rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(COLUMNS)]

    def line(cs: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cs, widths, strict=True))
        ).rstrip()

    lines = [head, line(COLUMNS), "  ".join("-" * w for w in widths), *map(line, cells)]
    return "\n".join(lines + notes(sweep))


def notes(sweep: Table) -> list[str]:
    """The notes under the table, the same in text and HTML: rows without numbers, rows whose
    plan chunks another axis than ``sf``'s, the plans' warnings."""
    out = [f"{label(r)}: {r['error']}" for r in sweep.rows if r["error"]]
    out += [
        f"{label(r)}: chunks another axis, {r['axis']} (an axis found rather than named "
        "by `argnums` or `in_axes` is chosen at each chunk, among the axes longer than it)"
        for r in sweep.rows[1:]
        if r["axis"] is not None and r["axis"] != sweep.rows[0]["axis"]
    ]
    out += [f"{label(r)}: {r['warning']}" for r in sweep.rows if r["warning"]]
    return out


def html(sweep: Table) -> str:
    """The sweep as an HTML table (for notebooks), then the notes and the plans' warnings."""

    def row(cells: Sequence[str], tag: str = "td") -> str:
        tds = (_html.cell(c, tag, "left" if i < 2 else "right") for i, c in enumerate(cells))
        return f"<tr>{''.join(tds)}</tr>"

    caption = (
        f"jaxpr_accum sweep of {sweep.name}: axis of size {sweep.axis_size}, value_and_grad "
        f"with respect to grad_argnums {sweep.grad_argnums}, median of {sweep.repeats} interleaved "
        f"repeat{'s' if sweep.repeats != 1 else ''}; ratios to the original's"
    )
    listed = notes(sweep)
    return (
        f'<div><table {_html.TABLE}><caption style="caption-side: top; text-align: left">'
        f"{escape(caption)}</caption><thead>{row(COLUMNS, 'th')}</thead><tbody>"
        + "".join(row(_cells(r)) for r in sweep.rows)
        + f"</tbody></table>{_html.items('notes', listed)}</div>"
    )


def plot(sweep: Table, path: str | None = None) -> Figure:
    """``Sweep.plot``: memory and time panels on an Agg canvas (files and memory, never a
    window); time on a log scale where it spreads over more than 10x. matplotlib is imported
    here, so the package does not need it otherwise."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError as e:
        raise ImportError(f"Sweep.plot needs matplotlib: {install_hint('plot')}") from e
    fig = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(fig)  # Agg: draws to memory and files, never to a window
    ax_mem, ax_time = fig.subplots(1, 2)
    original, rows = sweep.rows[0], sweep.rows[1:]
    mem_unit, mem_scale = _unit(sweep.rows, "temp_bytes", _BYTE_UNITS)
    time_unit, time_scale = _unit(sweep.rows, "time_s", _TIME_UNITS)
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
        ax.set_xlabel(f"chunk (axis of size {sweep.axis_size})")
        ax.set_title(title, fontsize=10)
        values = [r[key] for r in sweep.rows if r[key]]
        if key == "time_s" and values and max(values) > 10 * min(values):
            ax.set_yscale("log")  # a mode 10x slower than the others would flatten them
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax_mem.legend(fontsize=9)
    fig.suptitle(f"jaxpr_accum sweep of {sweep.name}", fontsize=11)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def _two_and_five(v: float, _: object) -> str:
    """Minor tick labels of a log axis at 2 and 5 times a power of ten only (not 3, 4, 6...)."""
    lead = v / 10 ** math.floor(math.log10(v)) if v > 0 else 0
    return f"{v:g}" if round(lead, 6) in (2, 5) else ""


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


def label(row: dict[str, Any]) -> str:
    return "original" if row["chunk"] is None else f"chunk {row['chunk']} ({row['grad']})"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _cells(r: dict[str, Any]) -> list[str]:
    memory = "n/a" if r["temp_bytes"] is None else format_bytes(r["temp_bytes"])
    if r["chunk"] is None:
        return ["original", "-", memory, "1", _time(r["time_s"]), "1", "-", "-"]
    grad = r["grad"] if r["mode"] in (None, r["grad"]) else f"{r['grad']} ({r['mode']})"
    if r["error"]:
        return [str(r["chunk"]), grad, "error", "-", "-", "-", "-", "-"]
    return [
        str(r["chunk"]),
        grad,
        memory,
        _ratio(r["memory_ratio"]),
        _time(r["time_s"]),
        _ratio(r["time_ratio"]),
        _err(r["value_rel_err"]),
        _err(r["max_rel_err"]),
    ]


def _time(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.2f} ms"
