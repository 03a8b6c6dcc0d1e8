"""Measure every figure the README and the docs state about the project, record them in
``docs/figures.json``, and write them into the pages.

Usage: ``python docs/figures.py [--section NAME ...] [--no-pages]`` from the repository root
(default: every section, then the pages). A section measured anew replaces its entries in the
JSON file; the others keep theirs. Sections:

- ``tests``: how many tests each tier collects (one ``python -m pytest --collect-only``, with
  this file as a plugin that counts them by marker).
- ``times``: wall and CPU seconds of the README's two commands' runs, the demo
  (``python -m jaxpr_accum demo``) and the default tier (``python -m pytest -q``), with the
  load average before each (minutes; run it on a machine with its cores free).
- ``examples``: what ``examples/mc_vae.py``, ``examples/nnx_grad_accum.py`` and
  ``examples/dropout_transformer.py`` print: XLA's temp memory of ``value_and_grad``,
  original and serialized, and the largest relative gradient difference.
- ``models``: which models save memory (``MODELS`` below): XLA's temp memory of the
  gradient of each model's loss with respect to its parameters, as written and serialized
  with ``grad="auto"``, whether auto ran it as written with a ``PlanWarning``, and (forced
  with ``grad="remat"``) what the chunked loop would have cost; the README's picture is the
  first of them.

**In the pages.** A figure is written after a mark, ``<!--fig:KEY-->VALUE``, where ``KEY`` is
a dotted path into the JSON file (``tests.default``, ``models.mc.after``); the mark does not
show when the page is rendered. ``tests/test_figures.py`` checks that every marked value is
the recorded one within ``TOLERANCE`` (counts and bytes exact, ratios to the digits shown,
times within 25%: a page may round), and the integration tier that the recorded test counts
are what the tiers collect now.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
RECORD = DOCS / "figures.json"
#: Pages whose figures come from this script.
PAGES = [ROOT / "README.md", DOCS / "index.md", DOCS / "quickstart.md"]
#: How far a page's figure may be from the recorded one: relative, by the key's last part.
TOLERANCE = {"wall_s": 0.25, "cpu_s": 0.25, "minutes": 0.25}
MARK = re.compile(r"<!--fig:([\w.]+)-->(\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]\d+)?)")

#: The tiers, by their pytest markers (``pyproject.toml``).
TIERS = ("default", "slow", "integration")


def tier(item: Any) -> str:
    """The tier of a collected test: its marker (``pyproject.toml``; one per test)."""
    for name in ("slow", "integration"):
        if item.get_closest_marker(name) is not None:
            return name
    return "default"


def pytest_collection_finish(session: Any) -> None:
    """As a pytest plugin (``-p figures``, ``count_tests``): print the tests per tier."""
    counts = {name: 0 for name in TIERS}
    for item in session.items:
        counts[tier(item)] += 1
    sys.__stdout__.write(f"\nfigures: tests per tier {json.dumps(counts)}\n")


def count_tests() -> dict[str, int]:
    """How many tests each tier collects, from one ``pytest --collect-only -m ''``."""
    path = os.pathsep.join(filter(None, [str(DOCS), os.environ.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "", "-p",
         "figures", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    ).stdout  # fmt: skip
    m = re.search(r"^figures: tests per tier (.*)$", out, re.M)
    if m is None:
        raise RuntimeError(f"pytest --collect-only printed no counts:\n{out[-2000:]}")
    return json.loads(m.group(1))


def tests() -> dict[str, int]:
    counts = count_tests()
    counts["all"] = sum(counts.values())
    return counts


def timed(command: list[str]) -> dict[str, float]:
    """Wall and CPU seconds (user + sys, children included) of ``command``, the load average
    of the minute before it started, and its exit status (the time counts either way: the
    default tier run while the pages are being rewritten fails ``tests/test_figures.py``)."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    status = subprocess.run(command, cwd=ROOT, check=False, capture_output=True).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall), "cpu_s": round(cpu), "load": round(load, 1), "exit": status}


def times() -> dict[str, Any]:
    return {
        "demo": timed([sys.executable, "-m", "jaxpr_accum", "demo"]),
        "default_tier": timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]),
        "cores": os.cpu_count(),
    }


_MEMORY = re.compile(r"original ([\d,]+) B, (?:serialized|accumulated) ([\d,]+) B")
_RELATIVE = re.compile(r"gradient difference.*relative:? ([\d.e+-]+)\)?$", re.M)


def example(name: str) -> dict[str, Any]:
    """What ``examples/<name>.py`` prints: memory before and after, largest relative
    gradient difference (the largest over its steps)."""
    out = subprocess.run(
        [sys.executable, f"examples/{name}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
    ).stdout
    memory = _MEMORY.search(out)
    if memory is None:
        raise RuntimeError(f"examples/{name}.py printed no memory line:\n{out[-2000:]}")
    before, after = (int(g.replace(",", "")) for g in memory.groups())
    relative = max(float(g) for g in _RELATIVE.findall(out))
    return {
        "before": before,
        "after": after,
        "ratio": round(before / after, 1),
        "grad_rel": float(f"{relative:.0e}"),
    }


def examples() -> dict[str, Any]:
    return {name: example(name) for name in ("mc_vae", "nnx_grad_accum", "dropout_transformer")}


def _mc() -> tuple[Callable, tuple, dict]:
    """Monte-Carlo samples: a decoder vmapped over 16 samples drawn inside."""
    import jax
    import jax.numpy as jnp

    def loss(params, mu, key):
        w1, w2 = params
        z = mu + jax.random.normal(key, (16, *mu.shape))
        h = jax.vmap(lambda z: jnp.tanh(jnp.tanh(z @ w1) @ w2))(z)
        return jnp.mean(h**2)

    k1, k2 = jax.random.split(jax.random.key(0))
    params = (jax.random.normal(k1, (64, 512)) / 8, jax.random.normal(k2, (512, 64)) / 22)
    return loss, (params, jnp.zeros((128, 64)), jax.random.key(1)), {"chunk": 2, "size": 16}


def _conv() -> tuple[Callable, tuple, dict]:
    """A conv net's mean loss over a batch of 128 images, in microbatches of 16."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def loss(params, x, y):
        w1, w2, wo = params
        h = jax.nn.relu(conv(x, w1))
        h = jax.nn.relu(conv(h, w2))
        logits = h.mean(axis=(1, 2)) @ wo
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    k = jax.random.split(jax.random.key(0), 4)
    params = (
        jax.random.normal(k[0], (3, 3, 3, 32)) / 5,
        jax.random.normal(k[1], (3, 3, 32, 32)) / 17,
        jax.random.normal(k[2], (32, 10)) / 6,
    )
    x = jax.random.normal(k[3], (128, 32, 32, 3))
    y = jnp.arange(128) % 10
    return loss, (params, x, y), {"chunk": 16, "argnums": (1, 2)}


def _attention() -> tuple[Callable, tuple, dict]:
    """One attention head over 8192 keys, serialized over the keys (a streamed softmax)."""
    import jax
    import jax.numpy as jnp

    def loss(params, q, kv):
        wq, wk, wv = params
        scores = (q @ wq) @ (kv @ wk).T / 8.0
        return jnp.mean((jax.nn.softmax(scores, axis=-1) @ (kv @ wv)) ** 2)

    k = jax.random.split(jax.random.key(0), 5)
    params = tuple(jax.random.normal(k[i], (64, 64)) / 8 for i in range(3))
    q, kv = jax.random.normal(k[3], (256, 64)), jax.random.normal(k[4], (8192, 64))
    return loss, (params, q, kv), {"chunk": 1024, "argnums": 2}


def _pairs() -> tuple[Callable, tuple, dict]:
    """A SimCLR-style contrastive loss over a batch of 2048: every pair of the batch."""
    import jax
    import jax.numpy as jnp

    def loss(w, x):
        z = jnp.tanh(x @ w)
        z = z / jnp.linalg.norm(z, axis=-1, keepdims=True)
        logits = z @ z.T / 0.1 - 1e9 * jnp.eye(z.shape[0])
        positives = jnp.roll(jnp.arange(z.shape[0]), z.shape[0] // 2)
        picked = jnp.take_along_axis(logits, positives[:, None], 1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    k1, k2 = jax.random.split(jax.random.key(0))
    w, x = jax.random.normal(k1, (64, 128)) / 8, jax.random.normal(k2, (2048, 64))
    return loss, (w, x), {"chunk": 256, "argnums": 1}


def _mlp() -> tuple[Callable, tuple, dict]:
    """A dense MLP classifier (784-2048-2048-10) at batch 256: its weights dominate."""
    import jax
    import jax.numpy as jnp

    def loss(params, x, y):
        w1, w2, w3 = params
        logits = jax.nn.relu(jax.nn.relu(x @ w1) @ w2) @ w3
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    k = jax.random.split(jax.random.key(0), 4)
    params = (
        jax.random.normal(k[0], (784, 2048)) / 28,
        jax.random.normal(k[1], (2048, 2048)) / 45,
        jax.random.normal(k[2], (2048, 10)) / 45,
    )
    x, y = jax.random.normal(k[3], (256, 784)), jnp.arange(256) % 10
    return loss, (params, x, y), {"chunk": 32, "argnums": (1, 2)}


#: The models of the "which models save" section, in the order the page gives them.
MODELS: dict[str, Callable[[], tuple[Callable, tuple, dict]]] = {
    "mc": _mc,
    "conv": _conv,
    "attention": _attention,
    "pairs": _pairs,
    "mlp": _mlp,
}


def model(build: Callable[[], tuple[Callable, tuple, dict]]) -> dict[str, Any]:
    import jax
    import numpy as np

    import jaxpr_accum as ja

    loss, args, settings = build()

    def compiled(f: Callable) -> Any:
        return jax.jit(jax.value_and_grad(f)).lower(*args).compile()

    def temp(f: Callable) -> int:
        return int(compiled(f).memory_analysis().temp_size_in_bytes)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ja.PlanWarning)
        auto = ja.serialize_axis(loss, **settings)
        after = temp(auto)
        (_, g0), (_, g1) = compiled(loss)(*args), compiled(auto)(*args)
    before = temp(loss)
    with warnings.catch_warnings():  # forced: "not expected to save memory", where it is not
        warnings.simplefilter("ignore", ja.PlanWarning)
        forced = temp(ja.serialize_axis(loss, grad="remat", **settings))
    scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(g0))
    diff = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True)
    )
    warned = any("not expected to save memory" in str(w.message) for w in caught)
    return {
        "before": before,
        "after": after,
        "ratio": round(after / before, 2),
        "remat_ratio": round(forced / before, 2),
        "grad_rel": float(f"{diff / scale:.0e}"),
        "as_written": warned,
    }


def models() -> dict[str, Any]:
    return {name: model(build) for name, build in MODELS.items()}


SECTIONS: dict[str, Callable[[], Any]] = {
    "tests": tests,
    "times": times,
    "examples": examples,
    "models": models,
}


def lookup(record: dict, key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value[part]
    return value


def formatted(value: Any, shown: str) -> str:
    """``value`` written as the page writes it (``shown``: thousands separators, digits)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    if isinstance(value, int) and "." not in shown:
        return f"{value:,}" if "," in shown or value >= 10_000 else str(value)
    if "e" in shown:
        return f"{value:.0e}"
    digits = len(shown.split(".", 1)[1]) if "." in shown else 0
    return f"{value:,.{digits}f}" if "," in shown else f"{value:.{digits}f}"


def parse(shown: str) -> float:
    return float(shown.replace(",", ""))


def agrees(key: str, recorded: float, shown: str) -> bool:
    """Whether a page's figure ``shown`` for ``key`` is the recorded one (``TOLERANCE``)."""
    tolerance = TOLERANCE.get(key.rsplit(".", 1)[-1])
    if tolerance is None:
        return formatted(recorded, shown) == shown
    return abs(parse(shown) - recorded) <= tolerance * abs(recorded)


def write_pages(record: dict) -> list[Path]:
    """Write the recorded figures after every mark of ``PAGES``; the pages changed."""
    changed = []
    for page in PAGES:
        text = page.read_text()

        def put(m: re.Match) -> str:
            return f"<!--fig:{m.group(1)}-->{formatted(lookup(record, m.group(1)), m.group(2))}"

        new = MARK.sub(put, text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", action="append", choices=sorted(SECTIONS))
    parser.add_argument("--no-pages", action="store_true", help="only record the figures")
    options = parser.parse_args(argv)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for name in options.section or list(SECTIONS):
        start = time.perf_counter()
        record[name] = SECTIONS[name]()
        print(f"{name}: {json.dumps(record[name])} ({time.perf_counter() - start:.0f} s)")
        RECORD.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if not options.no_pages:
        for page in write_pages(record):
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
