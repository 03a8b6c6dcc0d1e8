"""Measure the XLA:CPU conv-gradient-in-a-loop trap and the canonical-conv fix.

value_and_grad of  x -> conv3x3 -> relu -> conv3x3 -> sum  over a batch of B=64 NHWC
images [64, 32, 32, 16] (16 -> 16 channels):

  unchunked   : one call on the whole batch
  scan/plain  : lax.scan over 4 chunks of 16, body under jax.checkpoint (the trap)
  lib-style/* : custom_vjp over the scan whose backward calls jax.vjp per chunk (as
                jaxpr_accum does), plain lax convs; "rewrite" passes the pullback through
                jaxpr_accum._engine._conv.canonicalize (what the library does on CPU)

Beside the tests, not the benchmarks: it calls the package's private ``_conv``.

Usage: python tests/conv_trap.py [--stride 2] [--reps 7] [--hlo /tmp/trap.hlo]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.measuring import step_time  # noqa: E402
from jaxpr_accum._engine._conv import canonicalize as canonicalize_convs  # noqa: E402

DN = ("NHWC", "HWIO", "NHWC")


def make_loss(conv, stride):
    def loss(p, x):
        h = jax.nn.relu(conv(x, p[0], (stride, stride), "SAME", dimension_numbers=DN))
        return jnp.sum(conv(h, p[1], (1, 1), "SAME", dimension_numbers=DN) ** 2)

    return loss


def scanned(loss, n_chunks):
    def f(p, x):
        xs = x.reshape(n_chunks, x.shape[0] // n_chunks, *x.shape[1:])
        body = jax.checkpoint(loss)
        return lax.scan(lambda c, xc: (c + body(p, xc), None), 0.0, xs)[0]

    return f


def library_style(loss, n_chunks, rewrite):
    """Like jaxpr_accum's remat region: custom_vjp whose backward scans the chunks and calls
    jax.vjp of the chunk body; with rewrite=True the pullback goes through canonicalize_convs
    (the model keeps plain lax convs)."""

    def split(x):
        return x.reshape(n_chunks, x.shape[0] // n_chunks, *x.shape[1:])

    @jax.custom_vjp
    def f(p, x):
        return lax.scan(lambda c, xc: (c + loss(p, xc), None), 0.0, split(x))[0]

    def fwd(p, x):
        return f(p, x), (p, x)

    def bwd(res, ct):
        p, x = res

        def pull(p, xc):
            return jax.vjp(loss, p, xc)[1](ct)

        pull = canonicalize_convs(pull) if rewrite else pull

        def step(acc, xc):
            dp, dx = pull(p, xc)
            return jax.tree.map(jnp.add, acc, dp), dx

        dp, dxs = lax.scan(step, jax.tree.map(jnp.zeros_like, p), split(x))
        return dp, dxs.reshape(x.shape)

    f.defvjp(fwd, bwd)
    return f


def bench(f, args, reps):
    g = jax.jit(jax.value_and_grad(f))
    return step_time(g, args, reps), g


def conv_lines(hlo):
    out = []
    for line in hlo.splitlines():
        if " convolution(" in line:
            m = re.search(r"= (\S+) convolution.*?(window=\{[^}]*\}), (dim_labels=\S+?),", line)
            where = "while-body" if "/while/" in line else "entry"
            out.append(
                f"  {m.group(1):24s} {m.group(3):28s} {m.group(2):30s} [{where}]"
                if m
                else "  " + line.strip()[:160]
            )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hlo", default=None, help="write the trap's optimized HLO here")
    a = ap.parse_args()

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    C = a.channels
    x = jax.random.normal(k1, (a.batch, 32, 32, C), jnp.float32)
    p = [jax.random.normal(k2, (3, 3, C, C)) * 0.1, jax.random.normal(k3, (3, 3, C, C)) * 0.1]

    plain = make_loss(lax.conv_general_dilated, a.stride)
    cases = {
        "unchunked": plain,
        "scan/plain (trap)": scanned(plain, a.chunks),
        "lib-style/plain": library_style(plain, a.chunks, rewrite=False),
        "lib-style/rewrite": library_style(plain, a.chunks, rewrite=True),
    }
    print(
        f"jax {jax.__version__}, {jax.devices()[0].platform}, x={tuple(x.shape)}, "
        f"C={C}, stride={a.stride}, chunks={a.chunks}"
    )
    times, results = {}, {}
    for name, f in cases.items():
        times[name], g = bench(f, (p, x), a.reps)
        results[name] = g(p, x)
    base = times["unchunked"]
    for name, t in times.items():
        print(f"{name:20s} {t * 1e3:8.1f} ms   x{t / base:5.2f} vs unchunked")

    ref = results["unchunked"]
    for name in list(cases)[1:]:
        for r, q in zip(jax.tree.leaves(ref), jax.tree.leaves(results[name]), strict=False):
            np.testing.assert_allclose(np.asarray(q), np.asarray(r), rtol=2e-4, atol=1e-3)
    print("values/grads agree across cases")

    for name in ("scan/plain (trap)", "lib-style/rewrite"):
        hlo = jax.jit(jax.value_and_grad(cases[name])).lower(p, x).compile().as_text()
        print(f"convolutions in optimized HLO, {name}:")
        print("\n".join(conv_lines(hlo)))
        if a.hlo and "trap" in name:
            with open(a.hlo, "w") as fh:
                fh.write(hlo)


if __name__ == "__main__":
    main()
