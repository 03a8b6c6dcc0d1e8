"""The gradient modes: the four modes, ``Mode`` and ``mode_named`` (``_mode``), each mode's
linearization (``_remat``: a linear primitive whose transpose is the backward; ``_fused``:
Jacobian rows), one pass's frozen ``Decision`` (``_decision``: candidate, mode, reason,
layout, and with ``memory=`` the ``Budget`` of the chunk search) and choosing the mode
(``_choice``)."""
