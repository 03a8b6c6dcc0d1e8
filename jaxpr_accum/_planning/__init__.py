"""Planning one call signature, and the ``Plan`` it reports.

The planner (``_planner``) makes fail-safe attempts (``_fallback``), each deciding, assembling
and validating one program; with ``memory=`` it searches the chunk under a budget
(``_budget``, ``_chunk_search``; ``_gather`` for sharded parameters); never worse than the
function as written (``_worth``). ``Plan`` (``_plan``, with its text ``_plan_text`` and HTML
``_html``) reports what was decided. A value that pairs the axis with itself is planned by
the second pipeline (``jaxpr_accum._pairwise``, the same layer)."""
