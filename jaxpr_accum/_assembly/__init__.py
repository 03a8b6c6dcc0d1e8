"""Assembling the whole program and planning a call signature: the program with its
prologue, region and epilogue (``_assemble``); ``memory=``'s budget and its chunk search
(``_budget``, ``_chunk_search``); never worse than the function as written (``_worth``);
fail-safe attempts (``_fallback``); ``Plan`` and its HTML (``_report``, ``_html``); values
that pair the axis with itself, in two passes (``_pairwise``); and the planner of one call
signature (``_prepare``)."""
