"""Run one program-and-stack pair against the oracle, classify it, write its repro script.

A :class:`Pair` is a program (``programs.py``), a stack (``stacks.py``), a gradient mode, a
chunk size, how the axis is named (``argnums=``, ``in_axes=`` or automatic) and a data seed.
:func:`script` renders it as one standalone Python file: the layer helpers
(``runtime.py``, verbatim), the program, ``make_args``, ``run(g, args)`` applying the stack
to ``g``, and a ``__main__`` block that compares ``run(serialized(), args)`` with
``run(f, args)``. :func:`run_pair` executes that same text (not a copy of its logic), so a
report's script reproduces what the fuzzer ran.

Outcomes (:data:`OUTCOMES`):

* ``PASS``: the serialized function's result equals the original's under the stack
  (``jaxpr_accum.testing.assert_tree_close``: structure, shapes and dtypes exact, values within
  the float32 2e-4 relative to each leaf's magnitude);
* ``ORIGINAL_FAILS``: the original raises under the stack (say, forward mode through a
  ``custom_vjp``): skipped, not a failure;
* ``EXPECTED_ERROR``: the serialized function raises the documented ``ja.SerializeError``
  (nothing chunkable): counted separately, with the programs that raised it;
* ``MISMATCH``: a silently wrong value or gradient, the most serious; or, in a program with a
  counting user callback (``idioms.CALLBACKS``), the callbacks seeing another number of
  values than under the original;
* ``FALLBACK``: the serialized function raises an internal error under
  ``JAXPR_ACCUM_STRICT=1`` (the fuzzer's setting) but, run again without it, falls back to a
  narrower plan with a ``PlanWarning`` and matches the original: what a user sees is a
  warning and a plan that may save less memory; a finding, less serious than a crash;
* ``CRASH``: the serialized function raises anything else where the original runs (and
  still raises, or mismatches, without ``JAXPR_ACCUM_STRICT``);
* ``FUZZER_ERROR``: the generated script itself is broken (a bug in the fuzzer).

Failures are grouped into classes: a crash by its exception type and first line with numbers
and names normalised (:func:`crash_class`; a few known patterns get a short name, such as
``jvp_of_custom_vjp``), a mismatch by its stack family (the layers but ``jit`` and
``checkpoint``), its gradient mode and its triage (:func:`_triage`: ``wrong`` when the
serialized result is far further from a float64 run of the original than the float32
original is, ``precision`` when it is not, ``structure`` for pytree/shape/dtype differences).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
import time
import traceback
import types
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")

from hypothesis import strategies as st  # noqa: E402

from jaxpr_accum._base._settings import GRAD_MODES  # noqa: E402

from .programs import Program, programs  # noqa: E402
from .stacks import DATA, FAMILIES, Layer, arg_states, family_label, stacks  # noqa: E402

CHUNK_KINDS = ("1", "divisor", "non-divisor", "equal", "larger")
AXIS_SPECS = ("argnums", "in_axes", "auto")
OUTCOMES = (
    "PASS",
    "ORIGINAL_FAILS",
    "EXPECTED_ERROR",
    "MISMATCH",
    "CRASH",
    "FALLBACK",
    "FUZZER_ERROR",
)
FAILURES = ("MISMATCH", "CRASH", "FALLBACK", "FUZZER_ERROR")
STRICT = "JAXPR_ACCUM_STRICT"
RUNTIME_SOURCE = (Path(__file__).parent / "runtime.py").read_text()
#: compile with ``jax_disable_most_optimizations`` (about a third less XLA compile time; the
#: same setting for the original and the serialized function, and written into the repro
#: script); ``JAXPR_ACCUM_FUZZ_FULL_OPT=1`` turns it off
_FAST = "jax_disable_most_optimizations"
FAST_COMPILE = os.environ.get("JAXPR_ACCUM_FUZZ_FULL_OPT", "") in ("", "0")


@dataclasses.dataclass(frozen=True)
class Pair:
    program: Program
    layers: tuple[Layer, ...]
    mode: str
    chunk: int
    chunk_kind: str
    axis_spec: str = "argnums"
    seed: int = 0
    family: str = "mixed"

    @property
    def shard(self) -> bool:
        return any(lyr.kind == "shard_map" for lyr in self.layers)

    def stack_label(self) -> str:
        return family_label(self.program, self.layers)

    def summary(self) -> str:
        return (
            f"[{self.family}] {self.stack_label()} | mode={self.mode} chunk={self.chunk}"
            f" ({self.chunk_kind}) axis={self.axis_spec} | {self.program.summary()}"
        )


def chunk_for(n: int, kind: str, pick: int) -> int:
    """A chunk size of the kind for an axis of size ``n`` (``pick`` chooses among several)."""
    if kind == "1":
        return 1
    if kind == "equal":
        return n
    if kind == "larger":
        return n + 1 + pick % 3
    divisors = [k for k in range(2, n) if n % k == 0]
    others = [k for k in range(2, n) if n % k]
    options = divisors if kind == "divisor" else others
    if not options:  # n prime (no divisor), or n == 2 (no non-divisor below it)
        return 1 if kind == "divisor" else n + 1
    return options[pick % len(options)]


@st.composite
def pairs(draw: Any, family: str, eager_one_in: int = 8, idiom: str | None = None) -> Pair:
    """A program and a stack of ``family`` (one of ``stacks.FAMILIES``), a mode, a chunk;
    eager (no outer ``jit``) on one pair in ``eager_one_in`` (never with 0); ``idiom``: a
    head or callback of ``idioms.py`` every program has."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
    with_t = True if family == "vmap_unchunked" else None
    program = draw(programs(4 if family == "shard" else 13, with_t, idiom))
    layers = draw(stacks(program, family))
    # an outer jit on seven pairs in eight (what users do; op-by-op eager dispatch compiles
    # every primitive on its own: 3x the time of a jitted pair, 10x under vmap), eager on
    # the rest
    eager = eager_one_in > 0 and draw(st.integers(0, eager_one_in - 1)) == 0
    if (not layers or layers[-1].kind != "jit") and not eager:
        layers = (*layers, Layer("jit"))
    mode = draw(st.sampled_from(GRAD_MODES))
    chunk_kind = draw(st.sampled_from(CHUNK_KINDS))
    chunk = chunk_for(program.n, chunk_kind, draw(st.integers(0, 5)))
    axis_spec = draw(st.sampled_from(("argnums", "argnums", "argnums", "in_axes", "auto")))
    if axis_spec == "auto" and chunk >= program.n:
        # automatic mode looks for axes longer than the chunk: none, a SerializeError by design
        axis_spec = "argnums"
    seed = draw(st.integers(0, 2**16))
    return Pair(program, layers, mode, chunk, chunk_kind, axis_spec, seed, family)


# ------------------------------------------------------------------------------------------
# The script
# ------------------------------------------------------------------------------------------


def _serialize_call(pair: Pair) -> str:
    names = pair.program.args
    data = tuple(i for i, n in enumerate(names) if n in DATA)
    opts = f"chunk={pair.chunk}"
    if pair.axis_spec == "argnums":
        opts += f", argnums={data[0] if len(data) == 1 else data}"
    elif pair.axis_spec == "in_axes":
        axes = ", ".join("0" if n in DATA else "None" for n in names)
        opts += f", in_axes=({axes})"
    return f"ja.serialize_axis(f, {opts}, grad={pair.mode!r})"


def _make_args(pair: Pair) -> list[str]:
    prog = pair.program
    rows = prog.n * (8 if pair.shard else 1)
    make = {
        "p": "init_params(rng)",
        "x": f"sample_x(rng, {rows}, {prog.d})",
        "y": f"sample_y(rng, {rows}, {prog.ncls})",
        "m": f"sample_m(rng, {rows})",
        "t": "sample_t(rng)",
    }
    lines = ["def make_args(seed):", "    rng = np.random.default_rng(seed)"]
    for s in arg_states(prog, pair.layers):
        ops = f", {list(s.ops)}" if s.ops else ", []"
        lines.append(f"    {s.name} = stack(lambda: {make[s.name]}{ops})")
    lines.append(f"    return to_jax(({', '.join(prog.args)},))")
    return lines


def _runtime_for(pair: Pair) -> str:
    """``runtime.py`` without its docstring and without the layer helpers ``pair`` does not use."""
    body = RUNTIME_SOURCE[RUNTIME_SOURCE.index('"""', 3) + 3 :]
    chunks = re.split(r"\n(?=def |# -{10})", body)
    used = {f"L_{'shard' if lyr.kind == 'shard_map' else lyr.kind}" for lyr in pair.layers}
    keep = []
    for c in chunks:
        m = re.match(r"def (L_\w+)\(", c)
        if c.startswith("# -") or (m and m.group(1) not in used):
            continue
        keep.append(c.strip("\n"))
    return "\n\n\n".join(keep)


def script(pair: Pair) -> str:
    """The standalone repro script of ``pair``."""
    names = pair.program.args
    run = ["def run(g, args):", "    F = g"]
    run += ["    " + lyr.render(names) for lyr in pair.layers]
    run.append("    return F(*args)")
    header = [
        f'"""jaxpr_accum fuzz pair: {pair.summary()}',
        "",
        "Runs the stack `run` on the original `f` and on `serialized()`; they must agree.",
        '"""',
        "",
        "import os",
        "",
        'os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")',
        'os.environ.setdefault("JAX_PLATFORMS", "cpu")',
    ]
    if pair.shard:
        header.append('os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"')
    header += ["", "import warnings", "", "import jaxpr_accum as ja"]
    header += ["from jaxpr_accum.testing import assert_tree_close", ""]
    counted = pair.program.callback is not None
    main = [
        'if __name__ == "__main__":',
        '    warnings.simplefilter("ignore")',
        *([f"    jax.config.update({_FAST!r}, True)"] if FAST_COMPILE else []),
        f"    args = make_args({pair.seed})",
        "    ref = run(f, args)",
        *(["    seen_ref = calls()  # the values the user's callback saw"] if counted else []),
        "    got = run(serialized(), args)",
        *(["    seen_got = calls()"] if counted else []),
        "    assert_tree_close(got, ref)",
        *(["    assert seen_got == seen_ref, (seen_got, seen_ref)"] if counted else []),
        '    print("serialized matches the original")',
    ]
    parts = [
        "\n".join(header),
        "# ---- layer helpers (from tests/fuzz/runtime.py) ----\n" + _runtime_for(pair),
        "# ---- the program ----\n" + pair.program.source(),
        "\n".join(_make_args(pair)),
        "\n".join(run),
        f"def serialized():\n    return {_serialize_call(pair)}",
        "\n".join(main),
    ]
    return "\n\n\n".join(p.strip("\n") for p in parts) + "\n"


# ------------------------------------------------------------------------------------------
# Running and classifying
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
    pair: Pair
    outcome: str
    cls: str = ""  # the failure (or expected-error) class
    detail: str = ""  # the exception's first lines, or the comparison's message
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


_KNOWN = (
    ("jvp_of_custom_vjp", r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp"),
    ("shard_map_varying_manual_axes", r"varying manual axes|\bvma\b"),
    ("not_streamable", r"NotStreamable"),
    ("unhashable_literal", r"unhashable type: 'Literal'"),
    ("no_differentiation_rule", r"Differentiation rule for '(\w+)' not implemented"),
)


def _normalise(line: str) -> str:
    line = re.sub(r"0x[0-9a-f]+", "#", line)
    line = re.sub(r"\b[a-z]+\d*\[[^\]]*\]", "T[..]", line)  # avals f32[3,4]
    line = re.sub(r"\d+", "#", line)
    line = re.sub(r"'[^']{12,}'", "'..'", line)
    return line.strip()[:110]


def crash_class(exc: BaseException) -> str:
    name = type(exc).__name__
    text = f"{name}: {exc}"
    for label, pattern in _KNOWN:
        m = re.search(pattern, text)
        if m:
            return f"{label}({m.group(1)})" if m.groups() else label
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{name}: {_normalise(first)}"


def _size(rel: float) -> str:
    return "rel err >= 1e-2" if rel >= 1e-2 else "rel err < 1e-2"


def _first_lines(exc: BaseException, n: int = 6) -> str:
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tb = traceback.extract_tb(exc.__traceback__)
    import jaxpr_accum

    library = Path(jaxpr_accum.__file__).resolve().parent  # by path: the checkout's name varies
    inner = [fr for fr in tb if Path(fr.filename).resolve().is_relative_to(library)]
    head = "\n".join(lines[:n])[:1500]
    if not inner:
        return head
    return f"{head}\n  (raised in {inner[-1].filename.split('/')[-1]}:{inner[-1].lineno})"


def run_pair(pair: Pair) -> Result:
    """Run ``pair``'s script on the original and on the serialized function; classify."""
    import jax

    text = script(pair)
    filename = f"<fuzz pair {abs(hash(text)) % 10**10}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    module = types.ModuleType("fuzz_pair")  # a real module: flax dataclasses look it up
    sys.modules[module.__name__] = module
    start = time.perf_counter()
    fast = jax.config.read(_FAST)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            jax.config.update(_FAST, FAST_COMPILE)
            outcome, cls, detail = _outcome(text, filename, pair.seed, module.__dict__)
    finally:
        jax.config.update(_FAST, fast)
        linecache.cache.pop(filename, None)
        sys.modules.pop(module.__name__, None)
    if outcome == "MISMATCH":  # the class: where, and how wrong; the numbers go to the detail
        kind, _, numbers = cls.partition(": ")
        detail = f"{detail}\n  triage: {cls}" if numbers else detail
        cls = f"mismatch under {pair.stack_label()} in mode {pair.mode} ({kind})"
    return Result(pair, outcome, cls, detail, time.perf_counter() - start)


def _outcome(text: str, filename: str, seed: int, ns: dict[str, Any]) -> tuple[str, str, str]:
    import jax

    import jaxpr_accum as ja
    from jaxpr_accum.testing import assert_tree_close

    try:
        exec(compile(text, filename, "exec"), ns)
        args = ns["make_args"](seed)
    except Exception as e:
        return "FUZZER_ERROR", crash_class(e), _first_lines(e)
    calls = ns.get("calls", lambda: 0)  # the values a counting user callback saw
    try:
        calls()
        ref = jax.block_until_ready(ns["run"](ns["f"], args))
        seen_ref = calls()
    except Exception as e:
        return "ORIGINAL_FAILS", crash_class(e), _first_lines(e, 2)
    try:
        got = jax.block_until_ready(ns["run"](ns["serialized"](), args))
        seen_got = calls()
    except ja.SerializeError as e:
        first = (str(e).strip().splitlines() or [""])[0]
        return "EXPECTED_ERROR", _normalise(first), _first_lines(e, 3)
    except Exception as e:
        warning = _falls_back(ns, args, ref)
        if warning is not None:
            return "FALLBACK", crash_class(e), f"{_first_lines(e)}\n  without strict: {warning}"
        return "CRASH", crash_class(e), _first_lines(e)
    try:
        assert_tree_close(got, ref)
    except AssertionError as e:
        return "MISMATCH", _triage(ns, args, ref, got), str(e)[:1500]
    if seen_got != seen_ref:
        detail = f"the user's callbacks saw {seen_got} values, in the original {seen_ref}"
        return "MISMATCH", f"callback count: {detail}", detail
    return "PASS", "", ""


def _falls_back(ns: dict[str, Any], args: Any, ref: Any) -> str | None:
    """The serialized function run again without ``JAXPR_ACCUM_STRICT``: the first line of its
    ``PlanWarning`` when it then runs and matches the original (a fallback), else None."""
    import jax

    import jaxpr_accum as ja
    from jaxpr_accum.testing import assert_tree_close

    before = os.environ.get(STRICT)
    os.environ[STRICT] = "0"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = jax.block_until_ready(ns["run"](ns["serialized"](), args))
        assert_tree_close(got, ref)
    except Exception:
        return None
    finally:
        if before is None:
            os.environ.pop(STRICT, None)
        else:
            os.environ[STRICT] = before
    plan = [w for w in caught if issubclass(w.category, ja.PlanWarning)]
    first = str(plan[0].message).splitlines()[0][:300] if plan else "(no PlanWarning)"
    return first


def _triage(ns: dict[str, Any], args: Any, ref: Any, got: Any) -> str:
    """Is a mismatch wrong, or less accurate? The original run again in float64 is the truth:
    ``wrong`` when the serialized result is more than 10x further from it than the float32
    original is (and by more than the tolerance), ``precision`` otherwise; ``structure`` when
    the trees differ in structure, shapes or dtypes; the error's size when float64 fails."""
    import jax
    import jax.numpy as jnp

    from jaxpr_accum.testing import tree_difference

    def f64(tree: Any) -> Any:
        return jax.tree.map(
            lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
        )

    try:
        tree_difference(got, ref)
    except AssertionError:
        return "structure"
    x64 = jax.config.read("jax_enable_x64")
    try:
        jax.config.update("jax_enable_x64", True)
        truth = f64(jax.block_until_ready(ns["run"](ns["f"], f64(args))))
        err_ref = tree_difference(f64(ref), truth).max_rel
        err_got = tree_difference(f64(got), truth).max_rel
    except Exception:
        return _size(tree_difference(got, ref).max_rel)
    finally:
        jax.config.update("jax_enable_x64", x64)
    if err_got > 10 * err_ref and err_got > 2e-4:
        return f"wrong: {err_got:.1e} from float64, the original {err_ref:.1e}"
    return f"precision: {err_got:.1e} from float64, the original {err_ref:.1e}"


# ------------------------------------------------------------------------------------------
# Shrinking a failure to a small repro (structural, not Hypothesis's: a failure found in a
# long campaign is reduced directly, without searching for it again)
# ------------------------------------------------------------------------------------------


def _same(a: Result, b: Result) -> bool:
    if a.outcome != b.outcome:
        return False
    if a.outcome == "MISMATCH":  # the stack may shrink; the size of the error must not change
        return a.cls.rsplit("(", 1)[-1] == b.cls.rsplit("(", 1)[-1]
    return a.cls == b.cls


def _candidates(pair: Pair) -> list[Pair]:
    prog, out = pair.program, []
    rep = dataclasses.replace
    for i in range(len(pair.layers)):  # drop a layer
        out.append(rep(pair, layers=pair.layers[:i] + pair.layers[i + 1 :]))
    for i, lyr in enumerate(pair.layers):  # a vmap of fewer arguments
        if lyr.kind == "vmap" and sum(a is not None for a in lyr.in_axes) > 1:
            for j, a in enumerate(lyr.in_axes):
                if a is not None:
                    axes = lyr.in_axes[:j] + (None,) + lyr.in_axes[j + 1 :]
                    new = rep(lyr, in_axes=axes)
                    out.append(rep(pair, layers=pair.layers[:i] + (new,) + pair.layers[i + 1 :]))
        if isinstance(lyr.argnums, tuple) and len(lyr.argnums) > 1:
            for a in lyr.argnums:
                new = rep(lyr, argnums=a)
                out.append(rep(pair, layers=pair.layers[:i] + (new,) + pair.layers[i + 1 :]))
    simpler = [
        rep(prog, output="scalar", metric=None),
        rep(prog, guard=None),
        rep(prog, literal=None),
        rep(prog, label_lookup=False),
        rep(prog, callback=None),
        rep(prog, features="dense"),
    ]
    if len(prog.heads) > 1:
        for i in range(len(prog.heads)):
            simpler.append(rep(prog, heads=prog.heads[:i] + prog.heads[i + 1 :]))
    simpler.append(rep(prog, heads=tuple(rep(h, coef="") for h in prog.heads)))
    for n in sorted({2, 4, 6, prog.n - 1}):
        if 2 <= n < prog.n:
            simpler.append(rep(prog, n=n))
    simpler += [rep(prog, d=2), rep(prog, hdim=3)]
    out += [rep(pair, program=p) for p in simpler if p != prog]
    if pair.chunk_kind not in ("divisor", "1") and pair.program.n % 2 == 0:
        out.append(rep(pair, chunk=2 if pair.program.n > 2 else 1, chunk_kind="divisor"))
    if pair.axis_spec != "argnums":
        out.append(rep(pair, axis_spec="argnums"))
    return out


def _valid(pair: Pair) -> bool:
    try:
        arg_states(pair.program, pair.layers)
    except ValueError:
        return False
    n = pair.program.n
    return pair.chunk_kind not in ("equal",) or pair.chunk == n


def _fix_chunk(pair: Pair) -> Pair:
    n = pair.program.n
    if pair.chunk_kind == "equal":
        return dataclasses.replace(pair, chunk=n)
    if pair.chunk_kind == "larger":
        return dataclasses.replace(pair, chunk=n + 1)
    if pair.chunk >= n:
        return dataclasses.replace(pair, chunk=max(1, n - 1))
    return pair


def shrink(result: Result, budget_s: float = 120.0, log: Any = None) -> Result:
    """Greedily simplify ``result.pair`` while the failure stays the same (same class for a
    crash, a mismatch of the same size for a mismatch), within ``budget_s`` seconds."""
    best, start = result, time.perf_counter()
    improved = True
    while improved and time.perf_counter() - start < budget_s:
        improved = False
        for cand in _candidates(best.pair):
            cand = _fix_chunk(cand)
            if cand == best.pair or not _valid(cand) or time.perf_counter() - start > budget_s:
                continue
            r = run_pair(cand)
            if _same(r, best):
                if log:
                    log(f"    shrunk: {cand.summary()}")
                best, improved = r, True
                break
    return best
