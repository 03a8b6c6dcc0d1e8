"""Data parallelism: the serialized axis sharded over 8 (simulated) CPU devices.

The checks run in one subprocess (``tests/sharding_cases.py``), because the device count is
fixed when JAX initialises its backend and every other test keeps one device. That script
measures (only the cases of the tests selected, where each names its case: ``-k once``);
the assertions live here:

* values and gradients (parameters and batch) equal the *unsharded, unchunked* original's
  within 2e-4 relative to each leaf's magnitude, for a dense MLP, a Flax conv net and a Flax
  dropout MLP, in the ``remat``, ``auto`` (fused) and ``native`` gradient modes; dropout
  draws are identical (the exact zeros of d loss / d x, and a stacked output bit for bit);
* in the compiled HLO of ``jax.jit(jax.value_and_grad(sf))``, the while loops' body and
  condition computations (and everything they call) contain no collective at all; the module
  has at most one all-reduce per gradient leaf and output (XLA combines them: 1 or 2);
* ``mesh_axis=`` on a mesh of ``Auto`` axes, under ``jax.set_mesh`` and with
  ``NamedSharding`` inputs, and tuples of mesh axes;
* ``chunk`` not a multiple of the shards: a ``ValueError`` at the first call naming both
  numbers and the nearest valid sizes; an axis the shards do not divide: a ``ValueError``;
* ``str(sf.explain(...))`` names the mesh axis and the per-device chunk.

With parameters sharded (``tests/sharding_fsdp.py``: FSDP over the batch's mesh axis, tensor
parallelism over another, both on a 4 x 2 mesh; ``Explicit`` meshes and ``Auto`` ones with
``param_specs=``), every mode, a remainder chunk and dropout:

* values and gradients equal the unsharded original's, the dropout zeros exactly; each
  gradient leaves sharded like its parameter;
* inside the loop only the parameters' all-gathers and (over the batch's axis) their
  gradients' reduce-scatters; no all-reduce outside it moves a whole sharded gradient;
* ``explain`` counts the gathers and reduce-scatters, and says why a parameter whose
  dimension the shards do not divide is gathered whole before the loop.

Gathered once before the loop (``gather="once"``: remat, native, fused, a remainder chunk):
the same values and gradients and shardings, no gather inside the loop; ``gather="auto"``
under ``memory=`` gathers once where that fits the budget at some chunk, else per chunk, and
``explain`` says which and why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.oracle import GRAD_MODES

# One subprocess with 8 CPU devices; its module fixture runs once (one xdist worker: loadgroup).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sharding")]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "sharding_cases.py"
RTOL = 2e-4
N_DEVICES = 8
BATCH = 64

# case -> (grad mode reported by explain, mesh axes as explain prints them, devices, chunk)
MODEL_CASES: dict[str, tuple[str, str, int, int]] = {}
for _model in ("mlp", "conv", "dropout"):
    for _grad, _reported in (("remat", "remat"), ("auto", "fused"), ("native", "native")):
        MODEL_CASES[f"{_model}-{_grad}"] = (_reported, "('data',)", 8, 16)
for _grad, _reported in (("remat", "remat"), ("auto", "remat"), ("native", "native")):
    MODEL_CASES[f"pool-{_grad}"] = (_reported, "('data',)", 8, 16)
# the small MLP's gradients outweigh half of a chunk's estimated activations: auto is remat
MODEL_CASES["mlp-auto"] = ("remat", "('data',)", 8, 16)
MODEL_CASES.update(
    {
        "mesh_axis-set_mesh-mlp-auto": ("remat", "('data',)", 8, 16),
        "mesh_axis-set_mesh-dropout-remat": ("remat", "('data',)", 8, 16),
        "mesh_axis-inputs-mlp-auto": ("remat", "('data',)", 8, 16),
        "mesh_axis-inputs-conv-native": ("native", "('data',)", 8, 16),
        "dropout-remainder-remat": ("remat", "('data',)", 8, 24),
        "set_mesh-explicit-mlp-remat": ("remat", "('data',)", 8, 16),
        "set_mesh-explicit-dropout-auto": ("fused", "('data',)", 8, 16),
        "mesh2d-tuple-mlp-auto": ("remat", "('x', 'y')", 8, 16),
        "mesh2d-data-only-mlp-remat": ("remat", "('data',)", 4, 8),
    }
)


def selected_cases(request: pytest.FixtureRequest) -> list[str]:
    """The cases the selected tests of this module read, where each reads its ``name``
    parameter (``-k`` runs only those); none (every case) where one reads fixed cases."""
    items = [i for i in request.session.items if i.module is request.module]
    params = [getattr(i, "callspec", None) for i in items]
    if any(p is None or "name" not in p.params for p in params):
        return []
    return sorted({p.params["name"] for p in params})


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    """Run the cases (``selected_cases``) in one subprocess with 8 CPU devices;
    ``{case: facts}``."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N_DEVICES}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *selected_cases(request)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            facts = json.loads(line)
            out[facts["case"]] = facts
    if proc.returncode != 0 or not out:
        pytest.fail(
            f"{SCRIPT.name} exited with {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"
        )
    return out


def case(results: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    assert name in results, f"case {name!r} did not report (got {sorted(results)})"
    facts = results[name]
    if "error" in facts:
        pytest.fail(f"case {name!r} raised:\n{facts['error']}")
    return facts


def test_subprocess_has_eight_devices(results: dict) -> None:
    assert case(results, "devices")["device_count"] == N_DEVICES


def test_hlo_parser_finds_collectives_inside_a_loop(results: dict) -> None:
    """Negative control: a scan with a psum and an all_gather in its body is flagged."""
    facts = case(results, "parser_control")
    assert facts["n_while"] >= 1 and facts["loop_computations_missing"] == []
    found = " ".join(facts["loop_collectives"])
    assert "all-reduce" in found and "all-gather" in found, facts["loop_collectives"]


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_values_and_gradients_match_unsharded_original(results: dict, name: str) -> None:
    facts = case(results, name)
    grad, _, _, _ = MODEL_CASES[name]
    # auto: fused or remat, as its estimate decides
    assert facts["plan_grad"] in (("fused", "remat") if "auto" in name else (grad,))
    for what in ("value_err", "params_grad_err", "batch_grad_err"):
        assert facts[what] <= RTOL, f"{what} = {facts[what]:.3e} > {RTOL}"
    # the batch cotangents stay sharded over the batch axis
    for spec in facts["batch_grad_spec"]:
        assert spec.startswith(("P('data'", "P(('x', 'y')")), facts["batch_grad_spec"]
    if "dropout" in name:
        # The input dropout zeroes about half of d loss / d x; the same entries, exactly.
        assert 0.3 < facts["batch_grad_zero_fraction"] < 0.7
        assert facts["batch_grad_zeros_equal"], "dropout draws differ from the original's"


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_no_collectives_inside_the_loop(results: dict, name: str) -> None:
    facts = case(results, name)
    _, _, _, chunk = MODEL_CASES[name]
    assert facts["n_while"] >= 1, "no while loop in the compiled program: nothing was chunked"
    assert facts["loop_computations_missing"] == [], "a while loop's computation was not parsed"
    assert facts["loop_collectives"] == [], "collectives inside the chunk loop"
    # One psum of the accumulators after the loop (per pass): at most one all-reduce per
    # gradient leaf and output, and in practice XLA combines them into one or two.
    bound = facts["n_grad_leaves"] + facts["n_outputs"]
    assert 1 <= facts["all_reduce_total"] <= bound, facts["all_reduce_total"]
    # A streamed normaliser also merges each term's running max (a pmax) before its
    # rescaled accumulator is summed: one more all-reduce per pass.
    assert facts["all_reduce_total"] <= (4 if name.startswith("pool") else 2), facts[
        "all_reduce_total"
    ]
    assert set(facts["collectives_total"]) <= {"all-reduce", "all-reduce-start", "all-reduce-done"}
    if facts["trip_counts"]:  # the chunk loop runs N / chunk times on every device
        assert BATCH // chunk in facts["trip_counts"], facts["trip_counts"]


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_explain_reports_mesh_axis_and_per_device_chunk(results: dict, name: str) -> None:
    facts = case(results, name)
    _, axes, devices, chunk = MODEL_CASES[name]
    text = facts["explain"]
    assert f"mesh axis {axes}" in text, text
    assert f"({devices} devices)" in text, text
    assert f"chunks of {chunk // devices}" in text, text


def test_random_draws_bit_identical(results: dict) -> None:
    facts = case(results, "draws")
    assert facts["bit_identical"], f"{facts['n_different']} entries differ"


def _has_number(message: str, n: int) -> bool:
    return re.search(rf"(?<!\d){n}(?!\d)", message) is not None


@pytest.mark.parametrize(
    ("name", "chunk", "nearest"),
    [("chunk_error-explicit", 12, (8, 16)), ("chunk_error-mesh_axis", 20, (16, 24))],
)
def test_chunk_not_a_multiple_of_the_shards(
    results: dict, name: str, chunk: int, nearest: tuple[int, int]
) -> None:
    facts = case(results, name)
    assert facts["decoration_error"] is None, "the error needs the mesh: first call, not before"
    for how in ("call", "jit_value_and_grad"):
        err = facts[how]
        assert err is not None, f"{how}: no error for chunk={chunk} over {N_DEVICES} shards"
        assert err["is_value_error"], f"{how}: {err['type']}: {err['message']}"
        message = err["message"]
        for n in (chunk, N_DEVICES, *nearest):
            assert _has_number(message, n), f"{how}: {n} not in {message!r}"


def test_axis_not_divided_by_the_shards(results: dict) -> None:
    err = case(results, "uneven_axis")["error_raised"]
    assert err is not None, "no error for an axis of 60 over 8 shards"
    assert err["is_value_error"], f"{err['type']}: {err['message']}"
    assert _has_number(err["message"], 60) and _has_number(err["message"], N_DEVICES)


def test_mesh_axis_errors(results: dict) -> None:
    facts = case(results, "bad_mesh_axis")
    unknown, no_mesh = facts["unknown_axis"], facts["no_mesh"]
    assert unknown is not None and unknown["is_value_error"], unknown
    assert "model" in unknown["message"] and "data" in unknown["message"], unknown["message"]
    assert no_mesh is not None and no_mesh["is_value_error"], no_mesh
    assert "set_mesh" in no_mesh["message"], no_mesh["message"]


@pytest.mark.parametrize("name", ["checkify"])
def test_checkify_of_a_sharded_batch_reports_the_originals_error(results: dict, name: str) -> None:
    """Every mode and chunk, with and without ``jax.set_mesh``: the original's report, and
    none on clean rows (the per-site error slots crashed inside the layout's ``shard_map``)."""
    reports = case(results, name)["reports"]
    for key, got in reports.items():
        *_, set_mesh, clean = key.split("-")
        want = reports[f"original-{set_mesh}-{clean}"]
        assert got == want, (key, got, want)
    assert reports["original-False-False"].startswith("bad row -20.0"), reports
    assert reports["original-False-True"] is None, reports


@pytest.mark.parametrize("name", ["checkify-automatic"])
def test_automatic_checks_of_a_sharded_batch_report_the_originals_error(
    results: dict, name: str
) -> None:
    """JAX's automatic checks (division, NaN, lookup; two of one kind, two kinds) with two
    chunks a device: each report is the original's, one error as one device would report
    it (JAX's rule of ``shard_map`` reported it "at mapped index 0", raised on a lookup's
    bounds, or raised in ``err.get()`` on an explicit mesh). Where JAX's checkify of the
    original raises (a lookup on an explicit mesh), the report is the auto mesh's."""
    reports = case(results, name)["reports"]
    for key, got in reports.items():
        original = got["original"]
        if original.startswith("raised"):
            original = reports[key.replace("explicit/", "auto/")]["original"]
        assert original is not None and not original.startswith("raised"), (key, original)
        for grad, report in got.items():
            assert grad == "original" or report == original, (key, grad, report, original)
    assert reports["auto/two_nans/forward"]["original"] == "nan generated by primitive: log."
    assert reports["auto/two_kinds/forward"]["original"] == "division by zero"
    assert reports["auto/loop_two_nans/forward"]["original"] == "nan generated by primitive: sqrt."


def test_parts_as_written_in_nested_jaxprs_on_an_explicit_mesh(results: dict) -> None:
    """A ``scan``, ``cond``, ``while``, ``jit``, custom VJP or checkpoint that runs as
    written and reads the sharded rows: remat, fused and native, with and without
    ``jax.set_mesh``, run (each raised under ``jax.grad``), with the original's values,
    gradients and ``checkify`` report (a NaN made by ``sqrt``)."""
    facts = case(results, "nested-as-written")["programs"]
    assert len(facts) == 6 * 3 * 2, sorted(facts)
    bad = {
        k: v
        for k, v in facts.items()
        if "raised" in v or v["err"] > RTOL or v["report"] != v["original"]
    }
    assert not bad, bad
    assert {v["original"] for v in facts.values()} == {"nan generated by primitive: sqrt."}


def test_programs_jax_refuses_at_their_layouts_run_unsharded(results: dict) -> None:
    """A ``lax.scan`` over sharded rows, a lookup with sharded indices, a contraction sharded
    on both sides: the original raises JAX's layout error; every mode, traced without the
    layouts, runs with the unsharded original's values and gradients (as FSDP needs)."""
    facts = case(results, "layout-errors")["programs"]
    assert len(facts) == 6, sorted(facts)
    for key, got in facts.items():
        assert "raised" in got["original"], (key, got)
        for grad in ("remat", "native"):
            assert "raised" not in got[grad] and got[grad]["err"] <= RTOL, (key, grad, got)


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("parameters-sharded-batch-whole", "P(None, None, 'model')"),
        ("batch-and-features-sharded", "P('data', 'model')"),
    ],
)
def test_explicit_layouts_beside_the_batch_rows(results: dict, name: str, spec: str) -> None:
    """Tensor parallelism alone, the batch whole (remat and fused raised under
    ``jax.set_mesh``), and the batch's features sharded over ``model`` too (every mode
    raised): every mode, with and without ``jax.set_mesh``, runs with the original's values
    and gradients, the gradient (the parameters'; the batch's) laid out as its primal."""
    facts = case(results, name)["modes"]
    assert len(facts) == len(GRAD_MODES) * 2, sorted(facts)
    bad = {k: v for k, v in facts.items() if "raised" in v or v["err"] > RTOL or v["spec"] != spec}
    assert not bad, bad


@pytest.mark.parametrize("name", ["reuse-one-then-sharded", "reuse-sharded-then-one"])
def test_one_function_on_unsharded_and_sharded_inputs(results: dict, name: str) -> None:
    """The trace cache must tell placements apart, as ``jax.jit`` does."""
    facts = case(results, name)
    for which, layout in (("one", "one device"), ("sharded", "sharded over mesh axis")):
        got = facts[which]
        assert "raised" not in got, f"{which} call after the other: {got['raised']}"
        assert got["err"] <= RTOL, f"{which}: error {got['err']:.3e}"
        assert got["layout"].startswith(layout), f"{which}: layout {got['layout']!r}"


def test_serialized_inside_shard_map(results: dict) -> None:
    """r15: per-shard microbatching inside ``jax.shard_map`` (``check_vma`` on and off, every
    mode), against the original under the same ``shard_map``."""
    facts = {k: v for k, v in results["shard_map_inside"].items() if k != "case"}
    assert len(facts) == 16, facts
    bad = {k: v for k, v in facts.items() if "raised" in v or v["err"] > RTOL}
    assert not bad, bad


def test_idioms_inside_shard_map(results: dict) -> None:
    """The fuzzer's shard_map classes (repros f02-f04, and fused's gradient of replicated
    weights under a checkpoint or scan, or chunked along their own axis, once 8x): every
    mode, gradients inside and outside the ``shard_map``, against the original under the
    same stack."""
    facts = {k: v for k, v in results["shard_map_idioms"].items() if k != "case"}
    assert len(facts) == 48, facts
    bad = {k: v for k, v in facts.items() if "raised" in v or v["err"] > RTOL}
    assert not bad, bad


# -- FSDP and tensor parallelism (``tests/sharding_fsdp.py``) --------------------------------
# each layout in two modes, each mode in one layout at least (CI's hour; the three layouts in
# all four modes: 12 cases, every one passing when this was cut to 6)
FSDP_GRADS = ("remat", "fused", "native", "auto")
FSDP_CASES = [
    f"{layout}-{FSDP_GRADS[(i + j) % len(FSDP_GRADS)]}"
    for i, layout in enumerate(("fsdp-auto-mlp", "fsdp-explicit-mlp", "fsdp_tp-explicit-mlp"))
    for j in range(2)
]
FSDP_CASES += ["fsdp_tp-auto-mlp-remat", "tp-explicit-mlp-remat", "tp-explicit-mlp-native"]
FSDP_CASES += [f"fsdp-remainder-dropout-{g}" for g in ("remat", "fused", "native")]
FSDP_CASES += ["fsdp-auto-remainder-mlp-remat"]


@pytest.mark.parametrize("name", FSDP_CASES)
def test_sharded_parameters_values_and_gradients_match_unsharded_original(
    results: dict, name: str
) -> None:
    """Parameters sharded over the batch's mesh axis (FSDP), another one (tensor parallel)
    or both, every mode, a remainder chunk, dropout: the unsharded original's values and
    gradients, the same dropout zeros; each gradient leaves sharded like its parameter
    (on an ``Auto`` mesh, the weights, which the loop reads as passed)."""
    facts = case(results, name)
    if not name.endswith("-auto"):
        assert facts["plan_grad"] == name.rsplit("-", 1)[1]
    for what in ("value_err", "params_grad_err", "batch_grad_err"):
        assert facts[what] <= RTOL, f"{what} = {facts[what]:.3e} > {RTOL}"
    assert facts["batch_grad_zeros_equal"], "dropout draws differ from the original's"
    pairs = zip(facts["grad_specs"], facts["param_specs"], facts["param_ndims"], strict=True)
    auto = "-auto-" in name
    for got, placed, ndim in pairs:
        if not auto or ndim == 2:
            assert got == placed, (facts["grad_specs"], facts["param_specs"])


@pytest.mark.parametrize("name", FSDP_CASES)
def test_sharded_parameters_only_gather_and_scatter_inside_the_loop(
    results: dict, name: str
) -> None:
    """Inside the loop: the gathers of the sharded parameters and (over the batch's mesh
    axis) the reduce-scatters of their gradients, nothing else; outside: no all-reduce of a
    whole sharded parameter's gradient."""
    facts = case(results, name)
    inside = facts["collectives"]["loop"]
    assert set(inside) <= {"all-gather", "all-gather-start", "reduce-scatter"}, inside
    assert inside.get("all-gather", 0) + inside.get("all-gather-start", 0) >= 1, inside
    if not name.startswith("tp-"):  # FSDP: the gradients are reduce-scattered per chunk
        assert inside.get("reduce-scatter", 0) >= 1, inside
    whole = {tuple(s) for s in facts["sharded_shapes"]}
    reduced = [s for s in facts["all_reduce_shapes"] if tuple(s) in whole]
    assert not reduced, f"all-reduces of whole sharded gradients: {reduced}"


@pytest.mark.parametrize("name", FSDP_CASES)
def test_explain_counts_the_collectives_of_sharded_parameters(results: dict, name: str) -> None:
    text = case(results, name)["explain"]
    assert "stay sharded (FSDP / tensor parallelism)" in text, text
    assert re.search(r"\(\d+ all-gather\(s\)\)", text), text
    assert re.search(r"\d+ reduce-scatter\(s\) over \('data',\)", text), text
    assert "FSDP's own cost" in text, text


def test_a_parameter_the_shards_do_not_divide_stays_whole(results: dict) -> None:
    """``param_specs`` shards the last layer's 4 outputs over 8 devices: that parameter is
    gathered whole before the loop and ``explain`` says why."""
    text = case(results, "fsdp-auto-mlp-remat")["explain"]
    assert "1 sharded input(s) gathered whole before the loop" in text, text
    assert "dimension of 4 is not divided by the 8 shards of ('data',)" in text, text


@pytest.mark.parametrize("name", ["fsdp_tp-two_sums", "fsdp_tp-two_sums-once"])
def test_sharded_parameter_jacobian_rows_and_forward_mode(results: dict, name: str) -> None:
    """Two sums of a ``P("data", "model")`` weight: ``jax.jacrev`` (fused's rows with a
    row dimension) and ``jax.linearize`` (the chunked forward mode), every mode, gathered
    per chunk and once."""
    facts = case(results, name)
    for grad in ("remat", "fused", "native"):
        got = facts[grad]
        assert got["plan_grad"] == grad, got
        assert got["jacrev_err"] <= RTOL and got["linearize_err"] <= RTOL, (grad, got)
        assert got["jacrev_spec"] == "P(None, 'data', 'model')", (grad, got)


# -- gathered once before the loop (``gather=``) --------------------------------------------
ONCE_CASES = [f"fsdp-once-explicit-mlp-{g}" for g in ("remat", "native", "fused")]
ONCE_CASES += ["fsdp-once-remainder-dropout-remat"]


@pytest.mark.parametrize("name", ONCE_CASES)
def test_gathered_once_values_gradients_and_collectives(results: dict, name: str) -> None:
    """``gather="once"``: the unsharded original's values and gradients, each gradient
    sharded like its parameter; the gathers before the loop, none inside it (there only the
    gradients' reduce-scatters, none under native), no all-reduce of a whole sharded
    gradient; ``explain`` says where they are gathered, with the bytes and the counts."""
    facts = case(results, name)
    for what in ("value_err", "params_grad_err", "batch_grad_err"):
        assert facts[what] <= RTOL, f"{what} = {facts[what]:.3e} > {RTOL}"
    assert facts["batch_grad_zeros_equal"], "dropout draws differ from the original's"
    assert facts["grad_specs"] == facts["param_specs"], facts["grad_specs"]
    grad = name.rsplit("-", 1)[1]
    assert facts["plan_grad"] == grad, facts["plan_grad"]
    inside, outside = facts["collectives"]["loop"], facts["collectives"]["outside"]
    assert set(inside) <= ({"reduce-scatter"} if grad != "native" else set()), inside
    assert outside.get("all-gather", 0) + outside.get("all-gather-start", 0) >= 1, outside
    whole = {tuple(s) for s in facts["sharded_shapes"]}
    assert not [s for s in facts["all_reduce_shapes"] if tuple(s) in whole]
    text = facts["explain"]
    assert re.search(r"are gathered once before the loop \(\d+\.\d KiB gathered\): ", text), text
    assert "gather='once'; " in text and re.search(r"\(\d+ all-gather\(s\)\)", text), text


@pytest.mark.parametrize("name", ["fsdp-gather_budget"])
def test_gather_auto_under_a_memory_budget(results: dict, name: str) -> None:
    """``gather="auto"`` with ``memory=``: gathered once where the budget fits that at some
    chunk, per chunk where only that fits; explain says which and why; the original's value."""
    facts = case(results, name)
    assert facts["least"]["chunk"] < facts["least"]["once"], facts["least"]
    fits, over = facts["fits"], facts["over"]
    assert "are gathered once before the loop" in fits["layout"], fits["layout"]
    pattern = r"gather='auto': gathered once they fit the memory budget [\d.]+ KiB \(chunk "
    assert re.search(pattern, fits["layout"]), fits["layout"]
    assert "gathered per chunk (128.0 KiB gathered in each step)" in over["layout"], over
    assert "fit the memory budget" in over["layout"] and "at no chunk" in over["layout"], over
    assert fits["err"] <= RTOL and over["err"] <= RTOL, (fits["err"], over["err"])
