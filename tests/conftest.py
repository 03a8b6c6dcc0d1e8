"""Test configuration: one CPU device, Hypothesis profiles, test tiers.

Tiers (markers registered in ``pyproject.toml``): the default run, ``python -m pytest -q``,
is the fast tier (``-m 'not slow and not integration'`` in ``addopts``); ``-m slow`` runs
the full parametrisation matrices, the models and long property runs; ``-m integration``
runs what starts subprocesses (examples, docs snippets, multi-device and multi-process
checks); ``-m ''`` runs everything. A test is in exactly one tier: marking it both ``slow``
and ``integration`` is an error, so that running the three tiers runs every test once. In the
default tier a ``jaxpr_accum.PlanWarning`` that the test neither asserts nor filters is an
error.

Profiles (select with ``HYPOTHESIS_PROFILE=<name>``; default ``ci``):

* ``ci``: few examples, derandomized (the same examples on every run), no example database.
* ``dev``: more examples, random, with the local example database.
* ``thorough``: many examples, for an occasional long run.
"""

from __future__ import annotations

import os

# Everything on one CPU device, set before JAX is imported anywhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
# Every internal fallback is an error in the project's own tests (``_fallback``).
os.environ.setdefault("JAXPR_ACCUM_STRICT", "1")

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])

_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    max_examples=12,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW,
)
settings.register_profile(
    "dev", max_examples=40, deadline=None, print_blob=True, suppress_health_check=_SLOW
)
settings.register_profile(
    "thorough", max_examples=400, deadline=None, print_blob=True, suppress_health_check=_SLOW
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


TIERS = ("slow", "integration")
PLAN_WARNINGS_ARE_ERRORS = "error::jaxpr_accum.PlanWarning"
#: Test files that run whole example models (minutes on 2 cores) and carry no marker of their
#: own yet: the slow tier. (A marker in the file itself is better; then drop it from here.)
SLOW_FILES = ("test_docs_testing_examples.py",)
#: Tests moved to the slow tier to keep the default one under 3 minutes on 2 cores (each
#: family keeps a faster representative in the default tier).
SLOW_TESTS = (
    "test_rules_coverage.py::test_random_gamma_per_sample",
    "test_rules_coverage.py::test_linalg_decompositions",
    "test_rules_coverage.py::test_lstm_cell_chunks_whole",
    "test_rules_coverage.py::test_linalg_along_the_axis_is_a_barrier",
    "test_rules_coverage.py::test_per_row_lookup_saves_memory",
    "test_rules_coverage.py::test_checkpoint_name_and_policy",
    "test_testing.py::test_assert_matches_original_in_every_mode_and_chunk",
    "test_testing.py::test_check_passes_on_a_small_model",
    "test_testing.py::test_integer_and_key_inputs_and_outputs",
    "test_testing.py::test_batch_statistic_custom_vjp_passes_check",
    "test_budget.py::test_choice_is_reused_by_later_calls_jit_and_grad",
    "test_budget.py::test_nnx_train_step_under_nnx_jit",
    "test_random.py::test_compiled_hlo_has_no_full_random_buffer",
    "test_random.py::test_flax_dropout_mlp",
    "test_random.py::test_fold_in_per_index",
    "test_random.py::test_split_key_per_sample_size_hint",
    "test_random.py::test_legacy_threefry_is_exact_and_hoisted",
    "test_random.py::test_rbg_key_is_exact_and_hoisted",
    "test_compose.py::test_value_and_grad_auto",
    "test_compose.py::test_vmap_of_serialized",
    "test_compose.py::test_cache_respects_shapes",
    "test_compose.py::test_serialize_a_jitted_function",
    "test_compose.py::test_size_hint_axis_at_position_1",
    "test_rules.py::test_cumsum_sort_topk_other_axis",
    "test_flax.py::test_linen_apply_with_dropout_and_batch_stats[native]",
    "test_models.py::test_seed1_explain_names_sample_axis",
    "test_testing.py::test_check_on_an_nnx_model_with_dropout",
    "test_testing.py::test_automatic_axis_is_kept_at_chunks_as_long_as_the_axis",
    "test_random.py::test_distribution_along_axis[categorical",
    "test_random.py::test_distribution_along_axis[truncated_normal",
    "test_exactness.py::test_serialized_inside_serialized[auto]",
    "test_exactness.py::test_serialized_inside_serialized[fused]",
    "test_exactness.py::test_serialized_inside_serialized[native]",
    "test_exactness.py::test_polymorphic_custom_rules_are_chunked[auto]",
    "test_exactness.py::test_polymorphic_custom_rules_are_chunked[native]",
    "test_exactness.py::test_float64_is_float64_accurate[auto]",
    "test_exactness.py::test_float64_is_float64_accurate[native]",
    "test_exactness.py::test_hessian_forward_over_reverse_and_reverse_over_reverse",
    "test_exactness.py::test_perturbed_mask_does_not_leak_between_traces[auto]",
    "test_exactness.py::test_perturbed_mask_does_not_leak_between_traces[native]",
    "test_structure.py::test_seed1_no_full_size_buffers[native]",
    "test_structure.py::test_dropout_bits_generated_per_chunk[native]",
    "test_layout_of_code.py::test_threefry_counter_layout_matches_jax_random_bits[8-",
    "test_testing_examples.py::test_check_dropout_transformer",
    "test_testing_examples.py::test_check_mc_vae",
    "test_random.py::test_bits_widths[remat-3]",
    "test_conv.py::test_canonical_conv_matches_lax[case3]",
    "test_exactness.py::test_perturbed_mask_does_not_leak_between_traces[fused]",
    "test_streaming.py::test_float64_attention_and_vocab_ce",
    "test_structure.py::test_seed1_scan_over_samples[4-4]",
    "test_testing.py::test_batch_statistic_custom_vjp_matches_the_original",
    "test_layout_of_code.py::test_threefry_counter_layout_matches_jax_random_bits[16-",
    "test_compose.py::test_static_int_controls_shape",
    "test_compose.py::test_pytree_inputs_and_outputs",
    "test_compose.py::test_integer_labels[",
    "test_compose.py::test_vjp_with_integer_input_gives_float0",
    "test_compose.py::test_static_python_arguments",
    "test_properties.py::test_microbatched_program",
    "test_random.py::test_distribution_along_axis[uniform",
    "test_random.py::test_distribution_along_axis[bernoulli",
    "test_random.py::test_dropout_is_active",
    "test_rules_coverage.py::test_variadic_reduce_over_other_axes",
    "test_rules_coverage.py::test_linalg_tridiagonal_solve",
    "test_rules_coverage.py::test_max_pool_and_its_gradient",
    "test_rules_coverage.py::test_fft_along_other_axes",
    "test_rules_coverage.py::test_approx_top_k_along_other_axes",
    "test_compose.py::test_inner_transforms_and_control_flow[fori_loop",
)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        listed = item.path.name in SLOW_FILES or any(t in item.nodeid for t in SLOW_TESTS)
        if listed and not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.slow)
        if not any(item.get_closest_marker(t) for t in TIERS):
            # The default tier shows no warning that no test expects: a PlanWarning is an
            # error unless the test asserts it (pytest.warns) or filters it itself (its own
            # filterwarnings marks and catch_warnings blocks take precedence over this one).
            item.add_marker(pytest.mark.filterwarnings(PLAN_WARNINGS_ARE_ERRORS), append=False)
    both = [item.nodeid for item in items if all(item.get_closest_marker(t) for t in TIERS)]
    if both:
        raise pytest.UsageError(
            "a test is in one tier: marked both 'slow' and 'integration': " + ", ".join(both)
        )
