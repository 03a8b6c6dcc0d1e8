"""Planning one call signature: the planner (``_planner``) and its attempts (``_attempt``),
fail-safe from the widest plan to the function as written (``_fallback``); with ``memory=``
the chunk search under a budget (``_budget``, ``_chunk_search``; ``_gather`` for sharded
parameters); never worse than the function as written (``_worth``). The plan it reports is a
``_report._plan.Plan``; a value that pairs the axis with itself is planned by the second pipeline
(``_pairwise``), which the planner runs as its first attempt."""
