"""The checkify family: random programs with checks that may or may not fire, under
``jax.experimental.checkify``; the original under the same stack is the oracle.

A program (rendered as source, one operation a line, so that every check has a line of its
own in a file) is a chain of operations on the data ``x`` (scaled by the parameters ``w``),
with one or two *sites* among them that can make an error where a row of ``x`` is below a
threshold: an out-of-bounds index (into the parameters, naming the row; or along a row),
an integer division by zero, a NaN from ``log`` in the forward pass, a NaN only in the
backward pass (``sqrt`` at 0), an out-of-bounds index only in the backward pass (a custom
VJP's), a user ``checkify.check``, ``+inf`` and ``-inf`` in rows whose sum over the axis is a
NaN (the original's in its reduction; the chunks' sums add them). The threshold decides whether a
site fires and in which rows (the data are not sorted, so the first erroring row falls in any
chunk, the remainder included), or never. Then a reduction over the axis, and perhaps a
last step that makes a NaN after the region (``tail``), and perhaps a NaN outside the region,
before its first line, after its last or between them (where it runs after the loop), in a
value of the parameters alone, in a part that runs as written, or in a sort of a column that
the loop takes per chunk (``outside``).

The stack: ``checkify`` with an error set (``user_checks`` ... ``all_checks``) around a plain
call, ``jax.grad``, ``jax.value_and_grad``, ``jax.jvp``, ``jax.vmap``, ``jax.grad`` or
``jax.jvp`` of a ``jax.vmap``, or ``jax.grad`` inside one, or inside ``jax.vmap`` (every
``jax.vmap`` over a batch of two: the data, and its rows reversed, which err sooner), the
function or its ``jax.grad`` called at each step of a ``lax.scan`` (on the data scaled
differently at each step, so that different sites fire at different steps); under
``jax.jit`` or eagerly; every grad mode; chunks that divide the axis, that do not, and one
chunk. Compared: ``err.get()``'s text and the
program's line the error's traceback names (None where it names none).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax.experimental import checkify

import jaxpr_accum as ja

from .loading import import_program

N, D = 12, 3
#: a site's line(s) on ``h`` (rows x D); it fires in the rows where ``x[:, 0] < t``
SITES = {
    "index": "h = h + jnp.take(w, jnp.where(x[:, :1] < {t}, 40 + jnp.arange(x.shape[0])[:, None], "
    "0), mode=None)",
    "index_row": "h = h + jnp.take_along_axis(h, jnp.where(x[:, :1] < {t}, 7, 0), axis=1, "
    "mode=None)",
    "div": "h = h + 1 // (x[:, :1] >= {t}).astype(jnp.int32)",
    "nan": "h = h + jnp.log(x[:, :1] - {t} + 1e-3)",
    "backward_nan": "h = h + jnp.sqrt(jnp.maximum(x[:, :1] - {t}, 0.0))",
    "backward_index": "h = index_in_backward(h, x[:, :1] < {t})",
    "user": 'checkify.check(jnp.all(x[:, 0] >= {t}), "a row below {t}: {{m}}", m=jnp.min(x[:, 0]))',
    "infinities": "h = h + jnp.where(x[:, :1] < {t}, jnp.where(x[:, 1:2] < 0, -jnp.inf, jnp.inf), "
    "0.0)",
}  # fmt: skip
#: a custom VJP whose backward pass alone looks up out of bounds, naming the row
BACKWARD_INDEX = """@jax.custom_vjp
def index_in_backward(h, bad):
    return h


def _forward(h, bad):
    return h, bad


def _backward(bad, ct):
    idx = jnp.where(bad, 40 + jnp.arange(bad.shape[0])[:, None], 0)
    return ct + jnp.take(jnp.ones(3), idx, mode=None), None


index_in_backward.defvjp(_forward, _backward)"""
#: a line outside the region that makes a NaN where ``c`` is 1e3 (not where it is -1e3): in a
#: value of the parameters alone (the loop does not need it), or in a ``lax.cond`` whose
#: branch sums over the axis (it runs as written)
OUTSIDE = {
    "params": "jnp.log(jnp.sum(w) - {c})",
    "whole": "jax.lax.cond(x[0, 0] > -1e9, lambda v: jnp.log(jnp.sum(v) - {c}), jnp.sum, x)",
    "column": "jnp.log(jnp.sort(x[:, 1])[0] - {c} / 1e3)",
}
#: where the line is: before the region's first line, after its last, or between its lines
#: (after the first site's, else after the first line: it runs after the loop)
OUTSIDE_WHERE = st.sampled_from(("before", "after", "between"))
THRESHOLDS = (-2.0, -0.9, -0.5, 0.0, 0.7)  # -2: never fires
DELAYS = (0.0, 0.6)  # how much lower a site's threshold is per step before a loop's last
OPS = ("jnp.tanh({v})", "{v} * 1.5", "jnp.sin({v})", "{v} + 0.5 * {v} ** 3")
ERRORS = {
    "user_checks": checkify.user_checks,
    "index_checks": checkify.index_checks,
    "div_checks": checkify.div_checks,
    "nan_checks": checkify.nan_checks,
    "float_checks": checkify.float_checks,
    "all_checks": checkify.all_checks,
}
CALLS = (
    "forward", "grad", "value_and_grad", "jvp", "vmap", "vmap_inside", "grad_of_vmap",
    "vmap_of_grad", "jvp_of_vmap", "steps", "grad_steps",
)  # fmt: skip
#: what ``x`` is scaled by at each step of the ``lax.scan`` of yours that calls the function
#: (``"steps"``) or its gradient (``"grad_steps"``): different sites fire at different steps
STEP_SCALES = (0.6, 1.4, -1.0)
GRAD_MODES = ("auto", "remat", "fused", "native")
CHUNKS = (4, 5, N)


@dataclasses.dataclass(frozen=True)
class CheckPair:
    """One program with its stack, mode and chunk."""

    sites: tuple[tuple[str, float], ...]
    ops: tuple[str, ...]
    errors: str
    call: str
    jit: bool
    grad: str
    chunk: int
    #: the loss's last step makes a NaN after the region (``log`` of a negative number)
    tail: bool = False
    #: the sites run in the body of a ``lax.scan`` of yours, of this many steps (0: none),
    #: each site's threshold lowered by its ``delays`` entry at each step before the last
    steps: int = 0
    delays: tuple[float, ...] = ()
    #: a NaN outside the region, ``(where, what, fires)``: ``"before"`` the region's first
    #: line or ``"after"`` its last, in a value of the parameters alone or in a part that runs
    #: as written (``OUTSIDE``'s keys), made or not
    outside: tuple[str, str, bool] | None = None

    def source(self) -> str:
        lines = ["import jax", "import jax.numpy as jnp", "from jax.experimental import checkify"]
        lines += ["", "", BACKWARD_INDEX, "", "", "def f(w, x):"]
        where, what, fires = self.outside or ("", "", False)
        outside = "    p = " + OUTSIDE[what].format(c=1e3 if fires else -1e3) if what else ""
        lines += [outside] if where == "before" else []
        lines += ["    h = x * w"]
        between_sites = where == "between" and len(self.sites) == 2 and not self.steps
        lines += [outside] if where == "between" and not between_sites else []
        indent = "    "
        if self.steps:
            lines += ["    def step(h, s):"]
            indent = "        "
        for i, (kind, t) in enumerate(self.sites):
            lines += [indent + "h = " + op.format(v="h") for op in self.ops[i::2]]
            late = self.delays[i] if self.steps else 0.0
            when = f"({t} - {late} * ({self.steps - 1} - s))" if late else t
            lines += [indent + SITES[kind].format(t=when)]
            lines += [outside] if between_sites and i == 0 else []
        if self.steps:
            lines += [
                "        return h, None",
                f"    h, _ = jax.lax.scan(step, h, jnp.arange({self.steps}.0))",
            ]
        lines += [outside] if where == "after" else []
        loss = "jnp.sum(jnp.mean(h, axis=0) ** 2)"
        loss = f"jnp.log({loss} - 1e6)" if self.tail else loss
        lines += [f"    return {loss}" + (" + p" if what else ""), ""]
        return "\n".join(lines)

    def summary(self) -> str:
        sites = ", ".join(f"{k} below {t}" for k, t in self.sites)
        how = ("jit " if self.jit else "eager ") + self.call + (", NaN after" if self.tail else "")
        if self.steps:
            how += f", in a scan of {self.steps} steps (delays {self.delays})"
        if self.outside:
            where, what, fires = self.outside
            how += f", a NaN{'' if fires else ' not'} made {where} the region, in {what}"
        return f"{sites}; {self.errors}, {how}, grad={self.grad!r}, chunk={self.chunk}"


@st.composite
def check_pairs(draw: Any) -> CheckPair:
    site = st.tuples(st.sampled_from(sorted(SITES)), st.sampled_from(THRESHOLDS))
    return CheckPair(
        sites=tuple(draw(st.lists(site, min_size=1, max_size=2))),
        ops=tuple(draw(st.lists(st.sampled_from(OPS), max_size=3))),
        errors=draw(st.sampled_from(sorted(ERRORS))),
        call=draw(st.sampled_from(CALLS)),
        jit=draw(st.booleans()),
        grad=draw(st.sampled_from(GRAD_MODES)),
        chunk=draw(st.sampled_from(CHUNKS)),
        tail=draw(st.booleans()),
        steps=draw(st.sampled_from((0, 0, 3))),
        delays=tuple(draw(st.lists(st.sampled_from(DELAYS), min_size=2, max_size=2))),
        outside=draw(
            st.none() | st.tuples(OUTSIDE_WHERE, st.sampled_from(sorted(OUTSIDE)), st.booleans())
        ),
    )


def load(pair: CheckPair, directory: Path) -> tuple[Any, str]:
    """``(f, its file)``: the program written to a file of its own and imported."""
    return import_program(pair.source(), f"check_program_{abs(hash(pair))}", directory)


#: ``x[:, 0]``: the first row below -0.9 is 10 (the remainder of chunks of 5), below -0.5 it
#: is 9, below 0 it is 5, below 0.7 it is 1
FIRST_COLUMN = (0.9, 0.5, 0.8, 0.3, 0.95, -0.1, 0.7, 0.2, 0.6, -0.6, -0.95, 0.4)


def data() -> tuple[jax.Array, jax.Array]:
    """``(w, x)``: the rows of ``x`` in no order (``FIRST_COLUMN``)."""
    rows = np.sin(np.arange(N * D, dtype=np.float32) * 2.3).reshape(N, D)
    rows[:, 0] = FIRST_COLUMN
    return jnp.full((D,), 0.5, jnp.float32), jnp.asarray(rows)


def _stacked(pair: CheckPair, f: Any) -> Any:
    errors = ERRORS[pair.errors]
    batched = jax.vmap(f, in_axes=(None, 0))
    if pair.call == "vmap":
        run = jax.vmap(checkify.checkify(f, errors=errors), in_axes=(None, 0))
    else:
        inner = {
            "forward": f,
            "grad": jax.grad(f, argnums=(0, 1)),
            "value_and_grad": jax.value_and_grad(f),
            "jvp": lambda w, x: jax.jvp(f, (w, x), (jnp.ones_like(w), jnp.ones_like(x))),
            "vmap_inside": jax.vmap(f, in_axes=(None, 0)),
            "grad_of_vmap": jax.grad(lambda w, x: jnp.sum(batched(w, x)), argnums=(0, 1)),
            "vmap_of_grad": jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=(None, 0)),
            "jvp_of_vmap": lambda w, x: jax.jvp(
                batched, (w, x), (jnp.ones_like(w), jnp.ones_like(x))
            ),
            "steps": _in_steps(f),
            "grad_steps": _in_steps(lambda w, x: _total(jax.grad(f, argnums=(0, 1))(w, x))),
        }[pair.call]
        run = checkify.checkify(inner, errors=errors)
    return jax.jit(run) if pair.jit else run


def _in_steps(g: Any) -> Any:
    """``g`` called at each step of a ``lax.scan`` of yours, on ``x`` scaled by the step's
    ``STEP_SCALES`` entry, its results summed."""

    def stepped(w: jax.Array, x: jax.Array) -> jax.Array:
        step = lambda total, scale: (total + g(w, x * scale), None)  # noqa: E731
        return jax.lax.scan(step, jnp.float32(0), jnp.asarray(STEP_SCALES))[0]

    return stepped


def _total(tree: Any) -> jax.Array:
    return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(tree))


def report(pair: CheckPair, f: Any, file: str) -> tuple[str | None, int | None, tuple]:
    """``(err.get(), the program's line the error names, the kinds of error that fired)``."""
    w, x = data()
    if "vmap" in pair.call:
        # both err: the first where x does, the second in x's rows reversed (sooner)
        x = jnp.stack([x, x[::-1]])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*not expected to save", ja.PlanWarning)
        err, _ = _stacked(pair, f)(w, x)
    exc = err.get_exception()
    if exc is None:
        return None, None, ()
    fired = tuple(sorted(e.error_type.__name__ for e, p in err._pred.items() if np.any(p)))
    first = exc if not hasattr(exc, "error_mapping") else next(iter(exc.error_mapping.values()))
    lines = [fr.line_num for fr in first.traceback_info.frames if fr.file_name == file]
    return err.get(), (lines[0] if lines else None), fired


#: ``check``'s answer where the original itself raises (JAX's checkify of ``take_along_axis``
#: under ``jax.vmap``); such pairs are redrawn
ORIGINAL_RAISES = "the original raises"
#: ``check``'s answer where fused (or auto's pick of it) meets an infinite cotangent: it
#: multiplies the cotangent into a chunk's Jacobian, so the NaN that ``inf`` makes there is
#: named by that product, not by the original's reduction (docs/errors.md); redrawn
FUSED_INFINITE_COTANGENT = "fused's product with an infinite cotangent"


def check(pair: CheckPair, directory: Path) -> str | None:
    """None where the serialized function reports what the original reports (an error, or
    none, never raising), ``ORIGINAL_RAISES``, ``FUSED_INFINITE_COTANGENT``, else how they
    differ."""
    f, file = load(pair, directory)
    try:
        expected = report(pair, f, file)
    except Exception:  # noqa: BLE001 (JAX's own defect: the pair is redrawn)
        return ORIGINAL_RAISES
    sf = ja.serialize_axis(f, chunk=pair.chunk, argnums=1, grad=pair.grad)
    try:
        got = report(pair, sf, file)
    except Exception as e:  # noqa: BLE001 (any exception is the finding)
        return f"{pair.summary()}: raised {type(e).__name__}: {e}\n{pair.source()}"
    if expected[1] is None:  # the original's names JAX's frames only (inside ``jnp``)
        got = (got[0], None, got[2])
    if got == expected:
        return None
    if _fused_infinite_cotangent(pair, expected, got):
        return FUSED_INFINITE_COTANGENT
    return f"{pair.summary()}: reported {got}, the original {expected}\n{pair.source()}"


def _fused_infinite_cotangent(pair: CheckPair, expected: tuple, got: tuple) -> bool:
    """Whether the difference is the one documented where fused meets infinities: both
    report only a NaN, in a gradient of a program with infinite rows."""
    return (
        any(kind == "infinities" for kind, _ in pair.sites)
        and pair.grad in ("fused", "auto")
        and pair.call in ("grad", "value_and_grad", "grad_of_vmap", "vmap_of_grad", "grad_steps")
        and expected[2] == got[2] == ("NaNError",)
    )
