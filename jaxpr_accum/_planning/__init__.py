"""Planning one call: a call's arguments and their checks (``_arguments``), tracing
(``_trace``), the cost model and ``Candidate`` (``_cost``), the stage of every equation
(``_stages``), the ``Split`` of a program into prologue, region and epilogue (``_plan``), one
copy per row map of a value read at two (``_fanout``), and which axis (``_candidates``)."""
