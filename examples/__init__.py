"""Runnable examples of ``jaxpr_accum`` (``python examples/<name>.py [--quick]``).

Installed, this folder is the subpackage ``jaxpr_accum.examples``, so that
``python -m jaxpr_accum demo`` runs ``mc_vae``'s model from a wheel as from a checkout.
"""
