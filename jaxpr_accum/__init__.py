"""jaxpr_accum: run the batch or sample axis of a JAX function in chunks, exactly.

``serialize_axis(chunk=k)`` traces the function to a jaxpr, finds the axis by dataflow
analysis, and rewrites that region into a chunked ``lax.scan`` with rematerialisation and
explicit cotangent accumulation. Same values, same gradients; memory that scales with ``k``.
"""

from jaxpr_accum._api import SerializedFunction, serialize_axis
from jaxpr_accum._errors import PlanWarning, SerializeError
from jaxpr_accum._report import Plan
from jaxpr_accum._rules import register_rule
from jaxpr_accum._sweep import Sweep

__all__ = [
    "Plan",
    "PlanWarning",
    "SerializeError",
    "SerializedFunction",
    "Sweep",
    "register_rule",
    "serialize_axis",
]
__version__ = "0.1.0"
