"""The demo behind ``python -m jaxpr_accum demo``: the Monte-Carlo encoder-decoder of
``examples/mc_vae.py`` (installed: ``jaxpr_accum.examples.mc_vae``), original vs serialized.

Steps, each announced on stderr before it starts (the results go to stdout):

1. build the model (``mc_vae.problem``: one jitted program draws the batch and the parameters);
2. plan ``serialize_axis(loss, chunk=k)``: trace, find the sample axis, choose the gradient mode
   (``grad="auto"``); the plan is printed at the end;
3. one ``SerializedFunction.sweep`` of the original and each chunk, in the mode auto chose at
   ``k`` (or the modes asked for), with a line per program compiled and per timing round:

   - memory: XLA's own accounting, ``jax.jit(jax.value_and_grad(f)).lower(*args).compile()
     .memory_analysis().temp_size_in_bytes``, serialized vs original, in one process;
   - time: medians of interleaved repeats of the compiled ``value_and_grad``, as a ratio;
   - exactness: the largest difference of value and gradients against the original, each leaf
     relative to its own magnitude floored at 1e-3 of the largest leaf's
     (``jaxpr_accum.testing.tree_difference``).

Flax is needed (``pip install 'jaxpr-accum[flax]'``; from a clone, ``pip install -e '.[flax]'``:
the hint says the one that suits the install).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np

from jaxpr_accum._analysis._cost import format_bytes
from jaxpr_accum._base._install import install_hint
from jaxpr_accum._base._settings import GRAD_MODES

#: The relative tolerance on value and gradients.
EXACT_RTOL = 2e-4


def run_demo(
    *,
    quick: bool = False,
    chunks: Sequence[int] | None = None,
    repeats: int | None = None,
    time_budget_s: float = 10.0,
    grads: Sequence[str] | None = None,
    plot: str | None = None,
) -> int:
    """Run the demo; return the process exit code (0: every chunk size was exact).

    The table is ``SerializedFunction.sweep``'s: the original and each chunk in each of
    ``grads`` (None: the mode ``grad="auto"`` chooses at the chunk whose plan is printed).
    ``repeats`` is lowered (to no fewer than 1) when that many rounds of calls would not fit
    ``time_budget_s``. ``plot``: a path to write the sweep's figure to (PNG).
    """
    import jaxpr_accum as ja
    from jaxpr_accum._api._sweep import measure_sweep

    chunks = tuple(chunks or ((4,) if quick else (2, 4, 8)))
    repeats = repeats or (2 if quick else 3)
    k = 4 if 4 in chunks else chunks[0]  # the chunk whose plan is printed
    say = _Progress()
    print(
        "jaxpr_accum demo: a Monte-Carlo encoder-decoder whose decoder is vmapped over samples "
        "(examples/mc_vae.py, installed as jaxpr_accum.examples.mc_vae); its loss's "
        "value_and_grad is compiled as written and with the "
        f"samples in chunks of {', '.join(map(str, chunks))}, then checked, timed and "
        "explained. Progress on stderr.",
        flush=True,
    )
    loss, args = _model(quick, say)
    mode = grads[0] if grads else "auto"
    sf = ja.serialize_axis(loss, chunk=k, grad=mode)  # the axis is found, not named
    say(
        f"planning chunk {k}: tracing the loss, finding the sample axis"
        + (", choosing the gradient mode" if mode == "auto" else "")
    )
    plan = sf.explain(*args)
    if not grads:  # auto's choice at chunk k, measured at every chunk
        grads = (plan.grad,) if plan.grad in GRAD_MODES else ("auto",)
        say(f"grad='auto' chose {plan.grad!r} at chunk {k}; measuring {grads[0]!r} at each chunk")
    sweep = measure_sweep(
        sf, args, chunks=chunks, grads=grads, repeats=repeats, time_budget_s=time_budget_s,
        check_precision="highest", progress=True,
    )  # fmt: skip
    print(f"\ncompiled, checked and timed in {say.elapsed():.1f} s\n")
    print(sweep)
    ok = _check_rows(sweep.rows)
    print(f"\nsf.explain(...) for chunk={k}:\n")
    print(str(plan))
    if plot is not None:
        say(f"plotting to {plot}")
        sweep.plot(plot)
        print(f"\nplot written to {plot}")
    say("done")
    print("\nresult:", "OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


def _model(quick: bool, say: Callable[[str], None]) -> tuple[Callable[..., Any], tuple]:
    """``examples/mc_vae.py``'s ``problem`` at the demo's sizes, described on stdout."""
    say("importing the model (Flax), drawing a batch, initialising the parameters (compiles)")
    try:
        mc_vae = example("mc_vae")
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in ("flax", "optax"):
            raise
        raise SystemExit(f"the demo needs {missing}: {install_hint('flax')}") from e
    sizes = mc_vae.SMALL if quick else mc_vae.Sizes()
    loss, args = mc_vae.problem(sizes)
    n_params = sum(int(np.size(p)) for p in jax.tree.leaves(args[0]))
    print(
        f"model: batch of {sizes.batch} {sizes.height}x{sizes.width}x{sizes.channels} images, "
        f"{sizes.n_samples} Monte-Carlo samples, decoder widths {list(sizes.decoder_widths)}, "
        f"{n_params:,} parameters ({format_bytes(4 * n_params)})  [jax {jax.__version__}, "
        f"{jax.default_backend()}]",
        flush=True,
    )
    return loss, args


def example(name: str) -> ModuleType:
    """The example ``examples/<name>.py`` as the module ``jaxpr_accum.examples.<name>``:
    installed (a wheel, or an editable install, maps ``examples/`` there) or, where a source
    checkout is on ``sys.path`` without being installed, from that checkout's ``examples/``."""
    full = f"jaxpr_accum.examples.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as e:
        path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
        if e.name not in ("jaxpr_accum.examples", full) or not path.is_file():
            raise
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, path)
        assert spec is not None and spec.loader is not None
        sys.modules[full] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[full])
        except BaseException:
            del sys.modules[full]
            raise
    return sys.modules[full]


class _Progress:
    """A line per step on stderr, with the seconds since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, message: str) -> None:
        print(f"jaxpr_accum demo  [{self.elapsed():6.1f} s] {message}", file=sys.stderr, flush=True)


def _check_rows(rows: list[dict]) -> bool:
    """Print the original's time and whether every chunk's value and gradients are within
    ``EXACT_RTOL`` of the original's, then a line per row that is not; whether all are."""
    original, rows = rows[0], rows[1:]
    bad = [
        r
        for r in rows
        if r["error"] or not (r["value_rel_err"] <= EXACT_RTOL and r["max_rel_err"] <= EXACT_RTOL)
    ]
    print(
        f"(original value_and_grad: {original['time_s'] * 1e3:.1f} ms median; "
        f"errs are relative to the original's magnitude, tolerance {EXACT_RTOL:g}: "
        + ("all within)" if not bad else f"{len(bad)} FAIL)")
    )
    for r in bad:
        why = r["error"] or "differs from the original"
        print(f"FAIL: chunk {r['chunk']} ({r['grad']}): {why}")
    return not bad
