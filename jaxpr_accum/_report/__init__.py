"""What ``explain`` reports: the ``Plan`` of a call signature (``_plan``: the values it
reports, read off the decisions and the split), its text (``_plan_text``: stops, candidate
axes, the gradient mode) and its HTML view (``_html``). Both pipelines, one pass
(``_planning``) and two (``_pairwise``), report a ``Plan``."""
