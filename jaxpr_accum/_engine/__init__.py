"""The engine: the axis analysis and the re-emission of equations, with the rules as
plugins. ``_view`` holds the analysis's contexts and the rule interface (``View`` for
propagating, ``EqnResize`` for resizing); ``_table`` the rule table keyed by primitive
objects; ``_axes`` the axis analysis (a worklist fixpoint); ``_interpret`` the one equation
interpreter; ``_resize`` the re-emission of equations at chunk size; ``_conv`` canonical
convolutions. The engine imports no rule: ``_rules`` registers itself into ``_table``."""
