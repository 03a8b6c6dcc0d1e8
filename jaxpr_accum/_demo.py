"""The demo behind ``python -m jaxpr_accum demo``: the seed-1 model, original vs serialized.

The model is the stochastic encoder-decoder from the motivating issue (``DESIGN.md``, seed 1):
an encoder produces ``mu, sigma`` of a latent image, 16 Monte-Carlo samples
``z = mu + sigma * normal(key, (16, ...))`` are drawn inside the module, and the decoder is
``jax.vmap``-ed over them inside ``@nn.compact``, exactly as the user wrote it. The loss is the
negative Gaussian log-likelihood of the unmasked image, averaged over samples and batch.
Sizes are chosen so that the decoder's activations over the 16 samples dominate the backward
pass's memory, which is the situation ``serialize_axis`` is for.

Measurements follow ``DESIGN.md`` ("Performance targets"):

- memory: XLA's own accounting, ``jax.jit(jax.value_and_grad(f)).lower(*args).compile()
  .memory_analysis().temp_size_in_bytes``, serialized vs original, in one process;
- time: medians of interleaved repeats of the compiled ``value_and_grad``, as a ratio;
- exactness: the largest difference of value and gradients against the original, each leaf
  relative to its own magnitude floored at 1e-3 of the largest leaf's
  (``jaxpr_accum.testing.tree_difference``).

The helpers here (``seed1_problem``, ``temp_bytes``, ``compare_exact``, ``time_interleaved``)
are also used by ``benchmarks/memory.py``. Flax is needed (``pip install -e '.[flax]'``).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: The relative tolerance on value and gradients (DESIGN.md, issue-2 acceptance).
EXACT_RTOL = 2e-4


# --------------------------------------------------------------------------------------------
# The seed-1 model
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Seed1Config:
    """Sizes of the seed-1 problem. The defaults run the demo in well under a minute on CPU."""

    batch: int = 4
    height: int = 32
    width: int = 32
    channels: int = 1
    latent: int = 4
    n_samples: int = 16
    encoder_width: int = 8
    decoder_widths: tuple[int, ...] = (32, 32, 32)
    sigma_floor: float = 1e-3
    seed: int = 42


QUICK_SEED1 = Seed1Config(height=16, width=16, decoder_widths=(16, 16))


def _flax_linen():
    try:
        import flax.linen as nn
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "the demo needs Flax: pip install -e '.[flax]' (or pip install flax optax)"
        ) from e
    return nn


def _build_modules(cfg: Seed1Config):
    """Define the linen modules of the seed (lazily, so that importing this file needs no Flax)."""
    nn = _flax_linen()

    def to_sigma(h):
        return cfg.sigma_floor + (1.0 - cfg.sigma_floor) * nn.softplus(h)

    class Encoder(nn.Module):  # type: ignore[name-defined]
        """Small on purpose: the encoder runs once, outside the sample axis."""

        @nn.compact
        def __call__(self, x):
            h = nn.Conv(features=cfg.encoder_width, kernel_size=(3, 3))(x)
            h = nn.relu(h)
            h = nn.Conv(features=2 * cfg.latent, kernel_size=(3, 3))(h)
            return h[..., : cfg.latent], to_sigma(h[..., cfg.latent :])

    class Decoder(nn.Module):  # type: ignore[name-defined]
        """The heavy part: its activations exist once per Monte-Carlo sample."""

        @nn.compact
        def __call__(self, z):
            h = z
            for w in cfg.decoder_widths:
                h = nn.relu(nn.Conv(features=w, kernel_size=(3, 3))(h))
            h = nn.Conv(features=2 * cfg.channels, kernel_size=(3, 3))(h)
            return h[..., : cfg.channels], to_sigma(h[..., cfg.channels :])

    class Model(nn.Module):  # type: ignore[name-defined]
        @nn.compact
        def __call__(self, masked_x, rng, n_samples: int):
            mu, sigma = Encoder()(masked_x)
            # Monte-Carlo samples of the latent, stacked on a new leading axis.
            z = jax.random.normal(key=rng, shape=(n_samples, *mu.shape))
            # Re-parametrisation trick.
            z = z * jnp.expand_dims(sigma, 0) + jnp.expand_dims(mu, 0)
            decoder = Decoder()
            # The line the user asked about: every sample's decoder activations at once.
            mu_x_hat, sigma_x_hat = jax.vmap(decoder, in_axes=0)(z)
            return mu_x_hat, sigma_x_hat

    return Model, Encoder, Decoder


def seed1_modules(cfg: Seed1Config | None = None):
    """``(Model, Encoder, Decoder)`` linen classes of the seed-1 problem (for hand-written peers).

    ``Model().init(...)["params"]`` holds the two submodules under ``"Encoder_0"`` and
    ``"Decoder_0"``.
    """
    return _build_modules(cfg or Seed1Config())


def log_likelihood(x, mu, sigma):
    """Per-pixel Gaussian log-likelihood, as in the seed."""
    return -0.5 * ((x - mu) ** 2) / (sigma**2) - jnp.log(sigma)


def seed1_problem(cfg: Seed1Config | None = None) -> tuple[Callable[..., Any], tuple]:
    """Return ``(loss, args)``: ``loss(params, x, mask, rng) -> scalar`` and concrete args.

    Differentiate with respect to argument 0 (the Flax params), as the seed's train step does.
    """
    cfg = cfg or Seed1Config()
    Model, _, _ = _build_modules(cfg)
    model = Model()
    root = jax.random.PRNGKey(cfg.seed)
    data_key, mask_key, init_key, rng = jax.random.split(root, 4)
    x = jax.random.normal(data_key, (cfg.batch, cfg.height, cfg.width, cfg.channels), jnp.float32)
    mask = jax.random.bernoulli(mask_key, p=0.5, shape=(*x.shape[:-1], 1)).astype(x.dtype)
    params = model.init(init_key, mask * x, rng, cfg.n_samples)["params"]

    def loss(params, x, mask, rng):
        masked_x = mask * x
        mu_x_hat, sigma_x_hat = model.apply({"params": params}, masked_x, rng, cfg.n_samples)
        ll = jax.vmap(log_likelihood, in_axes=(0, 0, 0))  # over batch elements
        ll = jax.vmap(ll, in_axes=(None, 0, 0))(x, mu_x_hat, sigma_x_hat)  # over samples
        ll = ll.sum((2, 3, 4))  # spatial dims and channel
        return -ll.mean()  # samples and batch

    return loss, (params, x, mask, rng)


# --------------------------------------------------------------------------------------------
# Measurement helpers
# --------------------------------------------------------------------------------------------


def compile_value_and_grad(
    f: Callable[..., Any],
    args: tuple,
    argnums: int | Sequence[int] = 0,
    precision: str | None = None,
):
    """AOT-compile ``jax.jit(jax.value_and_grad(f, argnums))`` at ``args`` (call with ``*args``)."""
    with jax.default_matmul_precision(precision):
        return jax.jit(jax.value_and_grad(f, argnums=argnums)).lower(*args).compile()


def temp_bytes_of(compiled) -> int | None:
    """XLA's temp allocation of a compiled computation (None: the backend does not say)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    return int(stats.temp_size_in_bytes)


def temp_bytes(f: Callable[..., Any], args: tuple, argnums: int | Sequence[int] = 0) -> int | None:
    """XLA's temp allocation for ``jax.jit(jax.value_and_grad(f))`` at ``args`` (None: unknown)."""
    return temp_bytes_of(compile_value_and_grad(f, args, argnums))


def compare_exact(
    original: Callable[..., Any],
    serialized: Callable[..., Any],
    args: tuple,
    argnums: int | Sequence[int] = 0,
    *,
    compiled: tuple[Any, Any] | None = None,
) -> tuple[float, float]:
    """Return (relative value difference, largest per-leaf relative gradient difference).

    Differences are those of ``jaxpr_accum.testing.tree_difference``: per leaf,
    ``max|serialized - original|`` relative to the leaf's own magnitude, floored at 1e-3 of
    the largest leaf's (``inf`` if the trees differ in structure). On accelerators both are
    recompiled with matmuls and convolutions at "highest" precision, so that TF32 rounding
    does not drown the reassociation differences being checked; on CPU,
    ``compiled=(original_compiled, serialized_compiled)`` from ``compile_value_and_grad`` are
    reused instead of compiling again.
    """
    from jaxpr_accum.testing import tree_difference

    if compiled is not None and jax.default_backend() == "cpu":
        c0, c1 = compiled
    else:
        precision = None if jax.default_backend() == "cpu" else "highest"
        c0 = compile_value_and_grad(original, args, argnums, precision)
        c1 = compile_value_and_grad(serialized, args, argnums, precision)
    v0, g0 = c0(*args)
    v1, g1 = c1(*args)

    def rel(got, ref) -> float:
        try:
            return tree_difference(got, ref).max_rel
        except AssertionError:  # structure, shapes or dtypes differ
            return float("inf")

    return rel(v1, v0), rel(g1, g0)


def time_interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median wall time of each thunk, calling them round-robin so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1, out=None
) -> None:
    """Print a plain-text table; the first ``left`` columns are left-aligned, the rest right."""
    out = out or sys.stdout
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def fmt(cells):
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(fmt(headers), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print(fmt(r), file=out)


# --------------------------------------------------------------------------------------------
# The demo
# --------------------------------------------------------------------------------------------


def run_demo(
    quick: bool = False,
    chunks: Sequence[int] | None = None,
    repeats: int | None = None,
    time_budget_s: float = 20.0,
    grads: Sequence[str] = ("auto",),
    plot: str | None = None,
) -> int:
    """Run the demo; return the process exit code (0: every chunk size was exact).

    The table is ``SerializedFunction.sweep``'s: the original and each chunk in each of
    ``grads``. ``repeats`` is lowered (to no fewer than 1) when that many rounds of calls would
    not fit ``time_budget_s``. ``plot``: a path to write the sweep's figure to (PNG).
    """
    import jaxpr_accum as ja
    from jaxpr_accum._sweep import measure_sweep

    cfg = QUICK_SEED1 if quick else Seed1Config()
    if chunks is None:
        chunks = (4,) if quick else (1, 2, 4, 8)
    if repeats is None:
        repeats = 2 if quick else 3

    print(
        f"jaxpr_accum demo: seed-1 encoder-decoder, {cfg.n_samples} Monte-Carlo samples, "
        f"batch {cfg.batch}, {cfg.height}x{cfg.width}x{cfg.channels} images, "
        f"decoder widths {list(cfg.decoder_widths)}  [jax {jax.__version__}, "
        f"{jax.default_backend()}]"
    )
    loss, args = seed1_problem(cfg)
    n_params = sum(int(np.size(p)) for p in jax.tree.leaves(args[0]))
    print(f"parameters: {n_params} ({fmt_bytes(4 * n_params)})")

    t0 = time.perf_counter()
    sf = ja.serialize_axis(loss, chunk=chunks[0])  # the axis is found, as in the seed
    sweep = measure_sweep(
        sf, args, chunks=chunks, grads=grads, repeats=repeats, time_budget_s=time_budget_s,
        check_precision="highest",
    )  # fmt: skip
    print(f"compiled, checked and timed in {time.perf_counter() - t0:.1f} s\n")
    print(sweep)
    original, rows = sweep.rows[0], sweep.rows[1:]
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
    ok = not bad

    base = original["temp_bytes"]
    if base:  # the budget row: the chunk chosen for 40% of the original's memory
        ok &= _budget_line(loss, args, int(0.4 * base), rows)

    k = 4 if 4 in chunks else chunks[0]
    print(f"\nsf.explain(...) for chunk={k}:\n")
    try:
        print(str(ja.serialize_axis(loss, chunk=k, grad=grads[0]).explain(*args)))
    except Exception as e:
        ok = False
        print(f"explain failed: {type(e).__name__}: {e}")

    if plot is not None:
        sweep.plot(plot)
        print(f"\nplot written to {plot}")
    print("\nresult:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _budget_line(loss: Callable[..., Any], args: tuple, limit: int, rows: list) -> bool:
    """Print the chunk ``memory=limit`` chooses and its measured memory; check it exactly
    unless the sweep measured the same program. Whether it is exact."""
    import jaxpr_accum as ja

    try:
        sf = ja.serialize_axis(loss, memory=limit)
        budget = sf.explain(*args).budget
        swept = any(r["chunk"] == budget.chunk and r["mode"] == budget.grad for r in rows)
        vdiff, gdiff = (0.0, 0.0) if swept else compare_exact(loss, sf, args)
    except Exception as e:
        print(f"\nmemory={fmt_bytes(limit)} failed: {type(e).__name__}: {e}")
        return False
    exact = vdiff <= EXACT_RTOL and gdiff <= EXACT_RTOL
    print(
        f"\nmemory={fmt_bytes(limit)} (40% of the original's) chooses chunk {budget.chunk} "
        f"({budget.grad}), measured {fmt_bytes(budget.measured)}"
        + ("" if swept else f"; value err {vdiff:.1e}, grad err {gdiff:.1e}")
        + ("" if exact else " FAIL")
    )
    return exact
