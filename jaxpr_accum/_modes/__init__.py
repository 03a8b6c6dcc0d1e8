"""The gradient modes: each mode's linearization (``_remat``: a linear primitive whose
transpose is the backward; ``_fused``: Jacobian rows), one pass's frozen ``Decision``
(``_decision``: candidate, mode, reason, layout, budget) and choosing the mode
(``_choice``)."""
