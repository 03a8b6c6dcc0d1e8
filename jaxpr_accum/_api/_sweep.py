"""``SerializedFunction.sweep``: the original and every ``(chunk, grad)`` pair, side by side.

Each function measured is the original, ``sf.original``, or a copy of ``sf`` with one chunk and
one gradient mode and the rest of ``sf``'s settings (``Settings.at``: ``chunk`` and ``grad``
replaced, ``memory`` dropped, an automatic axis pinned by its size). For each,
``jax.jit(jax.value_and_grad(g, grad_argnums))`` is lowered at the arguments and compiled once,
where ``g`` reduces the function's floating outputs to a scalar as the memory budget does
(``_budget.scalar_of``). Then:

- memory: XLA's temp bytes of that compiled program (None where the backend has none);
- error: its first call (the warm-up) gives value and gradients, compared with the original's
  leaf by leaf, relative to each leaf's magnitude (``inf`` where the trees differ);
- time: ``repeats`` rounds, each calling every program once in the same order (so drift and
  load hit all alike), timed to ``block_until_ready``; the median per function.

Arguments with no array leaves (static Python values) are closed over, not traced. A copy
that fails to compile or run is a row with its ``error`` and no numbers; the original failing
is an error of the sweep itself. The copies' own ``PlanWarning`` (a chunk as large as the
axis is not expected to save memory) is not issued: each row carries its plan's ``warning``.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import jax

from jaxpr_accum._api import _sweep_view
from jaxpr_accum._api._measure import FirstCall, Program, difference
from jaxpr_accum._api._method_args import check_chunks, check_grad_argnums, check_grads
from jaxpr_accum._base._dtypes import is_array
from jaxpr_accum._base._errors import PlanWarning
from jaxpr_accum._base._settings import Settings
from jaxpr_accum._planning._budget import temp_bytes_of
from jaxpr_accum._report._plan import Plan

if TYPE_CHECKING:  # imported when drawn
    from matplotlib.figure import Figure


class Swept(Protocol):
    """What a sweep reads of a ``SerializedFunction`` (``_function``, which imports this
    module): its original, its settings, its plan, and a copy with other settings."""

    def __init__(self, fun: Callable, settings: Settings) -> None: ...

    @property
    def original(self) -> Callable: ...

    @property
    def settings(self) -> Settings: ...

    def explain(self, *args: object) -> Plan: ...

    @property
    def __call__(self) -> Callable[..., object]: ...  # callable as the original (ParamSpec)


@dataclasses.dataclass
class Sweep:
    """What ``SerializedFunction.sweep`` measured: one row per function, the original first.

    ``str(sweep)`` is a table, its HTML the same, each with the same notes (failed rows, rows
    chunking another axis than ``sf``'s, the plans' warnings); ``plot`` draws them by chunk.

    Attributes:
        rows: Dicts with ``chunk`` and ``grad`` (``None`` for the original), ``mode`` (what
            ``"auto"`` resolved to), ``temp_bytes``, ``time_s`` (median), ``memory_ratio`` and
            ``time_ratio`` (to the original's), ``max_rel_err`` (gradients, per leaf) and
            ``value_rel_err``, ``axis`` (the axis chunked), ``warning`` and ``error``.
        name: The function's name.
        axis_size: The length of the serialized axis.
        grad_argnums: The positional arguments differentiated.
        repeats: The timing rounds.

    Examples:
        >>> sweep = sf.sweep(w, x, chunks=(2, 5), repeats=1, progress=False)  # as in the docs
        >>> [row["chunk"] for row in sweep.rows]
        [None, 2, 5]
    """

    rows: list[dict[str, Any]]
    name: str
    axis_size: int
    grad_argnums: tuple[int, ...]
    repeats: int

    def __str__(self) -> str:
        return _sweep_view.text(self)

    def _repr_html_(self) -> str:
        return _sweep_view.html(self)

    def plot(self, path: str | None = None) -> Figure:
        """Draw temp memory and time against the chunk, one line per mode (original: dashed).

        Args:
            path: Where to write the figure as a PNG too; ``None``: nowhere.

        Returns:
            The matplotlib ``Figure``.

        Raises:
            ImportError: matplotlib is missing (``pip install -e '.[plot]'`` from a clone).

        Examples:
            >>> fig = sweep.plot("sweep.png")
        """
        return _sweep_view.plot(self, path)


# -- arguments ---------------------------------------------------------------------------------


def _has_arrays(x: object) -> bool:
    return any(is_array(leaf) for leaf in jax.tree.leaves(x))


# -- measuring ---------------------------------------------------------------------------------


def measure_sweep(
    sf: Swept,
    args: tuple,
    *,
    chunks: object = None,
    grads: object = ("auto",),
    grad_argnums: object = 0,
    repeats: int = 3,
    progress: bool | None = None,
    time_budget_s: float | None = None,
    check_precision: str | None = None,
) -> Sweep:
    """``sf.sweep(*args, ...)``. For the demo: ``time_budget_s``, fewer repeats where that
    many rounds would take longer than this, judged by the warm-up round; ``check_precision``,
    off CPU the values and gradients compared are those of programs compiled again at that
    matmul precision (``"highest"``: no TF32 rounding to drown the differences checked)."""
    call = _check_call(
        args, chunks=chunks, grads=grads, grad_argnums=grad_argnums, repeats=repeats,
        progress=progress,
    )  # fmt: skip
    say = _Progress(call.progress)
    plan = sf.explain(*args)
    diff = tuple(call.dynamic.index(i) for i in call.grad_argnums)
    program = Program(args, call.dynamic, diff[0] if isinstance(grad_argnums, int) else diff)
    entries = [(_row(None, None) | {"axis": _axis(plan)}, sf.original)]
    for g in call.modes:
        for c in check_chunks(chunks, plan.axis_size):
            settings = sf.settings.at(c, g, plan.axis_size)
            entries.append((_row(c, g), type(sf)(sf.original, settings)))

    compiled, results, first_calls = [], [], []
    for step, (row, f) in enumerate(entries):
        say(f"[{step + 1}/{len(entries)}] compiling and checking {_sweep_view.label(row)}")
        first = _compile_and_check(program, row, f, check_precision)
        row["temp_bytes"] = None if first.compiled is None else temp_bytes_of(first.compiled)
        compiled.append(first.compiled)
        results.append(first.out)
        first_calls.append(first.seconds)

    if time_budget_s is not None and sum(first_calls) > 0:
        repeats = max(1, min(repeats, int(time_budget_s / sum(first_calls))))
    times = _time_rounds(program, compiled, repeats, say)
    _fill_rows([row for row, _ in entries], results, times)
    name = getattr(sf.original, "__name__", repr(sf.original))
    return Sweep([row for row, _ in entries], name, plan.axis_size, call.grad_argnums, repeats)


@dataclasses.dataclass(frozen=True)
class _Checked:
    """The sweep's arguments, checked: the gradient ``modes``, the ``grad_argnums``, the
    positions of the arguments with array leaves (``dynamic``), ``progress`` on or off."""

    modes: list[str]
    grad_argnums: tuple[int, ...]
    dynamic: list[int]
    progress: bool


def _check_call(
    args: tuple,
    *,
    chunks: object,
    grads: object,
    grad_argnums: object,
    repeats: object,
    progress: object,
) -> _Checked:
    """The sweep's arguments checked before anything is traced."""
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"`repeats` must be an int >= 1, got {repeats!r}")
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"`progress` must be None, True or False, got {progress!r}")
    modes = check_grads(grads)
    nums = check_grad_argnums(grad_argnums, args)
    if chunks is not None:
        check_chunks(chunks, 1)  # bad arguments fail before anything is traced
    dynamic = [i for i, a in enumerate(args) if _has_arrays(a)]
    if any(i not in dynamic for i in nums):
        raise ValueError(f"`grad_argnums` {grad_argnums!r} names an argument with no array leaves")
    if progress is None:
        progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return _Checked(modes=modes, grad_argnums=nums, dynamic=dynamic, progress=progress)


def _compile_and_check(program: Program, row: dict, f: Any, precision: str | None) -> FirstCall:
    """``Program.compile_and_check`` of one row's function; a copy's row gets its plan's mode,
    axis and warning (the copy's own ``PlanWarning`` is not issued: the row carries it), or
    its ``error`` and an empty ``FirstCall`` where it fails (the original failing is an error
    of the sweep itself)."""
    try:
        with warnings.catch_warnings():
            if row["chunk"] is not None:
                warnings.simplefilter("ignore", PlanWarning)
                plan = f.explain(*program.args)
                row["mode"], row["warning"], row["axis"] = plan.grad, plan.warning, _axis(plan)
            return program.compile_and_check(f, precision)
    except Exception as e:
        if row["chunk"] is None:
            raise
        row["error"] = f"{type(e).__name__}: {e}"
        return FirstCall(compiled=None, out=None, seconds=0.0)


def _time_rounds(
    program: Program, compiled: list, repeats: int, say: Callable[[str], None]
) -> list[list[float]]:
    """``repeats`` rounds, each calling every compiled program once in the same order."""
    times: list[list[float]] = [[] for _ in compiled]
    for r in range(repeats):
        say(f"timing round {r + 1}/{repeats} ({len(compiled)} functions)")
        for exe, ts in zip(compiled, times, strict=True):
            if exe is not None:
                ts.append(program.time(exe))
    return times


def _fill_rows(rows: list[dict], results: list, times: list[list[float]]) -> None:
    """Each row that ran: its median time, its ratios to the original's (the first row) and
    its differences from the original's value and gradients."""
    base, (v0, g0) = rows[0], results[0]
    for row, out, ts in zip(rows, results, times, strict=True):
        if out is not None:
            row["time_s"] = statistics.median(ts)
            row["memory_ratio"] = _div(row["temp_bytes"], base["temp_bytes"])
            row["time_ratio"] = _div(row["time_s"], base["time_s"])
            row["value_rel_err"] = difference(out[0], v0)
            row["max_rel_err"] = difference(out[1], g0)


def _row(chunk: int | None, grad: str | None) -> dict[str, Any]:
    return dict.fromkeys(
        ("temp_bytes", "time_s", "memory_ratio", "time_ratio", "max_rel_err", "value_rel_err"),
        None,
    ) | {"chunk": chunk, "grad": grad, "mode": None, "axis": None, "warning": None, "error": None}


def _axis(plan: Plan) -> str:
    return f"size {plan.axis_size} born at {plan.born}"


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


class _Progress:
    """One line per step on stderr, when on."""

    def __init__(self, on: bool):
        self.on, self.t0 = on, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.on:
            took = time.perf_counter() - self.t0
            print(f"jaxpr_accum sweep [{took:6.1f} s] {message}", file=sys.stderr, flush=True)
