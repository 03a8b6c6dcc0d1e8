"""The analysis of one call: a call's arguments and their checks (``_arguments``), tracing
(``_trace``), the cost model (``_cost``) and ``Candidate``, a split at a chunk with its
estimate (``_estimate``), the stage of every equation (``_stages``), the ``Split`` of a
program into prologue, region and epilogue (``_split``), one copy per row map of a value read
at two (``_fanout``), slices of a chunked input read through roots of their own
(``_input_slices``), why a region stops (``_stop_reasons``), and which axis
(``_candidates``)."""
