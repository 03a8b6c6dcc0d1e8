"""The NaN/Inf family: random programs that make an invalid value in the forward pass, run
under ``jax_debug_nans`` / ``jax_debug_infs``; the original's report is the oracle.

A program (rendered as source, so that every operation has a line of its own in a file) is a
chain of sign-keeping operations on the data ``x`` (scaled by the parameters ``w``), one
operation that makes an invalid value somewhere, more operations, and a reduction over the
axis. The invalid value is made where the plan puts its operation: before the loop (on the
parameters alone), in the loop's body (on the data), or after it (on the reduced value).
The stack around it: a plain call, ``jax.jit``, ``jax.jit(jax.value_and_grad)``,
``jax.jit(jax.grad)`` or eager ``jax.value_and_grad``; every grad mode; chunks that divide
the axis, that do not, and one chunk.

The oracle is the original under the same stack, under ``jax.jit`` where the stack is eager
(a serialized function always runs compiled). The report compared: the error's first line
(``invalid value (nan) encountered in log``: the primitive) and its source line, the last
frame of the program's file in the original's traceback (its de-optimized run re-runs the
Python function) and, for the serialized one, that frame or the line its error notes
(``made by `log` at FILE:LINE``).
"""

from __future__ import annotations

import dataclasses
import re
import traceback
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from hypothesis import strategies as st

import jaxpr_accum as ja

from .loading import import_program

N, D = 12, 3
#: operations that keep each value's sign (so that the data's negative half stays negative)
KEEP_SIGN = (
    "jnp.tanh({v})",
    "jnp.sin({v})",
    "{v} * 1.5",
    "{v} + 0.5 * {v} ** 3",
    "jnp.arcsinh({v})",
)
#: operations on a value with negative entries that make an invalid value in the forward pass,
#: with the flag that reports it
MAKERS = {
    "jnp.log(h)": "jax_debug_nans",
    "jnp.sqrt(h)": "jax_debug_nans",
    "jnp.arccosh(h + 1.0)": "jax_debug_nans",
    "jnp.exp(-200.0 * h)": "jax_debug_infs",
}
#: operations on a finite value (after the maker: any)
AFTER = ("jnp.tanh({v})", "{v} * {v}", "jnp.cos({v})", "{v} + 1.0", "jnp.abs({v})")
PLACES = ("prologue", "body", "epilogue")
CALLS = ("plain", "jit", "jit_value_and_grad", "jit_grad", "value_and_grad")
EAGER = ("plain", "value_and_grad")
GRAD_MODES = ("auto", "remat", "fused", "native")
CHUNKS = (4, 5, N)  # dividing, not dividing, one chunk


@dataclasses.dataclass(frozen=True)
class NanPair:
    """One program with its stack, mode and chunk."""

    before: tuple[str, ...]
    maker: str
    after: tuple[str, ...]
    place: str
    call: str
    grad: str
    chunk: int

    @property
    def flag(self) -> str:
        return MAKERS[self.maker]

    def source(self) -> str:
        """The program: ``f(w, x)``, one operation a line."""
        lines = ["import jax", "import jax.numpy as jnp", "", "", "def f(w, x):"]
        if self.place == "prologue":  # on the parameters alone: w - 2 is negative
            lines += ["    h = w - 2.0", f"    h = {self.maker}", "    w = w + 0.0 * h"]
        lines += ["    h = x * w"]
        lines += ["    h = " + op.format(v="h") for op in self.before]
        if self.place == "body":
            lines += [f"    h = {self.maker}"]
            lines += ["    h = " + op.format(v="h") for op in self.after]
        lines += ["    s = jnp.mean(h, axis=0)"]  # the reduction over the axis
        if self.place == "epilogue":  # on the reduced value: -1 - |s| is negative
            lines += ["    h = -1.0 - jnp.abs(s)", f"    h = {self.maker}", "    s = s + h"]
            lines += ["    s = " + op.format(v="s") for op in self.after]
        lines += ["    return jnp.sum(s)", ""]
        return "\n".join(lines)

    def summary(self) -> str:
        return (
            f"{self.flag} {self.maker} in the {self.place}, {self.call}, grad={self.grad!r}, "
            f"chunk={self.chunk}"
        )


@st.composite
def nan_pairs(draw: Any) -> NanPair:
    ops = st.sampled_from(KEEP_SIGN)
    return NanPair(
        before=tuple(draw(st.lists(ops, max_size=3))),
        maker=draw(st.sampled_from(sorted(MAKERS))),
        after=tuple(draw(st.lists(st.sampled_from(AFTER), max_size=2))),
        place=draw(st.sampled_from(PLACES)),
        call=draw(st.sampled_from(CALLS)),
        grad=draw(st.sampled_from(GRAD_MODES)),
        chunk=draw(st.sampled_from(CHUNKS)),
    )


def load(pair: NanPair, directory: Path) -> tuple[Any, str]:
    """``(f, its file)``: the program written to a file of its own and imported."""
    return import_program(pair.source(), f"nan_program_{abs(hash(pair))}", directory)


def _call(how: str, f: Any, w: Any, x: Any) -> Any:
    if how == "plain":
        return f(w, x)
    if how == "jit":
        return jax.jit(f)(w, x)
    if how == "jit_value_and_grad":
        return jax.jit(jax.value_and_grad(f))(w, x)
    if how == "jit_grad":
        return jax.jit(jax.grad(f))(w, x)
    return jax.value_and_grad(f)(w, x)


def report(pair: NanPair, f: Any, file: str) -> tuple[str, int | None]:
    """``(the error's first line, the program's line it reports)`` under the pair's flag;
    ``("no error", None)`` when nothing is raised."""
    w = jnp.full((D,), 0.5, jnp.float32)
    x = jnp.linspace(-1.0, 1.0, N * D, dtype=jnp.float32).reshape(N, D)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
        with getattr(jax, pair.flag.removeprefix("jax_"))(True):  # jax.debug_nans / _infs
            try:
                jax.block_until_ready(_call(pair.call, f, w, x))
            except FloatingPointError as e:
                return str(e).splitlines()[0], _line(e, file)
    return "no error", None


def _line(e: BaseException, file: str) -> int | None:
    """The program's line that the error reports: its note (``made by `op` at FILE:LINE``),
    else the last frame of ``file`` in its traceback."""
    for note in getattr(e, "__notes__", ()):
        m = re.match(r"made by `\w+` at (.*):(\d+) \(", note)
        if m and m.group(1) == file:
            return int(m.group(2))
    frames = [fr.lineno for fr in traceback.extract_tb(e.__traceback__) if fr.filename == file]
    return frames[-1] if frames else None


#: ``check``'s answer where the original reports nothing: the invalid value is not in what
#: the stack computes (a value that ``jax.grad`` does not need, say); such pairs are redrawn
NO_ERROR = "the original reports no error"


#: ``check``'s answer for a documented difference (docs/semantics.md): under
#: ``jax_debug_infs`` alone and an eager ``jax.value_and_grad``, an Inf that no result of the
#: function or of its gradient holds (it becomes finite, its gradient a NaN) is reported by
#: ``jax.jit(f)``, whose forward pass hands it to the backward pass as a residual (an output,
#: which JAX checks), and not by the serialized function, whose loop keeps no residuals
RESIDUAL_ONLY = "an Inf that only the original's residuals hold"


def check(pair: NanPair, directory: Path) -> str | None:
    """None where the serialized function reports what the original reports, else why not
    (``NO_ERROR`` where the original reports nothing, ``RESIDUAL_ONLY`` for that
    documented difference)."""
    f, file = load(pair, directory)
    # a serialized function always runs compiled: called eagerly, its oracle is the original
    # under ``jax.jit`` (an invalid value that no output holds, an Inf that becomes a NaN
    # under ``jax_debug_infs`` alone, is reported by neither)
    expected = report(pair, jax.jit(f) if pair.call in EAGER else f, file)
    if expected[0] == "no error":
        return NO_ERROR
    if expected[1] is None:
        return f"the original reports {expected}: no line (the family's program is broken)"
    sf = ja.serialize_axis(f, chunk=pair.chunk, argnums=1, grad=pair.grad)
    got = report(pair, sf, file)
    if got == ("no error", None) and _residual_only(pair, f, file):
        return RESIDUAL_ONLY
    if got != expected:
        return f"{pair.summary()}: reported {got}, the original {expected}\n{pair.source()}"
    return None


def _residual_only(pair: NanPair, f: Any, file: str) -> bool:
    """Whether the original's invalid value is one that only its residuals hold: the eager
    ``value_and_grad`` under ``jax_debug_infs`` reports it, the same computation compiled
    whole (``jax.jit(jax.value_and_grad(f))``) does not."""
    if pair.call != "value_and_grad" or pair.flag != "jax_debug_infs":
        return False
    whole = dataclasses.replace(pair, call="jit_value_and_grad")
    return report(whole, f, file)[0] == "no error"
