"""Time on long rollouts: where a chunked loop around a long inner ``lax.scan`` spends it.

Run from the repository root (CPU; one process, public API only)::

    python benchmarks/rollouts.py             # both programs, chunks 8 and 32, 9 rounds
    python benchmarks/rollouts.py --rounds 15 --only reinforce

Two programs as their fields write them:

* REINFORCE (gymnax style): 64 environments, each a 500-step ``lax.scan`` rollout of a small
  policy MLP on CartPole physics written in ``jnp``; loss ``-mean(sum log pi * returns)``;
  serialized over the environments (``in_axes``: the per-environment keys).
* NeRF (jaxnerf style): a batch of rays, stratified samples along each ray, a positional
  encoding and an MLP vmapped over rays, volume rendering (``cumprod`` / ``cumsum`` along the
  samples), MSE loss; serialized over the rays.

Each row is a ``jax.jit(jax.value_and_grad(f))`` (or a forward-only ``jit(f)``, marked
``fwd``), timed in interleaved rounds (order rotated per round; a time is the least of
``--inner`` back-to-back calls); the figures are medians over rounds of the per-round ratios
``time / time(original)`` and ``time / time(peer scan+checkpoint)``, with their interquartile
ranges. ``docs/benchmarks.md`` (section "Long rollouts") holds the figures and their reading.
The rows split the cost: the forward alone; the hand-written peers (``lax.scan`` over chunks
of a ``jax.checkpoint``ed body, the same without checkpoint (no recomputation),
``jax.lax.map(batch_size=k)``); and ``serialize_axis`` in each ``grad`` mode.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

import jaxpr_accum as ja

# -- REINFORCE ---------------------------------------------------------------------------
ENVS, STEPS, HIDDEN, GAMMA = 64, 500, 64, 0.99


def _cartpole(s: jax.Array, a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One Euler step of CartPole (gymnax's constants); reward 1 while upright."""
    x, xd, th, thd = s[0], s[1], s[2], s[3]
    force = jnp.where(a == 1, 10.0, -10.0)
    ct, st = jnp.cos(th), jnp.sin(th)
    tmp = (force + 0.05 * thd**2 * st) / 1.1
    tha = (9.8 * st - ct * tmp) / (0.5 * (4.0 / 3.0 - 0.1 * ct**2 / 1.1))
    xa = tmp - 0.05 * tha * ct / 1.1
    s2 = jnp.stack([x + 0.02 * xd, xd + 0.02 * xa, th + 0.02 * thd, thd + 0.02 * tha])
    alive = (jnp.abs(s2[0]) < 2.4) & (jnp.abs(s2[2]) < 0.21)
    return s2, alive.astype(jnp.float32)


def _policy(p: dict, obs: jax.Array) -> jax.Array:
    h = jnp.tanh(obs @ p["w1"] + p["b1"])
    h = jnp.tanh(h @ p["w2"] + p["b2"])
    return jax.nn.log_softmax(h @ p["w3"] + p["b3"])


def episode_loss(p: dict, key: jax.Array) -> jax.Array:
    """One environment: a 500-step rollout, discounted returns, ``-sum(log pi * G)``."""
    k0, key = jax.random.split(key)
    s0 = jax.random.uniform(k0, (4,), minval=-0.05, maxval=0.05)

    def step(carry, _):
        s, k, alive = carry
        k, ka = jax.random.split(k)
        logp = _policy(p, s)
        a = jax.random.categorical(ka, lax.stop_gradient(logp))
        s2, r = _cartpole(s, a)
        return (s2, k, alive * r), (logp[a], alive * r)

    _, (logps, rewards) = lax.scan(step, (s0, key, jnp.float32(1.0)), None, length=STEPS)
    disc = GAMMA ** jnp.arange(STEPS, dtype=jnp.float32)
    returns = jnp.cumsum((rewards * disc)[::-1])[::-1] / disc
    return -jnp.sum(logps * lax.stop_gradient(returns))


def reinforce_problem() -> tuple[Callable, Callable, tuple, dict]:
    ks = jax.random.split(jax.random.key(0), 4)
    dims = [(4, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 2)]
    p = {f"w{i + 1}": jax.random.normal(ks[i], d) / d[0] ** 0.5 for i, d in enumerate(dims)}
    p |= {f"b{i + 1}": jnp.zeros(d[1]) for i, d in enumerate(dims)}
    keys = jax.random.key_data(jax.random.split(ks[3], ENVS))
    one = lambda p, k: episode_loss(p, jax.random.wrap_key_data(k))  # noqa: E731
    loss = lambda p, k: jnp.mean(jax.vmap(one, in_axes=(None, 0))(p, k))  # noqa: E731
    return loss, one, (p, keys), {"in_axes": (None, 0)}


# -- NeRF ---------------------------------------------------------------------------------
RAYS, SAMPLES, FREQS, WIDTH = 1024, 64, 10, 128


def _encode(x: jax.Array) -> jax.Array:
    scaled = x[..., None, :] * (2.0 ** jnp.arange(FREQS))[:, None]
    flat = scaled.reshape(*x.shape[:-1], -1)
    return jnp.concatenate([x, jnp.sin(flat), jnp.cos(flat)], axis=-1)


def ray_loss(p: dict, ray: tuple) -> jax.Array:
    """One ray: stratified samples, MLP, volume rendering, squared error of the colour."""
    origin, direction, jitter, target = ray
    edges = jnp.linspace(2.0, 6.0, SAMPLES + 1)
    t = edges[:-1] + jitter * (edges[1:] - edges[:-1])
    pts = origin + t[:, None] * direction
    h = _encode(pts)
    for i in range(3):
        h = jax.nn.relu(h @ p[f"w{i}"] + p[f"b{i}"])
    out = h @ p["w3"] + p["b3"]
    rgb, sigma = jax.nn.sigmoid(out[:, :3]), jax.nn.relu(out[:, 3])
    delta = jnp.concatenate([t[1:] - t[:-1], jnp.array([1e10])]) * jnp.linalg.norm(direction)
    alpha = 1.0 - jnp.exp(-sigma * delta)
    trans = jnp.concatenate([jnp.ones(1), jnp.cumprod(1.0 - alpha + 1e-10)[:-1]])
    weights = alpha * trans
    colour = jnp.sum(weights[:, None] * rgb, axis=0) + (1.0 - jnp.sum(weights))  # white bkgd
    return jnp.sum((colour - target) ** 2)


def nerf_batched_loss(p: dict, rays: tuple) -> jax.Array:
    """jaxnerf's layout: the same per ray, written on ``[rays, samples, ...]`` arrays, the MLP
    on the flattened ``[rays * samples, features]`` points."""
    origin, direction, jitter, target = rays
    edges = jnp.linspace(2.0, 6.0, SAMPLES + 1)
    t = edges[:-1] + jitter * (edges[1:] - edges[:-1])
    pts = origin[:, None, :] + t[..., None] * direction[:, None, :]
    h = _encode(pts).reshape(-1, 3 + 6 * FREQS)
    for i in range(3):
        h = jax.nn.relu(h @ p[f"w{i}"] + p[f"b{i}"])
    out = (h @ p["w3"] + p["b3"]).reshape(*t.shape, 4)
    rgb, sigma = jax.nn.sigmoid(out[..., :3]), jax.nn.relu(out[..., 3])
    far = jnp.full_like(t[:, :1], 1e10)
    delta = jnp.concatenate([t[:, 1:] - t[:, :-1], far], axis=-1)
    alpha = 1.0 - jnp.exp(-sigma * delta * jnp.linalg.norm(direction, axis=-1, keepdims=True))
    ones = jnp.ones_like(alpha[:, :1])
    trans = jnp.concatenate([ones, jnp.cumprod(1.0 - alpha + 1e-10, axis=-1)[:, :-1]], -1)
    weights = alpha * trans
    colour = jnp.sum(weights[..., None] * rgb, axis=-2) + (1.0 - weights.sum(-1))[:, None]
    return jnp.mean(jnp.sum((colour - target) ** 2, axis=-1))


def nerf_problem(batched: bool = False) -> tuple[Callable, Callable, tuple, dict]:
    ks = jax.random.split(jax.random.key(1), 9)
    d_in = 3 + 6 * FREQS
    dims = [(d_in, WIDTH), (WIDTH, WIDTH), (WIDTH, WIDTH), (WIDTH, 4)]
    p = {f"w{i}": jax.random.normal(ks[i], d) / d[0] ** 0.5 for i, d in enumerate(dims)}
    p |= {f"b{i}": jnp.zeros(d[1]) for i, d in enumerate(dims)}
    dirs = jax.random.normal(ks[5], (RAYS, 3))
    rays = (
        jax.random.normal(ks[4], (RAYS, 3)) * 0.1,
        dirs / jnp.linalg.norm(dirs, axis=-1, keepdims=True),
        jax.random.uniform(ks[6], (RAYS, SAMPLES)),
        jax.random.uniform(ks[7], (RAYS, 3)),
    )
    loss = lambda p, r: jnp.mean(jax.vmap(ray_loss, in_axes=(None, 0))(p, r))  # noqa: E731
    return nerf_batched_loss if batched else loss, ray_loss, (p, rays), {"argnums": 1}


# -- peers and rows -----------------------------------------------------------------------
def _chunked(xs, k: int):
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]), xs)


def peers(one: Callable, n: int, k: int) -> dict[str, Callable]:
    """The hand-written chunk loops of ``mean(vmap(one)(p, xs))`` (``k`` divides ``n``)."""

    def chunk_sum(p, xc):
        return jnp.sum(jax.vmap(one, in_axes=(None, 0))(p, xc))

    def scan(body):
        def f(p, xs):
            total, _ = lax.scan(lambda c, xc: (c + body(p, xc), None), 0.0, _chunked(xs, k))
            return total / n

        return f

    def lmap(ckpt: bool):
        g = jax.checkpoint(one) if ckpt else one
        return lambda p, xs: jnp.mean(lax.map(lambda x: g(p, x), xs, batch_size=k))

    return {
        "peer scan+checkpoint": scan(jax.checkpoint(chunk_sum)),
        "peer scan, no checkpoint": scan(chunk_sum),
        "peer lax.map(batch_size=k)": lmap(False),
        "peer lax.map(checkpoint)": lmap(True),
    }


def rows(loss: Callable, one: Callable, args: tuple, where: dict, n: int, chunks) -> dict:
    """``{label: thunk}``: the original and every chunked method, compiled."""
    vg = lambda f: jax.jit(jax.value_and_grad(f))  # noqa: E731
    fns: dict[str, Callable] = {"original": vg(loss), "original fwd": jax.jit(loss)}
    for k in chunks:
        for name, f in peers(one, n, k).items():
            fns[f"{name} k={k}"] = vg(f)
        fns[f"peer scan fwd k={k}"] = jax.jit(peers(one, n, k)["peer scan, no checkpoint"])
        head = (args[0], jax.tree.map(lambda x, k=k: x[:k], args[1]))
        fns[f"original fwd on k rows (x{n // k}) k={k}"] = (jax.jit(loss), head)
        for mode in ja.GRAD_MODES:
            sf = ja.serialize_axis(loss, chunk=k, grad=mode, **where)
            fns[f"ja {mode} k={k}"] = vg(sf)
            if mode == "remat":
                fns[f"ja fwd k={k}"] = jax.jit(sf)
    thunks = {}
    for label, f in fns.items():
        f, a = f if isinstance(f, tuple) else (f, args)
        thunks[label] = functools.partial(f.lower(*a).compile(), *a)
    return thunks


def time_rounds(thunks: dict[str, Callable], rounds: int, inner: int) -> list[dict]:
    """Each timed round's ``{label: seconds}`` (round 0, the warm-up, dropped; order rotated
    per round); a thunk's time in a round is the least of ``inner`` back-to-back calls."""
    names, out = list(thunks), []
    for r in range(rounds + 1):
        shift = r % len(names)
        times = dict.fromkeys(names, 0.0)  # rows in the order given
        for n in names[shift:] + names[:shift]:
            best = float("inf")
            for _ in range(inner):  # the least of a few back-to-back calls: preemption only adds
                t0 = time.perf_counter()
                jax.block_until_ready(thunks[n]())
                best = min(best, time.perf_counter() - t0)
            times[n] = best
        out += [times] if r else []
    return out


def _median_iqr(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 4 else (min(xs), 0, max(xs))
    return f"{statistics.median(xs):5.2f}x [{q[0]:.2f}, {q[2]:.2f}]"


def report(title: str, rounds: list[dict], sf: Callable, args: tuple) -> None:
    """Per row: median [IQR] of the per-round ratio to the original, and to the hand-written
    scan + checkpoint at the same chunk (the peer floor)."""
    print(f"\n## {title}: median [IQR] over {len(rounds)} rounds of per-round time ratios")
    print(f"{'':38s} {'/ original':>20s} {'/ peer scan+checkpoint':>24s}")
    for n in rounds[0]:
        k = n.rsplit(" k=", 1)[1] if " k=" in n else None
        peer = [t[n] / t[f"peer scan+checkpoint k={k}"] for t in rounds] if k else None
        vs = _median_iqr([t[n] / t["original"] for t in rounds])
        print(f"{n:38s} {vs:>20s} {_median_iqr(peer) if peer else '':>24s}")
    print(f"auto's choice: {sf.explain(*args).grad!r}")


PROBLEMS = {
    "reinforce": (reinforce_problem, ENVS),
    "nerf": (nerf_problem, RAYS),
    "nerf-batched": (lambda: nerf_problem(batched=True), RAYS),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--chunks", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--only", choices=list(PROBLEMS), nargs="+")
    a = ap.parse_args()
    for name, (problem, n) in PROBLEMS.items():
        if a.only and name not in a.only:
            continue
        loss, one, args, where = problem()
        chunks = [k * n // ENVS for k in a.chunks]
        rounds = time_rounds(rows(loss, one, args, where, n, chunks), a.rounds, a.inner)
        sf = ja.serialize_axis(loss, chunk=chunks[0], **where)
        report(f"{name} (chunks {chunks})", rounds, sf, args)


if __name__ == "__main__":
    main()
