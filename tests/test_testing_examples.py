"""``jaxpr_accum.testing.check`` on the three examples, in the default test tier.

Each test loads an example script as a module (with ``--quick`` sizes; the transformer with
one layer), serializes its loss as the example does, and runs ``check``: drawn parameters
and inputs, drawn chunk sizes, every gradient mode, and the ``jax.vmap`` contexts. The
testing issue asked for under 30 s each, before the vmap contexts; each test prints its time
(``pytest -s``), and timing is the benchmarks' business, not asserted here. Measured on 2
cores with a background job at low priority, two examples each: mc_vae 15 s,
dropout_transformer 51 s (17 s without the vmap contexts; the slow tier draws one example of
it), nnx_grad_accum 10 s.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import jax
import pytest

import jaxpr_accum as ja
from jaxpr_accum import testing

pytest.importorskip("flax")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BUDGET_S = 30.0
MAX_EXAMPLES = 2


def load_example(name: str):
    """Import ``examples/<name>`` with ``--quick`` sizes, leaving ``sys.argv`` and
    ``XLA_FLAGS`` as they were (the transformer example sets the device count)."""
    argv, flags = sys.argv, os.environ.get("XLA_FLAGS")
    sys.argv = [name, "--quick"]
    try:
        spec = importlib.util.spec_from_file_location(f"_example_{name[:-3]}", EXAMPLES / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags
    return module


def timed_check(sf, *args, max_examples: int = MAX_EXAMPLES):
    start = time.perf_counter()
    testing.check(sf, *args, max_examples=max_examples)
    took = time.perf_counter() - start
    print(f"check on {sf!r}: {took:.1f} s (the target is {BUDGET_S:g} s on a free machine)")
    return took


@pytest.mark.slow
def test_check_mc_vae():
    """The 16 Monte-Carlo samples, found automatically inside the Flax module."""
    mc = load_example("mc_vae.py")
    sizes = mc.Sizes(batch=2, height=8, width=8, decoder_widths=(8,))
    loss, args = mc.problem(sizes)
    sf = ja.serialize_axis(loss, chunk=mc.CHUNK)
    assert sf.explain(*args).axis_size == 16
    timed_check(sf, *args)


@pytest.mark.slow
def test_check_dropout_transformer():
    """Seed 2: the batch of tokens in chunks, dropout bits per chunk (one device here)."""
    dt = load_example("dropout_transformer.py")
    dt.LAYERS = 1
    tokens = jax.random.randint(jax.random.key(0), (8, dt.SEQ + 1), 0, dt.VOCAB)
    params = dt.model.init(jax.random.key(1), tokens[:, :-1], deterministic=True)["params"]
    sf = ja.serialize_axis(dt.loss, chunk=4, argnums=1)
    timed_check(sf, params, tokens, jax.random.key(2), max_examples=1)  # the slow tier's budget


@pytest.mark.slow
def test_check_nnx_grad_accum():
    """Seed 3: microbatches of a Flax NNX model with dropout; the Rngs state is compared."""
    from flax import nnx

    na = load_example("nnx_grad_accum.py")
    model = na.MLP(16, 32, 10, rngs=nnx.Rngs(0, dropout=1))
    x = jax.random.normal(jax.random.key(0), (16, 16))
    y = jax.random.randint(jax.random.key(1), (16,), 0, 10)
    sf = ja.serialize_axis(na.loss_fn, chunk=4, argnums=1)
    timed_check(sf, model, x, y)
