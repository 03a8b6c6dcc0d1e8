"""The four gradient modes, as ``grad=`` names them, declared once.

A ``Mode`` is what the region primitive carries as a parameter (``_region_p.GradientMode``):
its ``name``, its linearization rule of the primitive, and whether JAX differentiates the
chunk loop itself. ``REMAT`` (``_remat``: a linear primitive whose transpose is the chunked
backward) and ``FUSED`` (``_fused``: the Jacobian rows in the forward pass) have a rule of
their own; ``NATIVE`` runs the chunk loop with checkpointed bodies, which JAX differentiates;
``AUTO`` is a request, which planning turns into one of the others (``_choice``) and which is
never bound. Names are parsed once, from the settings, into these objects (``mode_named``);
modes are compared by identity, and plans report ``name``.
"""

from __future__ import annotations

import dataclasses

from jaxpr_accum._build._region_p import Linearize
from jaxpr_accum._modes import _fused, _remat


def _not_bound(name: str) -> Linearize:
    def linearize(*_: object) -> tuple:
        raise TypeError(f"the {name} gradient mode has no linearization rule of its own")

    return linearize


@dataclasses.dataclass(frozen=True, eq=False)
class Mode:
    """A gradient mode: ``name`` as ``grad=`` writes it, its ``linearize`` rule of the region
    primitive (``_region_p.Linearize``), and ``jax_differentiates``: the primitive is not
    bound, JAX differentiates the chunk loop with checkpointed bodies."""

    name: str
    linearize: Linearize
    jax_differentiates: bool = False

    def __repr__(self) -> str:
        return self.name


AUTO = Mode("auto", _not_bound("auto"))
REMAT = Mode("remat", _remat.linearize)
FUSED = Mode("fused", _fused.linearize)
NATIVE = Mode("native", _not_bound("native"), jax_differentiates=True)
MODES = (AUTO, REMAT, FUSED, NATIVE)


def mode_named(name: str) -> Mode:
    """The mode ``grad=name`` asks for (``name`` is one of ``_settings.GRAD_MODES``)."""
    return next(m for m in MODES if m.name == name)
